"""Mixture-of-experts layers as exported: every expert over every token, weighted by routing.

The serving kernels group tokens by expert, which needs data-dependent shapes no static ONNX
graph has. Exported, each expert runs on all tokens and its output is scaled by the token's
routing weight for it (0 for experts the token did not pick), summed in expert order, as
octavo's reference kernel sums them: the same result, at ``num_experts / top_k`` times the
expert FLOPs (fine for the small MoE models edge deployments run).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from octavo.models.moe.kernels.base import ExpertsKernel


class DenseExportExperts(ExpertsKernel):
    name = "onnx_export_dense"

    def apply(self, x, w13, w2, weights, ids):
        num_experts, inter = w13.shape[0], w2.shape[-1]
        experts = torch.arange(num_experts, device=ids.device)
        dense = ((ids[..., None] == experts).to(weights.dtype) * weights[..., None]).sum(1)  # [T, E]
        out = torch.zeros_like(x)
        for e in range(num_experts):
            gate_up = F.linear(x, w13[e])
            h = F.silu(gate_up[:, :inter]) * gate_up[:, inter:]
            out = out + (F.linear(h, w2[e]) * dense[:, e, None]).to(out.dtype)
        return out


def use_dense_experts(model: nn.Module, dtype: torch.dtype) -> int:
    """Give every MoE layer of ``model`` the exportable kernel; returns how many there are."""
    from octavo.models.moe.layer import FusedMoE

    layers = [m for m in model.modules() if isinstance(m, FusedMoE)]
    for layer in layers:
        layer.kernel = DenseExportExperts(dtype)
    return len(layers)
