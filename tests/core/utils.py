"""Helpers to drive the scheduler without a model: fake runner outputs, invariant checks."""

from __future__ import annotations

from collections import Counter

from octavo.core.block_hash import extend_block_hashes
from octavo.core.kv_cache_manager import KVCacheManager, group_key
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


def block_ids(sched: Scheduler, rid: str, group: int = 0) -> list[int]:
    return sched.kv_cache_manager.get_block_ids(rid)[group]


def free_ids(kv: KVCacheManager) -> list[int]:
    """Block ids in free-queue order (head = next to be evicted)."""
    return [b.block_id for b in kv.block_pool.free_block_queue]


def check_kv_invariants(kv: KVCacheManager, requests: dict[str, Request] | None = None) -> None:
    """The block pool's invariants, plus, given the owners, that shared KV is the right KV."""
    pool = kv.block_pool
    holders: Counter[int] = Counter()
    for rid, groups in kv.req_to_blocks.items():
        assert len(groups) == kv.num_groups
        ids = [b.block_id for blocks in groups for b in blocks if b is not pool.null_block]
        assert len(set(ids)) == len(ids), f"{rid} holds a block twice: {ids}"
        holders.update(ids)
        lengths = {len(blocks) for blocks in groups}
        assert len(lengths) == 1, f"{rid}: groups cover different lengths {lengths}"
        for g, blocks in enumerate(groups):
            first_real = next((i for i, b in enumerate(blocks) if b is not pool.null_block), len(blocks))
            assert all(b is not pool.null_block for b in blocks[first_real:]), f"{rid} group {g}: a null block inside"
            if kv.group_windows[g] is None:
                assert first_real == 0, f"{rid}: full-attention group {g} lost a block"
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
    for rid, groups in kv.req_to_blocks.items():
        req = requests[rid]
        expected: list = []
        extend_block_hashes(expected, req.all_token_ids, kv.block_size, req.cache_salt, kv.hash_fn)
        for g, blocks in enumerate(groups):
            for i, b in enumerate(blocks):
                if b.block_hash is not None and b is not pool.null_block:
                    assert i < len(expected) and b.block_hash == group_key(expected[i], g), (
                        f"{rid} group {g} block {i} ({b}) holds KV of another prefix or group"
                    )


def check_window_holding(kv: KVCacheManager, req: Request) -> None:
    """A sliding-window group holds at most its window plus one step's chunk (the blocks
    behind the window are freed at the request's next allocation)."""
    groups = kv.req_to_blocks.get(req.request_id)
    if not groups or kv.max_chunk_tokens is None:
        return
    for g, window in enumerate(kv.group_windows):
        if window is not None:
            bound = (kv.max_chunk_tokens + window + 2 * kv.block_size - 3) // kv.block_size
            held = kv.num_held_blocks(req.request_id, g)
            assert held <= bound, f"{req.request_id} group {g} holds {held} blocks > {bound}"


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
        for blocks in kv.req_to_blocks.get(r.request_id, ()):
            assert len(blocks) * kv.block_size >= r.num_computed_tokens
        check_window_holding(kv, r)
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
