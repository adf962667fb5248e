"""Scheduler behaviour with hand-computed allocation tables (after vLLM's scheduler tests).

Unless stated otherwise: blocks of 4 tokens, block 0 is the null block, the free queue starts
as 1, 2, 3, ... and a request samples one token in every step that computes its last known
token (``tests/core/utils.fake_output``).
"""

import pytest

from octavo.core.request import RequestStatus
from octavo.core.scheduler_output import ModelRunnerOutput
from tests.core.utils import (
    assert_all_free,
    block_ids,
    check_scheduler_invariants,
    make_request,
    make_scheduler,
    step,
)


def new_ids(so):
    return {r.req_id: r.block_ids[0] for r in so.scheduled_new_reqs}


def cached_ids(so):
    return {r.req_id: r.new_block_ids[0] for r in so.scheduled_cached_reqs}


def test_allocation_table_with_chunked_prefill():
    s = make_scheduler(budget=16)
    s.add_request(make_request("A", 10, max_tokens=3, start_token=100))
    s.add_request(make_request("B", 7, max_tokens=3, start_token=200))
    s.add_request(make_request("C", 20, max_tokens=3, start_token=300))

    so, outs = step(s)  # A whole prompt, B a 6-token chunk, C waits (budget spent)
    assert so.num_scheduled_tokens == {"A": 10, "B": 6}
    assert new_ids(so) == {"A": [1, 2, 3], "B": [4, 5]}
    assert [o.request_id for o in outs] == ["A"]

    so, outs = step(s)  # A decodes, B finishes its prompt, C gets the remaining 14
    assert so.num_scheduled_tokens == {"A": 1, "B": 1, "C": 14}
    assert cached_ids(so) == {"A": [], "B": []} and new_ids(so) == {"C": [6, 7, 8, 9]}
    assert {o.request_id for o in outs} == {"A", "B"}

    so, outs = step(s)  # C finishes its prompt into a 5th block; A reaches max_tokens
    assert so.num_scheduled_tokens == {"A": 1, "B": 1, "C": 6}
    assert cached_ids(so) == {"A": [], "B": [], "C": [10]}
    assert [o.finish_reason for o in outs if o.request_id == "A"] == ["length"]

    so, _ = step(s)  # A's blocks went to the tail (3, 2, 1): B and C take fresh ones
    assert so.finished_req_ids == {"A"}
    assert so.num_scheduled_tokens == {"B": 1, "C": 1}
    assert cached_ids(so) == {"B": [11], "C": [12]}
    check_scheduler_invariants(s)


def test_long_prefill_token_threshold_interleaves_short_prompts():
    s = make_scheduler(budget=10, long_prefill_token_threshold=4)
    s.add_request(make_request("long", 20))
    s.add_request(make_request("s1", 3, start_token=200))
    s.add_request(make_request("s2", 3, start_token=300))
    so, _ = step(s)
    assert so.num_scheduled_tokens == {"long": 4, "s1": 3, "s2": 3}
    so, _ = step(s)
    assert so.num_scheduled_tokens == {"long": 4, "s1": 1, "s2": 1}
    # Without the threshold the long prompt takes the whole budget.
    s = make_scheduler(budget=10)
    s.add_request(make_request("long", 20))
    s.add_request(make_request("s1", 3, start_token=200))
    so, _ = step(s)
    assert so.num_scheduled_tokens == {"long": 10}


def test_no_chunked_prefill_schedules_whole_prompts_only():
    s = make_scheduler(budget=12, enable_chunked_prefill=False)
    s.add_request(make_request("a", 8))
    s.add_request(make_request("b", 8, start_token=200))
    so, _ = step(s)
    assert so.num_scheduled_tokens == {"a": 8}  # b does not fit whole in the 4 left
    so, _ = step(s)
    assert so.num_scheduled_tokens == {"a": 1, "b": 8}


@pytest.mark.parametrize(
    "policy, victim, survivor_blocks",
    [("fcfs", "C", {"A": [6], "B": [5]}), ("priority", "B", {"A": [4], "C": []})],
)
def test_preemption_victim(policy, victim, survivor_blocks):
    # 6 usable blocks. A (priority 0) and B (priority 5) run; C (priority 1) arrives later.
    s = make_scheduler(num_blocks=7, budget=64, policy=policy)
    s.add_request(make_request("A", 7, max_tokens=20, priority=0, arrival=0.0, start_token=100))
    s.add_request(make_request("B", 7, max_tokens=20, priority=5, arrival=1.0, start_token=200))
    so, _ = step(s)
    assert new_ids(so) == {"A": [1, 2], "B": [3, 4]}
    s.add_request(make_request("C", 7, max_tokens=20, priority=1, arrival=2.0, start_token=300))
    so, _ = step(s)  # 8 tokens each fit in 2 blocks; C takes the last two
    assert new_ids(so) == {"C": [5, 6]}
    assert [r.request_id for r in s.running] == ["A", "B", "C"]

    # A and B (9 tokens) need a 3rd block and none is free; C (8 tokens) does not.
    # fcfs preempts the last admitted (C), priority the largest priority value (B). The
    # victim's blocks are freed in reverse order and handed out from the head.
    so, _ = step(s)
    assert so.preempted_req_ids == {victim}
    assert s.num_preemptions == 1
    assert cached_ids(so) == survivor_blocks
    v = s.requests[victim]
    assert v.status == RequestStatus.PREEMPTED and v.num_computed_tokens == 0
    assert v.num_output_tokens == {"B": 2, "C": 1}[victim] and block_ids(s, victim) == []
    assert s.waiting.peek() is v
    check_scheduler_invariants(s)


def test_preempted_request_goes_to_the_front_of_waiting():
    s = make_scheduler(num_blocks=5, budget=64)  # 4 usable blocks
    s.add_request(make_request("A", 7, max_tokens=20, start_token=100))
    s.add_request(make_request("B", 7, max_tokens=20, start_token=200))
    step(s)
    s.add_request(make_request("W", 3, max_tokens=2, start_token=300))
    step(s)  # no room for W: A and B hold all 4 blocks
    so, _ = step(s)  # A needs a block: B (the last admitted) is preempted
    assert so.preempted_req_ids == {"B"}
    assert [r.request_id for r in s.waiting] == ["B", "W"]
    check_scheduler_invariants(s)


def test_priority_order_with_arrival_tiebreak():
    s = make_scheduler(max_seqs=1, policy="priority")
    for rid, prio, t in [("p1t0", 1, 0.0), ("p0t2", 0, 2.0), ("p0t1", 0, 1.0), ("p1t3", 1, 3.0)]:
        s.add_request(make_request(rid, 3, max_tokens=1, priority=prio, arrival=t, start_token=100 + 10 * len(s.requests)))
    assert [r.request_id for r in s.waiting] == ["p0t1", "p0t2", "p1t0", "p1t3"]
    order = []
    while s.has_unfinished_requests():
        so, _ = step(s)
        order += [r.req_id for r in so.scheduled_new_reqs]
    assert order == ["p0t1", "p0t2", "p1t0", "p1t3"]
    assert_all_free(s)


def test_priority_no_preemption_when_space_exists():
    s = make_scheduler(policy="priority")
    s.add_request(make_request("low", 6, max_tokens=5, priority=9, arrival=0.0))
    step(s)
    s.add_request(make_request("high", 6, max_tokens=5, priority=0, arrival=1.0, start_token=300))
    so, _ = step(s)
    assert so.preempted_req_ids == set() and s.num_preemptions == 0
    assert set(so.num_scheduled_tokens) == {"low", "high"}


def test_parallel_sampling_children_share_prompt_blocks():
    s = make_scheduler(budget=64)
    prompt = list(range(100, 110))  # 10 tokens: 2 full blocks + a partial one
    for i in range(3):
        s.add_request(make_request(f"{i}_p", 0, prompt=prompt, parent="p", max_tokens=4))
    so, _ = step(s)
    # Only the first child computes the prompt; its siblings are held back.
    assert so.num_scheduled_tokens == {"0_p": 10}
    assert [r.request_id for r in s.waiting] == ["1_p", "2_p"]
    so, _ = step(s)
    # The siblings hit both full blocks and compute only the 2-token tail.
    assert so.num_scheduled_tokens == {"0_p": 1, "1_p": 2, "2_p": 2}
    ids = {rid: block_ids(s, rid) for rid in ("0_p", "1_p", "2_p")}
    assert ids["0_p"][:2] == ids["1_p"][:2] == ids["2_p"][:2] == [1, 2]
    assert len({ids[r][2] for r in ids}) == 3  # the tails diverge
    assert [s.kv_cache_manager.block_pool.blocks[b].ref_cnt for b in (1, 2)] == [3, 3]
    assert [s.requests[r].num_cached_tokens for r in ("1_p", "2_p")] == [8, 8]
    check_scheduler_invariants(s)
    while s.has_unfinished_requests():
        step(s)
        check_scheduler_invariants(s)
    assert_all_free(s)


def test_parallel_sampling_with_chunked_prompt():
    s = make_scheduler(budget=4)
    prompt = list(range(100, 110))
    for i in range(2):
        s.add_request(make_request(f"{i}_p", 0, prompt=prompt, parent="p", max_tokens=2))
    scheduled = []
    while s.has_unfinished_requests():
        so, _ = step(s)
        scheduled.append(so.num_scheduled_tokens)
        check_scheduler_invariants(s)
    assert scheduled[:3] == [{"0_p": 4}, {"0_p": 4}, {"0_p": 2, "1_p": 2}]
    assert_all_free(s)


def test_children_of_different_parents_are_not_held_back():
    s = make_scheduler(budget=64)
    s.add_request(make_request("0_x", 9, parent="x"))
    s.add_request(make_request("0_y", 9, parent="y", start_token=500))
    so, _ = step(s)
    assert set(so.num_scheduled_tokens) == {"0_x", "0_y"}


def test_abort_held_back_sibling_and_leader():
    s = make_scheduler(budget=64)
    for i in range(3):
        s.add_request(make_request(f"{i}_p", 10, parent="p"))
    step(s)
    s.finish_requests(["0_p", "2_p"], RequestStatus.FINISHED_ABORTED)
    so, _ = step(s)  # the leader is gone: the remaining sibling runs and hits its blocks
    assert so.num_scheduled_tokens == {"1_p": 2}
    s.finish_requests("1_p", RequestStatus.FINISHED_ABORTED)
    assert_all_free(s)


def test_prompt_that_can_never_fit_is_rejected():
    s = make_scheduler(num_blocks=5)  # 4 usable blocks = 16 tokens
    with pytest.raises(ValueError, match="can never fit"):
        s.add_request(make_request("big", 16))
    assert not s.requests
    s.add_request(make_request("ok", 15))


def test_sequences_stop_at_the_pool_size_instead_of_preempting_forever():
    s = make_scheduler(num_blocks=5, budget=64)  # 16 tokens in the whole pool
    s.add_request(make_request("a", 6, max_tokens=100, start_token=100))
    s.add_request(make_request("b", 6, max_tokens=100, start_token=200))
    finished = {}
    for _ in range(100):
        if not s.has_unfinished_requests():
            break
        _, outs = step(s)
        check_scheduler_invariants(s)
        finished.update({o.request_id: o.finish_reason for o in outs if o.finished})
    assert finished == {"a": "length", "b": "length"}
    assert s.num_preemptions >= 1
    assert_all_free(s)


def test_stop_token_ids_respect_min_tokens():
    s = make_scheduler()
    s.add_request(make_request("st", 4, max_tokens=10, stop_token_ids=[7]))
    s.add_request(make_request("mn", 4, max_tokens=10, stop_token_ids=[7], min_tokens=3, start_token=200))
    _, outs = step(s, token=7)
    assert [(o.request_id, o.finish_reason, o.stop_reason) for o in outs if o.finished] == [("st", "stop", 7)]
    step(s, token=7)
    _, outs = step(s, token=7)
    assert outs[0].finish_reason == "stop" and outs[0].new_token_ids == [7]
    assert s.requests == {}


def test_stats():
    s = make_scheduler(num_blocks=11, budget=64, max_seqs=2)
    shared = list(range(100, 108))
    s.add_request(make_request("a", 0, prompt=shared + [1], max_tokens=3))
    s.add_request(make_request("b", 0, prompt=shared + [2], max_tokens=3))
    s.add_request(make_request("c", 0, prompt=shared + [3], max_tokens=3))
    st = s.make_stats()
    assert (st.num_running_reqs, st.num_waiting_reqs, st.kv_cache_usage) == (0, 3, 0.0)
    step(s)
    st = s.make_stats()
    assert (st.num_running_reqs, st.num_waiting_reqs) == (2, 1)
    assert st.kv_cache_usage == pytest.approx(4 / 10)  # a: 3 blocks, b: 2 hits + 1
    assert (st.prefix_cache_queries, st.prefix_cache_hits) == (18, 8)
    while s.has_unfinished_requests():
        step(s)
    st = s.make_stats()
    assert (st.prefix_cache_queries, st.prefix_cache_hits) == (27, 16)
    assert st.kv_cache_usage == 0.0 and st.num_preemptions == 0


def test_prompt_logprobs_are_reported_once_across_chunks_and_recompute():
    s = make_scheduler(budget=4)
    s.add_request(make_request("r", 6, max_tokens=2, prompt_logprobs=0))

    def run(entries_for):
        so = s.schedule()
        req = s.requests["r"]
        start = req.num_computed_tokens - so.num_scheduled_tokens["r"]
        n = so.num_scheduled_tokens["r"]
        end = min(start + n, req.num_prompt_tokens - 1)
        plp = {"r": (start + 1, [{p + 1: (-1.0, 1)} for p in range(start, end)])} if end > start else None
        sampled = [[7]] if req.num_computed_tokens == req.num_tokens else [[]]
        return s.update_from_output(so, ModelRunnerOutput(["r"], sampled, prompt_logprobs=plp))

    outs = run(None)
    assert [list(d) for d in outs[0].prompt_logprobs] == [[1], [2], [3], [4]]
    outs = run(None)
    assert [list(d) for d in outs[0].prompt_logprobs] == [[5]]
    # Preempt and recompute from scratch: positions already reported are not sent again.
    s._preempt(s.requests["r"])
    outs = run(None)
    assert outs == []
    outs = run(None)
    assert outs[0].prompt_logprobs is None and outs[0].new_token_ids == [7]


def test_leak_after_mixed_workload():
    s = make_scheduler(num_blocks=12, budget=12, max_seqs=3, policy="priority")
    for i in range(8):
        s.add_request(make_request(str(i), 3 + 3 * i, max_tokens=2 + i, priority=i % 3, start_token=100 * (i % 2)))
    s.finish_requests("5", RequestStatus.FINISHED_ABORTED)
    steps = 0
    while s.has_unfinished_requests():
        step(s)
        check_scheduler_invariants(s)
        steps += 1
        assert steps < 500
    assert_all_free(s)


@pytest.mark.parametrize("caching", [False, True])
def test_equal_requests_do_not_preempt_each_other_forever(caching):
    # Regression (found by the property test): two children of one request share priority
    # and arrival time; a victim choice that broke that tie by list position made each one
    # preempt itself in turn, before either finished its 13-token prompt in a 16-token pool.
    s = make_scheduler(num_blocks=5, budget=18, policy="priority", caching=caching,
                       long_prefill_token_threshold=3)
    for i in range(2):
        s.add_request(make_request(f"{i}_p", 13, max_tokens=2, arrival=5.0, parent="p"))
    for _ in range(60):
        if not s.has_unfinished_requests():
            break
        step(s)
        check_scheduler_invariants(s)
    assert not s.has_unfinished_requests()
    s.schedule()
    assert_all_free(s)


def test_output_for_a_request_preempted_while_in_flight_is_dropped():
    from tests.core.utils import fake_output

    s = make_scheduler()
    s.add_request(make_request("a", 5, max_tokens=4))
    s.add_request(make_request("b", 5, max_tokens=4, start_token=200))
    step(s)
    so = s.schedule()
    runner_out = fake_output(so, s)
    s._preempt(s.requests["b"])  # e.g. an abort-and-retry path racing the step
    outs = s.update_from_output(so, runner_out)
    assert [o.request_id for o in outs] == ["a"]
    assert s.requests["b"].output_token_ids == [7] and s.requests["b"].num_computed_tokens == 0
    check_scheduler_invariants(s)


def test_paused_requests_are_skipped_keep_their_blocks_and_resume():
    """A paused running request is not scheduled and keeps its blocks; a paused waiting one
    keeps its place; with only paused requests there is nothing to schedule; resume
    continues exactly where they were."""
    sched = make_scheduler(budget=64)
    a, b = make_request("a", 6, max_tokens=4), make_request("b", 6, max_tokens=4)
    sched.add_request(a)
    step(sched)  # a runs (prefill + first token)
    sched.add_request(b)
    sched.pause_requests(["a", "b", "unknown"])
    assert sched.num_paused == 2 and not sched.has_schedulable_requests()
    held = block_ids(sched, "a")
    for _ in range(2):
        so, _ = step(sched)
        assert so.total_num_scheduled_tokens == 0
    assert block_ids(sched, "a") == held and a.num_output_tokens == 1
    assert a in sched.running and b.status == RequestStatus.WAITING
    sched.resume_requests(["b"])
    so, _ = step(sched)
    assert set(so.num_scheduled_tokens) == {"b"}
    sched.resume_requests(["a"])
    assert sched.num_paused == 0
    while sched.has_unfinished_requests():
        step(sched)
    assert a.num_output_tokens == 4 and b.num_output_tokens == 4
    check_scheduler_invariants(sched)
    assert_all_free(sched)


def test_a_paused_request_is_preempted_first_and_an_abort_forgets_it():
    sched = make_scheduler(num_blocks=6, budget=64)  # 5 usable blocks of 4 tokens
    a, b = make_request("a", 8, max_tokens=12), make_request("b", 8, max_tokens=12, start_token=500)
    sched.add_request(a)
    sched.add_request(b)
    step(sched)
    sched.pause_requests(["a"])  # a, admitted first, would never be the fcfs victim
    while b.status == RequestStatus.RUNNING and not b.is_finished() and a.status == RequestStatus.RUNNING:
        step(sched)
    assert a.status == RequestStatus.PREEMPTED and a.paused and block_ids(sched, "a") == []
    assert b.status == RequestStatus.RUNNING
    sched.finish_requests("a", RequestStatus.FINISHED_ABORTED)
    assert sched.num_paused == 0 and sched.has_schedulable_requests()
    while sched.has_unfinished_requests():
        step(sched)
    assert_all_free(sched)
