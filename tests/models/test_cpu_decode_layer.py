"""The CPU's lean decoder-layer step (``octavo/models/cpu_decode_layer.py``) against the module
path it replaces: same kernels in the same order, so bf16 outputs are equal bit for bit."""

from __future__ import annotations

import pytest
import torch

try:  # an ImportError when the C++ extension is not built
    from octavo.models import cpu_fused_ops
except ImportError as e:
    pytest.skip(f"C++ CPU kernels not built: {e}", allow_module_level=True)

from octavo import LLM, SamplingParams  # noqa: E402
from octavo.models import cpu_decode_layer, cpu_decode_stack  # noqa: E402
from octavo.models.llama import LlamaDecoderLayer  # noqa: E402
from tests.hf_reference import random_prompts  # noqa: E402

LENGTHS = [1, 20, 47, 5, 9, 30]


def _layers(llm) -> list:
    return [m for m in llm.llm_engine.core.runner.model.modules() if type(m) is LlamaDecoderLayer]


def _generate(llm, prompts, lean: bool, monkeypatch, fused: bool = True) -> tuple[list, int]:
    """(token ids and top-5 logprobs per prompt, number of lean layer steps taken); ``fused``
    False: the lean path calls each kernel from Python (no ``decoder_layer`` call)."""
    monkeypatch.setattr(cpu_decode_layer, "ENABLED", lean)
    for m in _layers(llm):
        monkeypatch.setattr(m.lean_forward, "fused", fused and m.lean_forward.fused)
    taken = []
    real = cpu_decode_layer.LeanLlamaLayer.__call__
    monkeypatch.setattr(
        cpu_decode_layer.LeanLlamaLayer,
        "__call__",
        lambda self, *a: (lambda r: taken.append(r is not None) or r)(real(self, *a)),
    )
    params = SamplingParams(temperature=0.0, max_tokens=10, logprobs=5)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    result = [
        (o.outputs[0].token_ids, [sorted(d.items()) for d in o.outputs[0].logprobs]) for o in outs
    ]
    return result, sum(taken)


def _logprob_values(result) -> list[list[float]]:
    return [[lp.logprob for step in steps for _, lp in step] for _, steps in result]


@pytest.mark.parametrize("max_num_seqs", [3, 8], ids=["gemv_rows", "blas_rows"])
@pytest.mark.parametrize(
    "arch", ["llama", "mistral", "qwen2", "qwen3"]
)  # sliding window, qkv bias, q/k norms
def test_lean_layer_equals_the_module_path(arch, max_num_seqs, checkpoints, monkeypatch):
    llm = LLM(
        checkpoints[arch],
        dtype="bfloat16",
        block_size=16,
        max_num_seqs=max_num_seqs,
        enable_prefix_caching=False,
    )
    assert all(m.lean_forward.why_not is None for m in _layers(llm))
    prompts = random_prompts(llm.llm_engine.config.model_config.vocab_size, LENGTHS, seed=3)
    lean, taken = _generate(llm, prompts, True, monkeypatch)
    module, none_taken = _generate(llm, prompts, False, monkeypatch)
    assert taken > 0 and none_taken == 0
    assert [t for t, _ in lean] == [t for t, _ in module]
    assert _logprob_values(lean) == _logprob_values(module)  # bit for bit, not close


@pytest.mark.parametrize("max_num_seqs", [3, 8])
@pytest.mark.parametrize("arch", ["llama", "mistral", "qwen2"])  # sliding window, qkv bias
def test_fused_steps_equal_the_per_op_lean_path(arch, max_num_seqs, checkpoints, monkeypatch):
    """The whole stack in one ``DecoderStack.run``, one ``decoder_layer`` call per layer, and
    the per-op lean path run the same kernels with the same arguments: bit for bit the same
    tokens and logprobs (GEMV rows, prefill rows, padding)."""
    llm = LLM(checkpoints[arch], dtype="bfloat16", block_size=16, max_num_seqs=max_num_seqs,
              enable_prefix_caching=False)
    assert all(m.lean_forward.fused for m in _layers(llm))
    stack = llm.llm_engine.core.runner.model.model.lean_stack
    runs = []
    real_run = cpu_decode_stack.LeanStack.__call__
    monkeypatch.setattr(cpu_decode_stack.LeanStack, "__call__",
                        lambda self, *a: (lambda r: runs.append(r is not None) or r)(real_run(self, *a)))
    calls = []
    for m in _layers(llm):
        monkeypatch.setattr(m.lean_forward, "ext", _CountingExt(cpu_fused_ops._ext, calls))
    prompts = random_prompts(llm.llm_engine.config.model_config.vocab_size, LENGTHS, seed=4)
    stacked, _ = _generate(llm, prompts, True, monkeypatch)
    assert sum(runs) > 0 and stack.plan is not None
    monkeypatch.setattr(cpu_decode_stack, "ENABLED", False)
    fused, _ = _generate(llm, prompts, True, monkeypatch)
    n = len(calls)
    per_op, taken = _generate(llm, prompts, True, monkeypatch, fused=False)
    assert n > 0 and taken > 0 and len(calls) == n  # lean steps, none of them fused
    assert [t for t, _ in stacked] == [t for t, _ in fused] == [t for t, _ in per_op]
    assert _logprob_values(stacked) == _logprob_values(fused) == _logprob_values(per_op)  # bit for bit


class _CountingExt:
    """The extension, with its ``decoder_layer`` calls counted."""

    def __init__(self, ext, calls: list) -> None:
        self._ext, self._calls = ext, calls

    def __getattr__(self, name):
        if name == "decoder_layer":
            return lambda **kw: self._calls.append(1) or self._ext.decoder_layer(**kw)
        return getattr(self._ext, name)


def test_quantized_layers_and_weight_updates(checkpoints, monkeypatch):
    """INT8 layers run their quantization kernel inside the lean step; a bf16 weight modified in
    place after the first step is seen (its packed GEMV copy is remade)."""
    llm = LLM(
        checkpoints["llama"],
        dtype="bfloat16",
        quantization="int8",
        block_size=16,
        max_num_seqs=3,
        enable_prefix_caching=False,
    )
    prompts = random_prompts(llm.llm_engine.config.model_config.vocab_size, LENGTHS[:3], seed=5)
    lean, taken = _generate(llm, prompts, True, monkeypatch)
    assert taken > 0 and lean == _generate(llm, prompts, False, monkeypatch)[0]

    llm = LLM(
        checkpoints["llama"],
        dtype="bfloat16",
        block_size=16,
        max_num_seqs=3,
        enable_prefix_caching=False,
    )
    before, _ = _generate(llm, prompts, True, monkeypatch)
    o_proj = _layers(llm)[0].self_attn.o_proj
    with torch.no_grad():
        o_proj.weight.mul_(-3.0)
    after, _ = _generate(llm, prompts, True, monkeypatch)
    assert _logprob_values(after) != _logprob_values(before)
    assert after == _generate(llm, prompts, False, monkeypatch)[0]


def test_layers_it_cannot_run_keep_the_module_path(checkpoints):
    llm = LLM(checkpoints["llama"], dtype="bfloat16", block_size=16, max_num_seqs=3)
    layer = _layers(llm)[0]
    layer.self_attn.rotary_emb.inv_freq_by_len = torch.ones(1)  # stands for length-dependent RoPE
    lean = cpu_decode_layer.LeanLlamaLayer(layer, cpu_fused_ops)
    assert lean.why_not and "RoPE" in lean.why_not
    assert lean(None, torch.zeros(1, 8, dtype=torch.bfloat16), None, None) is None


def test_decoder_layer_binding_checks_its_tensors():
    """The fused step's binding checks what it reads: a weight not in the GEMV's packed layout
    or of the wrong width, outputs not shaped like ``hidden``."""
    t, dim, nh, nkv, hd, inter = 2, 64, 4, 2, 16, 96
    bf = torch.bfloat16
    packed = lambda n, k: torch.zeros(n // 16, k // 2, 16, 2, dtype=bf)  # noqa: E731
    hidden = torch.randn(t, dim, dtype=bf)
    kw = dict(
        hidden=hidden, residual=None, hidden_out=torch.empty_like(hidden), residual_out=torch.empty_like(hidden),
        norm1=torch.ones(dim, dtype=bf), norm2=torch.ones(dim, dtype=bf), eps1=1e-5, eps2=1e-5,
        qkv_weight=packed((nh + 2 * nkv) * hd, dim), qkv_bias=None, o_weight=packed(dim, nh * hd), o_bias=None,
        gate_up_weight=packed(2 * inter, dim), gate_up_bias=None, down_weight=packed(dim, inter), down_bias=None,
        positions=torch.tensor([0, 1]), cos=torch.ones(8, hd, dtype=bf), sin=torch.zeros(8, hd, dtype=bf),
        num_heads=nh, num_kv_heads=nkv, kv_cache=torch.zeros(4, nkv, 2, 16 * hd, dtype=bf),
        slot_mapping=torch.tensor([0, 1]), query_start_loc=torch.tensor([0, 2], dtype=torch.int32),
        seq_lens=torch.tensor([2], dtype=torch.int32), block_table=torch.zeros(1, 2, dtype=torch.int32), scale=0.25,
    )
    ext = cpu_fused_ops._ext
    _check_stack(ext, kw)
    ext.decoder_layer(**kw)
    assert torch.isfinite(kw["hidden_out"].float()).all()
    with pytest.raises(ValueError, match="decoder_layer: o_weight .* must be the packed layout"):
        ext.decoder_layer(**{**kw, "o_weight": packed(dim, dim + 32)})
    with pytest.raises(ValueError, match="decoder_layer: residual_out .* must be contiguous bfloat16"):
        ext.decoder_layer(**{**kw, "residual_out": torch.empty(t + 1, dim, dtype=bf)})
    with pytest.raises(ValueError, match="decoder_layer: positions .* outside the cos/sin tables"):
        ext.decoder_layer(**{**kw, "positions": torch.tensor([0, 8])})


def _check_stack(ext, kw):
    """Three layers through ``DecoderStack.run`` equal three ``decoder_layer`` calls (the
    residual passed along), K/V writes included; a stack of unlike layers is refused."""
    g = torch.Generator().manual_seed(0)
    step = ("hidden", "residual", "hidden_out", "residual_out", "positions", "slot_mapping", "query_start_loc",
            "seq_lens", "block_table", "num_heads", "num_kv_heads")
    layers = []
    for _ in range(3):
        layer = {"sliding_window": 0, "soft_cap": 0.0, **{k: v for k, v in kw.items() if k not in step}}
        for k in ("qkv_weight", "o_weight", "gate_up_weight", "down_weight", "norm1", "norm2"):
            layer[k] = (torch.randn(layer[k].shape, generator=g) * 0.2).to(torch.bfloat16)
        layer["kv_cache"] = torch.zeros_like(kw["kv_cache"])
        layers.append(layer)
    idx = {k: kw[k] for k in ("positions", "slot_mapping", "query_start_loc", "seq_lens", "block_table")}
    h, r = kw["hidden"], None
    for layer in layers:
        ho, ro = torch.empty_like(h), torch.empty_like(h)
        ext.decoder_layer(hidden=h, residual=r, hidden_out=ho, residual_out=ro, num_heads=kw["num_heads"],
                          num_kv_heads=kw["num_kv_heads"], **idx, **layer)
        h, r = ho, ro
    caches = [la["kv_cache"].clone() for la in layers]
    for la in layers:
        la["kv_cache"].zero_()
    stack = ext.DecoderStack(layers=layers, hidden_size=h.shape[1], num_heads=kw["num_heads"],
                             num_kv_heads=kw["num_kv_heads"])
    out, res = torch.empty_like(h), torch.empty_like(h)
    stack.run(hidden=kw["hidden"], hidden_out=out, residual_out=res, **idx)
    assert len(stack) == 3 and torch.equal(out, h) and torch.equal(res, r)
    assert all(torch.equal(la["kv_cache"], c) for la, c in zip(layers, caches, strict=True))
    unlike = dict(layers[1], down_weight=torch.zeros(h.shape[1] // 16, 64, 16, 2, dtype=torch.bfloat16),
                  gate_up_weight=torch.zeros(2 * 128 // 16, h.shape[1] // 2, 16, 2, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="DecoderStack: layers differ"):
        ext.DecoderStack(layers=[layers[0], unlike], hidden_size=h.shape[1], num_heads=kw["num_heads"],
                         num_kv_heads=kw["num_kv_heads"])
    with pytest.raises(ValueError, match="DecoderStack.run: hidden .* does not have the stack's hidden size"):
        stack.run(hidden=torch.zeros(2, 32, dtype=torch.bfloat16), hidden_out=out, residual_out=res, **idx)
