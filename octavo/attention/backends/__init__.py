"""Attention backend registry: name -> qualified class path (imported only when chosen)."""

from __future__ import annotations

import importlib

from octavo.attention.backend import AttentionBackend

BACKENDS: dict[str, str] = {
    "torch_ref": "octavo.attention.backends.torch_ref.TorchRefBackend",
}


def resolve_backend(name_or_path: str) -> type[AttentionBackend]:
    """Import a backend class from its registered name or a ``module.Class`` path."""
    path = BACKENDS.get(name_or_path, name_or_path)
    if "." not in path:
        raise ValueError(
            f"unknown attention backend {name_or_path!r}; known: {sorted(BACKENDS)}"
        )
    module_name, cls_name = path.rsplit(".", 1)
    return getattr(importlib.import_module(module_name), cls_name)
