"""Routing: each token picks its top-k experts from a softmax over the router logits.

``select_experts`` follows transformers' order of operations: softmax in float32, top-k, then
(when ``renormalize``) divide the k weights by their sum. Mixtral always renormalises; Qwen2-MoE
and Qwen3-MoE do when the config's ``norm_topk_prob`` is set. Weights stay float32; ids are
int64 with values in ``[0, num_experts)``.
"""

from __future__ import annotations

import torch


def select_experts(
    router_logits: torch.Tensor, top_k: int, renormalize: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """``router_logits`` [T, E] -> (weights [T, k] float32, expert ids [T, k] int64)."""
    if not 1 <= top_k <= router_logits.shape[-1]:
        raise ValueError(f"top_k {top_k} must be in [1, {router_logits.shape[-1]}]")
    probs = torch.softmax(router_logits, dim=-1, dtype=torch.float32)
    weights, ids = torch.topk(probs, top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, ids
