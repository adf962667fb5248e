"""Host <-> device copies that never wait for the work already queued on the device.

A blocking host-to-device copy synchronizes the stream first, and a copy from pageable
memory may too, so a step that builds its inputs while the previous step still runs (async
scheduling) would stall on it. Both helpers go through pinned memory from torch's caching
host allocator (cheap after warm-up; a block is reused only once its copy has completed).
On the CPU they are plain conversions.
"""

from __future__ import annotations

from functools import cache

import numpy as np
import torch


@cache
def _pinnable_type(device_type: str) -> bool:
    from octavo.platforms import current_platform

    return device_type != "cpu" and bool(current_platform.is_pin_memory_available())


def _pinnable(device: torch.device) -> bool:
    return _pinnable_type(device.type)


def to_device(a: np.ndarray, device: torch.device) -> torch.Tensor:
    """``a`` as a tensor on ``device``; the copy is queued, the host does not wait."""
    t = torch.from_numpy(np.ascontiguousarray(a))
    if device.type == "cpu":
        return t
    if _pinnable(device):
        t = t.pin_memory()
    return t.to(device, non_blocking=True)


def to_host_async(t: torch.Tensor) -> torch.Tensor:
    """A host tensor that will hold ``t`` once the work queued so far has run.

    Read it only after an event recorded after this call has completed.
    """
    if t.device.type == "cpu":
        return t
    host = torch.empty(t.shape, dtype=t.dtype, pin_memory=_pinnable(t.device))
    host.copy_(t, non_blocking=True)
    return host
