"""KV cache manager and block pool, after vLLM's prefix-caching tests.

Pool: 11 blocks of 4 tokens (block 0 is the null block, so 10 usable: ids 1..10). Every
allocation table below is computed by hand from the rules: new blocks come from the head of
the free queue; freed blocks go to its tail in reverse request order; a hit revives a block
from wherever it is in the queue.
"""

import pytest

from octavo.core.kv_cache_manager import KVCacheManager
from tests.core.utils import check_kv_invariants, free_ids, make_request

BS = 4


def kv_manager(num_blocks: int = 11, caching: bool = True, hash_algo: str = "sha256") -> KVCacheManager:
    return KVCacheManager(num_blocks, BS, enable_caching=caching, hash_algo=hash_algo)


def admit(kv: KVCacheManager, req, n: int | None = None):
    """Prefix lookup + allocation of the rest of the prompt (or ``n`` tokens); returns new ids."""
    hits, num_hit = kv.get_computed_blocks(req)
    n = req.num_tokens - num_hit if n is None else n
    new = kv.allocate_slots(req, n, hits, num_hit)
    assert new is not None
    req.num_computed_tokens = num_hit + n
    return [b.block_id for b in hits[0]], [b.block_id for b in new[0]]


def decode(kv: KVCacheManager, req, token: int = 999):
    """One decode step as the scheduler does it: schedule the last token, then append one."""
    new = kv.allocate_slots(req, req.num_tokens - req.num_computed_tokens)
    req.num_computed_tokens = req.num_tokens
    req.append_output_token_ids(token)
    return [b.block_id for b in new[0]]


def prompt(*parts) -> list[int]:
    out: list[int] = []
    for p in parts:
        out += list(p)
    return out


def test_miss_then_hit_while_original_holds_blocks():
    kv = kv_manager()
    r0 = make_request("0", 0, prompt=prompt(range(10)))
    assert admit(kv, r0) == ([], [1, 2, 3])
    # Only the full blocks are hashed; the partial tail is not.
    blocks = kv.req_to_blocks["0"][0]
    assert blocks[0].block_hash is not None and blocks[1].block_hash is not None
    assert blocks[2].block_hash is None
    assert free_ids(kv) == [4, 5, 6, 7, 8, 9, 10]

    r1 = make_request("1", 0, prompt=prompt(range(8), [20, 21, 22]))
    assert admit(kv, r1) == ([1, 2], [4])
    assert [b.ref_cnt for b in kv.block_pool.blocks[1:5]] == [2, 2, 1, 1]
    assert r1.num_computed_tokens == 11
    check_kv_invariants(kv, {"0": r0, "1": r1})


def test_free_queue_order_after_frees_then_hit_after_free():
    kv = kv_manager()
    r0 = make_request("0", 0, prompt=prompt(range(10)))
    r1 = make_request("1", 0, prompt=prompt(range(8), [20, 21, 22]))
    admit(kv, r0)
    admit(kv, r1)
    kv.free(r0)  # 3 -> free; 2 and 1 still held by r1
    assert free_ids(kv) == [5, 6, 7, 8, 9, 10, 3]
    kv.free(r1)  # reverse order: 4, 2, 1
    # Unallocated, then the unique tails, then the common prefix reversed.
    assert free_ids(kv) == [5, 6, 7, 8, 9, 10, 3, 4, 2, 1]
    check_kv_invariants(kv)

    # Hit after free: blocks 1 and 2 are revived from the tail; the new block is the head.
    r2 = make_request("2", 0, prompt=prompt(range(8), [30, 31]))
    assert admit(kv, r2) == ([1, 2], [5])
    assert free_ids(kv) == [6, 7, 8, 9, 10, 3, 4]
    assert kv.block_pool.blocks[1].ref_cnt == 1
    check_kv_invariants(kv, {"2": r2})


def test_eviction_order_is_lru_and_evicted_block_loses_its_hash():
    kv = kv_manager()
    a = make_request("a", 0, prompt=prompt(range(100, 108), [1]))  # blocks 1, 2 (+3 partial)
    b = make_request("b", 0, prompt=prompt(range(200, 208), [1]))  # blocks 4, 5 (+6 partial)
    admit(kv, a)
    admit(kv, b)
    kv.free(a)
    kv.free(b)
    assert free_ids(kv) == [7, 8, 9, 10, 3, 2, 1, 6, 5, 4]
    pool = kv.block_pool
    hash_a0 = pool.blocks[1].block_hash
    assert pool.get_cached_block(hash_a0) is pool.blocks[1]

    # A 7-block request takes the 4 never-used blocks, then the LRU ones: 3 (no hash), 2, 1.
    big = make_request("big", 0, prompt=prompt(range(300, 325)))
    hits, new = admit(kv, big)
    assert hits == [] and new == [7, 8, 9, 10, 3, 2, 1]
    assert pool.num_evictions == 2  # blocks 2 and 1 carried a's hashes
    # Evicted-and-reused: block 1 now holds big's first block, a's hash is gone from the index.
    assert pool.get_cached_block(hash_a0) is None
    assert pool.blocks[1].block_hash is None  # big's 7th block is partial (25 tokens)
    assert pool.blocks[7].block_hash is not None
    # b's blocks survived: b hits again.
    b2 = make_request("b2", 0, prompt=prompt(range(200, 208), [2]))
    assert admit(kv, b2)[0] == [4, 5]
    check_kv_invariants(kv, {"big": big, "b2": b2})


def test_decode_within_block_allocates_nothing_crossing_allocates_one():
    kv = kv_manager()
    r = make_request("r", 0, prompt=prompt(range(6)))
    assert admit(kv, r) == ([], [1, 2])
    r.append_output_token_ids(50)  # sampled after the prefill: 7 tokens known
    b2 = kv.block_pool.blocks[2]
    assert decode(kv, r) == []  # computes position 6
    assert b2.block_hash is None
    assert decode(kv, r) == []  # computes position 7: block 2 becomes full and is hashed
    assert b2.block_hash is not None and kv.block_pool.get_cached_block(b2.block_hash) is b2
    assert decode(kv, r) == [3]  # position 8 crosses into a new block
    assert kv.block_pool.blocks[3].block_hash is None
    check_kv_invariants(kv, {"r": r})


def test_allocation_prefers_other_free_blocks_over_hit_ones():
    kv = kv_manager()
    r0 = make_request("0", 0, prompt=prompt(range(9)))
    admit(kv, r0)  # 1, 2, 3
    kv.free(r0)
    # Fill the pool so the hit blocks sit at the head of the free queue.
    filler = make_request("f", 0, prompt=prompt(range(500, 528)))  # 7 blocks: 4..10
    admit(kv, filler)
    kv.free(filler)
    assert free_ids(kv) == [3, 2, 1, 10, 9, 8, 7, 6, 5, 4]
    r1 = make_request("1", 0, prompt=prompt(range(8), [60, 61, 62, 63, 64]))
    hits, new = admit(kv, r1)
    # Hits 1, 2 leave the queue first, so the two new blocks are 3 and 10, not 2 and 1.
    assert hits == [1, 2] and new == [3, 10]
    assert free_ids(kv) == [9, 8, 7, 6, 5, 4]
    check_kv_invariants(kv, {"1": r1})


def test_failed_allocation_changes_nothing():
    kv = kv_manager(num_blocks=6)  # 5 usable
    r0 = make_request("0", 0, prompt=prompt(range(9)))
    admit(kv, r0)  # 1, 2, 3
    kv.free(r0)
    holder = make_request("h", 0, prompt=prompt(range(700, 707)))
    admit(kv, holder)  # takes 4, 5
    before = [(b.block_id, b.ref_cnt, b.block_hash) for b in kv.block_pool.blocks]
    free_before = free_ids(kv)
    big = make_request("big", 0, prompt=prompt(range(8), range(900, 912)))  # 20 tokens: 5 blocks
    hits, num_hit = kv.get_computed_blocks(big)
    assert [b.block_id for b in hits[0]] == [1, 2]
    assert kv.allocate_slots(big, big.num_tokens - num_hit, hits, num_hit) is None
    assert [(b.block_id, b.ref_cnt, b.block_hash) for b in kv.block_pool.blocks] == before
    assert free_ids(kv) == free_before
    assert "big" not in kv.req_to_blocks
    check_kv_invariants(kv)


def test_caching_disabled():
    kv = kv_manager(caching=False)
    r0 = make_request("0", 0, prompt=prompt(range(12)))
    admit(kv, r0)
    assert all(b.block_hash is None for b in kv.block_pool.blocks)
    r1 = make_request("1", 0, prompt=prompt(range(12)))
    assert admit(kv, r1) == ([], [4, 5, 6])
    kv.record_prefix_cache_query(r1, 0)
    assert kv.prefix_cache_queries == 0 and not kv.block_pool.cached_block_hash_to_block


def test_chunked_prefill_hashes_blocks_as_they_fill():
    kv = kv_manager()
    r = make_request("r", 0, prompt=prompt(range(13)))
    assert admit(kv, r, n=5) == ([], [1, 2])  # positions 0..4: block 1 full
    pool = kv.block_pool
    assert pool.blocks[1].block_hash is not None and pool.blocks[2].block_hash is None
    assert kv.allocate_slots(r, 5) is not None and [b.block_id for b in kv.req_to_blocks["r"][0]] == [1, 2, 3]
    r.num_computed_tokens = 10
    assert pool.blocks[2].block_hash is not None and pool.blocks[3].block_hash is None
    # A second request sharing the first 10 tokens already hits the two computed blocks.
    other = make_request("o", 0, prompt=prompt(range(10), [77]))
    assert kv.get_computed_blocks(other)[1] == 8
    check_kv_invariants(kv, {"r": r})


def test_last_token_is_always_recomputed():
    kv = kv_manager()
    r0 = make_request("0", 0, prompt=prompt(range(8)))
    admit(kv, r0)
    kv.free(r0)
    # Same 8 tokens: both blocks are cached, but the block holding the last token is not hit.
    r1 = make_request("1", 0, prompt=prompt(range(8)))
    assert kv.get_computed_blocks(r1)[1] == 4
    # Prompt logprobs must be computed: no hit at all.
    r2 = make_request("2", 0, prompt=prompt(range(8), [5]), prompt_logprobs=1)
    assert kv.get_computed_blocks(r2) == ([[]], 0)


def test_cache_salt_isolates_tenants():
    kv = kv_manager()
    toks = prompt(range(12))
    a = make_request("a", 0, prompt=toks, cache_salt="tenant-a")
    admit(kv, a)
    assert kv.get_computed_blocks(make_request("b", 0, prompt=toks, cache_salt="tenant-b"))[1] == 0
    assert kv.get_computed_blocks(make_request("n", 0, prompt=toks))[1] == 0
    assert kv.get_computed_blocks(make_request("a2", 0, prompt=toks, cache_salt="tenant-a"))[1] == 8
    # The salt enters the first block only, but the chain carries it to every later block.
    b = make_request("b", 0, prompt=toks, cache_salt="tenant-b")
    kv._update_hashes(b)
    assert b.block_hashes[0] != a.block_hashes[0] and b.block_hashes[1] != a.block_hashes[1]


def test_reset_prefix_cache_refused_while_blocks_are_held():
    kv = kv_manager()
    r = make_request("r", 0, prompt=prompt(range(9)))
    admit(kv, r)
    assert kv.reset_prefix_cache() is False
    assert kv.block_pool.cached_block_hash_to_block
    kv.free(r)
    assert kv.reset_prefix_cache() is True
    assert not kv.block_pool.cached_block_hash_to_block
    assert all(b.block_hash is None for b in kv.block_pool.blocks)
    assert kv.get_computed_blocks(make_request("s", 0, prompt=prompt(range(9))))[1] == 0


@pytest.mark.parametrize("algo,size", [("sha256", 32), ("xxhash", 16)])
def test_hash_algos_hit_the_same_prefix(algo, size):
    pytest.importorskip("xxhash") if algo == "xxhash" else None
    kv = kv_manager(hash_algo=algo)
    r0 = make_request("0", 0, prompt=prompt(range(9)))
    admit(kv, r0)
    assert all(isinstance(h, bytes) and len(h) == size for h in r0.block_hashes)
    assert kv.get_computed_blocks(make_request("1", 0, prompt=prompt(range(9))))[1] == 8
    assert kv.get_computed_blocks(make_request("2", 0, prompt=prompt([0, 1, 2, 3, 4, 5, 6, 99, 8])))[1] == 4
    check_kv_invariants(kv)
