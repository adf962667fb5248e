"""The contract every attention backend implements.

A backend
- declares the KV cache tensor shape for one layer given
  ``(num_blocks, block_size, num_kv_heads, head_size)``;
- says why it cannot run a configuration (``validate`` returns a list of reasons; empty = ok);
- builds its per-step metadata from the flattened batch (``CommonAttentionMetadata``);
- in ``forward``, first writes the new K/V of *every* token of the batch into the cache at the
  slot mapping, then computes causal attention of each request's query tokens over all of its
  cached + new tokens. Writing everything first is what lets a request read, in the same step,
  blocks that another request of the batch is filling (prefix hits on a block being computed).

Query token ``j`` of request ``i`` sits at absolute position ``seq_lens[i] - query_len_i + j``
and attends to key positions ``0 .. that position``.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from functools import cache
from typing import Any, ClassVar, Protocol, TypeVar

import numpy as np
import torch


@dataclass
class CommonAttentionMetadata:
    """The flattened batch, as every backend receives it.

    Device tensors: ``query_start_loc`` [B+1] int32, ``seq_lens`` [B] int32, ``block_table``
    [B, max_blocks] int32 (padded with the null block 0), ``slot_mapping`` [T] int64.
    Host copies (numpy) of the first two let reference code loop without a device sync.
    """

    query_start_loc: torch.Tensor
    seq_lens: torch.Tensor
    block_table: torch.Tensor
    slot_mapping: torch.Tensor
    query_start_loc_cpu: np.ndarray
    seq_lens_cpu: np.ndarray
    num_reqs: int
    num_actual_tokens: int
    max_query_len: int
    max_seq_len: int
    block_size: int


@dataclass
class KVGroupMetadata:
    """A step's attention metadata for a model with several KV cache groups
    (``octavo/core/kv_cache_groups.py``): ``groups[g]`` is the backend's metadata built from
    group ``g``'s block table and slot mapping (everything else is the same in all of them).
    Each attention layer reads the entry of its own group; a model with one group gets the
    backend's metadata itself, never this."""

    groups: list[Any]


_COMMON_FIELDS = frozenset(f.name for f in fields(CommonAttentionMetadata))

M = TypeVar("M")


@cache
def _shared_fields(metadata_cls: type) -> frozenset[str]:
    return frozenset(f.name for f in fields(metadata_cls) if f.init) & _COMMON_FIELDS


def metadata_from_common(
    metadata_cls: type[M], common: CommonAttentionMetadata, /, **extra: Any
) -> M:
    """Build a backend's metadata dataclass from the flattened batch.

    Every init field of ``metadata_cls`` that ``CommonAttentionMetadata`` also has takes the
    value of ``common`` by the same name (the same object: tensors are not copied or moved); the
    backend's own fields come from ``extra``, or from their defaults. A name given in ``extra``
    wins over ``common`` (e.g. a tensor converted to the dtype the kernel reads). The first two
    parameters are positional-only, so a backend may name a field ``common`` (``cpu_paged`` does).
    """
    shared = {name: getattr(common, name) for name in _shared_fields(metadata_cls) - extra.keys()}
    return metadata_cls(**shared, **extra)


class AttentionImpl:
    """Per-layer kernel wrapper. ``forward`` returns ``[T, num_heads, head_size]``.

    ``sliding_window`` (a query at position p sees keys ``(p - window, p]`` only; None: all
    earlier keys) and ``logits_soft_cap`` (scores become ``cap * tanh(score / cap)`` after
    scaling; None: no cap) are per layer. A backend that does not implement one says so at
    construction (``supports_*``), never by computing something else.
    """

    supports_sliding_window: ClassVar[bool] = False
    supports_logits_soft_cap: ClassVar[bool] = False
    # ``forward(..., kv_written=True)``: the caller already wrote this step's K/V at the slot
    # mapping (a RoPE launch that also writes the cache); only impls that say so accept it.
    supports_kv_written: ClassVar[bool] = False

    def __init__(
        self,
        num_heads: int,
        head_size: int,
        scale: float,
        num_kv_heads: int,
        sliding_window: int | None = None,
        logits_soft_cap: float | None = None,
    ) -> None:
        self.num_heads = num_heads
        self.head_size = head_size
        self.scale = scale
        self.num_kv_heads = num_kv_heads
        for value, ok, what in (
            (sliding_window, self.supports_sliding_window, "sliding-window attention"),
            (logits_soft_cap, self.supports_logits_soft_cap, "attention logit soft-capping"),
        ):
            if value and not ok:
                raise ValueError(
                    f"attention backend {type(self).__name__} does not implement {what}, which this "
                    "model needs; choose torch_ref, cpu_paged or triton_paged (OCTAVO_ATTENTION_BACKEND)"
                )
        self.sliding_window = sliding_window or None
        self.logits_soft_cap = logits_soft_cap or None

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        kv_cache: torch.Tensor,
        attn_metadata: Any,
    ) -> torch.Tensor:
        raise NotImplementedError


class PlatformView(Protocol):
    """What a backend may ask of the platform it is validated for.

    The platform layer passes itself (a ``Platform`` class) into ``validate``; backends never
    import a platform, so the attention layer stays below the platform layer.
    """

    name: str
    device_type: str

    def get_device_capability(self, device_id: int = 0) -> tuple[int, int] | None: ...


class AttentionBackend:
    name: ClassVar[str] = "abstract"
    # None: any device type; else the torch device types (``Platform.device_type``) it runs on.
    supported_device_types: ClassVar[tuple[str, ...] | None] = None
    supported_dtypes: ClassVar[tuple[torch.dtype, ...]] = (
        torch.float32,
        torch.float16,
        torch.bfloat16,
    )
    supported_kv_cache_dtypes: ClassVar[tuple[str, ...]] = ("auto",)
    # None: any head size / block size.
    supported_head_sizes: ClassVar[tuple[int, ...] | None] = None
    supported_block_sizes: ClassVar[tuple[int, ...] | None] = None

    @classmethod
    def validate(
        cls,
        head_size: int,
        dtype: torch.dtype,
        kv_cache_dtype: str,
        block_size: int,
        platform: PlatformView,
    ) -> list[str]:
        """Reasons this backend cannot run the configuration on ``platform`` (empty when it can)."""
        reasons = []
        types = cls.supported_device_types
        if types is not None and platform.device_type not in types:
            reasons.append(f"runs on {'/'.join(types)} devices, not {platform.device_type}")
        if dtype not in cls.supported_dtypes:
            reasons.append(f"dtype {dtype} not supported")
        if kv_cache_dtype not in cls.supported_kv_cache_dtypes:
            reasons.append(f"kv_cache_dtype {kv_cache_dtype!r} not supported on this backend")
        if cls.supported_head_sizes is not None and head_size not in cls.supported_head_sizes:
            reasons.append(f"head size {head_size} not in {list(cls.supported_head_sizes)}")
        if cls.supported_block_sizes is not None and block_size not in cls.supported_block_sizes:
            reasons.append(f"block size {block_size} not in {list(cls.supported_block_sizes)}")
        reasons.extend(cls.extra_reasons(head_size, dtype, kv_cache_dtype, block_size, platform))
        return reasons

    @classmethod
    def extra_reasons(
        cls, head_size: int, dtype: torch.dtype, kv_cache_dtype: str, block_size: int,
        platform: PlatformView,
    ) -> list[str]:
        """Backend-specific reasons (a missing package, a missing device capability)."""
        return []

    @staticmethod
    def get_kv_cache_shape(
        num_blocks: int, block_size: int, num_kv_heads: int, head_size: int
    ) -> tuple[int, ...]:
        raise NotImplementedError

    @classmethod
    def build_metadata(cls, common: CommonAttentionMetadata) -> Any:
        return common

    @classmethod
    def get_impl_cls(cls) -> type[AttentionImpl]:
        raise NotImplementedError


class StackedKVCacheBackend(AttentionBackend):
    """A backend whose per-layer cache is K and V stacked: ``[2, num_blocks, block_size,
    num_kv_heads, head_size]``.

    ``cache[0]`` holds K and ``cache[1]`` V; slot ``s`` of the slot mapping is row
    ``s % block_size`` of block ``s // block_size`` in both. ``torch_ref`` uses this layout, so
    every backend built on it can be checked against ``torch_ref`` on one cache tensor.
    """

    @staticmethod
    def get_kv_cache_shape(
        num_blocks: int, block_size: int, num_kv_heads: int, head_size: int
    ) -> tuple[int, ...]:
        return (2, num_blocks, block_size, num_kv_heads, head_size)
