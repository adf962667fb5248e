"""KV cache groups: which layers share one block list per request.

A model whose layers all attend the same way (all full attention, or all through one sliding
window) has one group: every layer reads the same blocks. A model that mixes full and
sliding-window layers (Gemma 2/3, Qwen2 with ``max_window_layers``) has several groups, one
attention type each, so a sliding-window group can free the blocks behind its window while a
full-attention group keeps them all (vLLM's hybrid KV cache manager does the same).

Layout: every group has the same number of layer slots ``num_kv_tensors`` (groups of one type
split into chunks of that size; a last, shorter chunk leaves slots unused). KV memory is
``num_kv_tensors`` tensors of ``num_blocks`` pages each; tensor ``j`` backs slot ``j`` of every
group, so block ``b`` is one page in each tensor and means a different thing in each group
(each block is held by at most one group at a time). Memory per block is therefore
``num_kv_tensors`` layer pages, not ``num_layers``.

The chunk size is the layer count of the rarest type, or of the most common one when the counts
are within 25% of each other (then fewer groups cost less than the padding): Gemma 2's
alternating layers make two groups of ``num_layers / 2``; Gemma 3's 5:1 pattern makes one full
group and five sliding groups of ``num_layers / 6`` layers each.
"""

from __future__ import annotations

from collections.abc import Sequence

from octavo.config import KVCacheGroupSpec

__all__ = ["KVCacheGroupSpec", "layer_slots", "make_kv_cache_groups", "max_request_tokens", "num_kv_tensors"]


def make_kv_cache_groups(layer_windows: Sequence[int | None]) -> tuple[KVCacheGroupSpec, ...]:
    """Groups for per-layer windows (``None`` = full attention), in order of first appearance."""
    if not layer_windows:
        raise ValueError("a model needs at least one attention layer")
    by_type: dict[int | None, list[int]] = {}
    for i, w in enumerate(layer_windows):
        by_type.setdefault(w, []).append(i)
    if len(by_type) == 1:
        (w, layers), = by_type.items()
        return (KVCacheGroupSpec(w, tuple(layers)),)
    counts = [len(v) for v in by_type.values()]
    size = max(counts) if max(counts) * 4 < min(counts) * 5 else min(counts)
    return tuple(
        KVCacheGroupSpec(w, tuple(layers[i : i + size]))
        for w, layers in by_type.items()
        for i in range(0, len(layers), size)
    )


def max_request_tokens(
    num_usable_blocks: int, block_size: int, group_windows: Sequence[int | None], max_chunk_tokens: int | None
) -> int:
    """The longest sequence one request can hold alone in ``num_usable_blocks`` blocks shared
    by groups with these windows, at any step: each full-attention group needs a block per
    ``block_size`` tokens, each windowed group at most its window plus one step's chunk
    (``max_chunk_tokens``; None: a whole sequence in one chunk)."""
    if len(group_windows) == 1:
        return num_usable_blocks * block_size

    def worst_case_blocks(num_tokens: int) -> int:
        n = -(-num_tokens // block_size)
        chunk = max_chunk_tokens or num_tokens
        return sum(n if w is None else min(n, (chunk + w + 2 * block_size - 3) // block_size) for w in group_windows)

    lo, hi = 0, num_usable_blocks * block_size
    while lo < hi:  # the largest length whose worst step fits
        mid = (lo + hi + 1) // 2
        if worst_case_blocks(mid) <= num_usable_blocks:
            lo = mid
        else:
            hi = mid - 1
    return lo


def num_kv_tensors(groups: Sequence[KVCacheGroupSpec]) -> int:
    """KV tensors the groups share positionally (the most layers any group has)."""
    return max(len(g.layers) for g in groups)


def layer_slots(groups: Sequence[KVCacheGroupSpec], num_layers: int) -> list[tuple[int, int]]:
    """Per layer: (its group, its slot = the KV tensor it reads and writes)."""
    out: list[tuple[int, int] | None] = [None] * num_layers
    for g, spec in enumerate(groups):
        for slot, layer in enumerate(spec.layers):
            out[layer] = (g, slot)
    missing = [i for i, s in enumerate(out) if s is None]
    if missing:
        raise ValueError(f"KV cache groups leave layers {missing} without a cache")
    return out  # type: ignore[return-value]
