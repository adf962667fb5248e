"""Garbage collection around device-graph capture, and the engine's long-lived heap."""

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


def freeze_startup_heap() -> None:
    """Collect once, then move every object alive now (the model, its kernels' plans, the
    tokenizer, the engine) out of the collector's view: full collections during serving then
    walk only what requests create. vLLM's engine core does the same after startup; a full
    collection over a loaded model otherwise costs milliseconds several times a second.
    ``thaw_heap`` (at shutdown) hands them back, so an engine built and dropped in a longer
    process (tests, notebooks) is still collected."""
    gc.collect()
    gc.freeze()


def thaw_heap() -> None:
    gc.unfreeze()
