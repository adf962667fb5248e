"""``--quantization int8``: online weight-only INT8 of an unquantized checkpoint.

Per output channel, symmetric: ``scale = amax(|w_row|) / 127``, ``q = round(w / scale)`` in
[-127, 127], stored as canonical unsigned codes ``q + 128`` with zero point 128. Activations
stay in the model dtype.
"""

from __future__ import annotations

from typing import Any

import torch

from octavo.quantization.base import LinearMethod, QuantizationConfig
from octavo.quantization.canonical import IntWeight


def quantize_int8_per_channel(w: torch.Tensor) -> IntWeight:
    wf = w.to(torch.float32)
    scale = (wf.abs().amax(dim=1, keepdim=True) / 127.0).clamp(min=1e-12)
    q = (torch.round(wf / scale).clamp(-127, 127) + 128).to(torch.uint8)
    return IntWeight(q, scale, torch.full_like(scale, 128, dtype=torch.uint8), 8, w.shape[1])


class Int8Online(LinearMethod):
    tensor_names = ("weight",)
    quantizes_on_device = True

    def to_canonical(self, t: dict[str, torch.Tensor]) -> IntWeight:
        return quantize_int8_per_channel(t["weight"])

    def describe(self) -> str:
        return "online int8 weight-only (per-channel)"


class Int8Config(QuantizationConfig):
    name = "int8"
    kinds = ("int",)

    @classmethod
    def from_config(cls, cfg: dict[str, Any] | None) -> Int8Config:
        if cfg is not None:
            raise ValueError("int8 quantizes an unquantized checkpoint at load; this checkpoint is already quantized")
        return cls()

    def linear_method(self, prefix: str) -> LinearMethod | None:
        return Int8Online()

    def describe(self) -> str:
        return "int8 (online weight-only, per-channel)"
