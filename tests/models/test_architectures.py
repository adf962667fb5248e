"""Phi-3 / Phi-4-mini and the Llama RoPE scalings: greedy token-identical to transformers (fp32).

``phi3`` has fused ``qkv_proj``/``gate_up_proj`` tensors, longrope and a 32-token window on every
layer; ``phi3_partial`` rotates half of each head. Prompts and outputs cross the window, with
chunked prefill (small token budget) and prefix caching (each batch run twice) on.
"""

from __future__ import annotations

import json

import pytest

from octavo import LLM, SamplingParams
from tests.hf_reference import hf_greedy, random_prompts

LENGTHS = [1, 20, 47, 100]
MAX_TOKENS = 20
# longrope is exact up to original_max_position_embeddings (1024 in the fixture).
KWARGS = {"phi3": {"max_model_len": 1024}}


@pytest.mark.parametrize("arch", ["phi3", "phi3_partial", "llama_yarn", "llama_linear"])
def test_greedy_matches_transformers(arch, checkpoints):
    path = checkpoints[arch]
    llm = LLM(path, dtype="float32", block_size=16, max_num_batched_tokens=40, max_num_seqs=3,
              **KWARGS.get(arch, {}))
    prompts = random_prompts(llm.llm_engine.config.model_config.vocab_size, LENGTHS, seed=11)
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS)
    expected = [hf_greedy(path, p, MAX_TOKENS) for p in prompts]
    for _ in range(2):
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        assert [o.outputs[0].token_ids for o in outs] == expected, arch
    assert llm.llm_engine.core.scheduler.kv_cache_manager.prefix_cache_hits > 0


def test_phi3_fused_checkpoint_tensors_are_split(checkpoints):
    from safetensors import safe_open

    with safe_open(f"{checkpoints['phi3']}/model.safetensors", framework="pt") as f:
        names = list(f.keys())
    assert any("qkv_proj" in n for n in names) and any("gate_up_proj" in n for n in names)
    assert not any("q_proj" in n for n in names)


def test_longrope_past_original_context_is_refused(checkpoints):
    with pytest.raises(ValueError, match=r"longrope .* pass --max-model-len 1024"):
        LLM(checkpoints["phi3"], dtype="float32")


def test_dynamic_rope_is_refused(checkpoints, tmp_path):
    import shutil

    d = tmp_path / "dyn"
    shutil.copytree(checkpoints["llama_linear"], d)
    cfg = json.loads((d / "config.json").read_text())
    cfg["rope_parameters"] = {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0}
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="rope_scaling type 'dynamic' is not supported"):
        LLM(str(d), dtype="float32")
