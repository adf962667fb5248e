"""The two halves of a quantization method (after vLLM's split).

``QuantizationConfig``: parsed once from a checkpoint's ``quantization_config`` (or from
``--quantization`` alone, for online quantization); says which linear layers are quantized and
with which ``LinearMethod``. Unknown or unsupported settings raise ``ValueError`` naming them.

``LinearMethod``: how one linear layer's checkpoint tensors (per checkpoint shard: ``q_proj``,
``gate_proj``, ...) become a canonical weight (``octavo.quantization.canonical``). Everything
after that (fusing shards, tensor-parallel slicing, the kernel) is shared in
``octavo.quantization.linear``; model files never change per method.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar

import torch

from octavo.quantization.canonical import CanonicalWeight


class LinearMethod(ABC):
    """Turns the tensors of one checkpoint shard into a canonical weight."""

    # Checkpoint tensor suffixes every shard must provide (``qweight``, ``weight_scale``, ...).
    tensor_names: tuple[str, ...] = ()
    # Suffixes a shard may provide (consumed when present, e.g. GPTQ's ``g_idx``).
    optional_names: tuple[str, ...] = ()
    # Online methods quantize full-precision weights: faster on the model's device.
    quantizes_on_device: bool = False

    @abstractmethod
    def to_canonical(self, tensors: dict[str, torch.Tensor]) -> CanonicalWeight:
        """``tensors``: suffix -> full (unsliced) tensor of one shard; raises ``ValueError``."""

    def describe(self) -> str:
        return type(self).__name__


class QuantizationConfig(ABC):
    """One quantization method's settings."""

    name: ClassVar[str]
    # Canonical weight kinds this method produces ("int", "fp8", "int8_w8a8").
    kinds: ClassVar[tuple[str, ...]] = ()

    @classmethod
    @abstractmethod
    def from_config(cls, cfg: dict[str, Any] | None) -> QuantizationConfig:
        """From the checkpoint's ``quantization_config`` (None: online quantization)."""

    @abstractmethod
    def linear_method(self, prefix: str) -> LinearMethod | None:
        """The method for the linear layer at checkpoint prefix ``prefix``
        (``model.layers.0.self_attn.q_proj``); None leaves it unquantized."""

    def describe(self) -> str:
        return self.name


def check_keys(cfg: dict[str, Any], known: set[str], what: str) -> None:
    """Refuse settings octavo does not honour (never ignore them silently)."""
    unknown = sorted(set(cfg) - known)
    if unknown:
        raise ValueError(f"{what}: unsupported quantization_config keys {unknown} (octavo honours: {sorted(known)})")


def matches_ignore(prefix: str, patterns: list[str]) -> bool:
    """compressed-tensors/llm-compressor ``ignore`` entries: exact names, name suffixes, or
    ``re:<regex>``."""
    import re

    for pat in patterns:
        if pat.startswith("re:"):
            if re.match(pat[3:], prefix):
                return True
        elif prefix == pat or prefix.endswith("." + pat):
            return True
    return False
