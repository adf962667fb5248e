"""``flash_attn``: FlashAttention-2's varlen kernel reading the paged KV cache (CUDA, sm80+).

KV cache layout per layer: ``[2, num_blocks, block_size, num_kv_heads, head_size]`` (K then V),
which is exactly the paged layout flash-attn reads (``k_cache[num_blocks, page_size, kv_heads,
head_dim]``) and the same as ``torch_ref``. One ``flash_attn_varlen_func`` call per layer covers
the whole mixed batch: its causal mask is aligned to the bottom-right corner, which is what a
prefill chunk or a decode token after cached context needs.

Upstream FlashAttention-2 reads a paged cache only when the page size is divisible by 256, so
this backend runs with ``--block-size 256``; with smaller blocks the CUDA platform falls
through to ``triton_paged`` and says why. The package is optional: nothing imports
``flash_attn`` until ``forward`` runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from octavo.attention.backend import (
    AttentionImpl,
    CommonAttentionMetadata,
    StackedKVCacheBackend,
    metadata_from_common,
)
from octavo.attention.backends.torch_ref import write_kv
from octavo.utils import packages


@dataclass
class VarlenMetadata:
    """The flattened batch plus ``cu_seqlens_k`` [B+1] int32, as varlen kernels take it."""

    query_start_loc: torch.Tensor
    cu_seqlens_k: torch.Tensor
    seq_lens: torch.Tensor
    block_table: torch.Tensor
    slot_mapping: torch.Tensor
    num_reqs: int
    num_actual_tokens: int
    max_query_len: int
    max_seq_len: int


def build_varlen_metadata(common: CommonAttentionMetadata) -> VarlenMetadata:
    """Adds the cumulative key lengths; stays on the device (no host sync)."""
    cu_seqlens_k = torch.nn.functional.pad(torch.cumsum(common.seq_lens, 0, dtype=torch.int32), (1, 0))
    return metadata_from_common(VarlenMetadata, common, cu_seqlens_k=cu_seqlens_k)


class FlashAttnImpl(AttentionImpl):
    def forward(self, query, key, value, kv_cache, attn_metadata: VarlenMetadata):
        from flash_attn import flash_attn_varlen_func

        md = attn_metadata
        write_kv(key, value, kv_cache, md.slot_mapping)
        return flash_attn_varlen_func(
            query,
            kv_cache[0],
            kv_cache[1],
            cu_seqlens_q=md.query_start_loc,
            cu_seqlens_k=md.cu_seqlens_k,
            max_seqlen_q=md.max_query_len,
            max_seqlen_k=md.max_seq_len,
            softmax_scale=self.scale,
            causal=True,
            block_table=md.block_table,
        )


class FlashAttnBackend(StackedKVCacheBackend):
    name = "flash_attn"
    supported_device_types: ClassVar[tuple[str, ...]] = ("cuda",)
    supported_dtypes: ClassVar[tuple[torch.dtype, ...]] = (torch.float16, torch.bfloat16)
    supported_block_sizes: ClassVar[tuple[int, ...] | None] = (256,)
    MIN_CAPABILITY: ClassVar[tuple[int, int]] = (8, 0)

    @classmethod
    def validate(cls, head_size, dtype, kv_cache_dtype, block_size, platform):
        reasons = super().validate(head_size, dtype, kv_cache_dtype, block_size, platform)
        return [
            "FlashAttention-2's paged KV cache needs a block size divisible by 256 "
            f"(got {block_size}; pass --block-size 256)"
            if r.startswith("block size") else r
            for r in reasons
        ]

    @classmethod
    def extra_reasons(cls, head_size, dtype, kv_cache_dtype, block_size, platform):
        reasons = []
        if not packages.package_available("flash_attn"):
            reasons.append("package 'flash_attn' is not installed")
        if head_size % 8 != 0 or head_size > 256:
            reasons.append(f"head size {head_size} is not a multiple of 8 up to 256")
        if platform.name != "cuda":  # ROCm shares the "cuda" device type, not FlashAttention-2
            reasons.append(f"needs an NVIDIA GPU (the platform is {platform.name})")
        else:
            cap = platform.get_device_capability() or (0, 0)
            if cap < cls.MIN_CAPABILITY:
                reasons.append(
                    f"needs compute capability >= {cls.MIN_CAPABILITY[0]}.{cls.MIN_CAPABILITY[1]}, "
                    f"this GPU has {cap[0]}.{cap[1]}"
                )
        return reasons

    @classmethod
    def build_metadata(cls, common: CommonAttentionMetadata) -> VarlenMetadata:
        return build_varlen_metadata(common)

    @classmethod
    def get_impl_cls(cls):
        return FlashAttnImpl
