"""CUDA/ROCm experts: Triton routing, grouping and grouped GEMMs (``triton_routing``,
``triton_gemm``). Triton is imported on first use, not with this class, so choosing or
describing the kernel never initialises a Triton driver."""

from __future__ import annotations

import torch

from octavo.models.moe.kernels.base import ExpertsKernel


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

    def apply(self, x, w13, w2, weights, ids):
        from octavo.models.moe.kernels.triton_gemm import fused_experts

        return fused_experts(x, w13, w2, weights, ids)
