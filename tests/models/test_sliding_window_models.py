"""Sliding-window models: greedy token-identical to transformers (fp32) past the window, and the
KV cache keeps only the blocks a request can still attend to.

``mistral_sw``: every layer windowed (32 tokens); ``qwen2_sw``: layer 0 full, layer 1 windowed
(``max_window_layers``); ``gemma2``: local/global alternating with attention and final logit
soft-capping; ``gemma3``: five local layers then a global one, per-type RoPE bases, q/k norms. Prompts and outputs cross the window; chunked prefill (small token
budget) and prefix caching (a shared prefix, run twice) are on. Both available CPU backends run.
Mixed models keep one block list per KV cache group (full / sliding window): their window
groups free what no query reads again, measured here per group, and stay exact under
preemption.
"""

from __future__ import annotations

import functools

import pytest

from octavo import LLM, SamplingParams, cpu_isa
from tests.hf_reference import hf_greedy, random_prompts

LENGTHS = [1, 20, 33, 47, 64, 100, 150]
MAX_TOKENS = 24
WINDOW = 32


@functools.cache
def _hf_greedy_cached(path: str, prompt: tuple[int, ...]) -> list[int]:
    return hf_greedy(path, list(prompt), MAX_TOKENS)


def _backends() -> list[str]:
    return ["torch_ref"] + (["cpu_paged"] if cpu_isa.extension_unavailable_reason() is None else [])


@pytest.mark.parametrize("backend", _backends())
@pytest.mark.parametrize("arch", ["mistral_sw", "qwen2_sw", "gemma2", "gemma3"])
def test_greedy_matches_transformers_past_the_window(arch, backend, checkpoints, monkeypatch):
    monkeypatch.setenv("OCTAVO_ATTENTION_BACKEND", backend)
    path = checkpoints[arch]
    llm = LLM(path, dtype="float32", block_size=16, max_num_batched_tokens=40, max_num_seqs=3,
              enable_prefix_caching=True)
    assert llm.llm_engine.config.model_config.max_model_len == 2048  # the full context, not the window
    vocab = llm.llm_engine.config.model_config.vocab_size
    prompts = random_prompts(vocab, LENGTHS, seed=7)
    prompts.append(prompts[-1][:120] + prompts[-2][:30])  # shares 7 full blocks with the last prompt
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS)
    expected = [_hf_greedy_cached(path, tuple(p)) for p in prompts]
    for _ in range(2):  # the second pass is served from the prefix cache
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        for p, o, e in zip(prompts, outs, expected, strict=True):
            assert o.outputs[0].token_ids == e, f"{arch}: prompt of {len(p)}"
    sched = llm.llm_engine.core.scheduler
    assert sched.kv_cache_manager.prefix_cache_hits > 0
    kv = sched.kv_cache_manager
    assert kv.block_pool.get_num_free_blocks() == kv.num_usable_blocks


def _held_blocks_per_step(path: str, prompt_len: int, max_tokens: int, **kw) -> tuple[list, list[int], tuple]:
    """Per step: the blocks the request holds in each KV cache group, and the pool's usage;
    then the groups' windows."""
    llm = LLM(path, dtype="float32", block_size=16, **kw)
    engine = llm.llm_engine
    prompt = random_prompts(engine.config.model_config.vocab_size, [prompt_len], seed=3)[0]
    engine.add_request("r", {"prompt_token_ids": prompt},
                       SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True))
    kv = engine.core.scheduler.kv_cache_manager
    held, pool_used = [], []
    while engine.has_unfinished_requests():
        engine.step()
        if "r" in kv.req_to_blocks:
            held.append([kv.num_held_blocks("r", g) for g in range(kv.num_groups)])
            pool_used.append(kv.num_usable_blocks - kv.block_pool.get_num_free_blocks())
    return held, pool_used, kv.group_windows


def test_window_only_model_keeps_window_blocks(checkpoints):
    """A 4 x window request holds <= window / block_size + 1 blocks once decoding."""
    prompt_len, max_tokens = 2 * WINDOW, 2 * WINDOW  # 4 x window tokens in all
    groups, used, _ = _held_blocks_per_step(checkpoints["mistral_sw"], prompt_len, max_tokens,
                                         max_num_batched_tokens=16)
    assert all(len(g) == 1 for g in groups)  # one group: every layer windowed
    held = [g[0] for g in groups]
    decode = held[prompt_len // 16:]
    assert len(decode) >= max_tokens - 2
    bound = WINDOW // 16 + 1
    print(f"\nblocks held per step (window {WINDOW}, block 16, {prompt_len}+{max_tokens} tokens): {held}")
    assert max(held) <= bound + 1  # a 16-token prefill chunk may straddle one more block
    assert max(decode) <= bound
    assert used == held  # the pool agrees: nothing else is held
    # Without the window (a full-attention model) the same request holds every block.
    full, _, _ = _held_blocks_per_step(checkpoints["mistral"], prompt_len, max_tokens, max_num_batched_tokens=16)
    assert full[-1] == [-(-(prompt_len + max_tokens - 1) // 16)]


def _hf(path: str, **change):
    import torch
    import transformers

    return transformers.AutoModelForCausalLM.from_pretrained(
        path, dtype=torch.float32, attn_implementation="eager", **change).eval()


def test_attention_cap_and_window_change_the_reference(checkpoints):
    """The fixture exercises what the greedy test checks: without Gemma 2's attention soft cap
    or its window, transformers itself answers differently on these prompts."""
    import torch

    path = checkpoints["gemma2"]
    prompt = random_prompts(512, [100], seed=7)[0]
    base = hf_greedy(path, prompt, MAX_TOKENS)
    ids = torch.tensor([prompt])
    for change in ({"attn_logit_softcapping": None}, {"sliding_window": 4096}):
        out = _hf(path, **change).generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=MAX_TOKENS,
                                           do_sample=False)
        assert out[0, len(prompt):].tolist() != base, change


def test_final_logit_soft_cap_in_logprobs(checkpoints):
    """The final cap is monotonic (greedy tokens cannot show it): compare log-probabilities."""
    import torch

    path = checkpoints["gemma2"]
    prompt = random_prompts(512, [40], seed=3)[0]
    llm = LLM(path, dtype="float32")
    out = llm.generate({"prompt_token_ids": prompt}, SamplingParams(temperature=0, max_tokens=1, logprobs=5),
                       use_tqdm=False)[0].outputs[0]
    ours = {t: lp.logprob for t, lp in out.logprobs[0].items()}
    with torch.no_grad():
        capped = torch.log_softmax(_hf(path)(torch.tensor([prompt])).logits[0, -1].float(), -1)
        uncapped = torch.log_softmax(
            _hf(path, final_logit_softcapping=None)(torch.tensor([prompt])).logits[0, -1].float(), -1)
    for t, lp in ours.items():
        assert abs(lp - capped[t].item()) < 1e-4
    assert max(abs(lp - uncapped[t].item()) for t, lp in ours.items()) > 1e-2


@pytest.mark.parametrize("arch", ["gemma2", "gemma3", "qwen2_sw"])
def test_mixed_model_frees_behind_the_window_per_group(arch, checkpoints):
    """Mixed full/sliding-window models: each sliding-window group of a 4 x window request
    holds <= window / block_size + 1 blocks once decoding, while each full-attention group
    keeps every block; the pool holds exactly what the groups hold."""
    prompt_len, max_tokens = 2 * WINDOW, 2 * WINDOW
    held, used, windows = _held_blocks_per_step(checkpoints[arch], prompt_len, max_tokens,
                                                max_num_batched_tokens=16)
    assert None in windows and WINDOW in windows, windows
    print(f"\n{arch}: groups {windows}; blocks held per group per step: {held}")
    bound = WINDOW // 16 + 1
    decode = held[prompt_len // 16:]
    for g, w in enumerate(windows):
        per_step = [h[g] for h in held]
        if w is None:
            assert per_step == sorted(per_step) and per_step[-1] == -(-(4 * WINDOW - 1) // 16)
        else:
            assert max(per_step) <= bound + 1  # a 16-token prefill chunk may straddle one more block
            assert max(h[g] for h in decode) <= bound
    assert used == [sum(h) for h in held]


@pytest.mark.parametrize("arch,num_blocks", [("gemma2", 24), ("gemma3", 48)])
def test_mixed_model_greedy_with_preemption(arch, num_blocks, checkpoints):
    """Per-group block freeing under pressure: a pool too small for the batch preempts (by
    recompute) while prompts and outputs cross the window, with chunked prefill and prefix
    caching; greedy tokens stay identical to transformers and no block leaks."""
    path = checkpoints[arch]
    llm = LLM(path, dtype="float32", block_size=16, max_num_batched_tokens=40, max_num_seqs=3,
              enable_prefix_caching=True, num_gpu_blocks_override=num_blocks)
    kv = llm.llm_engine.core.scheduler.kv_cache_manager
    assert kv.num_groups > 1 and kv.max_num_tokens >= max(LENGTHS) + MAX_TOKENS
    prompts = random_prompts(llm.llm_engine.config.model_config.vocab_size, LENGTHS, seed=7)
    prompts.append(prompts[-1][:120] + prompts[-2][:30])
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS)
    expected = [_hf_greedy_cached(path, tuple(p)) for p in prompts]
    for _ in range(2):
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        for p, o, e in zip(prompts, outs, expected, strict=True):
            assert o.outputs[0].token_ids == e, f"{arch}: prompt of {len(p)}"
    sched = llm.llm_engine.core.scheduler
    assert sched.num_preemptions > 0 and kv.prefix_cache_hits > 0
    assert kv.block_pool.get_num_free_blocks() == kv.num_usable_blocks and not kv.req_to_blocks
