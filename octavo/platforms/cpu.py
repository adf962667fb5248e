"""The CPU platform: host memory for the KV cache, gloo, no graphs."""

from __future__ import annotations

import os
import platform as _platform
from typing import ClassVar

import torch

from octavo import envs
from octavo.platforms.interface import Platform

GiB = 1 << 30


class CpuPlatform(Platform):
    name = "cpu"
    device_type = "cpu"
    _supported_dtypes: ClassVar[tuple[torch.dtype, ...]] = (torch.bfloat16, torch.float32, torch.float16)
    attn_backend_priority = ("torch_ref",)
    graph_capture = "none"
    communicator = "gloo"
    dist_backend = "gloo"
    default_block_size = 16

    @classmethod
    def is_available(cls) -> bool:
        return True

    @classmethod
    def get_device_name(cls, device_id: int = 0) -> str:
        try:
            with open("/proc/cpuinfo") as f:
                for line in f:
                    if line.startswith("model name"):
                        return line.split(":", 1)[1].strip()
        except OSError:
            pass
        return _platform.processor() or _platform.machine()

    @classmethod
    def get_device_total_memory(cls, device_id: int = 0) -> int:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")

    @classmethod
    def mem_get_info(cls, device_id: int = 0) -> tuple[int, int]:
        total = cls.get_device_total_memory()
        free = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")
        return free, total

    @classmethod
    def kv_cache_memory_bytes(cls, config, model_bytes: int, peak_bytes: int) -> int:
        space = config.cache_config.cpu_kvcache_space_bytes
        return space if space is not None else int(envs.OCTAVO_CPU_KVCACHE_SPACE * GiB)

    @classmethod
    def check_and_update_config(cls, config):
        config = super().check_and_update_config(config)
        from dataclasses import replace

        if config.cache_config.cpu_kvcache_space_bytes is None:
            space = int(envs.OCTAVO_CPU_KVCACHE_SPACE * GiB)
            if space <= 0:
                raise ValueError(f"OCTAVO_CPU_KVCACHE_SPACE must be > 0 GiB, got {envs.OCTAVO_CPU_KVCACHE_SPACE}")
            config = config.replace(cache_config=replace(config.cache_config, cpu_kvcache_space_bytes=space))
        return config
