"""Per-request block bookkeeping on top of the BlockPool.

For each running request the manager keeps the ordered list of its blocks; block ``i`` holds
the KV of token positions ``[i * block_size, (i + 1) * block_size)``. Contract:
- ``get_computed_blocks(req)`` finds the longest prefix of *full* blocks already cached,
  capped so at least the last known token is recomputed (there must be logits to sample);
  it changes nothing but the request's own hash list. Skipped (no hit) when caching is off
  or the request wants prompt logprobs (those positions must be computed).
- ``record_prefix_cache_query(req, n_hit)`` counts a lookup once, when the scheduler admits
  the request (a lookup for a request that then could not be admitted is not counted).
- ``allocate_slots(req, n, hits, n_hit)`` either makes room for ``n`` more tokens after the
  computed ones (attaching hit blocks first) and returns the new blocks, or returns ``None``
  and changes nothing at all (not even hit blocks' ref counts).
- ``free(req)`` releases the blocks in reverse order, so a request's tail is evicted before
  the prefix it may share with others.
- With ``sliding_window`` W (every layer windowed), ``allocate_slots`` first frees the
  request's blocks that lie wholly before the window of its next query (positions
  ``< p - W + 1`` for the first new position ``p``): nothing reads them again. Their place in
  the request's list becomes the null block, so list index = block index still holds; they
  keep their hashes (prefix hits stay valid until evicted). A request then holds at most
  ``W / block_size + 1`` blocks between decode steps.
"""

from __future__ import annotations

from collections.abc import Sequence

from octavo.core.block_hash import extend_block_hashes, get_hash_function
from octavo.core.block_pool import BlockPool, KVCacheBlock
from octavo.core.request import Request


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


class KVCacheManager:
    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        enable_caching: bool = True,
        hash_algo: str = "sha256",
        sliding_window: int | None = None,
    ) -> None:
        self.block_size = block_size
        self.sliding_window = sliding_window
        self.enable_caching = enable_caching
        self.block_pool = BlockPool(num_blocks)
        self.hash_fn = get_hash_function(hash_algo)
        self.req_to_blocks: dict[str, list[KVCacheBlock]] = {}
        # How many leading blocks of each request are already registered in the hash index.
        self.num_cached_blocks: dict[str, int] = {}
        # Prefix cache statistics, counted in tokens.
        self.prefix_cache_queries = 0
        self.prefix_cache_hits = 0

    @property
    def num_usable_blocks(self) -> int:
        return self.block_pool.num_blocks - 1

    @property
    def max_num_tokens(self) -> int:
        """Tokens the whole pool can hold: no single request can ever hold more KV than this."""
        return self.num_usable_blocks * self.block_size

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

    def get_computed_blocks(self, request: Request) -> tuple[list[KVCacheBlock], int]:
        """Return (hit blocks, number of hit tokens) for a request that holds no blocks."""
        if not self.enable_caching or request.sampling_params.prompt_logprobs is not None:
            return [], 0
        self._update_hashes(request)
        # Never hit the block holding the last token: it must be recomputed for logits.
        max_hit_blocks = (request.num_tokens - 1) // self.block_size
        hits: list[KVCacheBlock] = []
        for h in request.block_hashes[:max_hit_blocks]:
            b = self.block_pool.get_cached_block(h)
            if b is None:
                break
            hits.append(b)
        return hits, len(hits) * self.block_size

    def record_prefix_cache_query(self, request: Request, num_hit_tokens: int) -> None:
        """Count one admitted lookup: ``num_tokens`` queried, ``num_hit_tokens`` served."""
        if self.enable_caching and request.sampling_params.prompt_logprobs is None:
            self.prefix_cache_queries += request.num_tokens
            self.prefix_cache_hits += num_hit_tokens

    def allocate_slots(
        self,
        request: Request,
        num_new_tokens: int,
        new_computed_blocks: Sequence[KVCacheBlock] = (),
        num_new_computed_tokens: int = 0,
    ) -> list[KVCacheBlock] | None:
        if num_new_tokens <= 0:
            raise ValueError("num_new_tokens must be positive")
        if self.sliding_window:
            self._free_outside_window(request)
        req_blocks = self.req_to_blocks.setdefault(request.request_id, [])
        total_tokens = request.num_computed_tokens + num_new_computed_tokens + num_new_tokens
        num_required = cdiv(total_tokens, self.block_size)
        num_new_blocks = num_required - len(req_blocks) - len(new_computed_blocks)
        # Hit blocks that sit in the free queue are not available for new allocations.
        num_revived = sum(1 for b in new_computed_blocks if b.ref_cnt == 0)
        if num_new_blocks > self.block_pool.get_num_free_blocks() - num_revived:
            if not req_blocks:
                del self.req_to_blocks[request.request_id]
            return None

        if new_computed_blocks:
            self.block_pool.touch(new_computed_blocks)
            req_blocks.extend(new_computed_blocks)
            self.num_cached_blocks[request.request_id] = len(req_blocks)
        new_blocks = self.block_pool.get_new_blocks(num_new_blocks) if num_new_blocks > 0 else []
        req_blocks.extend(new_blocks)

        if self.enable_caching:
            # Register blocks that become full this step (their KV is computed in the step
            # in flight, before any later step can read them through a hit).
            num_known = min(total_tokens, request.num_tokens)
            num_full = num_known // self.block_size
            start = self.num_cached_blocks.get(request.request_id, 0)
            if num_full > start:
                self._update_hashes(request)
                for i in range(start, num_full):
                    self.block_pool.cache_full_block(req_blocks[i], request.block_hashes[i])
                self.num_cached_blocks[request.request_id] = num_full
        return new_blocks

    def _free_outside_window(self, request: Request) -> None:
        """Free the held blocks wholly before the window of the request's next query."""
        blocks = self.req_to_blocks.get(request.request_id)
        if not blocks:
            return
        assert self.sliding_window is not None
        first_visible = request.num_computed_tokens - self.sliding_window + 1
        num_skipped = min(max(0, first_visible) // self.block_size, len(blocks))
        null = self.block_pool.null_block
        freed = []
        for i in range(num_skipped - 1, -1, -1):  # later blocks first: the prefix is evicted last
            if blocks[i] is null:
                break  # everything before it was freed earlier
            freed.append(blocks[i])
            blocks[i] = null
        if freed:
            self.block_pool.free_blocks(freed)

    def num_held_blocks(self, request_id: str) -> int:
        """Real blocks a request holds (the null placeholders of freed ones not counted)."""
        null = self.block_pool.null_block
        return sum(1 for b in self.req_to_blocks.get(request_id, ()) if b is not null)

    def free(self, request: Request) -> None:
        blocks = self.req_to_blocks.pop(request.request_id, None)
        self.num_cached_blocks.pop(request.request_id, None)
        if blocks:
            null = self.block_pool.null_block
            self.block_pool.free_blocks(b for b in reversed(blocks) if b is not null)

    def get_block_ids(self, request_id: str) -> list[int]:
        return [b.block_id for b in self.req_to_blocks.get(request_id, ())]

    def reset_prefix_cache(self) -> bool:
        return self.block_pool.reset_prefix_cache()

    @property
    def prefix_cache_hit_rate(self) -> float:
        return self.prefix_cache_hits / self.prefix_cache_queries if self.prefix_cache_queries else 0.0
