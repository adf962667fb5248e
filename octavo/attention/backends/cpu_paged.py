"""``cpu_paged``: octavo's C++ paged attention for CPUs (AVX-512 + bf16 dot, AVX2, NEON, scalar).

One kernel source (``csrc/cpu/kernels_impl.h``) built once per ISA; ``octavo.cpu_isa`` imports
the variant this CPU runs. Mixed batches (prefill chunks with a causal mask over cached + new
tokens, and decodes) read K/V only through the block table; the query heads that share a KV
head are processed together; online softmax with fp32 accumulation; bf16, fp16 and fp32
caches; work items (sequence, KV head, query tile) run on torch's OpenMP threads with the GIL
released.

KV cache layout per layer: ``[num_blocks, num_kv_heads, 2, block_size * head_size]``. The last
dimension is the (block, KV head) tile, K then V, in the kernels' private order: K transposed
(``[head_size/P, block_size, P]``) and V row-major (``[block_size/P, head_size, P]``) with
``P = 2`` for 16-bit caches (the two operands of one bf16 dot-product lane side by side) and
``P = 1`` for fp32. Chosen by measurement against a row-major K tile (see
``csrc/cpu/README.md``). The extension takes the tensors themselves, by keyword, and checks
dtypes, shapes, strides and index ranges once per call (``csrc/cpu/tensor_args.h``). Head sizes: multiples of 16
up to 512; block sizes: multiples of 16 from 16 to 256 (``validate`` says why otherwise, and
the platform falls back to ``torch_ref``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from octavo.attention.backend import (
    AttentionBackend,
    AttentionImpl,
    CommonAttentionMetadata,
    metadata_from_common,
)

MIN_BLOCK, MAX_BLOCK = 16, 256
MAX_HEAD = 512


@dataclass
class CpuPagedMetadata:
    """``CommonAttentionMetadata`` plus the int32/int64 contiguous tensors the kernels read."""

    common: CommonAttentionMetadata
    query_start_loc: torch.Tensor
    seq_lens: torch.Tensor
    block_table: torch.Tensor
    slot_mapping: torch.Tensor
    num_reqs: int
    num_actual_tokens: int
    max_query_len: int

    def __getattr__(self, name):  # anything else reads through to the common metadata
        if name == "common":
            raise AttributeError(name)
        return getattr(self.common, name)


def _i32(t: torch.Tensor) -> torch.Tensor:
    return t if t.dtype == torch.int32 and t.is_contiguous() else t.to(torch.int32).contiguous()


def build_cpu_metadata(common: CommonAttentionMetadata) -> CpuPagedMetadata:
    qsl = _i32(common.query_start_loc)
    seq_lens = _i32(common.seq_lens)
    bt = _i32(common.block_table)
    slots = common.slot_mapping
    if slots.dtype != torch.int64 or not slots.is_contiguous():
        slots = slots.to(torch.int64).contiguous()
    return metadata_from_common(
        CpuPagedMetadata,
        common,
        common=common,
        query_start_loc=qsl,
        seq_lens=seq_lens,
        block_table=bt,
        slot_mapping=slots,
    )


class CpuPagedImpl(AttentionImpl):
    supports_sliding_window = True
    supports_logits_soft_cap = True

    def __init__(
        self,
        num_heads: int,
        head_size: int,
        scale: float,
        num_kv_heads: int,
        sliding_window: int | None = None,
        logits_soft_cap: float | None = None,
    ) -> None:
        super().__init__(num_heads, head_size, float(scale), num_kv_heads, sliding_window, logits_soft_cap)
        self._window = int(self.sliding_window or 0)
        self._soft_cap = float(self.logits_soft_cap or 0.0)
        from octavo.cpu_isa import load_extension

        self._ext = load_extension()
        if num_heads % num_kv_heads:
            raise ValueError(f"num_heads {num_heads} is not a multiple of num_kv_heads {num_kv_heads}")

    def forward(self, query, key, value, kv_cache, attn_metadata):
        md = attn_metadata
        if torch.compiler.is_compiling():  # the CPU graph mode: one custom op in the graph
            return torch.ops.octavo.cpu_paged_attention(
                query, key, value, kv_cache, md.slot_mapping, md.query_start_loc, md.seq_lens,
                md.block_table, self.scale, self._window, self._soft_cap,
            )
        if md.__class__ is not CpuPagedMetadata:
            md = build_cpu_metadata(md)
        return write_kv_and_attend(
            self._ext, query, key, value, kv_cache, md.slot_mapping[: md.num_actual_tokens],
            md.query_start_loc, md.seq_lens, md.block_table, self.scale, self._window, self._soft_cap,
        )


def write_kv_and_attend(
    ext, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor,
    slot_mapping: torch.Tensor, query_start_loc: torch.Tensor, seq_lens: torch.Tensor,
    block_table: torch.Tensor, scale: float, sliding_window: int, soft_cap: float,
) -> torch.Tensor:
    """One layer's step in one extension call (eager and the graph mode's custom op): write the
    K/V of the first ``len(slot_mapping)`` tokens (the real ones), then attention of every query
    token; ``[T, H, D]`` in the cache dtype, rows past the real tokens (padding) zero. (The
    kernel writes a decode token's K/V in the work item that reads its block, so those cache
    lines come from memory once.) Inputs are only brought to the cache's dtype with a unit
    inner stride; the extension checks the rest."""
    dtype, D = kv_cache.dtype, query.shape[-1]
    if query.dtype != dtype or query.stride(-1) != 1 or query.stride(-2) != D:
        query = query.to(dtype).contiguous()
    if key.dtype != dtype or key.stride(-1) != 1:
        key = key.to(dtype).contiguous()
    if value.dtype != dtype or value.stride(-1) != 1:
        value = value.to(dtype).contiguous()
    n = slot_mapping.shape[0]
    out = torch.empty(query.shape, dtype=dtype)
    if query.shape[0] > n:
        out[n:].zero_()
    ext.paged_attention(
        query=query, out=out, kv_cache=kv_cache, query_start_loc=query_start_loc, seq_lens=seq_lens,
        block_table=block_table, scale=scale, sliding_window=sliding_window, soft_cap=soft_cap,
        key=key, value=value, slot_mapping=slot_mapping,
    )
    return out


class CpuPagedBackend(AttentionBackend):
    name = "cpu_paged"
    supported_dtypes: ClassVar[tuple[torch.dtype, ...]] = (torch.bfloat16, torch.float16, torch.float32)
    supported_kv_cache_dtypes: ClassVar[tuple[str, ...]] = ("auto",)

    @classmethod
    def extra_reasons(cls, head_size, dtype, kv_cache_dtype, block_size, platform) -> list[str]:
        from octavo import envs
        from octavo.cpu_isa import extension_unavailable_reason, select_variant

        if envs.OCTAVO_CPU_ISA:
            select_variant()  # a forced ISA this CPU lacks is an error, not a silent fallback
        reasons = []
        why = extension_unavailable_reason()
        if why:
            reasons.append(f"C++ CPU kernels unavailable: {why}")
        if head_size % 16 or not 16 <= head_size <= MAX_HEAD:
            reasons.append(f"head size {head_size} is not a multiple of 16 in [16, {MAX_HEAD}]")
        if block_size % 16 or not MIN_BLOCK <= block_size <= MAX_BLOCK:
            reasons.append(f"block size {block_size} is not a multiple of 16 in [{MIN_BLOCK}, {MAX_BLOCK}]")
        return reasons

    @staticmethod
    def get_kv_cache_shape(num_blocks, block_size, num_kv_heads, head_size):
        return (num_blocks, num_kv_heads, 2, block_size * head_size)

    @classmethod
    def build_metadata(cls, common: CommonAttentionMetadata) -> CpuPagedMetadata:
        return build_cpu_metadata(common)

    @classmethod
    def get_impl_cls(cls):
        return CpuPagedImpl


# -- helpers for tests and benchmarks ---------------------------------------------------------

def cache_from_reference(ref_cache: torch.Tensor) -> torch.Tensor:
    """Repack a ``torch_ref`` cache ``[2, nb, bs, Hk, D]`` into the ``cpu_paged`` layout."""
    _, nb, bs, hk, d = ref_cache.shape
    p = 2 if ref_cache.element_size() == 2 else 1
    k = ref_cache[0].permute(0, 2, 1, 3)  # [nb, Hk, bs, D]
    v = ref_cache[1].permute(0, 2, 1, 3)
    k = k.reshape(nb, hk, bs, d // p, p).permute(0, 1, 3, 2, 4)  # [nb, Hk, D/P, bs, P]
    v = v.reshape(nb, hk, bs // p, p, d).permute(0, 1, 2, 4, 3)  # [nb, Hk, bs/P, D, P]
    out = torch.stack([k.reshape(nb, hk, bs * d), v.reshape(nb, hk, bs * d)], dim=2)
    return out.contiguous()


def cache_to_reference(cache: torch.Tensor, head_size: int) -> torch.Tensor:
    """Inverse of :func:`cache_from_reference`: back to ``[2, nb, bs, Hk, D]``."""
    nb, hk, _, n = cache.shape
    d = head_size
    bs = n // d
    p = 2 if cache.element_size() == 2 else 1
    k = cache[:, :, 0]
    v = cache[:, :, 1]
    k = k.reshape(nb, hk, d // p, bs, p).permute(0, 1, 3, 2, 4)
    k = k.reshape(nb, hk, bs, d).permute(0, 2, 1, 3)
    v = v.reshape(nb, hk, bs // p, d, p).permute(0, 1, 2, 4, 3).reshape(nb, hk, bs, d).permute(0, 2, 1, 3)
    return torch.stack([k, v]).contiguous()
