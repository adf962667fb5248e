"""Formats that quantize activations too (W8A8), teacher-forced against transformers.

compressed-tensors FP8 / INT8 W8A8: the reference is transformers running the quantized
checkpoint through the ``compressed-tensors`` package (it fake-quantizes each linear's input
as the scheme says: per token, or with the static scale). ``fp8`` with 128x128 block scales:
transformers runs those only on GPUs, so the reference is transformers on the dequantized
weights with every linear's input rounded through float8_e4m3fn per token and 128-column
group (a forward pre-hook written here, independent of octavo's kernels).
"""

from __future__ import annotations

import pytest
import torch

from octavo import LLM
from tests.hf_reference import hf_model
from tests.quantization import writers
from tests.quantization.agreement import compare, reference_sequences


def _calibrate(path: str, vocab: int) -> dict[str, float]:
    """Static input scales: amax / 448 of each linear's input over a few prompts."""
    model = hf_model(path)
    amax: dict[str, float] = {}
    hooks = []
    for name, mod in model.named_modules():
        if isinstance(mod, torch.nn.Linear) and name != "lm_head":
            def hook(m, args, name=name):
                amax[name] = max(amax.get(name, 0.0), float(args[0].abs().max()))
            hooks.append(mod.register_forward_pre_hook(hook))
    with torch.no_grad():
        model(torch.arange(3, 3 + 40).remainder(vocab).unsqueeze(0))
    for h in hooks:
        h.remove()
    return {k: v / writers.FP8_MAX for k, v in amax.items()}


CT_FORMATS = {
    "ct-fp8-channel-dynamic": lambda s, d: writers.ct_fp8(s, d, "channel"),
    "ct-fp8-tensor-dynamic": lambda s, d: writers.ct_fp8(s, d, "tensor"),
    "ct-fp8-channel-static": lambda s, d: writers.ct_fp8(s, d, "channel", _calibrate(s, hf_model(s).config.vocab_size)),
    "ct-int8-w8a8-dynamic": lambda s, d: writers.ct_int8_w8a8(s, d),
    "ct-fp8-block128-dynamic": lambda s, d: writers.ct_fp8_block(s, d),
}


@pytest.mark.parametrize("fmt", list(CT_FORMATS))
def test_compressed_tensors_w8a8_matches_transformers(fmt, wide_llama, tmp_path):
    pytest.importorskip("compressed_tensors")
    qdir, deq = CT_FORMATS[fmt](wide_llama, tmp_path / "q")
    ref = hf_model(str(qdir))  # transformers + compressed-tensors, activations quantized
    seqs = reference_sequences(ref, ref.config.vocab_size)
    llm = LLM(str(qdir), dtype="float32", max_num_seqs=8)
    result = compare(llm, ref, seqs)
    print(f"\n{fmt}: {result}")
    assert result.top1 >= 0.97, result
    # int8 activations: codes near a rounding boundary flip on float32 differences in the
    # per-token scale, and a random tiny model amplifies them: measured 1.05e-2.
    assert result.mean_abs_dlogprob < 2e-2, result
    # Activation rounding is real: the weight-only model is a clearly different function.
    weight_only = hf_model(str(writers.write_dequantized(wide_llama, tmp_path / "deq", deq)))
    assert compare(llm, weight_only, seqs).mean_abs_dlogprob > 3 * result.mean_abs_dlogprob + 1e-4


def _fp8_group_hook(module, args):
    x = args[0]
    g = x.reshape(*x.shape[:-1], -1, 128)
    s = (g.abs().amax(-1, keepdim=True) / writers.FP8_MAX).clamp(min=1e-12)
    q = (g / s).clamp(-writers.FP8_MAX, writers.FP8_MAX).to(torch.float8_e4m3fn).float() * s
    return (q.reshape(x.shape),)


def test_fp8_block_scales_match_emulated_transformers(wide_llama, tmp_path):
    qdir, deq = writers.fp8_block(wide_llama, tmp_path / "q")
    ref_dir = writers.write_dequantized(wide_llama, tmp_path / "deq", deq)
    import transformers

    ref = transformers.AutoModelForCausalLM.from_pretrained(str(ref_dir), dtype=torch.float32).eval()
    for name, mod in ref.named_modules():
        if isinstance(mod, torch.nn.Linear) and name != "lm_head":
            mod.register_forward_pre_hook(_fp8_group_hook)
    seqs = reference_sequences(ref, ref.config.vocab_size)
    result = compare(LLM(str(qdir), dtype="float32", max_num_seqs=8), ref, seqs)
    print(f"\nfp8-block128: {result}")
    assert result.top1 >= 0.97, result
    assert result.mean_abs_dlogprob < 1e-2, result


def _fp8_reference(src: str, dst, deq: dict[str, torch.Tensor], static: dict[str, float] | None):
    """transformers on the dequantized weights, each linear's input rounded through e4m3 per
    token (or with its static scale)."""
    import transformers

    ref = transformers.AutoModelForCausalLM.from_pretrained(
        str(writers.write_dequantized(src, dst, deq)), dtype=torch.float32
    ).eval()
    for name, mod in ref.named_modules():
        if isinstance(mod, torch.nn.Linear) and name != "lm_head":
            def hook(m, args, name=name):
                x = args[0]
                s = torch.tensor(static[name]) if static else (x.abs().amax(-1, keepdim=True) / writers.FP8_MAX)
                q = (x / s).clamp(-writers.FP8_MAX, writers.FP8_MAX).to(torch.float8_e4m3fn).float() * s
                return (q,)
            mod.register_forward_pre_hook(hook)
    return ref


@pytest.mark.parametrize("static", [False, True])
def test_fp8_per_tensor_matches_emulated_transformers(static, wide_llama, tmp_path):
    scales = _calibrate(wide_llama, hf_model(wide_llama).config.vocab_size) if static else None
    qdir, deq = writers.fp8_per_tensor(wide_llama, tmp_path / "q", scales)
    ref = _fp8_reference(wide_llama, tmp_path / "deq", deq, scales)
    seqs = reference_sequences(ref, ref.config.vocab_size)
    result = compare(LLM(str(qdir), dtype="float32", max_num_seqs=8), ref, seqs)
    print(f"\nfp8-per-tensor-{'static' if static else 'dynamic'}: {result}")
    assert result.top1 >= 0.97, result
    assert result.mean_abs_dlogprob < 1e-2, result


def _int8_token_hook(module, args):
    """Each linear's input rounded through int8 per token (``amax / 127.5``, round half to even)."""
    x = args[0]
    s = (x.abs().amax(-1, keepdim=True) / 127.5).clamp(min=1e-12)
    return ((x / s).round().clamp(-128, 127) * s,)


def _int8_activations_here() -> bool:
    from octavo import cpu_isa

    return cpu_isa.extension_unavailable_reason() is None and cpu_isa.load_extension().int_a8()


@pytest.mark.skipif(not _int8_activations_here(), reason="needs the C++ kernels and a CPU with AVX512-VNNI")
def test_int8_activation_opt_in_matches_fake_quantized_transformers(wide_llama, tmp_path, monkeypatch):
    """OCTAVO_CPU_INT8_ACTIVATIONS=1 on a W4A16 checkpoint: W4A8 numerics, the reference is
    transformers on the dequantized weights with every linear's input rounded through int8."""
    qdir, deq = writers.ct_weight_only(wide_llama, tmp_path / "q", 4, 32, sym=True)
    ref = hf_model(str(writers.write_dequantized(wide_llama, tmp_path / "deq", deq)))
    hooks = [mod.register_forward_pre_hook(_int8_token_hook) for name, mod in ref.named_modules()
             if isinstance(mod, torch.nn.Linear) and name != "lm_head"]
    seqs = reference_sequences(ref, ref.config.vocab_size)
    monkeypatch.setenv("OCTAVO_CPU_INT8_ACTIVATIONS", "1")
    llm = LLM(str(qdir), dtype="float32", max_num_seqs=8)
    result = compare(llm, ref, seqs)
    print(f"\nW4A16 g32 + int8 activations: {result}")
    assert result.top1 >= 0.97, result
    assert result.mean_abs_dlogprob < 2e-2, result
    for h in hooks:
        h.remove()  # the checkpoint's own (16-bit activation) numerics: clearly further away
    assert compare(llm, ref, seqs).mean_abs_dlogprob > 3 * result.mean_abs_dlogprob + 1e-4
