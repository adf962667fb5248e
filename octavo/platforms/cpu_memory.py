"""Host allocator policy for CPU workers: ``OCTAVO_CPU_MALLOC_RETAIN`` (default on).

torch's CPU tensors come from glibc's ``malloc``. glibc serves a request above its mmap
threshold (128 KiB at start, raised on the fly up to 32 MiB) with a fresh ``mmap`` and gives a
freed heap top above its trim threshold back to the OS, so the activations of every step -- a
prefill chunk's MLP output alone is ~12 MiB -- come back as untouched pages, and each first
write page-faults (about a microsecond per 4 KiB page in a VM). Pinning both thresholds keeps
freed memory in the process for the next step; the cost is that the heap's peak stays mapped.
(vLLM's CPU backend gets the same effect from tcmalloc, which its images ``LD_PRELOAD``.)
"""

from __future__ import annotations

import ctypes
import logging
import sys

from octavo import envs

logger = logging.getLogger(__name__)

M_TRIM_THRESHOLD = -1  # glibc's mallopt parameters (malloc.h)
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 << 20  # glibc's largest (64-bit); requests above it still get their own mmap
TRIM_THRESHOLD = 1 << 30  # free heap top kept before glibc returns any of it

_APPLIED: dict[str, bool] = {}


def retain_freed_memory() -> bool:
    """Pin glibc's mmap and trim thresholds (once per process; True when they are set). Off
    with ``OCTAVO_CPU_MALLOC_RETAIN=0``; a no-op (False) off Linux or without glibc's mallopt."""
    if "result" in _APPLIED:
        return _APPLIED["result"]
    ok = False
    if envs.OCTAVO_CPU_MALLOC_RETAIN and sys.platform.startswith("linux"):
        try:
            mallopt = ctypes.CDLL(None).mallopt
        except (OSError, AttributeError):  # not glibc (musl has no mallopt)
            mallopt = None
        if mallopt is not None:
            mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
            ok = mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1 and mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1
            if not ok:
                logger.warning("glibc refused the allocator thresholds; freed memory goes back to the OS")
    _APPLIED["result"] = ok
    return ok
