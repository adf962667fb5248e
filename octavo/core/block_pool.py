"""KV cache blocks, the free queue (which is also the LRU eviction order), and the pool.

Invariants (checked after every step by tests/core/test_scheduler_property.py, and in
tests/core/test_prefix_caching.py):
- a block is in the free queue iff its ``ref_cnt == 0`` (the null block is in neither);
- ``cached_block_hash_to_block[h].block_hash == h`` for every entry;
- a block with a hash keeps it while free, so it can be revived by a prefix hit; the hash is
  dropped only when the block is popped from the queue for reuse (eviction).
"""

from __future__ import annotations

from collections.abc import Iterable

from octavo.core.block_hash import BlockHash


class KVCacheBlock:
    __slots__ = ("block_id", "ref_cnt", "block_hash", "prev_free_block", "next_free_block")

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        self.ref_cnt = 0
        self.block_hash: BlockHash | None = None
        self.prev_free_block: KVCacheBlock | None = None
        self.next_free_block: KVCacheBlock | None = None

    def __repr__(self) -> str:
        return f"KVCacheBlock(id={self.block_id}, ref={self.ref_cnt}, hash={self.block_hash})"


class FreeBlockQueue:
    """Intrusive doubly linked list of free blocks: O(1) pop-left, append and remove-any.

    Allocation pops from the head; freed blocks are appended at the tail. The head is therefore
    the least recently freed block, which makes eviction of cached blocks LRU.
    """

    def __init__(self, blocks: list[KVCacheBlock]) -> None:
        self._head = KVCacheBlock(-1)
        self._tail = KVCacheBlock(-1)
        self.num_free_blocks = len(blocks)
        prev = self._head
        for b in blocks:
            prev.next_free_block = b
            b.prev_free_block = prev
            prev = b
        prev.next_free_block = self._tail
        self._tail.prev_free_block = prev

    def popleft(self) -> KVCacheBlock:
        b = self._head.next_free_block
        if b is self._tail or b is None:
            raise ValueError("no free blocks left")
        self.remove(b)
        return b

    def remove(self, b: KVCacheBlock) -> None:
        prev, nxt = b.prev_free_block, b.next_free_block
        if prev is None or nxt is None:
            raise RuntimeError(f"{b} is not in the free queue")
        prev.next_free_block = nxt
        nxt.prev_free_block = prev
        b.prev_free_block = b.next_free_block = None
        self.num_free_blocks -= 1

    def append(self, b: KVCacheBlock) -> None:
        last = self._tail.prev_free_block
        assert last is not None
        last.next_free_block = b
        b.prev_free_block = last
        b.next_free_block = self._tail
        self._tail.prev_free_block = b
        self.num_free_blocks += 1

    def __iter__(self):
        b = self._head.next_free_block
        while b is not None and b is not self._tail:
            yield b
            b = b.next_free_block


class BlockPool:
    """Owns every block. Block 0 is the null block: never allocated, used for padding."""

    def __init__(self, num_blocks: int) -> None:
        if num_blocks < 2:
            raise ValueError(f"the KV cache needs at least 2 blocks, got {num_blocks}")
        self.num_blocks = num_blocks
        self.blocks = [KVCacheBlock(i) for i in range(num_blocks)]
        self.free_block_queue = FreeBlockQueue(self.blocks)
        self.cached_block_hash_to_block: dict[BlockHash, KVCacheBlock] = {}
        self.null_block = self.free_block_queue.popleft()
        # Cached blocks whose hash was dropped to reuse them (prefix-cache evictions).
        self.num_evictions = 0

    # -- lookup -------------------------------------------------------------------------
    def get_cached_block(self, block_hash: BlockHash) -> KVCacheBlock | None:
        return self.cached_block_hash_to_block.get(block_hash)

    # -- allocation ---------------------------------------------------------------------
    def get_num_free_blocks(self) -> int:
        return self.free_block_queue.num_free_blocks

    def get_new_blocks(self, num_blocks: int) -> list[KVCacheBlock]:
        """Pop ``num_blocks`` from the head of the free queue, evicting their cached hashes."""
        if num_blocks > self.get_num_free_blocks():
            raise ValueError(f"cannot get {num_blocks} free blocks from the pool")
        out = []
        for _ in range(num_blocks):
            b = self.free_block_queue.popleft()
            if b.block_hash is not None:
                self._evict(b)
            b.ref_cnt = 1
            out.append(b)
        return out

    def _evict(self, b: KVCacheBlock) -> None:
        if self.cached_block_hash_to_block.get(b.block_hash) is b:
            del self.cached_block_hash_to_block[b.block_hash]
        b.block_hash = None
        self.num_evictions += 1

    def touch(self, blocks: Iterable[KVCacheBlock]) -> None:
        """Take a reference on blocks found by a prefix hit, reviving free ones."""
        for b in blocks:
            if b.ref_cnt == 0 and b is not self.null_block:
                self.free_block_queue.remove(b)
            b.ref_cnt += 1

    def free_blocks(self, ordered_blocks: Iterable[KVCacheBlock]) -> None:
        """Drop one reference each; blocks reaching 0 go to the tail in the given order."""
        for b in ordered_blocks:
            b.ref_cnt -= 1
            assert b.ref_cnt >= 0, f"double free of {b}"
            if b.ref_cnt == 0:
                self.free_block_queue.append(b)

    def cache_full_block(self, block: KVCacheBlock, block_hash: BlockHash) -> None:
        """Record that ``block`` holds the KV identified by ``block_hash``.

        If another block already holds that hash (two requests computed the same prefix
        concurrently), the index keeps the first; the second stays usable but unindexed.
        """
        if block.block_hash is not None:
            return
        block.block_hash = block_hash
        self.cached_block_hash_to_block.setdefault(block_hash, block)

    def reset_prefix_cache(self) -> bool:
        """Forget every cached hash. Refused (returns False) while any block is held."""
        if self.get_num_free_blocks() != self.num_blocks - 1:
            return False
        for b in self.blocks:
            b.block_hash = None
        self.cached_block_hash_to_block.clear()
        return True

    def get_usage(self) -> float:
        """Fraction of usable blocks that are held by requests (0.0 when idle)."""
        usable = self.num_blocks - 1
        return 1.0 - self.get_num_free_blocks() / usable
