"""Continuous batching basics: one token budget per step, chunked prefill, queueing."""

from tests.core.utils import make_request, make_scheduler, step


def test_budget_and_chunked_prefill():
    s = make_scheduler(budget=10, block_size=4)
    s.add_request(make_request("a", 25))
    s.add_request(make_request("b", 3))
    so, outs = step(s)
    assert so.num_scheduled_tokens == {"a": 10}
    assert outs == []  # a partial prefill samples nothing
    so, _ = step(s)
    assert so.num_scheduled_tokens == {"a": 10}
    so, outs = step(s)
    # a finishes its prompt (5 tokens) and samples; b joins with its whole prompt.
    assert so.num_scheduled_tokens == {"a": 5, "b": 3}
    assert {o.request_id for o in outs} == {"a", "b"}
    so, _ = step(s)
    assert so.num_scheduled_tokens == {"a": 1, "b": 1}


def test_max_num_seqs_queues_requests():
    s = make_scheduler(max_seqs=2, budget=100)
    for i in range(3):
        s.add_request(make_request(str(i), 5, max_tokens=2))
    so, _ = step(s)
    assert set(so.num_scheduled_tokens) == {"0", "1"}
    so, outs = step(s)
    assert set(so.num_scheduled_tokens) == {"0", "1"}
    assert all(o.finished and o.finish_reason == "length" for o in outs)
    so, _ = step(s)
    assert set(so.num_scheduled_tokens) == {"2"}
    assert so.finished_req_ids == {"0", "1"}


def test_stop_on_eos_unless_ignored_and_min_tokens():
    s = make_scheduler()
    s.add_request(make_request("eos", 4, max_tokens=10))
    s.add_request(make_request("ign", 4, max_tokens=3, ignore_eos=True))
    s.add_request(make_request("min", 4, max_tokens=10, min_tokens=2))
    _, outs = step(s, token=0)  # every request samples EOS
    by_id = {o.request_id: o for o in outs}
    assert by_id["eos"].finish_reason == "stop"
    assert not by_id["ign"].finished and not by_id["min"].finished
    _, outs = step(s, token=0)
    by_id = {o.request_id: o for o in outs}
    assert by_id["min"].finish_reason == "stop"
    _, outs = step(s, token=0)
    assert outs[0].request_id == "ign" and outs[0].finish_reason == "length"
    assert not s.has_unfinished_requests()
    kv = s.kv_cache_manager
    assert kv.block_pool.get_num_free_blocks() == kv.num_usable_blocks


def test_abort_frees_blocks_everywhere():
    s = make_scheduler(budget=6, max_seqs=1)
    s.add_request(make_request("run", 20))
    s.add_request(make_request("wait", 20))
    step(s)  # "run" is mid-prefill, "wait" waits
    s.finish_requests(["run", "wait"], __import__("octavo.core.request", fromlist=["RequestStatus"]).RequestStatus.FINISHED_ABORTED)
    assert not s.has_unfinished_requests()
    kv = s.kv_cache_manager
    assert kv.block_pool.get_num_free_blocks() == kv.num_usable_blocks
