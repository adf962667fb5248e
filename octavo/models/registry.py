"""Architecture name (``config.json`` ``architectures``) -> model class path.

Packages add architectures through the ``octavo.general_plugins`` entry-point group by calling
``register_model``. Classes are imported only when a checkpoint asks for them.
"""

from __future__ import annotations

import importlib

from octavo.utils import plugins

_LLAMA = "octavo.models.llama.LlamaForCausalLM"
_MOE = "octavo.models.llama_moe"

_MODELS: dict[str, str] = {
    "LlamaForCausalLM": _LLAMA,
    "MistralForCausalLM": _LLAMA,
    "Qwen2ForCausalLM": _LLAMA,
    "Qwen3ForCausalLM": _LLAMA,
    # Mixtures of experts (octavo.models.moe)
    "MixtralForCausalLM": f"{_MOE}.MixtralForCausalLM",
    "Qwen2MoeForCausalLM": f"{_MOE}.Qwen2MoeForCausalLM",
    "Qwen3MoeForCausalLM": f"{_MOE}.Qwen3MoeForCausalLM",
}

# Architectures whose layers route tokens to experts (``--enable-expert-parallel`` applies).
MOE_ARCHITECTURES = frozenset({"MixtralForCausalLM", "Qwen2MoeForCausalLM", "Qwen3MoeForCausalLM"})


def register_model(architecture: str, class_path: str) -> None:
    _MODELS[architecture] = class_path


def supported_architectures() -> list[str]:
    _load_plugins()
    return sorted(_MODELS)


def _load_plugins() -> None:
    """Architectures registered by ``octavo.general_plugins`` entry points (once per process)."""
    plugins.load_general_plugins()


def resolve_architecture(architectures: list[str] | None) -> tuple[str, type]:
    """Return (architecture, model class) for the first supported name, or raise ValueError."""
    _load_plugins()
    for arch in architectures or []:
        if arch in _MODELS:
            module, cls = _MODELS[arch].rsplit(".", 1)
            return arch, getattr(importlib.import_module(module), cls)
    raise ValueError(
        f"unsupported model architecture {architectures!r}; "
        f"octavo supports: {', '.join(supported_architectures())}"
    )
