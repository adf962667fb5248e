"""The Platform interface: what the hardware-agnostic engine asks of a kind of hardware.

Every member is a classmethod or class attribute: platforms are stateless answers. Heavy
vendor modules are named by qualified class path and imported only once the platform is chosen.
Plugins build against ``api_version``; a plugin whose major version differs is refused.
"""

from __future__ import annotations

import contextlib
import logging
import random
from typing import TYPE_CHECKING, ClassVar

import torch

if TYPE_CHECKING:
    from octavo.attention.backend import AttentionBackend
    from octavo.config import OctavoConfig

logger = logging.getLogger(__name__)

PLATFORM_API_VERSION = "1.0"


class Platform:
    name: ClassVar[str] = "abstract"
    device_type: ClassVar[str] = "cpu"  # torch device type string
    api_version: ClassVar[str] = PLATFORM_API_VERSION
    # The first entry is what dtype="auto" picks when the checkpoint's dtype is unsupported.
    _supported_dtypes: ClassVar[tuple[torch.dtype, ...]] = (torch.float32,)
    supported_kv_cache_dtypes: ClassVar[tuple[str, ...]] = ("auto",)
    default_block_size: ClassVar[int] = 16
    supported_block_sizes: ClassVar[tuple[int, ...]] = (1, 2, 4, 8, 16, 32, 64, 128, 256)
    # Attention backends by priority: registered names or qualified class paths.
    attn_backend_priority: ClassVar[tuple[str, ...]] = ("torch_ref",)
    graph_capture: ClassVar[str] = "none"
    communicator: ClassVar[str] = "gloo"
    dist_backend: ClassVar[str] = "gloo"

    # -- detection ----------------------------------------------------------------------
    @classmethod
    def is_available(cls) -> bool:
        """Cheap probe; never initialises a device context."""
        raise NotImplementedError

    # -- device operations --------------------------------------------------------------
    @classmethod
    def device_count(cls) -> int:
        return 1

    @classmethod
    def get_device_name(cls, device_id: int = 0) -> str:
        return cls.name

    @classmethod
    def get_device_total_memory(cls, device_id: int = 0) -> int:
        raise NotImplementedError

    @classmethod
    def mem_get_info(cls, device_id: int = 0) -> tuple[int, int]:
        """(free, total) bytes available to the KV cache and weights on the device."""
        raise NotImplementedError

    @classmethod
    def set_device(cls, device: torch.device) -> None:
        pass

    @classmethod
    def synchronize(cls) -> None:
        pass

    @classmethod
    def empty_cache(cls) -> None:
        pass

    @classmethod
    def manual_seed(cls, seed: int) -> None:
        torch.manual_seed(seed)

    @classmethod
    def seed_everything(cls, seed: int) -> None:
        random.seed(seed)
        try:
            import numpy as np

            np.random.seed(seed)
        except ImportError:  # pragma: no cover
            pass
        cls.manual_seed(seed)

    @classmethod
    def is_pin_memory_available(cls) -> bool:
        return False

    @classmethod
    def inference_mode(cls):
        return torch.inference_mode()

    @classmethod
    def device(cls, index: int = 0) -> torch.device:
        return torch.device(cls.device_type, index) if cls.device_type != "cpu" else torch.device("cpu")

    # -- capabilities -------------------------------------------------------------------
    @classmethod
    def supported_dtypes(cls) -> tuple[torch.dtype, ...]:
        return cls._supported_dtypes

    @classmethod
    def resolve_auto_dtype(cls, checkpoint_dtype: torch.dtype | None) -> torch.dtype:
        supported = cls.supported_dtypes()
        if checkpoint_dtype in supported:
            return checkpoint_dtype
        return supported[0]

    # -- choices ------------------------------------------------------------------------
    @classmethod
    def attn_backend_candidates(cls) -> tuple[str, ...]:
        return cls.attn_backend_priority

    @classmethod
    def get_attn_backend(
        cls,
        head_size: int,
        dtype: torch.dtype,
        kv_cache_dtype: str,
        block_size: int,
        forced: str | None = None,
    ) -> tuple[type[AttentionBackend], dict[str, list[str]]]:
        """Return (backend class, {skipped backend: reasons}).

        Walks the priority list and takes the first candidate that reports no reason it cannot
        run. ``forced`` (or ``OCTAVO_ATTENTION_BACKEND``) picks one; if it cannot run, raise
        ValueError listing its reasons.
        """
        from octavo import envs

        forced = forced or envs.OCTAVO_ATTENTION_BACKEND
        if forced:
            backend = _load_backend(forced)
            if isinstance(backend, str):
                raise ValueError(f"attention backend {forced!r} cannot be loaded: {backend}")
            reasons = backend.validate(head_size, dtype, kv_cache_dtype, block_size)
            if reasons:
                raise ValueError(
                    f"attention backend {forced!r} cannot run on {cls.name} with head size "
                    f"{head_size}, dtype {dtype}, kv cache {kv_cache_dtype}, block size "
                    f"{block_size}: " + "; ".join(reasons)
                )
            return backend, {}
        skipped: dict[str, list[str]] = {}
        for name in cls.attn_backend_candidates():
            backend = _load_backend(name)
            if isinstance(backend, str):
                skipped[name] = [backend]
                continue
            reasons = backend.validate(head_size, dtype, kv_cache_dtype, block_size)
            if not reasons:
                for n, r in skipped.items():
                    logger.info("attention backend %s skipped: %s", n, "; ".join(r))
                return backend, skipped
            skipped[name] = reasons
        detail = "; ".join(f"{n}: {', '.join(r)}" for n, r in skipped.items())
        raise ValueError(f"no attention backend of {cls.name} can run this model ({detail})")

    @classmethod
    def check_and_update_config(cls, config: OctavoConfig) -> OctavoConfig:
        """The single hook for platform policy; returns a (possibly replaced) config."""
        bs = config.cache_config.block_size
        if bs not in cls.supported_block_sizes:
            raise ValueError(
                f"--block-size (block_size) {bs} is not supported on {cls.name}; "
                f"supported: {list(cls.supported_block_sizes)}"
            )
        kvd = config.cache_config.kv_cache_dtype
        if kvd not in cls.supported_kv_cache_dtypes:
            raise ValueError(
                f"--kv-cache-dtype (kv_cache_dtype) {kvd!r} is not supported on {cls.name}; "
                f"supported: {list(cls.supported_kv_cache_dtypes)}"
            )
        return config

    @classmethod
    def kv_cache_memory_bytes(cls, config: OctavoConfig, model_bytes: int, peak_bytes: int) -> int:
        """Bytes the KV cache may take, given weights and peak activation bytes."""
        free, total = cls.mem_get_info()
        budget = int(total * config.cache_config.gpu_memory_utilization) - (total - free) - peak_bytes
        return max(budget, 0)

    @classmethod
    def describe(cls) -> dict[str, str]:
        """Facts for ``octavo info`` (extended by each platform)."""
        return {"device": cls.get_device_name()}

    @classmethod
    def stream_context(cls):
        return contextlib.nullcontext()


def _load_backend(name: str):
    from octavo.attention.backends import resolve_backend

    try:
        return resolve_backend(name)
    except ImportError as e:
        return f"not importable ({e})"
    except (ValueError, AttributeError) as e:
        return str(e)
