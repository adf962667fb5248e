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
) -> torch.Tensor:
    """Causal attention for a mixed batch, reading K/V only through block tables."""
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
        num_blocks = -(-seq_len // block_size)
        blocks = md.block_table[i, :num_blocks].long()
        k = kv_cache[0, blocks].reshape(-1, num_kv_heads, head_size)[:seq_len]
        v = kv_cache[1, blocks].reshape(-1, num_kv_heads, head_size)[:seq_len]
        k = k.float().repeat_interleave(group, dim=1)  # [L, H, D]
        v = v.float().repeat_interleave(group, dim=1)
        q = query[qs:qe].float()  # [nq, H, D]
        scores = torch.einsum("qhd,khd->hqk", q, k) * scale
        q_pos = torch.arange(ctx, seq_len, device=query.device)[:, None]
        k_pos = torch.arange(seq_len, device=query.device)[None, :]
        scores.masked_fill_(k_pos > q_pos, float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        out[qs:qe] = torch.einsum("hqk,khd->qhd", probs, v).to(query.dtype)
    return out


class TorchRefImpl(AttentionImpl):
    def forward(self, query, key, value, kv_cache, attn_metadata):
        write_kv(key, value, kv_cache, attn_metadata.slot_mapping)
        return paged_attention_ref(query, kv_cache, attn_metadata, self.scale)


class TorchRefBackend(StackedKVCacheBackend):
    name = "torch_ref"

    @classmethod
    def get_impl_cls(cls):
        return TorchRefImpl
