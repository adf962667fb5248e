"""The fused CPU ops (``octavo.models.cpu_fused_ops``) against the eager torch code they replace.

bf16/fp16 results must round where the eager ops round, so they agree to the last bit except
where fp32 reduction order or ``exp``'s last bit flips a rounding; fp32 agrees to ~1e-6. (The
layers use them for bf16/fp16 only; fp32 is checked by calling the kernels directly.)
"""

from __future__ import annotations

import pytest
import torch

try:  # an ImportError (not ModuleNotFoundError) when the C++ extension is not built
    from octavo.models import cpu_fused_ops as cfo
except ImportError as e:
    pytest.skip(f"C++ CPU kernels not built: {e}", allow_module_level=True)

from octavo.models import layers  # noqa: E402

DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def _fused(fn, *args):
    """Call through layers.py with the fused path forced on (also for fp32)."""
    old = cfo._HALF
    cfo._HALF = (torch.bfloat16, torch.float16, torch.float32)
    try:
        return fn(*args)
    finally:
        cfo._HALF = old


def _eager(fn, *args):
    old = cfo.ENABLED
    cfo.ENABLED = False
    try:
        return fn(*args)
    finally:
        cfo.ENABLED = old


def _close(a, b, dtype):
    if dtype == torch.float32:
        torch.testing.assert_close(a, b, rtol=2e-6, atol=2e-6)
    else:
        # at most a few elements one rounding step apart
        diff = (a.float() - b.float()).abs()
        assert (diff > 0).float().mean() < 0.01, f"{(diff > 0).sum()} of {diff.numel()} differ"
        torch.testing.assert_close(a.float(), b.float(), rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [576, 64, 37])
def test_rms_norm(dtype, n):
    torch.manual_seed(n)
    norm = layers.RMSNorm(n, 1e-5).to(dtype)
    assert layers.bind_fused_ops(norm, "cpu") is cfo
    with torch.no_grad():
        norm.weight.copy_(torch.randn(n))
    x = torch.randn(7, n).to(dtype)
    r = torch.randn(7, n).to(dtype)
    with torch.inference_mode():
        _close(_fused(norm, x), _eager(norm, x), dtype)
        out, res = _fused(norm, x, r)
        eout, eres = _eager(norm, x, r)
        assert torch.equal(res, eres), "x + residual must be exact"
        _close(out, eout, dtype)
        # strided input (a q/k-norm over heads of a fused qkv output)
        xs = torch.randn(5, 3 * n).to(dtype)[:, n : 2 * n]
        _close(_fused(norm, xs), _eager(norm, xs), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_silu_and_mul(dtype):
    torch.manual_seed(0)
    x = (torch.randn(9, 2 * 1536) * 4).to(dtype)
    with torch.inference_mode():
        _close(_fused(layers.silu_and_mul, x, cfo), _eager(layers.silu_and_mul, x, cfo), dtype)
        assert torch.equal(layers.silu_and_mul(x), _eager(layers.silu_and_mul, x, cfo))  # unbound: eager


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("head_dim", [64, 80, 128])
def test_rope_on_strided_views(dtype, head_dim):
    from transformers import LlamaConfig

    cfg = LlamaConfig(hidden_size=4 * head_dim, num_attention_heads=4, rope_theta=10000.0)
    torch.set_default_dtype(dtype)
    try:
        rope = layers.RotaryEmbedding(cfg, head_dim, 512, dtype)
        layers.bind_fused_ops(rope, "cpu")
    finally:
        torch.set_default_dtype(torch.float32)
    qkv = torch.randn(6, (4 + 2 * 2) * head_dim).to(dtype)
    q = qkv[:, : 4 * head_dim].view(6, 4, head_dim)
    k = qkv[:, 4 * head_dim : 6 * head_dim].view(6, 2, head_dim)
    pos = torch.tensor([0, 1, 5, 100, 511, 7])
    with torch.inference_mode():
        fq, fk = _fused(rope, pos, q, k)
        eq, ek = _eager(rope, pos, q, k)
    _close(fq, eq, dtype)
    _close(fk, ek, dtype)


def test_fp32_stays_on_the_eager_path():
    assert layers._use_fused(cfo, torch.zeros(2, 2)) is None
    assert layers._use_fused(cfo, torch.zeros(2, 2, dtype=torch.bfloat16)) is cfo
    assert layers._use_fused(None, torch.zeros(2, 2, dtype=torch.bfloat16)) is None


def test_kernels_are_chosen_once_by_kind():
    model = torch.nn.Sequential(layers.RMSNorm(8, 1e-5), torch.nn.Linear(8, 8))
    assert layers.fused_ops_of(model[0]) is None  # never bound: eager torch
    assert layers.bind_fused_ops(model, "cpu") is cfo
    assert all(layers.fused_ops_of(m) is cfo for m in model.modules())
    assert layers.bind_fused_ops(model, "none") is None
    assert layers.fused_ops_of(model[1]) is None
    with pytest.raises(ValueError, match="unknown fused op kernels"):
        layers.load_fused_ops("cuda")


def test_prepacked_linear_matches_and_tracks_weight_updates():
    """Prepacked oneDNN weights give F.linear's result and follow in-place weight updates.

    Bit-identity holds where oneDNN picks the same kernel for both calls (AVX-512 here); on CPUs
    where it does not (AMX hosts), the two round differently, so the check is bf16 closeness —
    tight enough that a stale packed copy (weights doubled below) fails it.
    """
    if not cfo.PREPACK:
        pytest.skip("torch has no oneDNN prepacking here")
    torch.manual_seed(0)
    lin = torch.nn.Linear(576, 960, bias=True).to(torch.bfloat16)
    layers.bind_fused_ops(lin, "cpu")

    def check(x):
        with torch.inference_mode():
            got, want = layers.linear(lin, x), torch.nn.functional.linear(x, lin.weight, lin.bias)
        torch.testing.assert_close(got.float(), want.float(), rtol=1.6e-2, atol=2e-2)

    for m in (1, 5, 32):
        x = torch.randn(m, 576).to(torch.bfloat16)
        check(x)
    assert lin.__dict__.get("_octavo_packed") is not None  # the bound kernels packed the weight
    with torch.no_grad():
        lin.weight.mul_(2)  # in place: the packed copy must be rebuilt
    check(x)
    # fp32 keeps the plain path
    lin32 = torch.nn.Linear(16, 8)
    x32 = torch.randn(3, 16)
    assert not cfo.linear_usable(lin32, x32)


def test_fused_op_bindings_check_their_tensors():
    """The extension checks shapes, dtypes, strides and index ranges itself, by keyword."""
    x = torch.randn(3, 8, dtype=torch.bfloat16)
    w = torch.ones(8, dtype=torch.bfloat16)
    out = torch.empty(3, 8, dtype=torch.bfloat16)
    cfo._rms_norm(x=x, weight=w, out=out, eps=1e-5)
    with pytest.raises(TypeError):
        cfo._rms_norm(x, w, out, 1e-5)  # keyword-only
    with pytest.raises(ValueError, match="rms_norm: weight .* must be contiguous \\[n\\]"):
        cfo._rms_norm(x=x, weight=torch.ones(7, dtype=torch.bfloat16), out=out, eps=1e-5)
    with pytest.raises(ValueError, match="rms_norm: weight must have the dtype of x"):
        cfo._rms_norm(x=x, weight=w.float(), out=out, eps=1e-5)
    with pytest.raises(ValueError, match="rms_norm: residual_out is given without residual"):
        cfo._rms_norm(x=x, weight=w, out=out, eps=1e-5, residual_out=out)
    with pytest.raises(ValueError, match="silu_and_mul: out .* must be \\[rows, n\\]"):
        cfo._silu_and_mul(x=x, out=out)
    with pytest.raises(ValueError, match="silu_and_mul: x .* unit inner stride"):
        cfo._silu_and_mul(x=x.t(), out=out)
    q = torch.randn(2, 4, 16, dtype=torch.bfloat16)
    table = torch.randn(8, 16, dtype=torch.bfloat16)
    ok = dict(positions=torch.tensor([0, 7]), q=q, k=q[:, :2], cos=table, sin=table,
              q_out=torch.empty_like(q), k_out=torch.empty(2, 2, 16, dtype=torch.bfloat16))
    cfo._rope(**ok)
    with pytest.raises(ValueError, match="rope: positions .* outside the cos/sin tables"):
        cfo._rope(**{**ok, "positions": torch.tensor([0, 8])})
    with pytest.raises(ValueError, match="rope: positions .* must be int64"):
        cfo._rope(**{**ok, "positions": torch.tensor([0, 1], dtype=torch.int32)})


@pytest.mark.parametrize("dtype", DTYPES)
def test_small_ops_split_over_threads_equal_one_thread(dtype):
    """Decode batches are split into one work item per thread or more (48 rows of 576 were one
    item); the rows are independent, so the split result is the one-thread result bit for bit."""
    torch.manual_seed(1)
    x, r, w = (torch.randn(48, 576).to(dtype) for _ in range(3))
    w = w[0].contiguous()
    outs = []
    for threads in (1, 2, 3):
        out, ro = torch.empty_like(x), torch.empty_like(x)
        cfo._rms_norm(x=x, weight=w, out=out, eps=1e-5, residual=r, residual_out=ro, num_threads=threads)
        gu = torch.randn(48, 2 * 1536, generator=torch.Generator().manual_seed(2)).to(dtype)
        h = torch.empty(48, 1536, dtype=dtype)
        cfo._silu_and_mul(x=gu, out=h, num_threads=threads)
        qkv = torch.randn(48, 12 * 64, generator=torch.Generator().manual_seed(3)).to(dtype)
        q, k = qkv[:, : 9 * 64].view(48, 9, 64), qkv[:, 9 * 64 :].view(48, 3, 64)
        table = torch.randn(512, 64, generator=torch.Generator().manual_seed(4)).to(dtype)
        qo, ko = torch.empty(48, 9, 64, dtype=dtype), torch.empty(48, 3, 64, dtype=dtype)
        cfo._rope(positions=torch.arange(48) * 7, q=q, k=k, cos=table, sin=table, q_out=qo, k_out=ko,
                  num_threads=threads)
        outs.append((out, ro, h, qo, ko))
    for other in outs[1:]:
        for a, b in zip(outs[0], other, strict=True):
            assert torch.equal(a, b)


@pytest.mark.parametrize("dtype", DTYPES)
def test_first_max_index_is_argmax(dtype):
    """The extension's row argmax returns exactly ``argmax``: the first of tied maxima, the
    first NaN where a row has one, infinities, signed zeros, an all -inf row's 0, rows shorter
    than a vector or a chunk, strided rows; other shapes fall back to torch."""
    g = torch.Generator().manual_seed(0)
    ties = torch.randint(-3, 4, (33, 4099), generator=g).to(dtype)
    mixed = torch.randn(6, 4099, generator=g).to(dtype)
    mixed[0, 100] = mixed[0, 50] = mixed[2, 4098] = float("nan")
    mixed[1, 3000] = mixed[1, 3001] = float("inf")
    mixed[3, 7] = float("-inf")
    mixed[4, 2000] = float("inf")
    mixed[4, 4000] = float("nan")
    ninf = torch.full((3, 4099), float("-inf"), dtype=dtype)
    zeros = torch.zeros(3, 700, dtype=dtype)
    zeros[0, 5] = zeros[1, :] = -0.0
    zeros[1, 650] = 0.0
    logits = torch.randn(48, 49152, generator=g).to(dtype)
    for x in (ties, mixed, ninf, zeros, logits, ties[:1, :7], logits[:, :17], logits[:5, 3:1000]):
        assert torch.equal(cfo.first_max_index(x), x.argmax(dim=-1))
    for x in (logits[0], logits[:4, ::2], logits.view(4, 12, 49152)):  # torch's path
        assert torch.equal(cfo.first_max_index(x), x.argmax(dim=-1))


def test_the_cpu_sampler_takes_the_row_argmax():
    from octavo.platforms.cpu import CpuPlatform
    from octavo.worker.model_runner import _first_max_kernel

    assert _first_max_kernel(CpuPlatform) is cfo.first_max_index
    with pytest.raises(ValueError, match="row_argmax: out .* must be int64"):
        cfo._row_argmax(x=torch.randn(2, 8), out=torch.empty(2, dtype=torch.int32))
    with pytest.raises(ValueError, match="row_argmax: out .* must be \\[rows\\]"):
        cfo._row_argmax(x=torch.randn(2, 8), out=torch.empty(3, dtype=torch.int64))
