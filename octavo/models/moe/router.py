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


def to_local_ids(ids: torch.Tensor, expert_start: int, num_local: int, num_experts: int) -> torch.Tensor:
    """Global expert ids -> ids of this rank's experts; experts elsewhere -> ``num_local``."""
    if expert_start == 0 and num_local == num_experts:
        return ids
    local = ids - expert_start
    return local.masked_fill((local < 0) | (local >= num_local), num_local)
