"""``--quantization int8`` / ``fp8`` on an unquantized checkpoint, and the refusals around them."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from octavo import LLM
from tests.hf_reference import hf_model
from tests.quantization import writers
from tests.quantization.agreement import compare, reference_sequences


def _int8_dequantized(path: str) -> dict[str, torch.Tensor]:
    """What per-channel symmetric int8 makes of each linear weight (amax / 127, round)."""
    out = {}
    for name, t in load_file(f"{path}/model.safetensors").items():
        if writers.is_linear(name):
            scale = t.abs().amax(dim=1, keepdim=True) / 127.0
            out[name] = torch.round(t / scale).clamp(-127, 127) * scale
    return out


def test_online_int8_matches_dequantized_reference(wide_llama, tmp_path, cpu_platform):
    ref = hf_model(str(writers.write_dequantized(wide_llama, tmp_path / "deq", _int8_dequantized(wide_llama))))
    seqs = reference_sequences(ref, ref.config.vocab_size)
    llm = LLM(wide_llama, dtype="float32", quantization="int8", max_num_seqs=8)
    result = compare(llm, ref, seqs)
    print(f"\nonline int8: {result}")
    assert result.top1 >= 0.99 and result.mean_abs_dlogprob < 1e-3, result


def test_online_int8_runs_in_bfloat16(wide_llama, cpu_platform):
    from octavo import SamplingParams

    llm = LLM(wide_llama, dtype="bfloat16", quantization="int8", max_num_seqs=4)
    out = llm.generate([{"prompt_token_ids": [5, 6, 7, 8]}], SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True),
                       use_tqdm=False)
    assert len(out[0].outputs[0].token_ids) == 8


def test_online_fp8_is_refused_on_cpu(llama_dir, cpu_platform):
    with pytest.raises(ValueError, match=r"'fp8' on an unquantized checkpoint .* cpu platform .* int8.*emulated"):
        LLM(llama_dir, quantization="fp8")


def test_checkpoint_only_methods_need_a_quantized_checkpoint(llama_dir, cpu_platform):
    with pytest.raises(ValueError, match=r"'awq' on an unquantized checkpoint"):
        LLM(llama_dir, quantization="awq")


def test_online_fp8_reference_kernel_matches_emulation():
    """What ``--quantization fp8`` computes (CUDA) equals per-channel e4m3 weights times
    per-token e4m3 activations, accumulated in float32."""
    from octavo.quantization.fp8 import quantize_fp8_per_channel
    from octavo.quantization.kernels import torch_ref

    gen = torch.Generator().manual_seed(0)
    w, x = torch.randn(48, 64, generator=gen), torch.randn(5, 64, generator=gen) * 3
    fw = quantize_fp8_per_channel(w)
    ws = w.abs().amax(1, keepdim=True) / 448
    wq = (w / ws).to(torch.float8_e4m3fn).float() * ws
    xs = x.abs().amax(1, keepdim=True) / 448
    xq = (x / xs).to(torch.float8_e4m3fn).float() * xs
    torch.testing.assert_close(torch_ref.fp8_linear(x, fw), xq @ wq.T, rtol=1e-5, atol=1e-5)
    assert (torch_ref.fp8_linear(x, fw) - x @ w.T).abs().max() > 1e-3  # activations really rounded


def test_fp8_kv_cache_is_refused_on_cpu(llama_dir, cpu_platform):
    with pytest.raises(ValueError, match=r"--kv-cache-dtype \(kv_cache_dtype\) 'fp8' is not supported on cpu"):
        LLM(llama_dir, kv_cache_dtype="fp8")
