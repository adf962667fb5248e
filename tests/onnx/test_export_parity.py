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


# RoPE that depends on the sequence length: the export is refused (longrope past the length where
# it switches; dynamic NTK always).
LENGTH_DEPENDENT_ROPE = {"llama_dynamic", "llama_longrope", "phi3_longrope"}


@pytest.mark.parametrize("arch", sorted(set(ARCH_SPECS) - LENGTH_DEPENDENT_ROPE))
def test_onnxruntime_greedy_matches_octavo(arch, checkpoints, onnx_exports):
    kwargs = {"max_model_len": MAX_MODEL_LEN[arch]} if arch in MAX_MODEL_LEN else {}
    limit = MAX_MODEL_LEN.get(arch, 10**9)
    prompts = random_prompts(500, [n for n in LENGTHS if n + MAX_TOKENS <= limit], seed=5)
    (expected,), _ = _greedy(checkpoints[arch], prompts, **kwargs)
    runs, llm = _greedy(onnx_exports[arch], prompts, runs=2, model_impl="onnxruntime", **kwargs)
    assert llm.llm_engine.config.model_config.model_impl == "onnxruntime"
    assert runs[0] == expected, arch
    assert runs[1] == expected, f"{arch}: from the prefix cache"
    assert llm.llm_engine.core.scheduler.kv_cache_manager.prefix_cache_hits > 0


@pytest.mark.parametrize("arch", sorted(LENGTH_DEPENDENT_ROPE))
def test_length_dependent_rope_export_is_refused(arch, checkpoints, tmp_path):
    from octavo.engine.model_files import load_hf_config
    from octavo.onnx.export import export_onnx

    hf_config, architecture = load_hf_config(checkpoints[arch])
    with pytest.raises(ValueError, match=r"RoPE depends on the sequence length beyond \d+ tokens"):
        export_onnx(checkpoints[arch], hf_config, architecture, str(tmp_path / "out"), max_model_len=4096)
    assert not (tmp_path / "out").exists()


def test_max_model_len_past_the_export_is_refused(onnx_exports):
    with pytest.raises(ValueError, match="exceeds the 1024 positions this ONNX export covers"):
        LLM(onnx_exports["phi3"], dtype="float32", model_impl="onnxruntime", max_model_len=2048)
