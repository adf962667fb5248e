"""Garbage collection around device-graph capture."""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def no_garbage_collection() -> Iterator[None]:
    """Collect once, then no collection until the block ends: a finalizer run by the collector
    in the middle of a capture (an earlier engine's pinned buffers, events or graphs being
    freed) would make a call that is illegal while capturing and invalidate the graph."""
    gc.collect()
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
