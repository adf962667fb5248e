"""How a model's linear layer runs: its quantization kernel, the bound fused kernels'
prepacked weights, or the module itself. A leaf module, so both the module path
(``models.layers``) and the CPU's lean decoder-layer step (``models.cpu_decode_layer``, which
``layers`` reaches through the fused kernels) dispatch through the same function."""

from __future__ import annotations

from types import ModuleType

import torch
from torch import nn


def fused_ops_of(module: nn.Module) -> ModuleType | None:
    return getattr(module, "fused_ops", None)


def linear(layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``layer(x)`` for a linear layer; through its quantization kernel when it is quantized
    (``octavo.quantization``), else the bound kernels' prepacked weights where they apply
    (oneDNN on the CPU)."""
    quant = layer.__dict__.get("quant_state")
    if quant is not None:
        return quant.apply(layer, x)
    ops = fused_ops_of(layer)
    if ops is not None and ops.linear_usable(layer, x):
        return ops.linear(layer, x)
    return layer(x)
