"""KV cache groups: how layers group, and the manager with a full and a sliding-window group
(what a mixed model such as Gemma 2 runs with): window freeing, per-group prefix hits."""

import pytest

from octavo.core.kv_cache_groups import (
    KVCacheGroupSpec,
    layer_slots,
    make_kv_cache_groups,
    num_kv_tensors,
)
from octavo.core.kv_cache_manager import KVCacheManager
from tests.core.utils import check_kv_invariants, make_request

BS, W = 4, 8


def test_one_type_is_one_group():
    assert make_kv_cache_groups([None] * 4) == (KVCacheGroupSpec(None, (0, 1, 2, 3)),)
    assert make_kv_cache_groups([32] * 3) == (KVCacheGroupSpec(32, (0, 1, 2)),)


def test_alternating_layers_make_two_groups_of_half():
    groups = make_kv_cache_groups([32, None] * 3)
    assert groups == (KVCacheGroupSpec(32, (0, 2, 4)), KVCacheGroupSpec(None, (1, 3, 5)))
    assert num_kv_tensors(groups) == 3
    assert layer_slots(groups, 6) == [(0, 0), (1, 0), (0, 1), (1, 1), (0, 2), (1, 2)]


def test_five_to_one_splits_the_common_type():
    windows = ([32] * 5 + [None]) * 2  # Gemma 3's pattern over 12 layers
    groups = make_kv_cache_groups(windows)
    assert [g.sliding_window for g in groups] == [32] * 5 + [None]
    assert all(len(g.layers) == 2 for g in groups) and num_kv_tensors(groups) == 2
    slots = layer_slots(groups, 12)
    assert sorted(slots) == sorted(set(slots))  # no two layers share a (group, slot)


def test_near_equal_counts_pad_instead_of_splitting():
    groups = make_kv_cache_groups([32] * 9 + [None] * 8)
    assert [len(g.layers) for g in groups] == [9, 8] and num_kv_tensors(groups) == 9


def _two_groups(num_blocks: int = 40) -> KVCacheManager:
    return KVCacheManager(num_blocks, BS, group_windows=(None, W), max_chunk_tokens=8)


def _run(kv: KVCacheManager, req, chunk: int, decode_tokens: int) -> list[list[int]]:
    """Prefill in chunks, then decode; returns the real blocks held per group after each step."""
    held = []
    while req.num_computed_tokens < req.num_tokens:
        n = min(chunk, req.num_tokens - req.num_computed_tokens)
        assert kv.allocate_slots(req, n) is not None
        req.num_computed_tokens += n
        held.append([kv.num_held_blocks(req.request_id, g) for g in range(2)])
    for i in range(decode_tokens):
        req.append_output_token_ids(500 + i)
        assert kv.allocate_slots(req, 1) is not None
        req.num_computed_tokens += 1
        held.append([kv.num_held_blocks(req.request_id, g) for g in range(2)])
    return held


def test_window_group_frees_full_group_keeps():
    kv = _two_groups()
    r = make_request("r", 4 * W)  # 32 tokens, then 32 more: 4 x window
    held = _run(kv, r, chunk=8, decode_tokens=4 * W)
    assert held[-1][0] == -(-(r.num_computed_tokens) // BS)  # every block of the full group
    assert max(h[1] for h in held[4:]) <= W // BS + 1  # decode: the window and one partial block
    assert max(h[1] for h in held) <= (8 + W - 1) // BS + 2  # a prefill chunk may add one more
    check_kv_invariants(kv, {"r": r})
    kv.free(r)
    assert kv.block_pool.get_num_free_blocks() == kv.num_usable_blocks


def _admit(kv: KVCacheManager, req) -> int:
    hits, num_hit = kv.get_computed_blocks(req)
    assert kv.allocate_slots(req, req.num_tokens - num_hit, hits, num_hit) is not None
    req.num_computed_tokens = req.num_tokens
    return num_hit


def test_hit_needs_only_the_window_in_a_window_group():
    kv = _two_groups(num_blocks=32)
    prompt = list(range(100, 124))  # 6 blocks
    a = make_request("a", 0, prompt=prompt)
    _run(kv, a, chunk=8, decode_tokens=1)  # the window group frees blocks 0..3 on the way
    full_blocks, window_blocks = (list(g) for g in kv.req_to_blocks["a"])
    kv.free(a)
    # 17 never-used blocks, then the window group's blocks 0..3, sit at the head of the free
    # queue: a filler taking 22 blocks evicts those four (and the unhashed last full block).
    filler = make_request("f", 0, prompt=list(range(900, 944)))
    assert kv.allocate_slots(filler, 44) is not None
    kv.free(filler)
    assert all(b.block_hash is None for b in window_blocks[:4])
    assert all(b.block_hash is not None for b in full_blocks[:6] + window_blocks[4:6])
    # The full group still caches the whole prefix and the window group the two blocks the
    # first new query reads (positions 17..23): the hit is the whole prefix.
    b = make_request("b", 0, prompt=prompt + [1, 2, 3, 4, 5])
    hits, num_hit = kv.get_computed_blocks(b)
    assert num_hit == 24
    null = kv.block_pool.null_block
    assert [x is null for x in hits[1]] == [True] * 4 + [False] * 2
    assert hits[0] == full_blocks[:6] and hits[1][4:] == window_blocks[4:6]
    assert kv.allocate_slots(b, 5, hits, num_hit) is not None
    b.num_computed_tokens = 29
    check_kv_invariants(kv, {"b": b})


def test_hit_shrinks_when_the_window_group_lost_its_window():
    kv = _two_groups(num_blocks=24)
    prompt = list(range(100, 124))
    a = make_request("a", 0, prompt=prompt)
    _admit(kv, a)
    window_blocks = list(kv.req_to_blocks["a"][1])
    kv.free(a)
    for blk in window_blocks[3:]:  # the window group's copies of blocks 3..5 are evicted
        kv.block_pool._evict(blk)
    b = make_request("b", 0, prompt=prompt + [1])
    hits, num_hit = kv.get_computed_blocks(b)
    # The full group alone would hit 6 blocks; a hit of n blocks needs the window group's
    # blocks (4n - 7) // 4 .. n - 1, which holds for n = 3 (blocks 1, 2) and no larger n.
    assert num_hit == 3 * BS
    assert len(hits[0]) == len(hits[1]) == 3 and hits[1][0] is kv.block_pool.null_block
    assert _admit(kv, b) == 3 * BS
    check_kv_invariants(kv, {"b": b})


@pytest.mark.parametrize("chunk", [8, 64])
def test_max_num_tokens_fits_alone(chunk):
    """The longest sequence the manager admits always fits alone, whatever the chunking."""
    kv = KVCacheManager(20, BS, group_windows=(None, W, W), max_chunk_tokens=chunk)
    cap = kv.max_num_tokens
    assert 0 < cap < kv.num_usable_blocks * BS
    r = make_request("r", cap - 1, max_tokens=1)
    _run(kv, r, chunk=chunk, decode_tokens=1)
    assert r.num_computed_tokens == cap
    check_kv_invariants(kv, {"r": r})
