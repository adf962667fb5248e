"""CUDA/ROCm experts: Triton routing, grouping and grouped GEMMs (``triton_routing``,
``triton_gemm``); batches of few token-expert pairs (``configs.use_gemv``: a static choice
from the shape, so each captured graph holds one path) run as per-pair GEMVs instead
(``triton_gemv``: no grouping, weights streamed near bandwidth). Triton is imported on first
use, not with this class, so choosing or describing the kernel never initialises a Triton
driver.

At few tokens the router GEMV and the routing run as one launch (``triton_router``, bf16 and
fp16 only); ``FUSED_ROUTER = False`` turns that off (comparisons; recapture graphs after).
"""

from __future__ import annotations

import torch

from octavo.models.moe.kernels.base import ExpertsKernel

FUSED_ROUTER = True


class TritonGroupedExperts(ExpertsKernel):
    name = "triton_grouped"
    supported_device_types = ("cuda",)

    @classmethod
    def validate(cls, dtype: torch.dtype) -> list[str]:
        ok = (torch.float16, torch.bfloat16, torch.float32)
        return [] if dtype in ok else [f"dtype {dtype} is not one of float16, bfloat16, float32"]

    def route(self, router_logits, top_k, renormalize, expert_start, num_local):
        from octavo.models.moe.kernels import triton_routing

        return triton_routing.route(router_logits, top_k, renormalize, expert_start, num_local)

    def route_hidden(self, x, router_weight, top_k, renormalize, expert_start, num_local, counters):
        from octavo.models.moe.configs import use_gemv

        num_tokens = x.shape[0]
        if (
            not FUSED_ROUTER or x.dtype not in (torch.bfloat16, torch.float16) or router_weight.dtype != x.dtype
            or num_tokens > counters.numel() or not use_gemv(num_tokens * top_k, num_local, top_k)
        ):
            return None
        from octavo.models.moe.kernels.triton_router import router_route

        return router_route(x, router_weight, top_k, renormalize, expert_start, num_local, counters)

    def describe(self) -> str:
        return f"{self.name} (per-pair GEMV at few pairs)"

    def apply(self, x, w13, w2, weights, ids):
        from octavo.models.moe.configs import use_gemv

        if use_gemv(ids.numel(), w13.shape[0], ids.shape[-1]):
            from octavo.models.moe.kernels.triton_gemv import gemv_experts

            return gemv_experts(x, w13, w2, weights, ids)
        from octavo.models.moe.kernels.triton_gemm import fused_experts

        return fused_experts(x, w13, w2, weights, ids)
