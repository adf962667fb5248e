"""``DummyPlatform``: the host CPU presented as a separate platform, every member spelled out.

It is what a vendor's platform file looks like: detection, the explicit device operations,
capabilities and choices, against octavo's platform API 1.x.
"""

from __future__ import annotations

import os
from typing import ClassVar

import torch

from octavo.platforms.interface import Platform


class DummyPlatform(Platform):
    name = "dummy"
    device_type = "cpu"
    api_version = "1.0"
    _supported_dtypes: ClassVar[tuple[torch.dtype, ...]] = (torch.float32, torch.bfloat16)
    supported_block_sizes: ClassVar[tuple[int, ...]] = (8, 16, 32)
    default_block_size = 16
    attn_backend_priority = ("octavo_dummy_platform.attention.DummyAttentionBackend",)
    graph_capture = "none"
    graph_capture_reason = "the dummy accelerator runs eagerly"
    communicator = "gloo"
    communicator_reason = "the dummy accelerator shares host memory"
    dist_backend = "gloo"
    KV_CACHE_BYTES: ClassVar[int] = 64 << 20

    @classmethod
    def unavailable_reason(cls) -> str | None:
        return None

    @classmethod
    def device_count(cls) -> int:
        return 1

    @classmethod
    def get_device_name(cls, device_id: int = 0) -> str:
        return "Dummy Accelerator (host CPU)"

    @classmethod
    def get_device_total_memory(cls, device_id: int = 0) -> int:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")

    @classmethod
    def mem_get_info(cls, device_id: int | None = None) -> tuple[int, int]:
        total = cls.get_device_total_memory()
        return min(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES"), total), total

    @classmethod
    def manual_seed(cls, seed: int) -> None:
        torch.manual_seed(seed)

    @classmethod
    def kv_cache_memory_bytes(cls, config, model_bytes: int, peak_bytes: int) -> int:
        return cls.KV_CACHE_BYTES

    @classmethod
    def describe(cls) -> dict[str, str]:
        return {"device": cls.get_device_name(), "kv cache": f"{cls.KV_CACHE_BYTES >> 20} MiB"}
