"""Google TPUs through torch_xla: ragged paged attention, lazily compiled steps.

torch_xla is optional (the ``[tpu]`` extra) and imported only here and in the ``xla`` backend.
octavo captures no graphs on TPUs: torch_xla traces each step and XLA compiles the traced
program, cached by shape. The runner does not pad steps to shape buckets, so every new
(token count, batch size) pays one compilation; ``octavo info`` says so rather than claiming
a bucketed ``xla_compile`` mode.
"""

from __future__ import annotations

import contextlib
from typing import ClassVar

import torch

from octavo.platforms.interface import Platform
from octavo.utils import packages


# -- probes (replaced by tests that simulate other machines) ----------------------------------
def _probe_torch_xla_installed() -> bool:
    return packages.package_available("torch_xla")


def _probe_xla_device_type() -> str | None:
    """PJRT's device type (TPU, CPU, CUDA...) without creating a client; None if unknown."""
    try:
        import torch_xla.runtime as xr

        return xr.device_type()
    except Exception:
        return None


def _probe_device_count() -> int:
    import torch_xla.runtime as xr

    return xr.addressable_device_count()


def _xm():
    import torch_xla.core.xla_model as xm

    return xm


class TpuPlatform(Platform):
    name = "tpu"
    device_type = "xla"
    auto_casts_float32 = True
    _supported_dtypes: ClassVar[tuple[torch.dtype, ...]] = (torch.bfloat16, torch.float32)
    supported_block_sizes: ClassVar[tuple[int, ...]] = (16, 32, 64, 128, 256)
    default_block_size = 16
    attn_backend_priority = ("xla", "torch_ref")
    graph_capture = "none"
    graph_capture_reason = (
        "no captured graphs: torch_xla compiles each traced step lazily, once per new input "
        "shape (steps are not padded to shape buckets)"
    )
    communicator = "xla"
    communicator_reason = "XLA collectives over the TPU interconnect (ICI)"
    dist_backend = "xla"

    @classmethod
    def unavailable_reason(cls) -> str | None:
        if not _probe_torch_xla_installed():
            return "torch_xla is not installed"
        kind = _probe_xla_device_type()
        if kind != "TPU":
            return f"torch_xla is installed but its device is {kind or 'unknown'}, not a TPU"
        return None

    @classmethod
    def device(cls, index: int = 0) -> torch.device:
        import torch_xla

        if hasattr(torch_xla, "device"):
            return torch_xla.device(index)
        return _xm().xla_device(index)

    @classmethod
    def device_count(cls) -> int:
        return _probe_device_count()

    @classmethod
    def get_device_name(cls, device_id: int = 0) -> str:
        try:
            import torch_xla.tpu

            return f"TPU v{torch_xla.tpu.version()}"
        except Exception:
            return "TPU"

    @classmethod
    def mem_get_info(cls, device_id: int | None = None) -> tuple[int, int]:
        info = _xm().get_memory_info(cls.device(device_id or 0))
        if "bytes_limit" in info:
            total = int(info["bytes_limit"])
            return total - int(info["bytes_used"]), total
        return int(info["kb_free"]) * 1024, int(info["kb_total"]) * 1024

    @classmethod
    def synchronize(cls) -> None:
        import torch_xla

        if hasattr(torch_xla, "sync"):
            torch_xla.sync()
        else:
            _xm().mark_step()
        _xm().wait_device_ops()

    @classmethod
    def manual_seed(cls, seed: int) -> None:
        torch.manual_seed(seed)
        _xm().set_rng_state(seed, cls.device())

    @classmethod
    def describe(cls) -> dict[str, str]:
        info = {"device": cls.get_device_name()}
        with contextlib.suppress(Exception):
            info["device count"] = str(cls.device_count())
        with contextlib.suppress(Exception):
            import torch_xla

            info["torch_xla"] = torch_xla.__version__
        return info
