"""``octavo export onnx`` of every fixture architecture, run by ONNX Runtime under octavo's engine
(``--model-impl onnxruntime``): greedy output token-identical to octavo's own torch path in
float32. Prompts cross the 32-token windows of the sliding-window fixtures, prefill is chunked
(a 40-token budget) and each batch runs twice (the second time from the prefix cache)."""

from __future__ import annotations

import pytest

from octavo import LLM, SamplingParams
from tests.fixtures.checkpoints import ARCH_SPECS
from tests.hf_reference import random_prompts
from tests.onnx.conftest import MAX_MODEL_LEN

LENGTHS = [1, 20, 47, 100]
MAX_TOKENS = 20


def _greedy(model: str, prompts: list[list[int]], runs: int = 1, **kwargs) -> tuple[list, LLM]:
    llm = LLM(model, dtype="float32", block_size=16, max_num_batched_tokens=40, max_num_seqs=3, **kwargs)
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    outs = []
    for _ in range(runs):
        res = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        outs.append([o.outputs[0].token_ids for o in res])
    return outs, llm


@pytest.mark.parametrize("arch", sorted(ARCH_SPECS))
def test_onnxruntime_greedy_matches_octavo(arch, checkpoints, onnx_exports):
    kwargs = {"max_model_len": MAX_MODEL_LEN[arch]} if arch in MAX_MODEL_LEN else {}
    prompts = random_prompts(500, LENGTHS, seed=5)
    (expected,), _ = _greedy(checkpoints[arch], prompts, **kwargs)
    runs, llm = _greedy(onnx_exports[arch], prompts, runs=2, model_impl="onnxruntime", **kwargs)
    assert llm.llm_engine.config.model_config.model_impl == "onnxruntime"
    assert runs[0] == expected, arch
    assert runs[1] == expected, f"{arch}: from the prefix cache"
    assert llm.llm_engine.core.scheduler.kv_cache_manager.prefix_cache_hits > 0
