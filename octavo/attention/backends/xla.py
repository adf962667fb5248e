"""``xla``: torch_xla's ragged paged attention (a Pallas kernel) on TPUs.

KV cache layout per layer: ``[num_blocks, block_size, 2 * num_kv_heads, head_size]`` with K and
V of each KV head interleaved (row ``2h`` is K of head ``h``, row ``2h + 1`` its V), the layout
``torch.ops.xla.ragged_paged_attention`` reads. One call per layer covers prefill chunks and
decodes together. Metadata stays on the device and its shapes depend only on the padded token
count and the request count, so XLA reuses one compiled graph per bucket.

torch_xla is optional (``octavo[tpu]``); nothing imports it until the backend is validated on a
machine that has it.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import ClassVar

import torch

from octavo.attention.backend import (
    AttentionBackend,
    AttentionImpl,
    CommonAttentionMetadata,
    metadata_from_common,
)
from octavo.utils import packages

TPU_HEAD_SIZE_ALIGNMENT = 128  # the kernel's lane width


@dataclass
class XlaMetadata:
    query_start_loc: torch.Tensor
    seq_lens: torch.Tensor
    block_table: torch.Tensor
    slot_mapping: torch.Tensor
    num_seqs: torch.Tensor  # [1] int32 on the device: the kernel reads it there
    num_actual_tokens: int


def write_kv_interleaved(
    key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor, slot_mapping: torch.Tensor
) -> None:
    """Scatter K/V of every token to its slot, K and V of each head interleaved."""
    _, _, num_combined_heads, head_size = kv_cache.shape
    kv = torch.cat([key, value], dim=-1).reshape(-1, num_combined_heads, head_size)
    kv_cache.flatten(0, 1).index_copy_(0, slot_mapping, kv.to(kv_cache.dtype))


class XlaImpl(AttentionImpl):
    def forward(self, query, key, value, kv_cache, attn_metadata: XlaMetadata):
        import torch_xla.experimental.custom_kernel  # noqa: F401  (registers torch.ops.xla.*)

        md = attn_metadata
        with contextlib.suppress(AttributeError):
            torch.ops.xla.dynamo_set_buffer_donor_(kv_cache, True)  # update the cache in place
        write_kv_interleaved(key, value, kv_cache, md.slot_mapping)
        return torch.ops.xla.ragged_paged_attention(
            query,
            kv_cache,
            md.seq_lens,
            md.block_table,
            md.query_start_loc,
            md.num_seqs,
            num_kv_pages_per_block=None,
            num_queries_per_block=None,
            vmem_limit_bytes=None,
            use_kernel=True,
            sm_scale=self.scale,
            sliding_window=None,
            soft_cap=None,
        )


class XlaBackend(AttentionBackend):
    name = "xla"
    supported_device_types: ClassVar[tuple[str, ...]] = ("xla",)
    supported_dtypes: ClassVar[tuple[torch.dtype, ...]] = (torch.bfloat16, torch.float32)

    @classmethod
    def extra_reasons(cls, head_size, dtype, kv_cache_dtype, block_size, platform):
        reasons = []
        if head_size % TPU_HEAD_SIZE_ALIGNMENT != 0:
            reasons.append(f"head size {head_size} is not a multiple of {TPU_HEAD_SIZE_ALIGNMENT}")
        if not packages.package_available("torch_xla"):
            reasons.append("package 'torch_xla' is not installed")
        elif not _has_ragged_kernel():
            reasons.append("this torch_xla has no ragged_paged_attention kernel (needs >= 2.7)")
        return reasons

    @staticmethod
    def get_kv_cache_shape(num_blocks, block_size, num_kv_heads, head_size):
        return (num_blocks, block_size, 2 * num_kv_heads, head_size)

    @classmethod
    def build_metadata(cls, common: CommonAttentionMetadata) -> XlaMetadata:
        num_seqs = torch.tensor([common.num_reqs], dtype=torch.int32, device=common.seq_lens.device)
        return metadata_from_common(XlaMetadata, common, num_seqs=num_seqs)

    @classmethod
    def get_impl_cls(cls):
        return XlaImpl


def _has_ragged_kernel() -> bool:
    try:
        from torch_xla.experimental import custom_kernel
    except Exception:
        return False
    return hasattr(custom_kernel, "ragged_paged_attention")
