"""octavo: a hardware-agnostic LLM inference and serving engine.

``from octavo import LLM, SamplingParams`` works without importing torch-heavy modules until
they are used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:
    from octavo.entrypoints.llm import LLM
    from octavo.outputs import CompletionOutput, RequestOutput
    from octavo.sampling_params import SamplingParams

_LAZY = {
    "LLM": "octavo.entrypoints.llm",
    "SamplingParams": "octavo.sampling_params",
    "RequestOutput": "octavo.outputs",
    "CompletionOutput": "octavo.outputs",
    "EngineArgs": "octavo.engine.arg_utils",
}

__all__ = ["LLM", "SamplingParams", "RequestOutput", "CompletionOutput", "EngineArgs", "__version__"]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'octavo' has no attribute {name!r}")
