"""Google TPUs through torch_xla: ragged paged attention, XLA compilation over shape buckets.

torch_xla is optional (the ``[tpu]`` extra) and imported only here and in the ``xla`` backend.
XLA compiles one program per input shape, so the model runner pads the flattened token count to
one of a few buckets (``padded_num_tokens``) and every step replays an already-compiled graph.
"""

from __future__ import annotations

import contextlib
from typing import ClassVar

import torch

from octavo.platforms.interface import Platform
from octavo.utils import packages

MIN_TOKEN_BUCKET = 16


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


def token_buckets(max_num_batched_tokens: int) -> list[int]:
    """Powers of two from ``MIN_TOKEN_BUCKET`` up to the first >= the token budget."""
    buckets = [MIN_TOKEN_BUCKET]
    while buckets[-1] < max_num_batched_tokens:
        buckets.append(buckets[-1] * 2)
    return buckets


def padded_num_tokens(num_tokens: int, max_num_batched_tokens: int) -> int:
    """The smallest bucket holding ``num_tokens`` (invariant: result >= num_tokens)."""
    for b in token_buckets(max_num_batched_tokens):
        if b >= num_tokens:
            return b
    raise ValueError(f"{num_tokens} tokens exceed the budget {max_num_batched_tokens}")


class TpuPlatform(Platform):
    name = "tpu"
    device_type = "xla"
    auto_casts_float32 = True
    _supported_dtypes: ClassVar[tuple[torch.dtype, ...]] = (torch.bfloat16, torch.float32)
    supported_block_sizes: ClassVar[tuple[int, ...]] = (16, 32, 64, 128, 256)
    default_block_size = 16
    attn_backend_priority = ("xla", "torch_ref")
    graph_capture = "xla_compile"
    graph_capture_reason = "XLA compiles one graph per padded token bucket"
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
    def token_buckets(cls, max_num_batched_tokens: int) -> list[int]:
        return token_buckets(max_num_batched_tokens)

    @classmethod
    def describe(cls) -> dict[str, str]:
        info = {"device": cls.get_device_name()}
        with contextlib.suppress(Exception):
            info["device count"] = str(cls.device_count())
        with contextlib.suppress(Exception):
            import torch_xla

            info["torch_xla"] = torch_xla.__version__
        return info
