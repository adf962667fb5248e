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
from octavo.models import cpu_decode_layer  # noqa: E402
from octavo.models.llama import LlamaDecoderLayer  # noqa: E402
from tests.hf_reference import random_prompts  # noqa: E402

LENGTHS = [1, 20, 47, 5, 9, 30]


def _layers(llm) -> list:
    return [m for m in llm.llm_engine.core.runner.model.modules() if type(m) is LlamaDecoderLayer]


def _generate(llm, prompts, lean: bool, monkeypatch) -> tuple[list, int]:
    """(token ids and top-5 logprobs per prompt, number of lean layer steps taken)."""
    monkeypatch.setattr(cpu_decode_layer, "ENABLED", lean)
    taken = []
    real = cpu_decode_layer.LeanLlamaLayer._attention
    monkeypatch.setattr(
        cpu_decode_layer.LeanLlamaLayer,
        "_attention",
        lambda self, *a: taken.append(1) or real(self, *a),
    )
    params = SamplingParams(temperature=0.0, max_tokens=10, logprobs=5)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    result = [
        (o.outputs[0].token_ids, [sorted(d.items()) for d in o.outputs[0].logprobs]) for o in outs
    ]
    return result, len(taken)


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
