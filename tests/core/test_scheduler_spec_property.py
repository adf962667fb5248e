"""Property-based test, speculative mode: random drafts, random acceptance, aborts, preemption.

Like ``test_scheduler_property`` (tiny pools, so preemption is frequent), but before every step
each decoding request gets 0-4 random drafts and the fake runner accepts a random prefix of the
drafts it was scheduled, emitting exactly those draft tokens plus one. After every step the KV
invariants hold and each running request has computed no more than its known tokens (the
rejected drafts are rolled back); at the end everything drains and every block is free.
Across the examples this runs well over 10k speculative steps. In async mode each step's
result is handed to the scheduler only after the next step was scheduled (drafts counted as
accepted meanwhile, then rolled back), as the engine does with async scheduling.
"""

import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from octavo.core.kv_cache_manager import KVCacheManager
from octavo.core.request import Request, RequestStatus
from octavo.core.scheduler import Scheduler
from octavo.core.scheduler_output import ModelRunnerOutput
from octavo.sampling_params import SamplingParams
from tests.core.utils import EOS, assert_all_free, check_scheduler_invariants

PREFIXES = [[11, 12, 13, 14, 15, 16, 17, 18], [21, 22, 23, 24, 25, 26, 27, 28]]
STEPS = {"spec": 0, "verified": 0}


def _fake_runner(s: Scheduler, so, rng: random.Random) -> ModelRunnerOutput:
    req_ids, sampled = [], []
    for rid, n in so.num_scheduled_tokens.items():
        req = s.requests[rid]
        drafts = so.scheduled_spec_decode_tokens.get(rid, [])
        assert n >= len(drafts) + (1 if drafts else 0)
        req_ids.append(rid)
        # Right after schedule: the request computes up to its known tokens and those in flight
        # (placeholders, this step's included: one plus one per draft), so it samples.
        done = req.num_computed_tokens == req.num_tokens + req.num_output_placeholders - 1
        if not done:
            sampled.append([])
            continue
        accepted = rng.randint(0, len(drafts))
        last = EOS if rng.random() < 0.08 else 40 + rng.randint(0, 9)
        sampled.append(drafts[:accepted] + [last])
        STEPS["verified"] += bool(drafts)
    return ModelRunnerOutput(req_ids, sampled)


def _propose(s: Scheduler, rng: random.Random) -> None:
    for req in s.running:
        if req.num_computed_tokens == req.num_tokens + req.num_output_placeholders - 1 and not req.spec_token_ids:
            req.spec_token_ids = [rng.randint(1, 60) for _ in range(rng.randint(0, 4))]


@settings(max_examples=720, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(
    num_blocks=st.integers(4, 14),
    block_size=st.sampled_from([2, 4]),
    budget=st.integers(2, 24),
    max_seqs=st.integers(1, 5),
    policy=st.sampled_from(["fcfs", "priority"]),
    caching=st.booleans(),
    seed=st.integers(0, 2**31),
    arrivals=st.lists(st.tuples(st.integers(0, 2), st.integers(1, 10), st.integers(1, 16),
                                st.sampled_from([1, 1, 2]), st.integers(0, 3)), min_size=1, max_size=40),
    groups=st.sampled_from([(None,), (None,), (4,), (None, 3), (5, None, 5)]),
    async_=st.booleans(),
)
def test_speculative_steps_keep_invariants(num_blocks, block_size, budget, max_seqs, policy, caching, seed, arrivals,
                                           groups, async_):
    """``groups``: KV cache group windows (one group, or a mixed full/sliding-window model's);
    ``async_``: a step's result lands after the next step is scheduled."""
    rng = random.Random(seed)
    kv = KVCacheManager(num_blocks, block_size, enable_caching=caching, group_windows=groups,
                        max_chunk_tokens=budget)
    s = Scheduler(kv, budget, max_seqs, 64, policy=policy)

    in_flight = []  # async: the step scheduled last, its result not handed over yet

    def one_step():
        _propose(s, rng)
        so = s.schedule()
        check_scheduler_invariants(s)
        in_flight.append((so, _fake_runner(s, so, rng)))
        if not async_ or len(in_flight) > 1 or not so.total_num_scheduled_tokens:
            land()
        STEPS["spec"] += 1

    def land():
        s.update_from_output(*in_flight.pop(0))
        check_scheduler_invariants(s)
        for r in s.running:
            assert r.num_computed_tokens <= r.num_tokens + r.num_output_placeholders, "rejected drafts not rolled back"

    for i, (prefix, suffix_len, max_tokens, n, prio) in enumerate(arrivals):
        prompt = (PREFIXES[prefix] if prefix < len(PREFIXES) else []) + [rng.randint(1, 60) for _ in range(suffix_len)]
        if len(prompt) < kv.max_num_tokens:
            for c in range(n):
                s.add_request(Request(f"{c}_r{i}", prompt, SamplingParams(max_tokens=max_tokens), EOS,
                                      arrival_time=float(i), priority=prio,
                                      parent_request_id=f"r{i}" if n > 1 else None))
        if s.requests and rng.random() < 0.15:
            s.finish_requests(rng.choice(sorted(s.requests)), RequestStatus.FINISHED_ABORTED)
            check_scheduler_invariants(s)
        one_step()
    for _ in range(3000):
        if not s.has_unfinished_requests():
            break
        one_step()
    while in_flight:
        land()
    assert not s.has_unfinished_requests(), "requests never finished"
    s.schedule()
    assert_all_free(s)


def test_the_property_suite_ran_many_speculative_steps():
    """Runs after the property test in this module (file order): >= 10k steps, most verifying."""
    if STEPS["spec"] == 0:
        import pytest

        pytest.skip("the property test did not run in this process")
    assert STEPS["spec"] >= 10_000 and STEPS["verified"] >= 1000, STEPS
