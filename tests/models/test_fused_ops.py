"""Fused Triton RMSNorm(+residual), SiLU·mul and RoPE against the eager ops in ``layers.py``.

Under ``TRITON_INTERPRET=1`` on CPU (small shapes) and on the GPU (``cuda`` marker, bf16/fp16
bit-exact except for float32 reduction order in RMSNorm).
"""

from __future__ import annotations

import os

import pytest
import torch

HAS_GPU = torch.cuda.is_available()
if not HAS_GPU:
    os.environ.setdefault("TRITON_INTERPRET", "1")

pytest.importorskip("triton")


class _Cfg:
    rope_parameters = {"rope_type": "default", "rope_theta": 10000.0}


def _eager_norm(x, w, eps, residual=None):
    from octavo.models import layers

    norm = layers.RMSNorm(x.shape[-1], eps).to(device=x.device, dtype=x.dtype)
    norm.weight.data.copy_(w)
    return norm(x, residual)  # never bound to fused kernels: the eager path


def _check_all(device, dtype, tokens=5, hidden=96, heads=3, kv_heads=1, head_dim=32):
    from octavo.models import fused_ops, layers

    g = torch.Generator().manual_seed(0)

    def rnd(*s):
        return torch.randn(*s, generator=g).to(dtype).to(device)

    x, r, w = rnd(tokens, hidden), rnd(tokens, hidden), rnd(hidden)
    # One unit in the last place of the 16-bit types; float32 differs by reduction order only.
    tol = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=1e-2, rtol=1e-2)
    torch.testing.assert_close(fused_ops.rms_norm(x, w, 1e-6), _eager_norm(x, w, 1e-6), **tol)
    fo, fr = fused_ops.rms_norm(x, w, 1e-6, r)
    eo, er = _eager_norm(x, w, 1e-6, r)
    torch.testing.assert_close(fr, er, atol=0, rtol=0)
    torch.testing.assert_close(fo, eo, **tol)

    gu = rnd(tokens, 2 * hidden)
    gate, up = gu.chunk(2, dim=-1)
    expected = torch.nn.functional.silu(gate) * up
    torch.testing.assert_close(fused_ops.silu_and_mul(gu), expected, **tol)

    rope = layers.RotaryEmbedding(_Cfg(), head_dim, 64, dtype).to(device)
    qkv = rnd(tokens, (heads + 2 * kv_heads) * head_dim)
    q = qkv[:, : heads * head_dim].view(tokens, heads, head_dim)
    k = qkv[:, heads * head_dim : (heads + kv_heads) * head_dim].view(tokens, kv_heads, head_dim)
    pos = torch.tensor([0, 3, 17, 63, 5][:tokens], device=device)
    fq, fk = fused_ops.rope(pos, q, k, rope.cos, rope.sin)
    cos, sin = rope.cos[pos].unsqueeze(1), rope.sin[pos].unsqueeze(1)
    eq = q * cos + layers.rotate_half(q) * sin
    ek = k * cos + layers.rotate_half(k) * sin
    torch.testing.assert_close(fq, eq, **tol)
    torch.testing.assert_close(fk, ek, **tol)

    qw, kw = rnd(head_dim), rnd(head_dim)
    nq, nk = fused_ops.qk_norm_rope(pos, q, k, qw, kw, 1e-6, rope.cos, rope.sin)
    q2, k2 = _eager_norm(q, qw, 1e-6), _eager_norm(k, kw, 1e-6)
    torch.testing.assert_close(nq, q2 * cos + layers.rotate_half(q2) * sin, **tol)
    torch.testing.assert_close(nk, k2 * cos + layers.rotate_half(k2) * sin, **tol)


@pytest.mark.skipif(HAS_GPU, reason="interpreter tests run where there is no GPU")
def test_fused_ops_interpreted():
    _check_all("cpu", torch.float32)


def _check_qk_normed_rope(device, dtype, tokens=3, heads=4, kv_heads=2, head_dim=32):
    """``RotaryEmbedding.forward_qk_normed`` with the Triton kernels bound equals the three eager
    ops for Qwen3's ``RMSNorm`` (fused) and for Gemma's ``(1 + w)`` norm (must not be fused)."""
    from octavo.models import fused_ops, layers
    from octavo.models.gemma import GemmaRMSNorm

    g = torch.Generator().manual_seed(1)

    def rnd(*s):
        return torch.randn(*s, generator=g).to(dtype).to(device)

    bound = layers.RotaryEmbedding(_Cfg(), head_dim, 64, dtype).to(device)
    bound.fused_ops = fused_ops
    eager = layers.RotaryEmbedding(_Cfg(), head_dim, 64, dtype).to(device)
    q, k = rnd(tokens, heads, head_dim), rnd(tokens, kv_heads, head_dim)
    pos = torch.tensor([0, 7, 63][:tokens], device=device)
    tol = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=1e-2, rtol=1e-2)
    for norm_cls in (layers.RMSNorm, GemmaRMSNorm):
        qn, kn = norm_cls(head_dim, 1e-6), norm_cls(head_dim, 1e-6)
        for n in (qn, kn):
            n.to(device=device, dtype=dtype).weight.data.copy_(rnd(head_dim))
        got = bound.forward_qk_normed(pos, q, k, qn, kn)
        want = eager(pos, qn(q), kn(k))
        torch.testing.assert_close(got[0], want[0], **tol)
        torch.testing.assert_close(got[1], want[1], **tol)


@pytest.mark.skipif(HAS_GPU, reason="interpreter tests run where there is no GPU")
def test_qk_normed_rope_fuses_only_plain_rmsnorm_interpreted():
    _check_qk_normed_rope("cpu", torch.float32)


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_GPU, reason="needs a GPU")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_qk_normed_rope_fuses_only_plain_rmsnorm_gpu(dtype):
    _check_qk_normed_rope("cuda", dtype)


def _check_kv_write_in_rope(device, dtype, cache_dtype=None, tokens=4, heads=4, kv_heads=2, head_dim=32):
    """``qk_norm_rope(kv_write=...)`` returns what it returns without, and leaves the cache as
    ``paged_attention.write_kv`` of the rotated k and v does (bit for bit; slot -1: no write)."""
    from octavo.attention.ops.paged_attention import write_kv
    from octavo.models import fused_ops, layers

    g = torch.Generator().manual_seed(2)

    def rnd(*s):
        return torch.randn(*s, generator=g).to(dtype).to(device)

    rope = layers.RotaryEmbedding(_Cfg(), head_dim, 64, dtype).to(device)
    q, k, v = rnd(tokens, heads, head_dim), rnd(tokens, kv_heads, head_dim), rnd(tokens, kv_heads, head_dim)
    qw, kw = rnd(head_dim), rnd(head_dim)
    pos = torch.tensor([0, 7, 63, 5][:tokens], device=device)
    slots = torch.tensor([5, 40, -1, 17][:tokens], device=device)  # -1: a padding token
    cache = rnd(2, 4, 16, kv_heads, head_dim).to(cache_dtype or dtype)
    want_q, want_k = fused_ops.qk_norm_rope(pos, q, k, qw, kw, 1e-6, rope.cos, rope.sin)
    want = cache.clone()
    write_kv(want_k, v, want, slots, 0.5, 2.0)
    got = cache.clone()
    got_q, got_k = fused_ops.qk_norm_rope(pos, q, k, qw, kw, 1e-6, rope.cos, rope.sin,
                                          kv_write=(v, got, slots, 0.5, 2.0))
    assert torch.equal(got_q, want_q) and torch.equal(got_k, want_k)
    assert torch.equal(got.view(torch.uint8), want.view(torch.uint8))
    assert not torch.equal(got, cache)
    with pytest.raises(ValueError, match="KV write target"):
        fused_ops.qk_norm_rope(pos, q, k, qw, kw, 1e-6, rope.cos, rope.sin, kv_write=(v, got, slots[:1], 1.0, 1.0))


@pytest.mark.skipif(HAS_GPU, reason="interpreter tests run where there is no GPU")
def test_kv_write_in_rope_interpreted():
    _check_kv_write_in_rope("cpu", torch.float32)


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_GPU, reason="needs a GPU")
@pytest.mark.parametrize("dtype,cache_dtype", [(torch.bfloat16, None), (torch.float32, None),
                                               (torch.bfloat16, torch.float8_e4m3fn)])
def test_kv_write_in_rope_gpu(dtype, cache_dtype):
    _check_kv_write_in_rope("cuda", dtype, cache_dtype, tokens=4, heads=32, kv_heads=4, head_dim=128)


def test_kv_write_needs_the_fused_launch():
    """An eager (unbound) RoPE cannot write the cache: asked to, it refuses."""
    from octavo.models import layers

    rope = layers.RotaryEmbedding(_Cfg(), 32, 64, torch.float32)
    qn, kn = layers.RMSNorm(32, 1e-6), layers.RMSNorm(32, 1e-6)
    q, k = torch.randn(2, 4, 32), torch.randn(2, 2, 32)
    assert not rope.writes_kv(q, qn, kn)
    with pytest.raises(ValueError, match="kv_write"):
        rope.forward_qk_normed(torch.tensor([0, 1]), q, k, qn, kn, (k, None, None, 1.0, 1.0))


def test_platforms_bind_triton_only_on_gpus():
    """CPU models never reach Triton (the fp32 HF-equivalence path stays pure torch)."""
    from octavo.platforms.cpu import CpuPlatform
    from octavo.platforms.cuda import CudaPlatform
    from octavo.platforms.rocm import RocmPlatform

    assert CpuPlatform.fused_op_kernels == "cpu"
    assert CudaPlatform.fused_op_kernels == RocmPlatform.fused_op_kernels == "triton"


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_GPU, reason="needs a GPU")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_fused_ops_gpu(dtype):
    _check_all("cuda", dtype, tokens=5, hidden=4096, heads=32, kv_heads=8, head_dim=128)
    _check_all("cuda", dtype, tokens=3, hidden=896, heads=14, kv_heads=2, head_dim=64)


# -- decode GEMV on the linears ---------------------------------------------------------------
def _linears(device, dtype, shapes=((96, 64), (64, 96))):
    from octavo.distributed.layers import ColumnParallelLinear, RowParallelLinear

    gen = torch.Generator().manual_seed(0)
    col = ColumnParallelLinear(shapes[0][1], {None: (shapes[0][0], 0)}, bias=True)
    row = RowParallelLinear(shapes[1][1], shapes[1][0], bias=False)
    for p in (*col.parameters(), *row.parameters()):
        p.data.copy_(torch.randn(p.shape, generator=gen))
    return torch.nn.Sequential(col, row).to(device=device, dtype=dtype)


def _check_gemv_linears(model, policy, rows=(1, 3, 8)):
    from octavo.models import fused_ops, layers

    choices = fused_ops.select_linear_kernels(model, policy)
    assert len(choices) == len(model)
    gen = torch.Generator(device=model[0].weight.device).manual_seed(1)
    with torch.inference_mode():
        for layer in model:
            for m in rows:
                x = torch.randn(m, layer.weight.shape[1], device=layer.weight.device, generator=gen)
                x = x.to(layer.weight.dtype)
                ref = torch.nn.functional.linear(x.double(), layer.weight.double(),
                                                 None if layer.bias is None else layer.bias.double())
                y = fused_ops.linear(layer, x) if fused_ops.linear_usable(layer, x) else layer(x)
                err = float((y.double() - ref).norm() / ref.norm())
                assert y.dtype == x.dtype and err < 8e-3, (policy, m, err)
                assert layers.linear(layer, x).shape == y.shape
    return choices


@pytest.mark.skipif(HAS_GPU, reason="interpreter tests run where there is no GPU")
def test_gemv_linears_table_policy_interpreted():
    from octavo.models import fused_ops

    model = _linears("cpu", torch.bfloat16)
    _check_gemv_linears(model, "table", rows=(1, 5))
    layer = model[0]
    small = torch.randn(2, 64).bfloat16()
    assert fused_ops.linear_usable(layer, small)
    assert not fused_ops.linear_usable(layer, torch.randn(9, 64).bfloat16())  # > 8 rows: cuBLAS
    assert not fused_ops.linear_usable(layer, small.float())  # dtype differs from the weight
    fused_ops.GEMV_ENABLED = False
    try:
        assert not fused_ops.linear_usable(layer, small)
    finally:
        fused_ops.GEMV_ENABLED = True
    with pytest.raises(ValueError, match="decode GEMV policy"):
        fused_ops.select_linear_kernels(model, "fast")
    fp32 = _linears("cpu", torch.float32)
    assert fused_ops.select_linear_kernels(fp32, "table") == {}  # fp32 keeps the torch path


def test_decode_gemv_policy_per_platform(monkeypatch):
    from octavo.platforms.cpu import CpuPlatform
    from octavo.platforms.cuda import CudaPlatform
    from octavo.platforms.rocm import RocmPlatform

    monkeypatch.delenv("OCTAVO_DECODE_GEMV", raising=False)
    assert CudaPlatform.decode_gemv_policy() == "auto"
    assert RocmPlatform.decode_gemv_policy() == "off"
    assert CpuPlatform.decode_gemv_policy() == "table"  # the CPU's own bf16 GEMV
    monkeypatch.setenv("OCTAVO_DECODE_GEMV", "table")
    assert CudaPlatform.decode_gemv_policy() == "table"
    assert RocmPlatform.decode_gemv_policy() == "off"  # no GEMV there to force
    monkeypatch.setenv("OCTAVO_DECODE_GEMV", "off")
    assert CpuPlatform.decode_gemv_policy() == CudaPlatform.decode_gemv_policy() == "off"
    monkeypatch.setenv("OCTAVO_DECODE_GEMV", "fastest")
    with pytest.raises(ValueError, match="OCTAVO_DECODE_GEMV"):
        CudaPlatform.decode_gemv_policy()


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_GPU, reason="needs a GPU")
@pytest.mark.parametrize("policy", ["auto", "table"])
def test_gemv_linears_gpu(policy):
    model = _linears("cuda", torch.bfloat16, shapes=((6144, 4096), (4096, 14336)))
    choices = _check_gemv_linears(model, policy, rows=(1, 2, 3, 4, 7, 8))
    if policy == "auto":
        for choice in choices.values():
            for m, cfg in choice["table"].items():
                times = choice["times"][m]
                assert cfg is None or times[cfg.describe()] < times["cublas"]
