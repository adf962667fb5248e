"""Optional-package probes that never import the package."""

from __future__ import annotations

import importlib.util


def package_available(name: str) -> bool:
    """Whether ``import name`` would find a module, without importing it.

    Every optional-package probe in platforms and backends goes through this one function (read
    as ``packages.package_available`` at call time) so tests can simulate installed stacks.
    """
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):  # a parent package missing, or a broken __spec__
        return False
