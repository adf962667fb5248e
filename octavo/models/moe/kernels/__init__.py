"""Expert kernels: name -> qualified class path, imported only when chosen.

Every kernel computes, for tokens ``x`` [T, H] and their routing (``weights`` [T, k] float32,
``ids`` [T, k] integer local expert ids, where ``num_local_experts`` means "not on this rank"):

    out[t] = sum_j weights[t, j] * down_e( silu(gate_e(x[t])) * up_e(x[t]) ),  e = ids[t, j]

with ``w13`` [E, 2I, H] (gate rows then up rows) and ``w2`` [E, H, I]; pairs whose id is
``num_local_experts`` contribute nothing. Platforms name their preference in
``Platform.moe_backend_priority``; ``choose_kernel`` walks it like the attention backends'
priority walk and ``OCTAVO_MOE_BACKEND`` forces one.
"""

from __future__ import annotations

import importlib
import logging
from typing import Any

import torch

from octavo.models.moe.kernels.base import ExpertsKernel

logger = logging.getLogger(__name__)

__all__ = ["KERNELS", "ExpertsKernel", "choose_kernel", "resolve_kernel"]

KERNELS: dict[str, str] = {
    "torch_ref": "octavo.models.moe.kernels.torch_ref.TorchRefExperts",
    "cpu_grouped": "octavo.models.moe.kernels.cpu_grouped.CpuGroupedExperts",
    "triton_grouped": "octavo.models.moe.kernels.triton_grouped.TritonGroupedExperts",
}

PACKAGE_REQUIREMENTS: dict[str, tuple[str, ...]] = {"triton_grouped": ("triton",)}


def resolve_kernel(name_or_path: str) -> type[ExpertsKernel]:
    path = KERNELS.get(name_or_path, name_or_path)
    if "." not in path:
        raise ValueError(f"unknown MoE kernel {name_or_path!r}; known: {sorted(KERNELS)}")
    module, cls = path.rsplit(".", 1)
    return getattr(importlib.import_module(module), cls)


def _reasons(name: str, device_type: str, dtype: torch.dtype) -> tuple[type[ExpertsKernel] | None, list[str]]:
    from octavo.utils import packages

    missing = [p for p in PACKAGE_REQUIREMENTS.get(name, ()) if not packages.package_available(p)]
    if missing:
        return None, [f"package {m!r} is not installed" for m in missing]
    try:
        cls = resolve_kernel(name)
    except (ImportError, AttributeError, ValueError) as e:
        return None, [f"not importable ({e})"]
    reasons = []
    if cls.supported_device_types is not None and device_type not in cls.supported_device_types:
        reasons.append(f"runs on {'/'.join(cls.supported_device_types)} devices, not {device_type}")
    reasons.extend(cls.validate(dtype))
    return cls, reasons


def choose_kernel(
    platform: Any, dtype: torch.dtype, forced: str | None = None
) -> tuple[type[ExpertsKernel], dict[str, list[str]]]:
    """(kernel class, {skipped kernel: reasons}): the first of the platform's
    ``moe_backend_priority`` that can run on its devices.

    ``forced`` (or ``OCTAVO_MOE_BACKEND``) names one; if it cannot run, ``ValueError`` lists why.
    """
    from octavo import envs

    priority, device_type = platform.moe_backend_priority, platform.device_type
    forced = forced or envs.OCTAVO_MOE_BACKEND
    if forced:
        cls, reasons = _reasons(forced, device_type, dtype)
        if reasons or cls is None:
            raise ValueError(f"MoE kernel {forced!r} (OCTAVO_MOE_BACKEND) cannot run: " + "; ".join(reasons))
        return cls, {}
    skipped: dict[str, list[str]] = {}
    for name in priority:
        cls, reasons = _reasons(name, device_type, dtype)
        if cls is not None and not reasons:
            return cls, skipped
        skipped[name] = reasons
    detail = "; ".join(f"{n}: {', '.join(r)}" for n, r in skipped.items())
    raise ValueError(f"no MoE kernel can run {str(dtype).removeprefix('torch.')} experts on {device_type} ({detail})")
