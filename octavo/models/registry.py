"""Architecture name (``config.json`` ``architectures``) -> model class path.

This is the one list of models octavo runs. Packages add architectures through the
``octavo.general_plugins`` entry-point group by calling ``register_model``. Classes are
imported only when a checkpoint asks for them, or when ``describe_models`` (``octavo info
--models``) reads the features each class declares (``supports_sliding_window``,
``supports_tensor_parallel``).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

from octavo.utils import plugins

_LLAMA = "octavo.models.llama.LlamaForCausalLM"
_MOE = "octavo.models.llama_moe"

_MODELS: dict[str, str] = {
    "LlamaForCausalLM": _LLAMA,
    "MistralForCausalLM": _LLAMA,
    "Qwen2ForCausalLM": _LLAMA,
    "Qwen3ForCausalLM": _LLAMA,
    "Gemma2ForCausalLM": "octavo.models.gemma.Gemma2ForCausalLM",
    "Gemma3ForCausalLM": "octavo.models.gemma.Gemma3ForCausalLM",
    "Phi3ForCausalLM": "octavo.models.phi3.Phi3ForCausalLM",
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
            return arch, _import(_MODELS[arch])
    raise ValueError(
        f"unsupported model architecture {architectures!r}; "
        f"octavo supports: {', '.join(supported_architectures())}"
    )


@dataclass(frozen=True)
class ModelDescription:
    """One registered architecture and what octavo supports for it, read from its class."""

    architecture: str
    class_path: str
    sliding_window: bool
    tensor_parallel: bool
    mixture_of_experts: bool
    formats: tuple[str, ...]


def _import(class_path: str) -> type:
    module, cls = class_path.rsplit(".", 1)
    return getattr(importlib.import_module(module), cls)


def describe_models() -> list[ModelDescription]:
    """Every registered architecture with its features, in name order (imports the classes)."""
    from octavo.models.gguf_loader import GGUF_ARCHITECTURES

    gguf = set(GGUF_ARCHITECTURES.values())
    out = []
    for arch in supported_architectures():
        cls = _import(_MODELS[arch])
        out.append(ModelDescription(
            architecture=arch,
            class_path=_MODELS[arch],
            sliding_window=bool(getattr(cls, "supports_sliding_window", False)),
            tensor_parallel=bool(getattr(cls, "supports_tensor_parallel", False)),
            mixture_of_experts=arch in MOE_ARCHITECTURES,
            formats=("safetensors", "pt") + (("gguf",) if arch in gguf else ()),
        ))
    return out
