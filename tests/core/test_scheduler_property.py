"""Property-based test: random workloads against the scheduler and a tiny KV cache.

Hypothesis draws a pool (a few blocks), a policy, and a script of steps; each step may add
requests (random lengths, priorities, prompts sharing prefixes so the cache gets hits,
some as ``n > 1`` children), abort some, and runs one schedule/update with random sampled
tokens (EOS sometimes). After every step the invariants of ``check_scheduler_invariants`` must
hold (ref counts == holders, free queue == ref 0, nothing free and held, the hash index points
only at matching blocks, shared blocks hold the right prefix); at the end everything drains
and every block is free.

The KV cache runs with one group (full attention, or one sliding window) or with several
(mixed full/sliding-window models: a full-attention group plus windowed ones, as Gemma 2/3
have), so the per-group hit search, window freeing and worst-case sizing are driven too.
"""

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from octavo.core.kv_cache_manager import KVCacheManager
from octavo.core.request import Request, RequestStatus
from octavo.core.scheduler import Scheduler
from octavo.core.scheduler_output import ModelRunnerOutput
from octavo.sampling_params import SamplingParams
from tests.core.utils import EOS, assert_all_free, check_scheduler_invariants

# KV cache group windows (None = full attention): one group, or a mixed model's several.
GROUPS = [(None,), (None,), (5,), (None, 3), (None, 5), (6, None, 6), (None, 3, 8)]

PREFIXES = [[11, 12, 13, 14, 15, 16, 17, 18], [21, 22, 23, 24, 25, 26, 27, 28], [31, 32, 33]]

new_request = st.fixed_dictionaries(
    {
        "prefix": st.integers(0, len(PREFIXES)),  # len(PREFIXES): no shared prefix
        "suffix": st.lists(st.integers(1, 50), min_size=0, max_size=12),
        "max_tokens": st.integers(1, 12),
        "priority": st.integers(0, 3),
        "n": st.sampled_from([1, 1, 1, 2, 3]),
        "salt": st.sampled_from([None, None, "t"]),
        "min_tokens": st.sampled_from([0, 0, 2]),
    }
)

step_script = st.fixed_dictionaries(
    {
        "arrivals": st.lists(new_request, max_size=3),
        "aborts": st.lists(st.integers(0, 1000), max_size=2),
        "eos": st.lists(st.booleans(), min_size=8, max_size=8),
    }
)


@settings(
    max_examples=120,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(
    num_blocks=st.integers(4, 12),
    block_size=st.sampled_from([2, 4]),
    budget=st.integers(3, 24),
    max_seqs=st.integers(1, 5),
    policy=st.sampled_from(["fcfs", "priority"]),
    caching=st.booleans(),
    threshold=st.sampled_from([0, 0, 3]),
    script=st.lists(step_script, min_size=1, max_size=25),
    groups=st.sampled_from(GROUPS),
)
def test_random_workloads_keep_invariants(
    num_blocks, block_size, budget, max_seqs, policy, caching, threshold, script, groups
):
    kv = KVCacheManager(num_blocks, block_size, enable_caching=caching, group_windows=groups,
                        max_chunk_tokens=budget)
    s = Scheduler(kv, budget, max_seqs, 64, policy=policy, long_prefill_token_threshold=threshold)
    counter = 0
    clock = 0.0

    def one_step(eos_flags):
        so = s.schedule()
        check_scheduler_invariants(s)
        req_ids, sampled = [], []
        for i, rid in enumerate(so.num_scheduled_tokens):
            req = s.requests[rid]
            req_ids.append(rid)
            done = req.num_computed_tokens == req.num_tokens
            sampled.append([EOS if eos_flags[i % len(eos_flags)] else 40 + i] if done else [])
        s.update_from_output(so, ModelRunnerOutput(req_ids, sampled))
        check_scheduler_invariants(s)

    for action in script:
        for a in action["arrivals"]:
            prompt = (PREFIXES[a["prefix"]] if a["prefix"] < len(PREFIXES) else []) + a["suffix"]
            if not prompt:
                prompt = [1]
            params = SamplingParams(max_tokens=a["max_tokens"], min_tokens=min(a["min_tokens"], a["max_tokens"]))
            parent = f"p{counter}" if a["n"] > 1 else None
            clock += 1.0
            for i in range(a["n"]):
                rid = f"{i}_p{counter}" if parent else f"r{counter}"
                req = Request(rid, prompt, params, EOS, arrival_time=clock, priority=a["priority"],
                              cache_salt=a["salt"], parent_request_id=parent)
                if len(prompt) >= kv.max_num_tokens:
                    try:
                        s.add_request(req)
                    except ValueError:
                        continue
                    raise AssertionError("a prompt that can never fit was accepted")
                s.add_request(req)
            counter += 1
        live = sorted(s.requests)
        for k in action["aborts"]:
            if live and k % 3 == 0:
                s.finish_requests(live[k % len(live)], RequestStatus.FINISHED_ABORTED)
                check_scheduler_invariants(s)
        one_step(action["eos"])

    # Drain: with no new arrivals everything must finish (no preemption livelock).
    for _ in range(2000):
        if not s.has_unfinished_requests():
            break
        one_step([False])
    assert not s.has_unfinished_requests(), "requests never finished"
    s.schedule()  # hand the last finished ids to the (absent) runner
    assert_all_free(s)
