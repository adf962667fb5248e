"""``FusedMoE``: route each token to its top-k experts and run them as grouped GEMMs.

Parameters (this rank's part), filled from per-expert checkpoint tensors at load:

- ``w13_weight`` [E_local, 2 * I_local, H]: every local expert's gate rows then up rows;
- ``w2_weight`` [E_local, H, I_local]: every local expert's down projection.

Placement over the tensor-parallel group of N ranks:

- default (tensor-sharded, like a dense MLP): every rank holds all E experts, each sliced to
  ``I / N`` intermediate rows; partial outputs are all-reduced;
- ``--enable-expert-parallel``: rank r holds experts ``[r * E/N, (r + 1) * E/N)`` whole. The
  hidden states entering the layer are already identical on every rank (attention is
  tensor-parallel), so dispatch needs no communication: each rank runs the pairs routed to its
  experts, and the combine is one all-reduce (a reduce-scatter + all-gather) through the
  platform's communicator.

The checkpoint shard id of an expert tensor is ``"<expert>.<gate|up|down>"``; tensors of
experts held by other ranks are accepted and dropped by the loader, so every rank still checks
that the checkpoint provides every expert.
"""

from __future__ import annotations

import logging

import torch
import torch.nn.functional as F
from torch import nn

from octavo.distributed.parallel_state import expert_parallel_enabled, get_tp
from octavo.models.moe.kernels import ExpertsKernel, choose_kernel
from octavo.models.moe.router import to_local_ids

logger = logging.getLogger(__name__)

_LOGGED: set[tuple[str, str]] = set()

# Tokens per launch a kernel may route with the router GEMV fused (``ExpertsKernel.route_hidden``).
ROUTE_COUNTERS = 64


def make_kernel(dtype: torch.dtype) -> ExpertsKernel:
    """The platform's MoE kernel for ``dtype`` (chosen once per layer build, logged once)."""
    from octavo.platforms import current_platform

    cls, skipped = choose_kernel(current_platform, dtype)
    kernel = cls(dtype)
    key = (kernel.describe(), str(dtype))
    if key not in _LOGGED:
        _LOGGED.add(key)
        for name, reasons in skipped.items():
            logger.info("MoE kernel %s skipped: %s", name, "; ".join(reasons))
        logger.info("MoE kernel: %s", kernel.describe())
    return kernel


class FusedMoE(nn.Module):
    def __init__(
        self,
        num_experts: int,
        top_k: int,
        hidden_size: int,
        intermediate_size: int,
        renormalize: bool,
        dtype: torch.dtype,
    ) -> None:
        super().__init__()
        tp = get_tp()
        self.tp = tp
        self.num_experts = num_experts
        self.top_k = top_k
        self.renormalize = renormalize
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.expert_parallel = expert_parallel_enabled() and tp.world_size > 1
        if self.expert_parallel:
            if num_experts % tp.world_size:
                raise ValueError(
                    f"--enable-expert-parallel: the model's {num_experts} experts do not divide over "
                    f"--tensor-parallel-size {tp.world_size} ranks"
                )
            self.num_local_experts = num_experts // tp.world_size
            self.expert_start = tp.rank * self.num_local_experts
            self.local_inter, self.inter_start = intermediate_size, 0
        else:
            if intermediate_size % tp.world_size:
                raise ValueError(
                    f"the experts' intermediate size ({intermediate_size}) is not divisible by "
                    f"--tensor-parallel-size {tp.world_size}; try --enable-expert-parallel"
                )
            self.num_local_experts, self.expert_start = num_experts, 0
            self.local_inter = intermediate_size // tp.world_size
            self.inter_start = tp.rank * self.local_inter
        e, i = self.num_local_experts, self.local_inter
        self.w13_weight = nn.Parameter(torch.empty(e, 2 * i, hidden_size))
        self.w2_weight = nn.Parameter(torch.empty(e, hidden_size, i))
        self.w13_weight.weight_loader = self._load_w13  # type: ignore[attr-defined]
        self.w2_weight.weight_loader = self._load_w2  # type: ignore[attr-defined]
        self.kernel = make_kernel(dtype)
        # Zero between launches: the arrival counters of a fused router GEMV + routing.
        self.register_buffer("route_counters", torch.zeros(ROUTE_COUNTERS, dtype=torch.int32), persistent=False)

    def describe(self) -> str:
        """Placement on this rank and the kernel, e.g. for ``octavo info`` and startup logs."""
        if self.expert_parallel:
            where = (
                f"experts {self.expert_start}-{self.expert_start + self.num_local_experts - 1} of "
                f"{self.num_experts} on rank {self.tp.rank} (expert parallel)"
            )
        elif self.tp.world_size > 1:
            where = f"all {self.num_experts} experts, {self.local_inter} of {self.intermediate_size} rows each (tensor-sharded)"
        else:
            where = f"all {self.num_experts} experts"
        return f"top-{self.top_k} of {where}; kernel {self.kernel.describe()}"

    # -- loading ---------------------------------------------------------------------------
    def checkpoint_targets(self, prefix: str) -> set[tuple[str, str]]:
        """Every (parameter, shard) the checkpoint must provide: all E experts, on every rank."""
        out: set[tuple[str, str]] = set()
        for e in range(self.num_experts):
            out.add((f"{prefix}.w13_weight", f"{e}.gate"))
            out.add((f"{prefix}.w13_weight", f"{e}.up"))
            out.add((f"{prefix}.w2_weight", f"{e}.down"))
        return out

    def _local(self, shard_id: str | None) -> tuple[int | None, str]:
        expert, _, which = (shard_id or "").partition(".")
        if not expert.isdigit() or int(expert) >= self.num_experts:
            raise ValueError(f"expert shard {shard_id!r} is not '<expert < {self.num_experts}>.<gate|up|down>'")
        local = int(expert) - self.expert_start
        return (local if 0 <= local < self.num_local_experts else None), which

    def _load_w13(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: str | None = None) -> None:
        local, which = self._local(shard_id)
        if which not in ("gate", "up"):
            raise ValueError(f"expert shard {shard_id!r} is not a gate or up projection")
        expected = (self.intermediate_size, self.hidden_size)
        if tuple(loaded.shape) != expected:
            raise ValueError(f"expert {which} projection has shape {tuple(loaded.shape)}, expected {expected}")
        if local is None:
            return  # held by another rank
        offset = 0 if which == "gate" else self.local_inter
        param.data[local].narrow(0, offset, self.local_inter).copy_(
            loaded.narrow(0, self.inter_start, self.local_inter)
        )

    def _load_w2(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: str | None = None) -> None:
        local, which = self._local(shard_id)
        if which != "down":
            raise ValueError(f"expert shard {shard_id!r} is not a down projection")
        expected = (self.hidden_size, self.intermediate_size)
        if tuple(loaded.shape) != expected:
            raise ValueError(f"expert down projection has shape {tuple(loaded.shape)}, expected {expected}")
        if local is None:
            return  # held by another rank
        param.data[local].copy_(loaded.narrow(1, self.inter_start, self.local_inter))

    # -- forward ---------------------------------------------------------------------------
    def local_expert_ids(self, ids: torch.Tensor) -> torch.Tensor:
        """Global expert ids -> this rank's ids; experts elsewhere -> ``num_local_experts``."""
        return to_local_ids(ids, self.expert_start, self.num_local_experts, self.num_experts)

    def forward(self, hidden: torch.Tensor, router_logits: torch.Tensor, reduce: bool = True) -> torch.Tensor:
        """``hidden`` [T, H], ``router_logits`` [T, E] -> [T, H], summed over ranks (or this
        rank's partial sum with ``reduce=False``, for a caller that adds more before reducing)."""
        routed = self.kernel.route(
            router_logits, self.top_k, self.renormalize, self.expert_start, self.num_local_experts
        )
        return self._experts(hidden, routed, reduce)

    def forward_from_router(self, hidden: torch.Tensor, router_weight: torch.Tensor, reduce: bool = True) -> torch.Tensor:
        """``forward(hidden, F.linear(hidden, router_weight), reduce)``; a kernel that fuses the
        router GEMV into its routing for this batch (``route_hidden``) gets the weight instead."""
        routed = self.kernel.route_hidden(
            hidden, router_weight, self.top_k, self.renormalize, self.expert_start, self.num_local_experts,
            self.route_counters,
        )
        if routed is None:
            return self.forward(hidden, F.linear(hidden, router_weight), reduce)
        return self._experts(hidden, routed, reduce)

    def _experts(self, hidden: torch.Tensor, routed: tuple, reduce: bool) -> torch.Tensor:
        """The routed (weights, local ids) experts applied, summed over ranks unless not ``reduce``."""
        out = self.kernel.apply(hidden, self.w13_weight, self.w2_weight, *routed)
        return self.tp.all_reduce(out) if reduce and self.tp.world_size > 1 else out

    def activation_bytes(self, num_tokens: int) -> int:
        """Peak bytes the grouped kernels hold for ``num_tokens`` tokens (routing included)."""
        return grouped_activation_bytes(
            num_tokens, self.top_k, self.num_local_experts, self.num_experts, self.local_inter,
            self.hidden_size, self.w13_weight.element_size(),
        )


def grouped_activation_bytes(
    num_tokens: int, top_k: int, local_experts: int, num_experts: int, local_inter: int, hidden: int,
    elem: int,
) -> int:
    """Bytes live at the peak of one MoE layer over ``num_tokens`` tokens: router
    probabilities and top-k, the expert-sorted pair ids padded to the largest block (128), the
    SiLU-gated intermediate [pairs, I_local], the per-pair outputs [pairs, H] and the result,
    plus 1 MiB for the allocator's rounding of the many small buffers."""
    pairs = num_tokens * top_k
    routing = num_tokens * num_experts * 4 + pairs * (4 + 8)
    sort = (pairs + (local_experts + 1) * 127) * 4 + pairs * 8 * 3
    slack = 1 << 20
    return routing + sort + pairs * (local_inter + hidden) * elem + num_tokens * hidden * elem + slack
