"""Device operations shared by platforms whose torch backend module follows torch's device API.

``torch.cuda`` (CUDA, and ROCm builds of torch) and ``torch.xpu`` offer the same calls for
setting the device, synchronizing, seeding, events and allocator statistics. A platform names
its module once (``torch_module``); the calls below are then written once.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import torch

from octavo.platforms.interface import Platform


class TorchDevicePlatform(Platform):
    """A platform driving its devices through one ``torch.<backend>`` module."""

    @classmethod
    def torch_module(cls) -> ModuleType:
        """``torch.cuda`` or ``torch.xpu``: resolved at call time (never at import)."""
        raise NotImplementedError(f"{cls.__name__} must name its torch device module")

    @classmethod
    def set_device(cls, device: torch.device) -> None:
        cls.torch_module().set_device(device)

    @classmethod
    def synchronize(cls) -> None:
        cls.torch_module().synchronize()

    @classmethod
    def empty_cache(cls) -> None:
        cls.torch_module().empty_cache()

    @classmethod
    def manual_seed(cls, seed: int) -> None:
        torch.manual_seed(seed)
        cls.torch_module().manual_seed_all(seed)  # queued until the device initialises

    @classmethod
    def is_pin_memory_available(cls) -> bool:
        return True

    @classmethod
    def new_event(cls, timing: bool = False) -> Any:
        return cls.torch_module().Event(enable_timing=timing)

    @classmethod
    def supports_memory_profiling(cls) -> bool:
        return True

    @classmethod
    def memory_allocated(cls, device: torch.device) -> int:
        return cls.torch_module().memory_allocated(device)

    @classmethod
    def max_memory_allocated(cls, device: torch.device) -> int:
        return cls.torch_module().max_memory_allocated(device)

    @classmethod
    def reset_peak_memory_stats(cls, device: torch.device) -> None:
        cls.torch_module().reset_peak_memory_stats(device)
