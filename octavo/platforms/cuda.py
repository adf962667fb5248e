"""NVIDIA GPUs through ``torch.cuda``: flash-attn or Triton attention, CUDA graphs, NCCL.

Detection never creates a CUDA context: ``torch.cuda.device_count()`` asks NVML when pynvml is
importable (and the driver otherwise), and the compute capability and device name come from NVML
while CUDA is still uninitialised, so the API process can probe and then fork workers safely.
The module-level ``_probe_*`` functions are the only places that look at the machine; tests
simulate other machines by replacing them.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable
from typing import Any, ClassVar

import torch

from octavo.platforms.torch_device import TorchDevicePlatform

logger = logging.getLogger(__name__)


# -- probes (replaced by tests that simulate other machines) ----------------------------------
def _probe_hip_version() -> str | None:
    return getattr(torch.version, "hip", None)


def _probe_cuda_version() -> str | None:
    return getattr(torch.version, "cuda", None)


def _probe_device_count() -> int:
    """Visible devices; NVML-based in torch when pynvml imports, never a context."""
    return torch.cuda.device_count()


def _physical_index(device_id: int) -> int | None:
    """NVML index of logical device ``device_id`` under CUDA_VISIBLE_DEVICES (None: unknown)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return device_id
    items = [v.strip() for v in visible.split(",") if v.strip()]
    if device_id < len(items) and items[device_id].isdigit():
        return int(items[device_id])
    return None  # UUIDs / MIG ids: leave it to torch


def _nvml_query(device_id: int, fn: Callable[[Any, Any], Any]) -> Any:
    """Run ``fn(pynvml, handle)`` for a device, or return None when NVML cannot answer."""
    try:
        import pynvml
    except ImportError:
        return None
    index = _physical_index(device_id)
    if index is None:
        return None
    try:
        pynvml.nvmlInit()
    except Exception:
        return None
    try:
        return fn(pynvml, pynvml.nvmlDeviceGetHandleByIndex(index))
    except Exception:
        return None
    finally:
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()


def _probe_capability(device_id: int = 0) -> tuple[int, int]:
    if not torch.cuda.is_initialized():
        cap = _nvml_query(device_id, lambda nv, h: nv.nvmlDeviceGetCudaComputeCapability(h))
        if cap is not None:
            return int(cap[0]), int(cap[1])
    return torch.cuda.get_device_capability(device_id)


def _probe_device_name(device_id: int = 0) -> str:
    if not torch.cuda.is_initialized():
        name = _nvml_query(device_id, lambda nv, h: nv.nvmlDeviceGetName(h))
        if name is not None:
            return name.decode() if isinstance(name, bytes) else str(name)
    return torch.cuda.get_device_name(device_id)


def _probe_total_memory(device_id: int = 0) -> int:
    if not torch.cuda.is_initialized():
        total = _nvml_query(device_id, lambda nv, h: nv.nvmlDeviceGetMemoryInfo(h).total)
        if total is not None:
            return int(total)
    return torch.cuda.get_device_properties(device_id).total_memory


# Sizing of the CUDA/HIP graph memory pool (see ``CudaLikePlatform.graph_pool_bytes``).
GRAPH_POOL_MARGIN = 1.1
GRAPH_POOL_RESERVE = 64 << 20


class CudaLikePlatform(TorchDevicePlatform):
    """Device operations shared by the platforms that drive GPUs through ``torch.cuda``.

    ROCm builds of torch expose HIP devices under the same ``torch.cuda`` API and the ``cuda``
    device type, so the ROCm platform inherits these and changes only its choices.
    """

    device_type = "cuda"
    fused_op_kernels = "triton"
    auto_casts_float32 = True
    supported_block_sizes: ClassVar[tuple[int, ...]] = (16, 32, 64, 128, 256)
    default_block_size = 16
    moe_backend_priority: ClassVar[tuple[str, ...]] = ("triton_grouped", "torch_ref")

    @classmethod
    def torch_module(cls):
        return torch.cuda

    @classmethod
    def device_count(cls) -> int:
        return _probe_device_count()

    @classmethod
    def get_device_name(cls, device_id: int = 0) -> str:
        return _probe_device_name(device_id)

    @classmethod
    def get_device_capability(cls, device_id: int = 0) -> tuple[int, int] | None:
        return _probe_capability(device_id)

    @classmethod
    def get_device_total_memory(cls, device_id: int = 0) -> int:
        return _probe_total_memory(device_id)

    @classmethod
    def mem_get_info(cls, device_id: int | None = None) -> tuple[int, int]:
        free, total = torch.cuda.mem_get_info(device_id)
        return int(free), int(total)

    @classmethod
    def graph_pool_bytes(cls, decode_peak_bytes: int) -> int:
        """The graphs share one pool sized by the largest capture: its eager decode peak plus
        ``GRAPH_POOL_MARGIN`` for the allocator's rounding and fragmentation inside the private
        pool, plus ``GRAPH_POOL_RESERVE`` for cuBLAS workspaces and the graph objects."""
        return int(decode_peak_bytes * GRAPH_POOL_MARGIN) + GRAPH_POOL_RESERVE

    @classmethod
    def new_graph(cls) -> torch.cuda.CUDAGraph:
        return torch.cuda.CUDAGraph()  # a HIP graph on ROCm builds

    @classmethod
    def graph_pool_handle(cls) -> Any:
        return torch.cuda.graph_pool_handle()

    @classmethod
    def graph_capture_context(cls, graph: Any, pool: Any = None) -> contextlib.AbstractContextManager:
        # thread_local: only this thread's calls can invalidate the capture. Under the default
        # ("global") a synchronizing call from any other thread of the process (an engine
        # shutting down, a heartbeat, a host-memory free) breaks it, and the error surfaces
        # later as a cuBLAS failure inside the captured forward.
        return torch.cuda.graph(graph, pool=pool, capture_error_mode="thread_local")


class CudaPlatform(CudaLikePlatform):
    name = "cuda"
    # flash-attn when importable (and the GPU and config suit it), else Triton, else the reference.
    attn_backend_priority = ("flash_attn", "triton_paged", "torch_ref")
    graph_capture = "cuda_graph"
    graph_capture_reason = "CUDA graphs replay captured decode steps (mixed steps too with OCTAVO_MIXED_GRAPHS=1)"
    communicator = "nccl"
    communicator_reason = "NCCL over NVLink / PCIe"
    dist_backend = "nccl"
    decode_gemv = "auto"  # Triton split-K GEMV where it beats cuBLAS (timed at load)
    supported_quantization = ("awq", "compressed-tensors", "fp8", "gptq", "int8")
    supported_online_quantization = ("fp8", "int8")
    supported_kv_cache_dtypes = ("auto", "fp8", "fp8_e4m3", "fp8_e5m2")  # fp8: triton_paged
    quant_kernel_priority: ClassVar[dict[str, tuple[str, ...]]] = {
        "int": ("triton_w4a16",), "fp8": ("triton_fp8",),
    }

    @classmethod
    def unavailable_reason(cls) -> str | None:
        hip = _probe_hip_version()
        if hip:
            return f"this torch is a ROCm build (HIP {hip}); the rocm platform drives it"
        if _probe_cuda_version() is None:
            return f"this torch build has no CUDA support (torch {torch.__version__})"
        if _probe_device_count() == 0:
            visible = os.environ.get("CUDA_VISIBLE_DEVICES")
            where = f" (CUDA_VISIBLE_DEVICES={visible!r})" if visible is not None else ""
            return f"no NVIDIA GPU is visible{where}"
        return None

    @classmethod
    def supported_dtypes(cls) -> tuple[torch.dtype, ...]:
        """bfloat16 needs compute capability >= 8.0 (Ampere); float16 is the Volta/Turing choice."""
        cap = cls.get_device_capability() or (0, 0)
        if cap >= (8, 0):
            return (torch.bfloat16, torch.float16, torch.float32)
        return (torch.float16, torch.float32)

    @classmethod
    def describe(cls) -> dict[str, str]:
        cap = cls.get_device_capability() or (0, 0)
        return {
            "device": f"{cls.get_device_name()} (compute capability {cap[0]}.{cap[1]})",
            "device count": str(cls.device_count()),
            "cuda": str(_probe_cuda_version()),
        }
