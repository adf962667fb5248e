"""Draft-model speculation: greedy output equals speculation off, token for token (float32,
every fixture architecture), with the target as its own draft (every draft is the target's
own argmax, so every draft is accepted: acceptance rate 1.0) and with a smaller one-layer
draft of the same tokenizer (drafts accepted and rejected). Also: chunked prefill (the
draft's catch-up split into passes), preemption, prefix caching, n > 1 and logprobs."""

from __future__ import annotations

import pytest

from octavo import LLM, SamplingParams
from tests.fixtures.checkpoints import ARCH_SPECS
from tests.spec_decode.test_greedy_equivalence import (
    KWARGS,
    _generate,
    _length_dependent_rope,
    _prompts,
    assert_same_outputs,
)


def draft_spec(path: str, k: int = 3) -> dict:
    return {"method": "draft_model", "model": path, "num_speculative_tokens": k}


def _token_ids(outs) -> list[list[int]]:
    return [list(c.token_ids) for o in outs for c in o.outputs]


@pytest.mark.parametrize("arch", sorted(ARCH_SPECS))
def test_greedy_identical_with_itself_as_draft(checkpoints, llama_dir, arch):
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    kw = KWARGS.get(arch, {})
    base, _ = _generate(checkpoints[arch], None, params, **kw)
    if _length_dependent_rope(checkpoints[arch], kw):
        # Such a model cannot draft (refused) and is not drafted for (see core/scheduler.py):
        # with a fixed-RoPE draft the output is still the target's, with no drafts verified.
        with pytest.raises(ValueError, match="RoPE depends on the sequence length"):
            LLM(checkpoints[arch], speculative_config=draft_spec(checkpoints[arch]), **kw)
        spec, stats = _generate(checkpoints[arch], draft_spec(llama_dir), params, **kw)
        assert _token_ids(spec) == _token_ids(base) and stats.spec_num_draft_tokens == 0
        return
    spec, stats = _generate(checkpoints[arch], draft_spec(checkpoints[arch]), params, **kw)
    assert _token_ids(spec) == _token_ids(base)
    assert stats.spec_num_draft_tokens > 0
    assert stats.spec_num_accepted_tokens == stats.spec_num_draft_tokens  # acceptance rate 1.0


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3", "mistral_sw", "gemma3", "mixtral"])
def test_greedy_identical_with_a_smaller_draft(checkpoints, small_draft_dir, arch):
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    base, _ = _generate(checkpoints[arch], None, params)
    spec, stats = _generate(checkpoints[arch], draft_spec(small_draft_dir, k=4), params)
    assert _token_ids(spec) == _token_ids(base)
    assert stats.spec_num_draft_tokens > 0
    assert stats.spec_num_accepted_tokens < stats.spec_num_draft_tokens  # a real draft: some rejected


def test_greedy_identical_under_chunked_prefill_preemption_and_n(llama_dir):
    """A token budget of 8 (the draft catches a prompt up in passes of <= 8 tokens; drafts cut
    by the budget), a pool small enough to preempt, prefix caching, n > 1 and logprobs."""
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True, n=2, logprobs=2)
    kw = dict(max_num_batched_tokens=8, num_gpu_blocks_override=8, block_size=16, max_num_seqs=6)
    base, _ = _generate(llama_dir, None, params, **kw)
    spec, stats = _generate(llama_dir, draft_spec(llama_dir), params, **kw)
    assert stats.num_preemptions > 0 and stats.spec_num_accepted_tokens > 0
    assert_same_outputs(base, spec, ranks=False)


def test_blocks_hold_both_models_kv(llama_dir, small_draft_dir):
    """One pool block's bytes count the target's and the draft's K/V; the draft's tensors have
    the pool's blocks plus its scratch blocks."""
    llm = LLM(llama_dir, dtype="float32", speculative_config=draft_spec(small_draft_dir))
    runner = llm.llm_engine.core.runner
    drafter = runner.drafter
    target_only = runner.kv_bytes_per_block() - drafter.kv_bytes_per_block()
    bs = runner.block_size
    # llama fixture: 2 layers x K,V x bs tokens x 2 KV heads x 16 dims x 4 bytes; draft: 1 layer, 1 head of 16.
    assert (target_only, drafter.kv_bytes_per_block()) == (2 * 2 * bs * 2 * 16 * 4, 1 * 2 * bs * 1 * 16 * 4)
    num_blocks = runner.num_blocks
    assert drafter.kv_caches[0].shape[0] == num_blocks + drafter.num_rows * drafter.scratch_per_row


def _random_workload(llm, steps: int, seed: int) -> tuple[dict[str, list[int]], dict[str, list[int]], int]:
    """Random arrivals (shared prefixes, priorities, lengths) and aborts over ``steps`` engine
    steps, then drained. Returns (prompt of every request, output of each one that finished on
    its own, speculative steps taken)."""
    import random

    rng = random.Random(seed)
    engine = llm.llm_engine
    vocab = engine.config.model_config.vocab_size
    prefix = [rng.randrange(3, vocab) for _ in range(40)]
    prompts, done, live, n, spec_steps = {}, {}, set(), 0, 0
    for _ in range(steps):
        if rng.random() < 0.3 or not live:
            rid, n = f"r{n}", n + 1
            head = prefix[: rng.choice([0, 17, 33])]
            prompts[rid] = head + [rng.randrange(3, vocab) for _ in range(rng.randrange(1, 30))]
            params = SamplingParams(temperature=0, max_tokens=rng.randrange(1, 40), ignore_eos=True)
            engine.add_request(rid, {"prompt_token_ids": prompts[rid]}, params, priority=rng.randrange(3))
            live.add(rid)
        if live and rng.random() < 0.05:
            rid = rng.choice(sorted(live))
            engine.abort_request(rid)
            live.discard(rid)
        before = engine.get_stats().spec_num_drafts
        for out in engine.step():
            if out.finished and out.request_id in live:
                done[out.request_id] = list(out.outputs[0].token_ids)
                live.discard(out.request_id)
        spec_steps += engine.get_stats().spec_num_drafts > before
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished and out.request_id in live:
                done[out.request_id] = list(out.outputs[0].token_ids)
                live.discard(out.request_id)
    return prompts, done, spec_steps


# Random arrivals and aborts on a pool small enough to preempt, priorities, chunked prompts.
LEAK_HUNT_KW = dict(dtype="float32", block_size=16, max_num_batched_tokens=24, num_gpu_blocks_override=10,
                    max_num_seqs=6, scheduling_policy="priority")


# 10k steps take most of an hour on a loaded 2-core CPU (marked slow); 250 check the same quickly.
@pytest.mark.parametrize("steps", [pytest.param(10_000, marks=pytest.mark.slow), 250])
def test_no_block_leaks_with_aborts_and_preemptions(llama_dir, small_draft_dir, steps):
    """Random arrivals and aborts on a pool small enough to preempt (priority policy, prefix
    caching, a token budget that chunks prompts): every block comes back, and every request
    that finished on its own produced what it produces without speculation."""
    llm = LLM(llama_dir, speculative_config=draft_spec(small_draft_dir, k=4), **LEAK_HUNT_KW)
    prompts, done, spec_steps = _random_workload(llm, steps, seed=steps)
    kv = llm.llm_engine.core.scheduler.kv_cache_manager
    stats = llm.get_stats()
    assert kv.block_pool.get_num_free_blocks() == kv.num_usable_blocks
    assert stats.num_preemptions > 0 and spec_steps > steps // 4
    assert 0 < stats.spec_num_accepted_tokens < stats.spec_num_draft_tokens
    assert_finished_as_without_speculation(llama_dir, prompts, done, 40)


def assert_finished_as_without_speculation(target: str, prompts: dict, done: dict, limit: int) -> None:
    """The first ``limit`` requests that finished on their own produced what ``target``
    produces for them without speculation (greedy, the same lengths)."""
    ref = LLM(target, dtype="float32", block_size=16)
    rids = sorted(done)[:limit]
    outs = ref.generate([{"prompt_token_ids": prompts[r]} for r in rids],
                        [SamplingParams(temperature=0, max_tokens=len(done[r]), ignore_eos=True) for r in rids],
                        use_tqdm=False)
    assert [list(o.outputs[0].token_ids) for o in outs] == [done[r] for r in rids]


def test_staged_input_path_proposes_the_same_drafts(llama_dir, small_draft_dir):
    """The accelerator's input path of the draft (persistent buffers, block tables at the
    widest a row can need, device-side draft ids copied in), run on the CPU: the same drafts,
    so the same acceptance counts and output as the zero-copy host path."""
    from octavo.worker.cuda_graph import StepBuffers

    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    results = []
    for staged in (False, True):
        llm = LLM(llama_dir, dtype="float32", speculative_config=draft_spec(small_draft_dir, k=4),
                  max_num_batched_tokens=16)
        d, sc = llm.llm_engine.core.runner.drafter, llm.llm_engine.config.scheduler_config
        if staged:
            d.step_buffers = StepBuffers(max(sc.max_num_batched_tokens, sc.max_num_seqs), sc.max_num_seqs,
                                         d.max_blocks_per_req + d.scratch_per_row, d.block_size, d.device, d.platform)
        outs = llm.generate(_prompts(llm.llm_engine.config.model_config.vocab_size), params, use_tqdm=False)
        st = llm.get_stats()
        results.append((_token_ids(outs), st.spec_num_draft_tokens, st.spec_num_accepted_tokens_per_pos))
    assert results[0] == results[1] and results[0][1] > 0


@pytest.mark.usefixtures("cpu_platform")  # gloo on CPU: both workers run the sharded draft
def test_tensor_parallel_workers_run_the_draft(llama_dir):
    params = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
    base, _ = _generate(llama_dir, None, params)
    llm = LLM(llama_dir, dtype="float32", speculative_config=draft_spec(llama_dir), tensor_parallel_size=2)
    outs = llm.generate(_prompts(llm.llm_engine.config.model_config.vocab_size), params, use_tqdm=False)
    stats = llm.llm_engine.get_stats()
    llm.shutdown()
    assert _token_ids(outs) == _token_ids(base)
    assert 0 < stats.spec_num_accepted_tokens == stats.spec_num_draft_tokens
