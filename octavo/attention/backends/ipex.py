"""``ipex``: Intel Extension for PyTorch's paged attention (Intel GPUs, also Intel CPUs).

KV cache layout per layer: ``[2, num_blocks, block_size, num_kv_heads, head_size]`` (K then V),
the "flash" layout IPEX's ``PagedAttention.reshape_and_cache_flash`` writes and its
``flash_attn_varlen_func`` reads through block tables, for prefill chunks and decodes in one
call. IPEX is optional (``pip install intel-extension-for-pytorch``); nothing imports it until
``forward`` runs, and without it the XPU platform falls through to ``triton_paged``.
"""

from __future__ import annotations

from typing import ClassVar

import torch

from octavo.attention.backend import AttentionImpl, CommonAttentionMetadata, StackedKVCacheBackend
from octavo.attention.backends.flash_attn import VarlenMetadata, build_varlen_metadata
from octavo.utils import packages


class IpexImpl(AttentionImpl):
    def forward(self, query, key, value, kv_cache, attn_metadata: VarlenMetadata):
        import intel_extension_for_pytorch as ipex

        md = attn_metadata
        paged = ipex.llm.modules.PagedAttention
        key_cache, value_cache = kv_cache[0], kv_cache[1]
        paged.reshape_and_cache_flash(key, value, key_cache, value_cache, md.slot_mapping)
        out = torch.empty_like(query)
        paged.flash_attn_varlen_func(
            out,
            query.contiguous(),
            key_cache,
            value_cache,
            md.query_start_loc,
            md.cu_seqlens_k,
            md.max_query_len,
            md.max_seq_len,
            self.scale,
            True,  # causal, aligned to the end of each sequence
            md.block_table,
            None,  # alibi slopes
        )
        return out


class IpexBackend(StackedKVCacheBackend):
    name = "ipex"
    supported_device_types: ClassVar[tuple[str, ...]] = ("xpu", "cpu")
    supported_dtypes: ClassVar[tuple[torch.dtype, ...]] = (torch.float16, torch.bfloat16)
    supported_block_sizes: ClassVar[tuple[int, ...] | None] = (16, 32, 64, 128, 256)

    @classmethod
    def extra_reasons(cls, head_size, dtype, kv_cache_dtype, block_size, platform):
        reasons = []
        if not packages.package_available("intel_extension_for_pytorch"):
            reasons.append("package 'intel_extension_for_pytorch' is not installed")
        if head_size % 8 != 0 or head_size > 256:
            reasons.append(f"head size {head_size} is not a multiple of 8 up to 256")
        return reasons

    @classmethod
    def build_metadata(cls, common: CommonAttentionMetadata) -> VarlenMetadata:
        return build_varlen_metadata(common)

    @classmethod
    def get_impl_cls(cls):
        return IpexImpl
