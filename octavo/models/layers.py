"""Building blocks of Llama-family decoders, numerically matched to HF transformers.

Each op follows transformers' order of operations and dtypes exactly, so float32 outputs agree
bit for bit wherever the underlying GEMMs do.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

_FUSED = None


def fused_ops():
    """``octavo.models.fused_ops`` (Triton) for GPU tensors, or None where triton is missing."""
    global _FUSED
    if _FUSED is None:
        try:
            from octavo.models import fused_ops as mod
        except ImportError:
            mod = False
        _FUSED = mod
    return _FUSED or None


_CPU_FUSED = None


def cpu_fused_ops():
    """``octavo.models.cpu_fused_ops`` (octavo's C++ CPU kernels), or None where not built."""
    global _CPU_FUSED
    if _CPU_FUSED is None:
        try:
            from octavo.models import cpu_fused_ops as mod
        except ImportError:
            mod = False
        _CPU_FUSED = mod
    return _CPU_FUSED or None


def _use_fused(x: torch.Tensor):
    if not x.is_cuda:
        ops = cpu_fused_ops() if x.is_cpu else None
        return ops if ops is not None and ops.usable(x) else None
    ops = fused_ops()
    return ops if ops is not None and ops.usable(x) else None


def linear(layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``layer(x)`` for a linear layer; on CPU through prepacked oneDNN weights where that applies."""
    if x.is_cpu:
        ops = cpu_fused_ops()
        if ops is not None and ops.linear_usable(layer, x):
            return ops.linear(layer, x)
    return layer(x)


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        """``norm(x)``, or with ``residual``: ``(norm(x + residual), x + residual)``."""
        ops = _use_fused(x)
        if ops is not None:
            return ops.rms_norm(x, self.weight, self.eps, residual)
        if residual is not None:
            x = x + residual
            residual = x
        dtype = x.dtype
        h = x.to(torch.float32)
        var = h.pow(2).mean(-1, keepdim=True)
        h = h * torch.rsqrt(var + self.eps)
        out = self.weight * h.to(dtype)
        return out if residual is None else (out, residual)


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    ops = _use_fused(gate_up)
    if ops is not None:
        return ops.silu_and_mul(gate_up)
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def _rope_parameters(hf_config) -> dict:
    params = getattr(hf_config, "rope_parameters", None)
    if params:
        return dict(params)
    out = {"rope_type": "default", "rope_theta": getattr(hf_config, "rope_theta", 10000.0)}
    scaling = getattr(hf_config, "rope_scaling", None)
    if scaling:
        out.update(scaling)
        out["rope_type"] = scaling.get("rope_type", scaling.get("type", "default"))
    return out


def compute_inv_freq(hf_config, head_dim: int) -> tuple[torch.Tensor, float]:
    """Inverse frequencies and attention scaling, as transformers computes them."""
    params = _rope_parameters(hf_config)
    rope_type = params.get("rope_type", "default")
    if rope_type == "default":
        base = params["rope_theta"]
        inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float) / head_dim))
        return inv_freq, 1.0
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    if rope_type not in ROPE_INIT_FUNCTIONS or rope_type == "dynamic":
        raise ValueError(
            f"rope_scaling type {rope_type!r} is not supported "
            f"(supported: default, {', '.join(k for k in ROPE_INIT_FUNCTIONS if k != 'dynamic')})"
        )
    inv_freq, attention_scaling = ROPE_INIT_FUNCTIONS[rope_type](hf_config, "cpu")
    return inv_freq.float(), float(attention_scaling)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


_ROPE_TABLES: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}


class RotaryEmbedding(nn.Module):
    """Neox-style RoPE with a precomputed cos/sin table indexed by absolute position."""

    def __init__(self, hf_config, head_dim: int, max_position: int, dtype: torch.dtype) -> None:
        super().__init__()
        # Built on the CPU (the same table on every device), then moved to the device the
        # model is being built on; layers of one model share one table.
        device = torch.empty(0).device
        key = (repr(_rope_parameters(hf_config)), head_dim, max_position, dtype, device)
        tables = _ROPE_TABLES.get(key)
        if tables is None:
            inv_freq, scaling = compute_inv_freq(hf_config, head_dim)
            pos = torch.arange(max_position, dtype=torch.int64, device="cpu").float()
            freqs = pos[:, None] * inv_freq.cpu()[None, :]
            emb = torch.cat((freqs, freqs), dim=-1)
            tables = ((emb.cos() * scaling).to(dtype).to(device), (emb.sin() * scaling).to(dtype).to(device))
            if len(_ROPE_TABLES) > 8:
                _ROPE_TABLES.clear()
            _ROPE_TABLES[key] = tables
        self.register_buffer("cos", tables[0], persistent=False)
        self.register_buffer("sin", tables[1], persistent=False)

    def forward(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor):
        """``q``: [T, H, D], ``k``: [T, Hk, D]; returns rotated copies."""
        ops = _use_fused(q)
        if ops is not None:
            return ops.rope(positions, q, k, self.cos, self.sin)
        cos = self.cos[positions].unsqueeze(1)
        sin = self.sin[positions].unsqueeze(1)
        return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
