"""``torch_ref``: the readable reference backend, pure torch, any device.

KV cache layout per layer: ``[2, num_blocks, block_size, num_kv_heads, head_size]`` (K then V).
Each request's keys are gathered through its block table and attention runs in float32 with an
explicit causal mask. Slow by design; every other backend is tested against it.
"""

from __future__ import annotations

import torch

from octavo.attention.backend import AttentionImpl, CommonAttentionMetadata, StackedKVCacheBackend


def write_kv(
    key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor, slot_mapping: torch.Tensor
) -> None:
    """Scatter K/V of every token into its slot (``block_id * block_size + offset``)."""
    _, _, _, num_kv_heads, head_size = kv_cache.shape
    k_flat = kv_cache[0].view(-1, num_kv_heads, head_size)
    v_flat = kv_cache[1].view(-1, num_kv_heads, head_size)
    k_flat.index_copy_(0, slot_mapping, key.to(kv_cache.dtype))
    v_flat.index_copy_(0, slot_mapping, value.to(kv_cache.dtype))


def paged_attention_ref(
    query: torch.Tensor,
    kv_cache: torch.Tensor,
    md: CommonAttentionMetadata,
    scale: float,
    sliding_window: int | None = None,
    logits_soft_cap: float | None = None,
) -> torch.Tensor:
    """Causal attention for a mixed batch, reading K/V only through block tables.

    With ``sliding_window`` a query at position p sees keys ``(p - window, p]``; blocks wholly
    before the first query's window are not read (their table entries may be stale).
    """
    num_tokens, num_heads, head_size = query.shape
    block_size = kv_cache.shape[2]
    num_kv_heads = kv_cache.shape[3]
    group = num_heads // num_kv_heads
    out = torch.empty_like(query)
    qsl = md.query_start_loc_cpu
    for i in range(md.num_reqs):
        qs, qe = int(qsl[i]), int(qsl[i + 1])
        if qe == qs:
            continue
        seq_len = int(md.seq_lens_cpu[i])
        ctx = seq_len - (qe - qs)
        first = max(0, ctx - sliding_window + 1) // block_size if sliding_window else 0
        k0 = first * block_size  # absolute position of the first gathered key
        num_blocks = -(-seq_len // block_size)
        blocks = md.block_table[i, first:num_blocks].long()
        k = kv_cache[0, blocks].reshape(-1, num_kv_heads, head_size)[: seq_len - k0]
        v = kv_cache[1, blocks].reshape(-1, num_kv_heads, head_size)[: seq_len - k0]
        k = k.float().repeat_interleave(group, dim=1)  # [L, H, D]
        v = v.float().repeat_interleave(group, dim=1)
        q = query[qs:qe].float()  # [nq, H, D]
        scores = torch.einsum("qhd,khd->hqk", q, k) * scale
        if logits_soft_cap:
            scores = torch.tanh(scores / logits_soft_cap) * logits_soft_cap
        q_pos = torch.arange(ctx, seq_len, device=query.device)[:, None]
        k_pos = torch.arange(k0, seq_len, device=query.device)[None, :]
        hidden = k_pos > q_pos
        if sliding_window:
            hidden |= k_pos <= q_pos - sliding_window
        scores.masked_fill_(hidden, float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        out[qs:qe] = torch.einsum("hqk,khd->qhd", probs, v).to(query.dtype)
    return out


class TorchRefImpl(AttentionImpl):
    supports_sliding_window = True
    supports_logits_soft_cap = True

    def forward(self, query, key, value, kv_cache, attn_metadata):
        write_kv(key, value, kv_cache, attn_metadata.slot_mapping)
        return paged_attention_ref(
            query, kv_cache, attn_metadata, self.scale, self.sliding_window, self.logits_soft_cap
        )


class TorchRefBackend(StackedKVCacheBackend):
    name = "torch_ref"

    @classmethod
    def get_impl_cls(cls):
        return TorchRefImpl
