"""Import a script of the repository (``benchmarks/``, ``tools/``) by its path: they are not
part of the installed package."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]


def load_script(rel: str) -> ModuleType:
    """The module at ``ROOT / rel``, registered in ``sys.modules`` under its file stem."""
    spec = importlib.util.spec_from_file_location(Path(rel).stem, ROOT / rel)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod
