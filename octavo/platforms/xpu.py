"""Intel GPUs through PyTorch's native ``torch.xpu``: IPEX paged attention when installed.

IPEX (``intel_extension_for_pytorch``) is optional: without it the platform runs Triton's
XPU backend or the reference. Collectives use torch's native ``xccl`` process group where the
build has it, else oneCCL's ``ccl`` from ``oneccl_bindings_for_pytorch``.
"""

from __future__ import annotations

import contextlib
from typing import ClassVar

import torch

from octavo.platforms.interface import Choice
from octavo.platforms.torch_device import TorchDevicePlatform
from octavo.utils import packages


# -- probes (replaced by tests that simulate other machines) ----------------------------------
def _probe_device_count() -> int:
    xpu = getattr(torch, "xpu", None)
    if xpu is None:
        return 0
    return xpu.device_count()


def _probe_has_torch_xpu() -> bool:
    return hasattr(torch, "xpu") and torch.xpu._is_compiled()


def _probe_bf16_supported() -> bool:
    return torch.xpu.is_bf16_supported()


def _probe_xccl_available() -> bool:
    import torch.distributed as dist

    return bool(getattr(dist, "is_xccl_available", lambda: False)())


class XpuPlatform(TorchDevicePlatform):
    name = "xpu"
    device_type = "xpu"
    auto_casts_float32 = True
    _supported_dtypes: ClassVar[tuple[torch.dtype, ...]] = (torch.bfloat16, torch.float16, torch.float32)
    supported_block_sizes: ClassVar[tuple[int, ...]] = (16, 32, 64, 128, 256)
    default_block_size = 16
    attn_backend_priority = ("ipex", "triton_paged", "torch_ref")
    graph_capture = "none"
    graph_capture_reason = "XPU runs eagerly (octavo captures no XPU graphs)"
    communicator = "xccl"
    communicator_reason = "torch's native XCCL process group"
    dist_backend = "xccl"

    @classmethod
    def torch_module(cls):
        return torch.xpu

    @classmethod
    def unavailable_reason(cls) -> str | None:
        if not _probe_has_torch_xpu():
            return f"this torch build has no XPU support (torch {torch.__version__})"
        if _probe_device_count() == 0:
            return "no Intel GPU is visible (torch.xpu.device_count() == 0)"
        return None

    @classmethod
    def supported_dtypes(cls) -> tuple[torch.dtype, ...]:
        if _probe_bf16_supported():
            return cls._supported_dtypes
        return (torch.float16, torch.float32)

    @classmethod
    def get_communicator(cls) -> Choice:
        if _probe_xccl_available():
            return Choice("xccl", cls.communicator_reason)
        if packages.package_available("oneccl_bindings_for_pytorch"):
            return Choice("ccl", "oneCCL bindings (this torch has no native xccl)")
        return Choice(
            "xccl",
            "not in this torch build; install oneccl_bindings_for_pytorch for tensor parallelism",
        )

    @classmethod
    def get_dist_backend(cls) -> str:
        """``xccl``, or ``ccl`` (registered by ``import oneccl_bindings_for_pytorch``)."""
        return cls.get_communicator().value

    # -- device operations --------------------------------------------------------------
    @classmethod
    def device_count(cls) -> int:
        return _probe_device_count()

    @classmethod
    def get_device_name(cls, device_id: int = 0) -> str:
        return torch.xpu.get_device_name(device_id)

    @classmethod
    def get_device_total_memory(cls, device_id: int = 0) -> int:
        return torch.xpu.get_device_properties(device_id).total_memory

    @classmethod
    def mem_get_info(cls, device_id: int | None = None) -> tuple[int, int]:
        if hasattr(torch.xpu, "mem_get_info"):
            free, total = torch.xpu.mem_get_info(device_id)
            return int(free), int(total)
        index = torch.xpu.current_device() if device_id is None else device_id
        total = cls.get_device_total_memory(index)
        return total - torch.xpu.memory_reserved(index), total

    @classmethod
    def describe(cls) -> dict[str, str]:
        info = {"device": cls.get_device_name(), "device count": str(cls.device_count())}
        ipex = "installed" if packages.package_available("intel_extension_for_pytorch") else "not installed"
        info["ipex"] = ipex
        with contextlib.suppress(Exception):
            info["driver"] = str(torch.xpu.get_device_properties(0).driver_version)
        return info
