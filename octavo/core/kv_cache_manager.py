"""Per-request block bookkeeping on top of the BlockPool, one block list per KV cache group.

A model has one KV cache group (every layer reads the same blocks) unless it mixes attention
types; then each group is one type (full attention, or one sliding window) and a request holds
one block list per group, all drawn from the one shared pool (``core/kv_cache_groups.py`` says
how layers map to groups and memory). In each list, entry ``i`` holds the KV of token positions
``[i * block_size, (i + 1) * block_size)``. Contract:
- ``get_computed_blocks(req)`` finds the longest prefix of *full* blocks whose KV is cached in
  every group, capped so at least the last known token is recomputed (there must be logits to
  sample); it changes nothing but the request's own hash list. A full-attention group needs
  every block of the prefix; a sliding-window group only those its first query can see (the
  rest become null blocks), as vLLM's sliding-window hit search does. Skipped (no hit) when
  caching is off or the request wants prompt logprobs (those positions must be computed).
- ``record_prefix_cache_query(req, n_hit)`` counts a lookup once, when the scheduler admits
  the request (a lookup for a request that then could not be admitted is not counted).
- ``allocate_slots(req, n, hits, n_hit)`` either makes room for ``n`` more tokens after the
  computed ones in every group (attaching hit blocks first) and returns the new blocks per
  group, or returns ``None`` and changes nothing (not even hit blocks' ref counts) except
  freeing blocks behind a window, which nothing reads again.
- ``free(req)`` releases each group's blocks in reverse order, so a request's tail is evicted
  before the prefix it may share with others.
- In a group with sliding window W, ``allocate_slots`` first frees the request's blocks that
  lie wholly before the window of its next query (positions ``< p - W + 1`` for the first new
  position ``p``): nothing reads them again. Their place in the request's list becomes the
  null block, so list index = block index still holds; they keep their hashes (prefix hits
  stay valid until evicted). A request then holds at most ``W / block_size + 1`` blocks in that
  group between decode steps.
- Cached blocks are indexed by hash in group 0 and by hash + group id in the others, so a hit
  never hands one group's block to another.
"""

from __future__ import annotations

from collections.abc import Sequence

from octavo.core.block_hash import BlockHash, extend_block_hashes, get_hash_function
from octavo.core.block_pool import BlockPool, KVCacheBlock
from octavo.core.kv_cache_groups import max_request_tokens
from octavo.core.request import Request

# Per group, one list of blocks (what get_computed_blocks and allocate_slots hand around).
GroupBlocks = list[list[KVCacheBlock]]


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def group_key(block_hash: BlockHash, group: int) -> BlockHash:
    """The prefix-cache key of a block of ``group`` (group 0: the hash itself)."""
    return block_hash if group == 0 else block_hash + group.to_bytes(2, "little")


class KVCacheManager:
    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        enable_caching: bool = True,
        hash_algo: str = "sha256",
        sliding_window: int | None = None,
        group_windows: Sequence[int | None] | None = None,
        max_chunk_tokens: int | None = None,
    ) -> None:
        """``group_windows``: the window of each KV cache group (None = full attention); the
        default is one group with ``sliding_window``. ``max_chunk_tokens``: the most tokens
        one request computes in one step (the scheduler's budget), which bounds what a
        sliding-window group holds during a prefill; only several groups need it."""
        self.block_size = block_size
        self.group_windows: tuple[int | None, ...] = (
            (sliding_window,) if group_windows is None else tuple(w or None for w in group_windows)
        )
        if not self.group_windows:
            raise ValueError("a KV cache needs at least one group")
        self.num_groups = len(self.group_windows)
        # One full-attention group: a running request's decode usually fits its last block
        # (``allocate_slots``' fast path).
        self._plain = self.group_windows == (None,)
        self.sliding_window = self.group_windows[0] if self.num_groups == 1 else None
        self.max_chunk_tokens = max_chunk_tokens
        self.enable_caching = enable_caching
        self.block_pool = BlockPool(num_blocks)
        self.hash_fn = get_hash_function(hash_algo)
        # Per request: one block list per group.
        self.req_to_blocks: dict[str, GroupBlocks] = {}
        # Per request and group: how many leading blocks are already registered in the index.
        self.num_cached_blocks: dict[str, list[int]] = {}
        # Prefix cache statistics, counted in tokens.
        self.prefix_cache_queries = 0
        self.prefix_cache_hits = 0

    @property
    def num_usable_blocks(self) -> int:
        return self.block_pool.num_blocks - 1

    @property
    def max_num_tokens(self) -> int:
        """The longest sequence one request can hold alone in the pool (no request ever needs
        more): every usable block with one group; see ``max_request_tokens`` for several."""
        return max_request_tokens(self.num_usable_blocks, self.block_size, self.group_windows, self.max_chunk_tokens)

    @property
    def usage(self) -> float:
        return self.block_pool.get_usage()

    def _update_hashes(self, request: Request) -> None:
        extend_block_hashes(
            request.block_hashes,
            request.all_token_ids,
            self.block_size,
            request.cache_salt,
            self.hash_fn,
            request.kv_key,
        )

    def get_computed_blocks(self, request: Request) -> tuple[GroupBlocks, int]:
        """Return (hit blocks per group, number of hit tokens) for a request holding none."""
        if not self.enable_caching or request.sampling_params.prompt_logprobs is not None:
            return [[] for _ in self.group_windows], 0
        self._update_hashes(request)
        # Never hit the block holding the last token: it must be recomputed for logits.
        num_hit = min((request.num_tokens - 1) // self.block_size, len(request.block_hashes))
        hashes = request.block_hashes
        while True:  # each group may shorten the hit; stop when all groups agree
            n = num_hit
            for g, window in enumerate(self.group_windows):
                n = self._group_hit(hashes, n, g, window)
            if n == num_hit or self.num_groups == 1:
                num_hit = n
                break
            num_hit = n
        hits = [self._hit_blocks(hashes, num_hit, g, w) for g, w in enumerate(self.group_windows)]
        return hits, num_hit * self.block_size

    def _first_visible_block(self, num_tokens: int, window: int | None) -> int:
        """The first block the query at position ``num_tokens`` reads through ``window``."""
        return 0 if window is None else max(0, num_tokens - window + 1) // self.block_size

    def _group_hit(self, hashes: Sequence[BlockHash], limit: int, group: int, window: int | None) -> int:
        """The longest hit (in blocks, <= ``limit``) whose visible blocks ``group`` caches."""
        cached = self.block_pool.get_cached_block
        if window is None:
            for i in range(limit):
                if cached(group_key(hashes[i], group)) is None:
                    return i
            return limit
        run = 0  # cached blocks in a row ending at block i
        runs = []
        for i in range(limit):
            run = run + 1 if cached(group_key(hashes[i], group)) is not None else 0
            runs.append(run)
        for n in range(limit, 0, -1):
            if runs[n - 1] >= n - self._first_visible_block(n * self.block_size, window):
                return n
        return 0

    def _hit_blocks(self, hashes: Sequence[BlockHash], num_hit: int, group: int, window: int | None) -> list[KVCacheBlock]:
        first = self._first_visible_block(num_hit * self.block_size, window)
        cached = self.block_pool.get_cached_block
        hit = [cached(group_key(hashes[i], group)) for i in range(first, num_hit)]
        return [self.block_pool.null_block] * first + hit  # type: ignore[list-item]

    def record_prefix_cache_query(self, request: Request, num_hit_tokens: int) -> None:
        """Count one admitted lookup: ``num_tokens`` queried, ``num_hit_tokens`` served."""
        if self.enable_caching and request.sampling_params.prompt_logprobs is None:
            self.prefix_cache_queries += request.num_tokens
            self.prefix_cache_hits += num_hit_tokens

    def allocate_slots(
        self,
        request: Request,
        num_new_tokens: int,
        new_computed_blocks: Sequence[Sequence[KVCacheBlock]] = (),
        num_new_computed_tokens: int = 0,
    ) -> GroupBlocks | None:
        """New blocks per group for ``num_new_tokens`` more tokens, or None (see the module)."""
        if num_new_tokens <= 0:
            raise ValueError("num_new_tokens must be positive")
        rid = request.request_id
        held = self.req_to_blocks.get(rid)
        if held is not None and self._plain and not new_computed_blocks:
            total_tokens = request.num_computed_tokens + num_new_tokens
            if total_tokens <= len(held[0]) * self.block_size:  # room in the blocks held
                if self.enable_caching:
                    self._cache_full_blocks(request, held, self.num_cached_blocks[rid], total_tokens)
                return [[]]
        if held is not None:
            for g, window in enumerate(self.group_windows):
                if window:
                    self._free_outside_window(request, held[g], window)
        groups = held if held is not None else [[] for _ in self.group_windows]
        hits = new_computed_blocks or [()] * self.num_groups
        total_tokens = request.num_computed_tokens + num_new_computed_tokens + num_new_tokens
        num_required = cdiv(total_tokens, self.block_size)
        need = [max(0, num_required - len(groups[g]) - len(hits[g])) for g in range(self.num_groups)]
        # Hit blocks that sit in the free queue are not available for new allocations.
        null = self.block_pool.null_block
        num_revived = sum(1 for hit in hits for b in hit if b.ref_cnt == 0 and b is not null)
        if sum(need) > self.block_pool.get_num_free_blocks() - num_revived:
            return None

        self.req_to_blocks[rid] = groups
        cached = self.num_cached_blocks.setdefault(rid, [0] * self.num_groups)
        for g in range(self.num_groups):  # every hit is taken before any block is popped
            if hits[g]:
                self.block_pool.touch(b for b in hits[g] if b is not null)
                groups[g].extend(hits[g])
                cached[g] = len(groups[g])
        new_blocks = [self.block_pool.get_new_blocks(n) if n else [] for n in need]
        for g, new in enumerate(new_blocks):
            groups[g].extend(new)
        if self.enable_caching:
            self._cache_full_blocks(request, groups, cached, total_tokens)
        return new_blocks

    def _cache_full_blocks(self, request: Request, groups: GroupBlocks, cached: list[int], total_tokens: int) -> None:
        """Register the blocks that become full this step (their KV is computed in the step in
        flight, before any later step can read them through a hit)."""
        num_full = min(total_tokens, request.num_tokens) // self.block_size
        if num_full <= min(cached):
            return
        self._update_hashes(request)
        null = self.block_pool.null_block
        for g, blocks in enumerate(groups):
            for i in range(cached[g], num_full):
                if blocks[i] is not null:  # freed behind a window before it was registered
                    self.block_pool.cache_full_block(blocks[i], group_key(request.block_hashes[i], g))
            cached[g] = max(cached[g], num_full)

    def _free_outside_window(self, request: Request, blocks: list[KVCacheBlock], window: int) -> None:
        """Free the held blocks wholly before the window of the request's next query."""
        num_skipped = min(self._first_visible_block(request.num_computed_tokens, window), len(blocks))
        null = self.block_pool.null_block
        freed = []
        for i in range(num_skipped - 1, -1, -1):  # later blocks first: the prefix is evicted last
            if blocks[i] is null:
                break  # everything before it was freed earlier
            freed.append(blocks[i])
            blocks[i] = null
        if freed:
            self.block_pool.free_blocks(freed)

    def num_held_blocks(self, request_id: str, group: int | None = None) -> int:
        """Real blocks a request holds in ``group`` (None: all groups; the null placeholders
        of freed ones not counted)."""
        null = self.block_pool.null_block
        groups = self.req_to_blocks.get(request_id, ())
        if group is not None:
            groups = groups[group : group + 1]
        return sum(1 for blocks in groups for b in blocks if b is not null)

    def free(self, request: Request) -> None:
        groups = self.req_to_blocks.pop(request.request_id, None)
        self.num_cached_blocks.pop(request.request_id, None)
        if groups:
            null = self.block_pool.null_block
            for blocks in groups:
                self.block_pool.free_blocks(b for b in reversed(blocks) if b is not null)

    def get_block_ids(self, request_id: str) -> list[list[int]]:
        """Block ids per group (empty lists for a request holding none)."""
        groups = self.req_to_blocks.get(request_id)
        if groups is None:
            return [[] for _ in self.group_windows]
        return [[b.block_id for b in blocks] for blocks in groups]

    def reset_prefix_cache(self) -> bool:
        return self.block_pool.reset_prefix_cache()

    @property
    def prefix_cache_hit_rate(self) -> float:
        return self.prefix_cache_hits / self.prefix_cache_queries if self.prefix_cache_queries else 0.0
