"""One ``Communicator`` per platform choice, over ``torch.distributed`` process groups.

The platform names its communicator (``nccl``, ``rccl``, ``xccl``/``ccl``, ``xla``, ``gloo``);
``create_communicator`` maps that name to the torch.distributed backend that implements it
(RCCL is exposed by ROCm builds of torch under the ``nccl`` name; Intel's is ``xccl`` in
recent torch and ``ccl`` through oneCCL bindings; torch_xla registers ``xla``). Every
collective is in-place where torch allows and returns the result tensor.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

# communicator name -> torch.distributed backend name
TORCH_BACKENDS = {
    "nccl": "nccl",
    "rccl": "nccl",
    "xccl": "xccl",
    "ccl": "ccl",
    "xla": "xla",
    "gloo": "gloo",
}


def torch_backend_for(communicator: str) -> str:
    try:
        return TORCH_BACKENDS[communicator]
    except KeyError:
        raise ValueError(
            f"unknown communicator {communicator!r}; known: {sorted(TORCH_BACKENDS)}"
        ) from None


class Communicator:
    """Collectives over one process group (all ranks of the tensor-parallel group)."""

    def __init__(self, name: str, group: dist.ProcessGroup | None, rank: int, world_size: int):
        self.name = name
        self.group = group
        self.rank = rank
        self.world_size = world_size

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        if self.world_size == 1:
            return x
        dist.all_reduce(x, group=self.group)
        return x

    def all_gather(self, x: torch.Tensor, dim: int = -1) -> torch.Tensor:
        """Concatenate every rank's ``x`` along ``dim`` (same shape on every rank)."""
        if self.world_size == 1:
            return x
        parts = [torch.empty_like(x) for _ in range(self.world_size)]
        dist.all_gather(parts, x.contiguous(), group=self.group)
        return torch.cat(parts, dim=dim)

    def gather(self, x: torch.Tensor, dst: int = 0, dim: int = -1) -> torch.Tensor | None:
        """Concatenation on ``dst`` (None elsewhere). Falls back to all_gather where needed."""
        if self.world_size == 1:
            return x
        if self.name in ("gloo",):
            parts = [torch.empty_like(x) for _ in range(self.world_size)] if self.rank == dst else None
            dist.gather(x.contiguous(), parts, dst=dst, group=self.group)
            return torch.cat(parts, dim=dim) if parts is not None else None
        out = self.all_gather(x, dim)
        return out if self.rank == dst else None

    def broadcast(self, x: torch.Tensor, src: int = 0) -> torch.Tensor:
        if self.world_size > 1:
            dist.broadcast(x, src=src, group=self.group)
        return x

    def barrier(self) -> None:
        if self.world_size > 1:
            dist.barrier(group=self.group)


class XlaCommunicator(Communicator):
    """TPU collectives through torch_xla's own ops (compiled into the XLA graph)."""

    def all_reduce(self, x):
        if self.world_size == 1:
            return x
        import torch_xla.core.xla_model as xm

        return xm.all_reduce(xm.REDUCE_SUM, x)

    def all_gather(self, x, dim=-1):
        if self.world_size == 1:
            return x
        import torch_xla.core.xla_model as xm

        return xm.all_gather(x, dim=dim)

    def gather(self, x, dst=0, dim=-1):
        out = self.all_gather(x, dim)
        return out if self.rank == dst else None


def create_communicator(name: str, group, rank: int, world_size: int) -> Communicator:
    torch_backend_for(name)  # validates the name
    cls = XlaCommunicator if name == "xla" else Communicator
    return cls(name, group, rank, world_size)
