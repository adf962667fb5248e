"""Attention backend registry: name -> qualified class path (imported only when chosen).

``PACKAGE_REQUIREMENTS`` names the optional packages a backend needs; the platform's priority
walk checks them with ``find_spec`` before importing the backend's module, so a missing Triton,
IPEX, flash-attn or torch_xla is a clean "package ... is not installed" reason, never an import
of half a stack.
"""

from __future__ import annotations

import importlib

from octavo.attention.backend import AttentionBackend
from octavo.utils import packages

BACKENDS: dict[str, str] = {
    "torch_ref": "octavo.attention.backends.torch_ref.TorchRefBackend",
    "triton_paged": "octavo.attention.backends.triton_paged.TritonPagedBackend",
    "cpu_paged": "octavo.attention.backends.cpu_paged.CpuPagedBackend",
    "flash_attn": "octavo.attention.backends.flash_attn.FlashAttnBackend",
    "ipex": "octavo.attention.backends.ipex.IpexBackend",
    "xla": "octavo.attention.backends.xla.XlaBackend",
}

PACKAGE_REQUIREMENTS: dict[str, tuple[str, ...]] = {
    "triton_paged": ("triton",),
    "flash_attn": ("flash_attn",),
    "ipex": ("intel_extension_for_pytorch",),
    "xla": ("torch_xla",),
}


def missing_packages(name_or_path: str) -> list[str]:
    """Required packages of a registered backend that are not installed (empty for paths)."""
    return [p for p in PACKAGE_REQUIREMENTS.get(name_or_path, ()) if not packages.package_available(p)]


def resolve_backend(name_or_path: str) -> type[AttentionBackend]:
    """Import a backend class from its registered name or a ``module.Class`` path."""
    path = BACKENDS.get(name_or_path, name_or_path)
    if "." not in path:
        raise ValueError(
            f"unknown attention backend {name_or_path!r}; known: {sorted(BACKENDS)}"
        )
    module_name, cls_name = path.rsplit(".", 1)
    return getattr(importlib.import_module(module_name), cls_name)
