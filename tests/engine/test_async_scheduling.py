"""Async scheduling (step N+1 scheduled and launched before step N's tokens reach the host)
gives exactly the outputs of synchronous scheduling, for every feature that touches the
token in flight: stops that are only known late, length limits, seeds, min_tokens,
logprobs, n > 1, chunked prefill, preemption, abort, and the penalties that make the engine
fall back to waiting. On the CPU the launch computes synchronously, but the scheduler's
placeholders and the runner's device-side token hand-over run exactly as on a GPU.
"""

import pytest

from octavo import LLM, SamplingParams
from tests.hf_reference import random_prompts

COMMON = dict(dtype="float32", block_size=16, max_model_len=128)


@pytest.fixture(scope="module")
def engines(llama_dir):
    return {
        mode: LLM(llama_dir, max_num_batched_tokens=64, max_num_seqs=8, async_scheduling=mode, **COMMON)
        for mode in (False, True)
    }


@pytest.fixture(scope="module")
def tiny(llama_dir):
    """7 usable blocks and a 32-token budget: chunked prefill and preemption, both modes."""
    return {
        mode: LLM(llama_dir, num_gpu_blocks_override=8, max_num_batched_tokens=32, max_num_seqs=4,
                  async_scheduling=mode, **COMMON)
        for mode in (False, True)
    }


@pytest.fixture(scope="module")
def vocab(engines):
    return engines[False].llm_engine.config.model_config.vocab_size


def summary(outs):
    return [
        [(c.token_ids, c.finish_reason, c.stop_reason,
          None if c.logprobs is None else [{k: round(v.logprob, 4) for k, v in d.items()} for d in c.logprobs])
         for c in o.outputs]
        + [None if o.prompt_logprobs is None else len(o.prompt_logprobs)]
        for o in outs
    ]


def assert_idle(llm):
    kv = llm.llm_engine.core.scheduler.kv_cache_manager
    assert not llm.llm_engine.has_unfinished_requests()
    assert kv.block_pool.get_num_free_blocks() == kv.num_usable_blocks
    assert all(r.num_output_placeholders == 0 for r in llm.llm_engine.core.scheduler.running)


def run_both(pair, prompts, params):
    outs = {mode: llm.generate(prompts, params, use_tqdm=False) for mode, llm in pair.items()}
    for llm in pair.values():
        assert_idle(llm)
    assert summary(outs[True]) == summary(outs[False])
    return outs[False]


def test_async_scheduling_is_on_only_where_asked(engines):
    assert engines[True].llm_engine.core.async_scheduling
    assert not engines[False].llm_engine.core.async_scheduling


def test_greedy_seeded_lengths_and_late_stops(engines, vocab):
    prompts = [{"prompt_token_ids": p} for p in random_prompts(vocab, [5, 40, 17, 70, 3, 33], seed=3)]
    greedy = [SamplingParams(temperature=0.0, max_tokens=m, ignore_eos=True) for m in (1, 2, 9, 30, 17, 5)]
    base = run_both(engines, prompts, greedy)
    # Stop tokens that only appear mid-generation: the step after the stop is already in
    # flight under async scheduling, and its token must be dropped.
    stops = [o.outputs[0].token_ids[min(3, len(o.outputs[0].token_ids) - 1)] for o in base]
    stopped = [SamplingParams(temperature=0.0, max_tokens=30, stop_token_ids=[t]) for t in stops]
    outs = run_both(engines, prompts, stopped)
    assert any(o.outputs[0].finish_reason == "stop" and len(o.outputs[0].token_ids) < 30 for o in outs)
    seeded = [SamplingParams(temperature=0.9, top_p=0.9, seed=7 + i, max_tokens=20, ignore_eos=True,
                             min_tokens=5, logprobs=3) for i in range(6)]
    run_both(engines, prompts, seeded)


def test_context_limit_and_parallel_sampling(engines, vocab):
    # 120-token prompts stop at max_model_len (128): no step may run past it.
    prompts = [{"prompt_token_ids": p} for p in random_prompts(vocab, [120, 126, 60], seed=5)]
    outs = run_both(engines, prompts, SamplingParams(temperature=0.0, max_tokens=None, ignore_eos=True))
    assert [len(o.outputs[0].token_ids) for o in outs][:2] == [8, 2]
    params = SamplingParams(n=3, temperature=1.0, seed=11, max_tokens=12, ignore_eos=True, prompt_logprobs=2)
    run_both(engines, prompts[2:], params)


def test_penalties_fall_back_to_waiting(engines, vocab):
    prompts = [{"prompt_token_ids": p} for p in random_prompts(vocab, [9, 21, 14], seed=8)]
    params = [SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True, repetition_penalty=1.3),
              SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True),
              SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True, frequency_penalty=0.5)]
    run_both(engines, prompts, params)


def test_chunked_prefill_and_preemption(tiny, vocab):
    prompts = [{"prompt_token_ids": p} for p in random_prompts(vocab, [20, 17, 27, 12], seed=21)]
    before = {m: llm.get_stats().num_preemptions for m, llm in tiny.items()}
    run_both(tiny, prompts, SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True))
    seeded = [SamplingParams(temperature=1.0, top_k=40, seed=100 + i, max_tokens=24, ignore_eos=True) for i in range(4)]
    run_both(tiny, prompts, seeded)
    for m, llm in tiny.items():
        assert llm.get_stats().num_preemptions > before[m]


def test_abort_with_a_step_in_flight(engines, vocab):
    llm = engines[True]
    engine = llm.llm_engine
    params = SamplingParams(temperature=0.0, max_tokens=50, ignore_eos=True)
    for i, p in enumerate(random_prompts(vocab, [10, 30, 7], seed=13)):
        engine.add_request(f"abort-{i}", {"prompt_token_ids": p}, params)
    for _ in range(6):
        engine.step()
    assert engine.core._inflight is not None
    engine.abort_request(["abort-0", "abort-2"])
    finished = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                finished[out.request_id] = len(out.outputs[0].token_ids)
    assert finished == {"abort-1": 50}
    assert engine.core._inflight is None
    assert_idle(llm)
    # The engine serves on normally afterwards (same tokens as the synchronous engine).
    prompts = [{"prompt_token_ids": p} for p in random_prompts(vocab, [10, 30], seed=14)]
    run_both(engines, prompts, SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True))
