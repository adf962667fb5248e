"""``triton_paged``: Triton paged attention for CUDA and ROCm (same kernels on both).

KV cache layout per layer: ``[2, num_blocks, block_size, num_kv_heads, head_size]``, as in
``torch_ref``, so the two backends can be checked against each other on one cache.

Per layer ``forward`` launches one KV-write kernel and one attention kernel over the whole
mixed batch (prefill chunks and decodes together); steps of decodes or short verify chunks with
few requests and long contexts take the split-KV variant (one more small merge launch, or the
merge inside the attention launch with ``paged_attention.FUSED_SPLIT_REDUCE``). A model may write
the K/V itself in an earlier launch (Qwen3's q/k norm + RoPE) and pass ``kv_written=True``.
Nothing here reads a device value on the host, so every launch can be captured in a CUDA/HIP
graph: the metadata's shapes depend only on (num tokens, num requests), and the split decision
only on static facts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from octavo.attention.backend import (
    AttentionImpl,
    CommonAttentionMetadata,
    StackedKVCacheBackend,
    metadata_from_common,
)
from octavo.attention.kv_cache_dtype import KV_CACHE_DTYPES

# Split-KV (flash-decoding) policy: split decode and speculative-verify steps (a few query
# tokens per request) whose (requests x KV heads) programs would leave most of the GPU idle,
# once contexts are long enough to pay for the reduction.
SPLIT_MIN_SEQ_LEN = 512
SPLIT_MAX_QUERY_LEN = 8
SPLIT_TARGET_PROGRAMS = 256
SPLIT_MAX_SEGMENTS = 16


def num_kv_segments(num_reqs: int, num_kv_heads: int, max_query_len: int, max_seq_len: int) -> int:
    if max_query_len > SPLIT_MAX_QUERY_LEN or max_seq_len < SPLIT_MIN_SEQ_LEN:
        return 1
    programs = num_reqs * num_kv_heads
    segments = 1
    while segments < SPLIT_MAX_SEGMENTS and programs * segments * 2 <= SPLIT_TARGET_PROGRAMS:
        segments *= 2
    return segments


@dataclass
class TritonPagedMetadata:
    query_start_loc: torch.Tensor
    seq_lens: torch.Tensor
    block_table: torch.Tensor
    slot_mapping: torch.Tensor
    num_reqs: int
    num_actual_tokens: int
    max_query_len: int
    max_seq_len: int
    # Split-KV partial buffers and arrival counters, shared by every layer of the step (layers
    # run in order; each launch leaves the counters zero, also in every graph replay).
    workspaces: dict[tuple, Any] = field(default_factory=dict)


class TritonPagedImpl(AttentionImpl):
    supports_sliding_window = True
    supports_logits_soft_cap = True
    supports_kv_written = True
    # An fp8 cache's per-layer scales (``octavo.attention.kv_cache_dtype``): the checkpoint's
    # (``octavo.models.kv_scales`` sets them on the layer's instance), else 1.0.
    k_scale = 1.0
    v_scale = 1.0

    def forward(self, query, key, value, kv_cache, attn_metadata: TritonPagedMetadata, kv_written: bool = False):
        from octavo.attention.ops.paged_attention import alloc_workspace, paged_attention, write_kv

        md = attn_metadata
        if not kv_written:  # else the caller wrote them (``supports_kv_written``)
            write_kv(key, value, kv_cache, md.slot_mapping, self.k_scale, self.v_scale)
        num_tokens = query.shape[0]
        out = torch.empty(
            (num_tokens, self.num_heads, self.head_size), dtype=query.dtype, device=query.device
        )
        segments = num_kv_segments(md.num_reqs, self.num_kv_heads, md.max_query_len, md.max_seq_len)
        workspace = None
        if segments > 1:
            key_ = (num_tokens, self.num_heads, self.head_size, segments)
            workspace = md.workspaces.get(key_)
            if workspace is None:
                workspace = md.workspaces[key_] = alloc_workspace(*key_, query.device)
        return paged_attention(
            query, kv_cache, out, md.query_start_loc, md.seq_lens, md.block_table,
            md.num_reqs, md.max_query_len, self.scale, segments, workspace,
            sliding_window=self.sliding_window, logits_soft_cap=self.logits_soft_cap,
            k_scale=self.k_scale, v_scale=self.v_scale,
        )


class TritonPagedBackend(StackedKVCacheBackend):
    name = "triton_paged"
    # Forward reads no device value on the host: safe to capture in a CUDA/HIP graph.
    supports_graph_capture = True
    # ... and its grid is a function of (tokens, rows) alone, every length read on the device: one
    # graph per padded token count serves any mix of prefill chunks and decodes.
    supports_mixed_graph_capture = True
    # CUDA and ROCm (whose torch device type is also "cuda"); CI runs the kernels on CPU
    # under TRITON_INTERPRET=1 by calling them directly.
    supported_device_types = ("cuda",)
    supported_block_sizes = (16, 32, 64, 128)
    supported_kv_cache_dtypes = KV_CACHE_DTYPES

    @classmethod
    def extra_reasons(cls, head_size, dtype, kv_cache_dtype, block_size, platform):
        reasons = []
        cap = None
        if kv_cache_dtype != "auto" and platform is not None:
            try:
                cap = platform.get_device_capability()
            except (RuntimeError, AssertionError):  # no device to ask (validation off the GPU)
                cap = None
        if cap is not None and tuple(cap) < (8, 9):
            reasons.append(f"an fp8 KV cache needs compute capability 8.9 or newer (this GPU: {cap[0]}.{cap[1]})")
        try:
            import triton  # noqa: F401
        except ImportError:
            reasons.append("triton is not installed (pip install 'octavo[cuda]')")
        if head_size % 8 != 0 or not 16 <= head_size <= 256:
            reasons.append(f"head size {head_size} is not a multiple of 8 in [16, 256]")
        return reasons

    @classmethod
    def build_metadata(cls, common: CommonAttentionMetadata) -> TritonPagedMetadata:
        return metadata_from_common(TritonPagedMetadata, common)

    @classmethod
    def get_impl_cls(cls):
        return TritonPagedImpl
