"""Speculative decoding with async scheduling (draft model and EAGLE): step N+1 is scheduled
while step N runs, counting step N's drafts as accepted; the runner waits for step N's
accepted tokens before it stages step N+1 and proposes the drafts asked for meanwhile. Output
equals the same engine without async scheduling and without speculation, token for token,
whatever is accepted, under chunked prefill, preemption, stops and length limits; no KV block
is left behind. Run on the CPU with async scheduling switched on (the device-drafts path)."""

from __future__ import annotations

import pytest

from octavo import LLM, SamplingParams
from tests.spec_decode.test_draft_model import draft_spec
from tests.spec_decode.test_eagle import eagle_spec
from tests.spec_decode.test_greedy_equivalence import _prompts


def _run(path: str, spec: dict | None, params, async_scheduling: bool, in_step: bool = False, **kw):
    """(token ids of every completion, stats, per step launched while another ran: how many of
    its requests verify drafts behind a verification of theirs in flight, the engine core)."""
    llm = LLM(path, dtype="float32", speculative_config=spec, async_scheduling=async_scheduling,
              max_num_batched_tokens=kw.pop("max_num_batched_tokens", 16), **kw)
    core = llm.llm_engine.core
    assert core.async_scheduling == async_scheduling
    runner, deferred = core.runner, []
    if in_step:  # the accelerator's in-step draft passes (and device drafts), on the CPU
        runner.drafter.step_buffers = runner.drafter.make_step_buffers()
        if runner.device_drafts is None:
            from octavo.spec_decode.device_drafts import DeviceDrafts

            runner.device_drafts = DeviceDrafts(core.config.scheduler_config.max_num_seqs, spec["num_speculative_tokens"],
                                                runner.device, runner.transfer)
    if spec is not None:  # count the verifications launched behind one of the same request in flight
        launch, last = runner.execute_model_async, [set()]

        def overlapped_launch(so):
            ids = {r for r, d in so.scheduled_spec_decode_tokens.items() if d}
            if runner._unresulted:
                deferred.append(len(ids & last[0]))
            last[0] = ids
            return launch(so)

        runner.execute_model_async = overlapped_launch
    vocab = llm.llm_engine.config.model_config.vocab_size
    outs = llm.generate(_prompts(vocab), params, use_tqdm=False)
    tokens = [list(c.token_ids) for o in outs for c in o.outputs]
    if in_step:
        assert runner.drafter.in_step.launches > 0
    return tokens, llm.get_stats(), deferred, core


def _assert_drained(core) -> None:
    kv = core.scheduler.kv_cache_manager
    assert not core.scheduler.has_unfinished_requests() and core._inflight is None
    assert kv.usage == 0.0


GREEDY = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)


@pytest.mark.parametrize("method", ["self_draft", "small_draft", "eagle", "in_step"])
def test_greedy_identical_with_async_scheduling(llama_dir, small_draft_dir, eagle_heads, method):
    spec = {"self_draft": draft_spec(llama_dir, k=3), "small_draft": draft_spec(small_draft_dir, k=4),
            "eagle": eagle_spec(eagle_heads["llama", "random"], k=3),
            "in_step": draft_spec(small_draft_dir, k=3)}[method]
    base, _, _, _ = _run(llama_dir, None, GREEDY, async_scheduling=False)
    sync, sync_stats, _, _ = _run(llama_dir, spec, GREEDY, async_scheduling=False, in_step=method == "in_step")
    got, stats, deferred, core = _run(llama_dir, spec, GREEDY, async_scheduling=True, in_step=method == "in_step")
    assert got == base == sync
    assert sum(deferred) > 0  # steps verified drafts behind verifications in flight
    assert stats.spec_num_draft_tokens > 0
    if method == "self_draft":  # the target drafting for itself: every draft is accepted
        assert stats.spec_num_accepted_tokens == stats.spec_num_draft_tokens
    else:
        assert stats.spec_num_accepted_tokens < stats.spec_num_draft_tokens  # rejections rolled back
    _assert_drained(core)


@pytest.mark.parametrize("params", [
    SamplingParams(temperature=0.8, seed=7, max_tokens=32, ignore_eos=True, n=2),
    SamplingParams(temperature=1.0, seed=3, max_tokens=24, ignore_eos=True, min_tokens=20, logprobs=2),
], ids=["seeded_n2", "min_tokens_logprobs"])
def test_sampling_identical_with_async_scheduling(llama_dir, small_draft_dir, params):
    """Seeds, ``min_tokens`` and logprobs read the output count: the runner stages from exact counts."""
    spec = draft_spec(small_draft_dir, k=3)
    sync, _, _, _ = _run(llama_dir, spec, params, async_scheduling=False)
    got, _, deferred, core = _run(llama_dir, spec, params, async_scheduling=True)
    assert got == sync and sum(deferred) > 0
    _assert_drained(core)


def test_stops_length_limits_and_preemption(llama_dir, small_draft_dir):
    """Stop tokens inside an accepted run, ``max_tokens`` reached mid-verification and a KV
    pool too small for every request at once (preemption while a step is in flight)."""
    base, _, _, _ = _run(llama_dir, None, GREEDY, async_scheduling=False)
    stops = sorted({t[9] for t in base})  # a token each completion emits early
    kw = {"num_gpu_blocks_override": 10, "block_size": 16, "max_model_len": 128}
    preemptions = []
    for params in (SamplingParams(temperature=0, max_tokens=40, stop_token_ids=stops),
                   SamplingParams(temperature=0, max_tokens=7, ignore_eos=True),
                   GREEDY):
        spec = draft_spec(llama_dir, k=4)
        want, _, _, _ = _run(llama_dir, None, params, async_scheduling=False, **kw)
        got, stats, deferred, core = _run(llama_dir, spec, params, async_scheduling=True, **kw)
        assert got == want
        assert sum(deferred) > 0 or params.max_tokens < 10  # near max_tokens: waits for the count
        _assert_drained(core)
        preemptions.append(core.scheduler.num_preemptions)
    assert preemptions[-1] > 0


def test_ngram_keeps_synchronous_scheduling(llama_dir):
    spec = {"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 2}
    with pytest.raises(ValueError, match="async.scheduling.*'ngram'"):
        LLM(llama_dir, speculative_config=spec, async_scheduling=True)
