"""Helpers to drive the scheduler without a model: fake runner outputs, invariant checks."""

from __future__ import annotations

from collections import Counter

from octavo.core.block_hash import extend_block_hashes
from octavo.core.kv_cache_manager import KVCacheManager
from octavo.core.request import Request, RequestStatus
from octavo.core.scheduler import Scheduler
from octavo.core.scheduler_output import ModelRunnerOutput, SchedulerOutput
from octavo.sampling_params import SamplingParams

EOS = 0


def make_request(rid: str, prompt_len: int, max_tokens: int = 8, priority: int = 0,
                 arrival: float | None = None, start_token: int = 100,
                 prompt: list[int] | None = None, cache_salt: str | None = None,
                 parent: str | None = None, **kw) -> Request:
    params = SamplingParams(max_tokens=max_tokens, **kw)
    if prompt is None:
        prompt = [start_token + i for i in range(prompt_len)]
    return Request(rid, prompt, params, EOS, arrival_time=arrival, priority=priority,
                   cache_salt=cache_salt, parent_request_id=parent)


def make_scheduler(num_blocks: int = 64, block_size: int = 4, budget: int = 32, max_seqs: int = 8,
                   max_model_len: int = 256, caching: bool = True, **kw) -> Scheduler:
    kv = KVCacheManager(num_blocks, block_size, enable_caching=caching)
    return Scheduler(kv, budget, max_seqs, max_model_len, **kw)


def fake_output(so: SchedulerOutput, sched: Scheduler, token: int = 7) -> ModelRunnerOutput:
    """Sample ``token`` for every request whose known tokens are all computed after the step."""
    req_ids, sampled = [], []
    for rid in so.num_scheduled_tokens:
        req = sched.requests[rid]
        req_ids.append(rid)
        sampled.append([token] if req.num_computed_tokens == req.num_tokens else [])
    return ModelRunnerOutput(req_ids, sampled)


def step(sched: Scheduler, token: int = 7):
    so = sched.schedule()
    outs = sched.update_from_output(so, fake_output(so, sched, token))
    return so, outs


def block_ids(sched: Scheduler, rid: str) -> list[int]:
    return sched.kv_cache_manager.get_block_ids(rid)


def free_ids(kv: KVCacheManager) -> list[int]:
    """Block ids in free-queue order (head = next to be evicted)."""
    return [b.block_id for b in kv.block_pool.free_block_queue]


def check_kv_invariants(kv: KVCacheManager, requests: dict[str, Request] | None = None) -> None:
    """The block pool's invariants, plus, given the owners, that shared KV is the right KV."""
    pool = kv.block_pool
    holders: Counter[int] = Counter()
    for rid, blocks in kv.req_to_blocks.items():
        ids = [b.block_id for b in blocks]
        assert len(set(ids)) == len(ids), f"{rid} holds a block twice: {ids}"
        assert pool.null_block.block_id not in ids, f"{rid} holds the null block"
        holders.update(ids)
    free = free_ids(kv)
    assert len(free) == len(set(free)) == pool.get_num_free_blocks()
    free_set = set(free)
    assert pool.null_block.block_id not in free_set
    for b in pool.blocks[1:]:
        assert b.ref_cnt == holders[b.block_id], f"{b}: held by {holders[b.block_id]} requests"
        assert (b.block_id in free_set) == (b.ref_cnt == 0), f"{b} free-queue membership"
    for h, b in pool.cached_block_hash_to_block.items():
        assert b.block_hash == h, f"index entry {h} points at {b}"
    if requests is None:
        return
    for rid, blocks in kv.req_to_blocks.items():
        req = requests[rid]
        expected: list = []
        extend_block_hashes(expected, req.all_token_ids, kv.block_size, req.cache_salt, kv.hash_fn)
        for i, b in enumerate(blocks):
            if b.block_hash is not None:
                assert i < len(expected) and b.block_hash == expected[i], (
                    f"{rid} block {i} ({b}) holds KV of another prefix"
                )


def check_scheduler_invariants(sched: Scheduler) -> None:
    kv = sched.kv_cache_manager
    running = {r.request_id for r in sched.running}
    waiting = {r.request_id for r in sched.waiting}
    assert not running & waiting
    assert running | waiting == set(sched.requests)
    assert len(sched.running) <= sched.max_num_seqs
    assert set(kv.req_to_blocks) <= running, "only running requests hold blocks"
    for r in sched.running:
        assert r.status == RequestStatus.RUNNING
        assert len(kv.req_to_blocks.get(r.request_id, ())) * kv.block_size >= r.num_computed_tokens
    for r in sched.waiting:
        assert r.status in (RequestStatus.WAITING, RequestStatus.PREEMPTED)
        assert r.num_computed_tokens == 0
    check_kv_invariants(kv, sched.requests)


def assert_all_free(sched: Scheduler) -> None:
    """The leak test: nothing running or waiting, no held blocks, every block back in the queue."""
    kv = sched.kv_cache_manager
    assert not sched.requests and not sched.running and len(sched.waiting) == 0
    assert not kv.req_to_blocks and not kv.num_cached_blocks
    assert all(b.ref_cnt == 0 for b in kv.block_pool.blocks)
    assert kv.block_pool.get_num_free_blocks() == kv.block_pool.num_blocks - 1
    assert not sched.siblings
