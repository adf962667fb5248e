"""Quantized checkpoints under tensor parallelism (gloo on CPU): each rank keeps its slice of
the canonical weight (rows of q/k/v, gate/up; input columns of o_proj, down_proj, group-aligned)."""

from __future__ import annotations

import pytest

from octavo import LLM, SamplingParams
from tests.hf_reference import random_prompts
from tests.quantization import writers

FORMATS = {
    "ct-w4a16-g32-asym": lambda s, d: writers.ct_weight_only(s, d, 4, 32, sym=False),
    "awq-g64": lambda s, d: writers.awq(s, d, 64),
    "gptq-g32": lambda s, d: writers.gptq(s, d, 32, desc_act=False),
}


def _generate(path: str, tp: int, **kw) -> list[list[int]]:
    llm = LLM(path, dtype="float32", tensor_parallel_size=tp, max_num_seqs=4, **kw)
    vocab = llm.llm_engine.config.model_config.vocab_size
    prompts = [{"prompt_token_ids": p} for p in random_prompts(vocab, [3, 17, 40], seed=5)]
    outs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True), use_tqdm=False)
    llm.shutdown()
    return [o.outputs[0].token_ids for o in outs]


@pytest.mark.parametrize("fmt", list(FORMATS))
@pytest.mark.usefixtures("cpu_platform")
def test_tp2_matches_tp1(fmt, wide_llama, tmp_path):
    qdir, _ = FORMATS[fmt](wide_llama, tmp_path / "q")
    assert _generate(str(qdir), 2) == _generate(str(qdir), 1)


@pytest.mark.usefixtures("cpu_platform")
def test_online_int8_tp2_matches_tp1(wide_llama):
    """Per-channel scales span the whole row; each rank keeps them for its input columns."""
    assert _generate(wide_llama, 2, quantization="int8") == _generate(wide_llama, 1, quantization="int8")


@pytest.mark.usefixtures("cpu_platform")
def test_act_order_cannot_split_input_columns(wide_llama, tmp_path):
    qdir, _ = writers.gptq(wide_llama, tmp_path / "q", 32, desc_act=True)
    with pytest.raises(Exception, match=r"act-order \(desc_act / g_idx\) weights cannot be split"):
        LLM(str(qdir), dtype="float32", tensor_parallel_size=2)
