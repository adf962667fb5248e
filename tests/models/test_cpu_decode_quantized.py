"""The CPU's fused decoder-layer step (``decoder_layer``, ``DecoderStack``) over INT8 / INT4
weight-only linears (``cpu_int.PackedInt``, int8 activations where the packed weight says so)
against the per-op path it replaces: the same kernels with the same arguments in the same
order, so the outputs are equal bit for bit. On every ISA variant this machine runs; end to end
through ``LLM`` for the online INT8 method, a W4A16 checkpoint and the int8-activation opt-in."""

from __future__ import annotations

import pytest
import torch

from octavo import cpu_isa

if cpu_isa.extension_unavailable_reason() is not None:
    pytest.skip(f"C++ CPU kernels unavailable: {cpu_isa.extension_unavailable_reason()}", allow_module_level=True)

from octavo import LLM, SamplingParams  # noqa: E402
from octavo.attention.backends.cpu_paged import write_kv_and_attend  # noqa: E402
from octavo.models import cpu_decode_layer, cpu_decode_stack, cpu_fused_ops  # noqa: E402
from octavo.models.llama import LlamaDecoderLayer  # noqa: E402
from octavo.quantization.kernels import cpu_int  # noqa: E402
from tests.hf_reference import random_prompts  # noqa: E402

VARIANTS = cpu_isa.usable_variants()
A8 = [v for v in VARIANTS if cpu_isa.load_variant(v).int_a8()]
DIM, NH, NKV, HD, INTER = 64, 4, 2, 16, 96
BF = torch.bfloat16
# (qkv, o, gate_up, down): "bf16" the GEMV; "int8" / "int4" (g32) weight-only; "+a8" int8 activations
MIXES = {
    "int8": ("int8", "int8", "int8", "int8"),
    "int4": ("int4", "int4", "int4", "int4"),
    "mixed": ("int4", "bf16", "int8", "bf16"),
    "a8": ("int8+a8", "int4+a8", "int8+a8", "int4+a8"),
}


def _linear(kind: str, n: int, k: int, variant: str, g: torch.Generator, bias: bool) -> tuple:
    """(decoder_layer weight, its bias, per-op fn x -> y) of one linear of ``kind``."""
    b = (torch.randn(n, generator=g) * 0.1).to(BF) if bias else None
    if kind == "bf16":
        w = (torch.randn(n, k, generator=g) * 0.2).to(BF)
        packed = cpu_fused_ops.pack_gemv_weight(w)
        ext = cpu_isa.load_variant(variant)

        def gemv(x):
            out = torch.empty(x.shape[0], n, dtype=BF)
            ext.gemv(x=x, weight=packed, out=out, bias=b)
            return out

        return packed, b, gemv
    bits = 8 if kind.startswith("int8") else 4
    group = k if bits == 8 else 32
    q = torch.randint(0, 1 << bits, (n, k), generator=g, dtype=torch.uint8)
    scales = torch.rand(n, k // group, generator=g) * 0.02 + 0.001
    zeros = torch.randint(0, 1 << bits, (n, k // group), generator=g, dtype=torch.uint8)
    p = cpu_int.prepack_int(q, scales, zeros, bits, variant=variant, act_int8=kind.endswith("+a8"))
    return p, cpu_int.kernel_bias(b), lambda x: cpu_int.int_linear(x, p, b)


def _layer(mix: tuple, variant: str, seed: int) -> tuple[dict, list]:
    """(decoder_layer's layer keywords, the four per-op linear functions)."""
    g = torch.Generator().manual_seed(seed)
    shapes = [((NH + 2 * NKV) * HD, DIM), (DIM, NH * HD), (2 * INTER, DIM), (DIM, INTER)]
    names = ("qkv", "o", "gate_up", "down")
    kw, fns = {}, []
    for name, kind, (n, k) in zip(names, mix, shapes, strict=True):
        w, b, fn = _linear(kind, n, k, variant, g, bias=name == "qkv")
        kw[f"{name}_weight"], kw[f"{name}_bias"] = w, b
        fns.append(fn)
    pos = torch.arange(64, dtype=torch.float32)[:, None] * torch.rand(HD, generator=g)[None]
    kw.update(norm1=(1 + 0.1 * torch.randn(DIM, generator=g)).to(BF), norm2=(1 + 0.1 * torch.randn(DIM, generator=g)).to(BF),
              eps1=1e-5, eps2=1e-6, cos=pos.cos().to(BF), sin=pos.sin().to(BF), scale=HD**-0.5,
              kv_cache=torch.zeros(16, NKV, 2, 16 * HD, dtype=BF), sliding_window=0, soft_cap=0.0)
    return kw, fns


def _step(t: int) -> dict:
    """A step of ``t`` decode tokens, one per sequence, at positions 3 + i (earlier K/V zero)."""
    pos = torch.arange(t, dtype=torch.int64) + 3
    seq = (pos + 1).to(torch.int32)
    table = torch.arange(t, dtype=torch.int32)[:, None]  # one block of 16 per sequence
    return dict(positions=pos, slot_mapping=table[:, 0].to(torch.int64) * 16 + pos,
                query_start_loc=torch.arange(t + 1, dtype=torch.int32), seq_lens=seq, block_table=table)


def _per_op(kw: dict, fns: list, step: dict, hidden, residual, ext) -> tuple:
    """``LeanLlamaLayer``'s per-op path, kernel by kernel."""
    t = hidden.shape[0]
    x, r = torch.empty_like(hidden), torch.empty_like(hidden)
    if residual is None:
        ext.rms_norm(x=hidden, weight=kw["norm1"], out=x, eps=kw["eps1"])
        r = hidden
    else:
        ext.rms_norm(x=hidden, weight=kw["norm1"], out=x, eps=kw["eps1"], residual=residual, residual_out=r)
    q, k, v = fns[0](x).split([NH * HD, NKV * HD, NKV * HD], dim=-1)
    q_rot, k_rot = torch.empty(t, NH, HD, dtype=BF), torch.empty(t, NKV, HD, dtype=BF)
    ext.rope(positions=step["positions"], q=q.view(t, NH, HD), k=k.view(t, NKV, HD), cos=kw["cos"], sin=kw["sin"],
             q_out=q_rot, k_out=k_rot)
    a = write_kv_and_attend(ext, q_rot, k_rot, v.view(t, NKV, HD), kw["kv_cache"], step["slot_mapping"],
                            step["query_start_loc"], step["seq_lens"], step["block_table"], kw["scale"], 0, 0.0)
    a = fns[1](a.view(t, NH * HD))
    x, r2 = torch.empty_like(hidden), torch.empty_like(hidden)
    ext.rms_norm(x=a, weight=kw["norm2"], out=x, eps=kw["eps2"], residual=r, residual_out=r2)
    gate_up = fns[2](x)
    h = torch.empty(t, INTER, dtype=BF)
    ext.silu_and_mul(x=gate_up, out=h)
    return fns[3](h), r2


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("mix", list(MIXES))
@pytest.mark.parametrize("t", [1, 6, 12])  # GEMV, the int kernels' AMX rows, int8 activations' AMX rows
def test_fused_quantized_step_equals_the_kernels(variant, mix, t):
    if mix == "a8" and variant not in A8:
        pytest.skip(f"{variant}: no int8-activation kernels on this CPU")
    ext = cpu_isa.load_variant(variant)
    layers = [_layer(MIXES[mix], variant, seed) for seed in (1, 2)]
    step = _step(t)
    hidden = (torch.randn(t, DIM, generator=torch.Generator().manual_seed(0))).to(BF)
    h, r = hidden, None
    for kw, fns in layers:
        h, r = _per_op(kw, fns, step, h, r, ext)
    caches = [kw["kv_cache"].clone() for kw, _ in layers]
    for kw, _ in layers:
        kw["kv_cache"].zero_()
    heads = dict(num_heads=NH, num_kv_heads=NKV)
    h1, r1 = hidden, None
    for kw, _ in layers:
        ho, ro = torch.empty_like(hidden), torch.empty_like(hidden)
        ext.decoder_layer(hidden=h1, residual=r1, hidden_out=ho, residual_out=ro, **heads, **step, **kw)
        h1, r1 = ho, ro
    assert torch.equal(h1, h) and torch.equal(r1, r)  # bit for bit
    assert all(torch.equal(kw["kv_cache"], c) for (kw, _), c in zip(layers, caches, strict=True))
    for kw, _ in layers:
        kw["kv_cache"].zero_()
    stack = ext.DecoderStack(layers=[kw for kw, _ in layers], hidden_size=DIM, **heads)
    out, res = torch.empty_like(hidden), torch.empty_like(hidden)
    stack.run(hidden=hidden, hidden_out=out, residual_out=res, **step)
    assert torch.equal(out, h) and torch.equal(res, r)


def test_fused_quantized_step_checks_its_weights():
    kw, _ = _layer(MIXES["int8"], VARIANTS[0], 0)
    ext = cpu_isa.load_variant(VARIANTS[0])
    hidden = torch.zeros(1, DIM, dtype=BF)
    args = dict(hidden=hidden, residual=None, hidden_out=torch.empty_like(hidden), residual_out=torch.empty_like(hidden),
                num_heads=NH, num_kv_heads=NKV, **_step(1), **kw)
    with pytest.raises(ValueError, match=r"decoder_layer: o_weight is a quantized \[128, 64\] weight, must be \[64, 64\]"):
        ext.decoder_layer(**{**args, "o_weight": kw["qkv_weight"]})
    with pytest.raises(ValueError, match="decoder_layer: bias .* of a quantized linear must be contiguous float32"):
        ext.decoder_layer(**{**args, "qkv_bias": kw["qkv_bias"].to(BF)})


def _layers(llm) -> list:
    return [m for m in llm.llm_engine.core.runner.model.modules() if type(m) is LlamaDecoderLayer]


def _generate(llm, prompts) -> list:
    params = SamplingParams(temperature=0.0, max_tokens=8, logprobs=5)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    return [(o.outputs[0].token_ids, [[lp.logprob for _, lp in sorted(d.items())] for d in o.outputs[0].logprobs])
            for o in outs]


def _three_ways(llm, monkeypatch) -> tuple[list, list, list, int]:
    """(stacked, one fused call per layer, per-op) outputs, and how many stack runs were taken."""
    prompts = random_prompts(llm.llm_engine.config.model_config.vocab_size, [1, 20, 7, 9], seed=6)
    runs = []
    real = cpu_decode_stack.LeanStack.__call__
    monkeypatch.setattr(cpu_decode_stack.LeanStack, "__call__",
                        lambda self, *a: (lambda r: runs.append(r is not None) or r)(real(self, *a)))
    stacked = _generate(llm, prompts)
    with monkeypatch.context() as m:
        m.setattr(cpu_decode_stack, "ENABLED", False)
        fused = _generate(llm, prompts)
        for layer in _layers(llm):
            m.setattr(layer.lean_forward, "fused", False)
        per_op = _generate(llm, prompts)
    return stacked, fused, per_op, sum(runs)


@pytest.mark.parametrize("a8", [False, True], ids=["int8", "int8_act"])
def test_online_int8_takes_the_stack_bit_for_bit(a8, checkpoints, monkeypatch):
    if a8 and not A8:
        pytest.skip("no int8-activation kernels on this CPU")
    monkeypatch.setenv("OCTAVO_CPU_INT8_ACTIVATIONS", "1" if a8 else "0")
    llm = LLM(checkpoints["qwen2"], dtype="bfloat16", quantization="int8", block_size=16, max_num_seqs=3,
              enable_prefix_caching=False)  # qwen2: qkv bias (the float32 copy)
    packed = _layers(llm)[0].self_attn.qkv_proj.quant_state.packed
    assert isinstance(packed, cpu_int.PackedInt) and packed.a8 == a8
    stacked, fused, per_op, runs = _three_ways(llm, monkeypatch)
    stack = llm.llm_engine.core.runner.model.model.lean_stack
    assert runs > 0 and stack.plan is not None
    assert stacked == fused == per_op  # token ids and logprobs, bit for bit


def test_weight_only_int4_checkpoint_takes_the_stack(checkpoints, tmp_path, monkeypatch):
    from tests.quantization.writers import ct_weight_only

    ct_weight_only(checkpoints["llama"], tmp_path / "w4", bits=4, group=32, sym=True)
    llm = LLM(str(tmp_path / "w4"), dtype="bfloat16", block_size=16, max_num_seqs=3, enable_prefix_caching=False)
    packed = _layers(llm)[0].mlp.down_proj.quant_state.packed
    assert isinstance(packed, cpu_int.PackedInt) and packed.bits == 4
    stacked, fused, per_op, runs = _three_ways(llm, monkeypatch)
    assert runs > 0 and stacked == fused == per_op


def test_a_replaced_quantized_weight_is_seen(checkpoints, monkeypatch):
    """The stack's plan points into each layer's packed weight; replacing it rebuilds the plan."""
    llm = LLM(checkpoints["llama"], dtype="bfloat16", quantization="int8", block_size=16, max_num_seqs=3,
              enable_prefix_caching=False)
    prompts = random_prompts(llm.llm_engine.config.model_config.vocab_size, [5, 9], seed=7)
    before = _generate(llm, prompts)
    st = _layers(llm)[0].mlp.down_proj.quant_state
    p = st.packed
    st.packed = cpu_int.PackedInt(p.weight, p.scales * -3.0, p.zeros * 1.0, p.n, p.k, p.group, p.bits, p.ext,
                                  p.amx, p.a8, p.input_scale)
    after = _generate(llm, prompts)
    assert after != before
    monkeypatch.setattr(cpu_decode_layer, "ENABLED", False)
    assert after == _generate(llm, prompts)  # the module path, with the new weight
