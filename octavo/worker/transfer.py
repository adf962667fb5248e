"""Host <-> device copies that never wait for the work already queued on the device.

A blocking host-to-device copy synchronizes the stream first, and a copy from pageable
memory may too, so a step that builds its inputs while the previous step still runs (async
scheduling) would stall on it. Both directions go through pinned memory from torch's caching
host allocator (cheap after warm-up; a block is reused only once its copy has completed) where
the platform has it. Where the platform's device is the host (CPU) they are plain conversions.
The choice is made once, from the platform the runner was handed.
"""

from __future__ import annotations

import numpy as np
import torch


class DeviceTransfer:
    """Copies between numpy/host tensors and one device of one platform."""

    def __init__(self, platform, device: torch.device) -> None:
        self.device = device
        self.host = bool(platform.device_is_host())
        self.pin = not self.host and bool(platform.is_pin_memory_available())

    def to_device(self, a: np.ndarray) -> torch.Tensor:
        """``a`` as a tensor on the device; the copy is queued, the host does not wait."""
        t = torch.from_numpy(np.ascontiguousarray(a))
        if self.host:
            return t
        if self.pin:
            t = t.pin_memory()
        return t.to(self.device, non_blocking=True)

    def to_host_async(self, t: torch.Tensor) -> torch.Tensor:
        """A host tensor that will hold ``t`` once the work queued so far has run.

        Read it only after an event recorded after this call has completed.
        """
        if self.host:
            return t
        host = torch.empty(t.shape, dtype=t.dtype, pin_memory=self.pin)
        host.copy_(t, non_blocking=True)
        return host
