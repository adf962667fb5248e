"""Phi-3 / Phi-4-mini and the Llama RoPE scalings: greedy token-identical to transformers (fp32).

``phi3`` has fused ``qkv_proj``/``gate_up_proj`` tensors, longrope and a 32-token window on every
layer; ``phi3_partial`` rotates half of each head. Prompts and outputs cross the window, with
chunked prefill (small token budget) and prefix caching (each batch run twice) on.
"""

from __future__ import annotations

import functools
import json

import pytest

from octavo import LLM, SamplingParams
from tests.hf_reference import hf_greedy, random_prompts

LENGTHS = [1, 20, 47, 100]
MAX_TOKENS = 20


@pytest.mark.parametrize("arch", ["phi3", "phi3_partial", "llama_yarn", "llama_linear"])
def test_greedy_matches_transformers(arch, checkpoints):
    path = checkpoints[arch]
    llm = LLM(path, dtype="float32", block_size=16, max_num_batched_tokens=40, max_num_seqs=3)
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


# Lengths around the 64-token threshold of both fixtures: prompts that stay below it, cross it
# while decoding, sit on it, and start past it; the last two share a prefix with the longest.
THRESHOLD_LENGTHS = [1, 20, 50, 63, 64, 65, 100, 150]
LONG_TOKENS = 30


def _needs_a_transformers_reference(arch: str) -> None:
    """transformers before 5.20 is no reference for Phi-3 past the switch: its ``generate`` drops
    the cache there but still feeds only the newest token (fixed in 5.20 by resetting
    ``next_sequence_length``), so its tokens after the switch are wrong."""
    import transformers
    from packaging.version import Version

    if arch == "phi3_longrope" and Version(transformers.__version__) < Version("5.20"):
        pytest.skip(f"transformers {transformers.__version__} < 5.20 mis-generates Phi-3 at the longrope switch")


@functools.cache
def _fresh_hf_greedy_cached(path: str, prompt: tuple[int, ...], max_new_tokens: int) -> list[int]:
    return _fresh_hf_greedy(path, list(prompt), max_new_tokens)


def _fresh_hf_greedy(path: str, prompt: list[int], max_new_tokens: int, **change) -> list[int]:
    """transformers ``generate`` on a freshly loaded model: dynamic NTK keeps state between
    calls (a sequence after a longer one reuses the longer one's frequencies)."""
    import torch
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(
        path, dtype=torch.float32, attn_implementation="eager", **change).eval()
    ids = torch.tensor([prompt])
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                             do_sample=False, pad_token_id=model.config.pad_token_id)
    return out[0, len(prompt):].tolist()


@pytest.mark.parametrize("num_blocks", [None, 20], ids=["roomy", "preempting"])
@pytest.mark.parametrize("arch", ["phi3_longrope", "llama_longrope", "llama_dynamic"])
def test_length_dependent_rope_matches_transformers(arch, num_blocks, checkpoints):
    """longrope switches to the long factors, dynamic NTK rescales, once a sequence passes 64
    tokens, as transformers ``generate`` does (Phi-3 recomputing the sequence at the switch);
    with chunked prefill, prefix caching, and preemption by recompute in a small cache."""
    _needs_a_transformers_reference(arch)
    path = checkpoints[arch]
    llm = LLM(path, dtype="float32", block_size=16, max_num_batched_tokens=40, max_num_seqs=3,
              enable_prefix_caching=True, num_gpu_blocks_override=num_blocks)
    assert llm.llm_engine.config.model_config.max_model_len == (256 if arch == "llama_dynamic" else 512)
    prompts = random_prompts(llm.llm_engine.config.model_config.vocab_size, THRESHOLD_LENGTHS, seed=5)
    prompts += [prompts[-1][:120], prompts[-1][:40]]  # prefixes of the longest, above and below 64
    params = SamplingParams(temperature=0.0, max_tokens=LONG_TOKENS)
    expected = [_fresh_hf_greedy_cached(path, tuple(p), LONG_TOKENS) for p in prompts]
    for _ in range(2):  # the second pass is served from the prefix cache
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        for p, o, e in zip(prompts, outs, expected, strict=True):
            assert o.outputs[0].token_ids == e, f"{arch}: prompt of {len(p)}"
    sched = llm.llm_engine.core.scheduler
    assert sched.kv_cache_manager.prefix_cache_hits > 0
    assert (sched.num_preemptions > 0) == (num_blocks is not None)


@pytest.mark.parametrize("arch", ["phi3_longrope", "llama_dynamic"])
def test_length_dependence_changes_the_reference(arch, checkpoints):
    """The fixtures exercise the switch: without it transformers itself answers differently."""
    path = checkpoints[arch]
    cfg = json.loads(open(f"{path}/config.json").read())
    rope = dict(cfg["rope_parameters"])
    if arch == "phi3_longrope":
        rope["long_factor"] = rope["short_factor"]
    else:
        rope = {"rope_type": "default", "rope_theta": rope["rope_theta"]}
    prompt = random_prompts(512, [100], seed=5)[0]
    assert _fresh_hf_greedy(path, prompt, LONG_TOKENS) != _fresh_hf_greedy(
        path, prompt, LONG_TOKENS, rope_parameters=rope)


@pytest.mark.cuda
@pytest.mark.parametrize("enforce_eager", [False, True])
@pytest.mark.parametrize("arch", ["phi3_longrope", "llama_longrope", "llama_dynamic"])
def test_length_dependent_rope_on_gpu_matches_transformers(arch, enforce_eager, checkpoints, monkeypatch):
    """fp32 on the GPU (Triton RoPE reading rope keys, captured decode graphs, async
    scheduling with the Phi-3 restart waiting for tokens in flight): transformers' tokens."""
    _needs_a_transformers_reference(arch)
    import torch

    from octavo.platforms import reset_current_platform

    if not torch.cuda.is_available():
        pytest.skip("needs a GPU")
    path = checkpoints[arch]
    monkeypatch.setenv("OCTAVO_PLATFORM", "cuda")
    reset_current_platform()
    try:
        llm = LLM(path, dtype="float32", block_size=16, max_num_batched_tokens=40, max_num_seqs=3,
                  enable_prefix_caching=True, enforce_eager=enforce_eager)
        prompts = random_prompts(llm.llm_engine.config.model_config.vocab_size, THRESHOLD_LENGTHS, seed=5)
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts],
                            SamplingParams(temperature=0.0, max_tokens=LONG_TOKENS), use_tqdm=False)
        assert (llm.llm_engine.core.runner.graph_runner is None) == enforce_eager
    finally:
        monkeypatch.delenv("OCTAVO_PLATFORM")
        reset_current_platform()
    expected = [_fresh_hf_greedy_cached(path, tuple(p), LONG_TOKENS) for p in prompts]
    assert [o.outputs[0].token_ids for o in outs] == expected
