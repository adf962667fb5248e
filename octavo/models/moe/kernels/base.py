"""The contract every expert kernel implements (see ``octavo.models.moe.kernels``)."""

from __future__ import annotations

from typing import ClassVar

import torch


class ExpertsKernel:
    """One way of running the experts over a routed batch (see the module docstring)."""

    name: ClassVar[str] = "abstract"
    # torch device types this kernel runs on; None: any.
    supported_device_types: ClassVar[tuple[str, ...] | None] = None

    @classmethod
    def validate(cls, dtype: torch.dtype) -> list[str]:
        """Reasons this kernel cannot run ``dtype`` weights (empty when it can)."""
        return []

    def __init__(self, dtype: torch.dtype) -> None:
        self.dtype = dtype

    def describe(self) -> str:
        return self.name

    def route(
        self, router_logits: torch.Tensor, top_k: int, renormalize: bool, expert_start: int, num_local: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(weights [T, k] float32, local ids [T, k]): ``select_experts``, then global ids
        mapped to this rank's experts ``[expert_start, expert_start + num_local)``; any other
        expert becomes ``num_local`` (computed elsewhere). Kernels may fuse this."""
        from octavo.models.moe.router import select_experts, to_local_ids

        weights, ids = select_experts(router_logits, top_k, renormalize)
        return weights, to_local_ids(ids, expert_start, num_local, router_logits.shape[-1])

    def route_hidden(
        self, x: torch.Tensor, router_weight: torch.Tensor, top_k: int, renormalize: bool,
        expert_start: int, num_local: int, counters: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """``route(F.linear(x, router_weight), ...)`` where this kernel fuses the router GEMV
        into its routing for this batch; None where it does not (the caller then computes the
        logits and calls ``route``). ``counters``: the layer's zeroed int32 scratch."""
        return None

    def apply(
        self,
        x: torch.Tensor,
        w13: torch.Tensor,
        w2: torch.Tensor,
        weights: torch.Tensor,
        ids: torch.Tensor,
    ) -> torch.Tensor:
        """[T, H] in ``x.dtype``: the routed experts' weighted sum for every token (this rank's
        experts only; pairs with id ``w13.shape[0]`` contribute zero)."""
        raise NotImplementedError
