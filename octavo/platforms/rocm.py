"""AMD GPUs through a ROCm (HIP) build of torch: Triton attention, HIP graphs, RCCL.

HIP builds expose AMD devices as ``torch.cuda`` with the ``cuda`` device type, so device
operations come from ``CudaLikePlatform``; what differs is detection (``torch.version.hip``) and
the choices. torch names RCCL's process-group backend "nccl".
"""

from __future__ import annotations

import os
from typing import ClassVar

import torch

from octavo.platforms import cuda as _cuda
from octavo.platforms.cuda import CudaLikePlatform


def _probe_arch(device_id: int = 0) -> str:
    """The gfx architecture (e.g. gfx942); initialises HIP, so only after selection."""
    return getattr(torch.cuda.get_device_properties(device_id), "gcnArchName", "unknown")


class RocmPlatform(CudaLikePlatform):
    name = "rocm"
    _supported_dtypes: ClassVar[tuple[torch.dtype, ...]] = (torch.bfloat16, torch.float16, torch.float32)
    attn_backend_priority = ("triton_paged", "torch_ref")
    graph_capture = "hip_graph"
    graph_capture_reason = "HIP graphs (torch.cuda.CUDAGraph on ROCm) replay decode steps (mixed steps too with OCTAVO_MIXED_GRAPHS=1)"
    communicator = "rccl"
    communicator_reason = "RCCL over Infinity Fabric / PCIe"
    dist_backend = "nccl"  # torch's name for the RCCL process group

    @classmethod
    def unavailable_reason(cls) -> str | None:
        if not _cuda._probe_hip_version():
            return "this torch is not a ROCm build (torch.version.hip is None)"
        if _cuda._probe_device_count() == 0:
            visible = os.environ.get("HIP_VISIBLE_DEVICES") or os.environ.get("ROCR_VISIBLE_DEVICES")
            where = f" (HIP_VISIBLE_DEVICES={visible!r})" if visible is not None else ""
            return f"no AMD GPU is visible{where}"
        return None

    @classmethod
    def get_device_name(cls, device_id: int = 0) -> str:
        return torch.cuda.get_device_name(device_id)  # NVML does not know AMD devices

    @classmethod
    def get_device_capability(cls, device_id: int = 0) -> tuple[int, int] | None:
        return torch.cuda.get_device_capability(device_id)

    @classmethod
    def get_device_total_memory(cls, device_id: int = 0) -> int:
        return torch.cuda.get_device_properties(device_id).total_memory

    @classmethod
    def describe(cls) -> dict[str, str]:
        return {
            "device": f"{cls.get_device_name()} ({_probe_arch()})",
            "device count": str(cls.device_count()),
            "hip": str(_cuda._probe_hip_version()),
        }
