"""``OCTAVO_CPU_INT8_LM_HEAD`` (``octavo/quantization/lm_head.py``): off by default (the
checkpoint's output projection, untouched); on, logits come from an INT8 per-channel copy
through the C++ kernels, the embedding lookup keeps the checkpoint's weight, and a weight
modified in place is re-quantized."""

from __future__ import annotations

import pytest
import torch

from octavo import cpu_isa

if cpu_isa.extension_unavailable_reason() is not None:
    pytest.skip(f"C++ CPU kernels unavailable: {cpu_isa.extension_unavailable_reason()}", allow_module_level=True)

from octavo import LLM, SamplingParams  # noqa: E402
from octavo.quantization.int8 import quantize_int8_per_channel  # noqa: E402
from octavo.quantization.kernels import cpu_int  # noqa: E402
from tests.hf_reference import random_prompts  # noqa: E402


def _model(llm):
    return llm.llm_engine.core.runner.model


def _expected(weight: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
    w = quantize_int8_per_channel(weight)
    return cpu_int.int_linear(hidden, cpu_int.prepack_int(w.q, w.scales, w.zeros, 8))


@pytest.mark.parametrize("arch", ["llama", "qwen2"])  # own lm_head, tied embedding
def test_int8_lm_head_is_opt_in(arch, checkpoints, monkeypatch):
    llm = LLM(checkpoints[arch], dtype="bfloat16", block_size=16, max_num_seqs=2)
    model = _model(llm)
    assert "int8_lm_head" not in model.__dict__  # default: the checkpoint's weight
    hidden = torch.randn(3, model.config.hidden_size).to(torch.bfloat16)
    plain = model.compute_logits(hidden)

    monkeypatch.setenv("OCTAVO_CPU_INT8_LM_HEAD", "1")
    llm = LLM(checkpoints[arch], dtype="bfloat16", block_size=16, max_num_seqs=2)
    model = _model(llm)
    head = model.output_head()
    assert model.__dict__["int8_lm_head"].module is head
    logits = model.compute_logits(hidden)
    assert torch.equal(logits, _expected(head.weight, hidden))
    assert not torch.equal(logits, plain)
    assert float((logits.float() - plain.float()).abs().max()) < 0.05 * float(plain.float().abs().max())
    prompts = random_prompts(model.config.vocab_size, [5, 9], seed=2)
    out = llm.generate([{"prompt_token_ids": p} for p in prompts], SamplingParams(temperature=0.0, max_tokens=4),
                       use_tqdm=False)
    assert all(len(o.outputs[0].token_ids) == 4 for o in out)

    with torch.no_grad():
        head.weight.mul_(-1.0)  # modified in place: the copy is remade
    assert torch.equal(model.compute_logits(hidden), _expected(head.weight, hidden))


def test_int8_lm_head_leaves_float32_alone(checkpoints, monkeypatch):
    monkeypatch.setenv("OCTAVO_CPU_INT8_LM_HEAD", "1")
    llm = LLM(checkpoints["llama"], dtype="float32", block_size=16, max_num_seqs=2)
    assert "int8_lm_head" not in _model(llm).__dict__
