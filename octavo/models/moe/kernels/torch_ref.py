"""The readable reference: for each expert, the tokens routed to it, as transformers does."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from octavo.models.moe.kernels.base import ExpertsKernel


class TorchRefExperts(ExpertsKernel):
    name = "torch_ref"

    def apply(self, x, w13, w2, weights, ids):
        out = torch.zeros_like(x)
        inter = w2.shape[-1]
        for e in range(w13.shape[0]):
            token, slot = torch.where(ids == e)
            if token.numel() == 0:
                continue
            gate_up = F.linear(x[token], w13[e])
            h = F.silu(gate_up[:, :inter]) * gate_up[:, inter:]
            h = F.linear(h, w2[e]) * weights[token, slot, None]
            out.index_add_(0, token, h.to(out.dtype))
        return out
