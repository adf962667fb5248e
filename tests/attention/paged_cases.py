"""Randomised paged batches for checking attention kernels against ``torch_ref``."""

from __future__ import annotations

import numpy as np
import torch

from octavo.attention.backend import CommonAttentionMetadata


def make_batch(
    seqs: list[tuple[int, int]],
    *,
    num_heads: int,
    num_kv_heads: int,
    head_size: int,
    block_size: int,
    dtype: torch.dtype,
    device: str | torch.device = "cpu",
    seed: int = 0,
    extra_blocks: int = 3,
):
    """``seqs``: (context_len, query_len) per request, in batch order.

    Blocks are drawn at random (never the null block 0); the whole cache starts random so a
    kernel reading a slot it should not would show. Returns (query, key, value, kv_cache, md).
    """
    g = torch.Generator().manual_seed(seed)
    rng = np.random.default_rng(seed)
    seq_lens = np.array([c + q for c, q in seqs], dtype=np.int64)
    q_lens = np.array([q for _, q in seqs], dtype=np.int64)
    blocks_per = [-(-int(s) // block_size) for s in seq_lens]
    num_blocks = 1 + sum(blocks_per) + extra_blocks
    perm = rng.permutation(np.arange(1, num_blocks))
    max_blocks = max(blocks_per) + 1
    block_table = np.zeros((len(seqs), max_blocks), dtype=np.int32)
    at = 0
    for i, n in enumerate(blocks_per):
        block_table[i, :n] = perm[at : at + n]
        at += n
    qsl = np.zeros(len(seqs) + 1, dtype=np.int64)
    qsl[1:] = np.cumsum(q_lens)
    total = int(qsl[-1])
    slots = []
    for i, (c, q) in enumerate(seqs):
        pos = np.arange(c, c + q)
        slots.append(block_table[i, pos // block_size].astype(np.int64) * block_size + pos % block_size)
    slot_mapping = np.concatenate(slots) if slots else np.zeros(0, dtype=np.int64)

    def rand(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float32).to(dtype).to(device)

    query = rand(total, num_heads, head_size)
    key = rand(total, num_kv_heads, head_size)
    value = rand(total, num_kv_heads, head_size)
    kv_cache = rand(2, num_blocks, block_size, num_kv_heads, head_size)
    dev = torch.device(device)
    md = CommonAttentionMetadata(
        query_start_loc=torch.from_numpy(qsl.astype(np.int32)).to(dev),
        seq_lens=torch.from_numpy(seq_lens.astype(np.int32)).to(dev),
        block_table=torch.from_numpy(block_table).to(dev),
        slot_mapping=torch.from_numpy(slot_mapping).to(dev),
        query_start_loc_cpu=qsl,
        seq_lens_cpu=seq_lens,
        num_reqs=len(seqs),
        num_actual_tokens=total,
        max_query_len=int(q_lens.max()),
        max_seq_len=int(seq_lens.max()),
        block_size=block_size,
    )
    return query, key, value, kv_cache, md


def reference(query, key, value, kv_cache, md, scale):
    """torch_ref on float64 copies: (output, cache after the write)."""
    from octavo.attention.backends.torch_ref import paged_attention_ref, write_kv

    cache = kv_cache.double().clone()
    write_kv(key.double(), value.double(), cache, md.slot_mapping)
    out = paged_attention_ref(query.double(), cache, md, scale)
    return out, cache


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double().cpu(), b.double().cpu()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))
