"""The tensor-parallel group of this process: rank, world size and its communicator.

``init_distributed`` is called once per worker process (after the device is set); with
world size 1 no process group is created and every collective is the identity.
Environment variables of ``torchrun`` (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``,
``MASTER_PORT``) are honoured when no explicit init method is given.
"""

from __future__ import annotations

import datetime
import logging
import os

import torch.distributed as dist

from octavo.distributed.communicator import Communicator, create_communicator, torch_backend_for

logger = logging.getLogger(__name__)

_TP: Communicator = create_communicator("gloo", None, 0, 1)
# --enable-expert-parallel: MoE layers place whole experts on ranks instead of sharding each.
_EXPERT_PARALLEL = False


def init_distributed(
    communicator: str,
    rank: int,
    world_size: int,
    init_method: str | None = None,
    timeout_s: float = 120.0,
) -> Communicator:
    global _TP
    if world_size == 1:
        _TP = create_communicator(communicator, None, 0, 1)
        return _TP
    backend = torch_backend_for(communicator)
    if not dist.is_initialized():
        if init_method is None:
            addr = os.environ.get("MASTER_ADDR", "127.0.0.1")
            port = os.environ.get("MASTER_PORT", "29500")
            init_method = f"tcp://{addr}:{port}"
        dist.init_process_group(
            backend=backend,
            init_method=init_method,
            rank=rank,
            world_size=world_size,
            timeout=datetime.timedelta(seconds=timeout_s),
        )
    _TP = create_communicator(communicator, dist.group.WORLD, rank, world_size)
    logger.info("rank %d/%d joined the %s group", rank, world_size, communicator)
    return _TP


def get_tp() -> Communicator:
    return _TP


def set_expert_parallel(enabled: bool) -> None:
    """Record ``--enable-expert-parallel`` for the MoE layers built in this process."""
    global _EXPERT_PARALLEL
    _EXPERT_PARALLEL = bool(enabled)


def expert_parallel_enabled() -> bool:
    return _EXPERT_PARALLEL


def destroy_distributed() -> None:
    global _TP, _EXPERT_PARALLEL
    _EXPERT_PARALLEL = False
    if dist.is_initialized():
        dist.destroy_process_group()
    _TP = create_communicator("gloo", None, 0, 1)
