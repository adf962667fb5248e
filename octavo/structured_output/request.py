"""One request's grammar state: the compile future, then an xgrammar ``GrammarMatcher``.

Invariant: once ready, the matcher has accepted exactly the request's output tokens that
count for the constraint (all of them, or those after the reasoning section when a reasoning
parser is set), in order. Preemption by recompute keeps the output tokens, so the matcher
keeps its state; nothing is ever removed from the output, so no rollback is needed.
"""

from __future__ import annotations

import logging
from concurrent.futures import Future

import numpy as np

logger = logging.getLogger(__name__)


class StructuredOutputRequest:
    def __init__(self, grammar: Future) -> None:
        self._grammar = grammar
        self.matcher = None
        self.error: str | None = None

    def is_ready(self) -> bool:
        """The grammar compiled and the matcher exists. Never blocks. After a failed compile
        this stays False and ``error`` says why (the engine then finishes the request)."""
        if self.matcher is None and self.error is None and self._grammar.done():
            exc = self._grammar.exception()
            if exc is not None:
                self.error = str(exc) or type(exc).__name__
            else:
                import xgrammar as xgr

                self.matcher = xgr.GrammarMatcher(self._grammar.result())
        return self.matcher is not None

    def wait(self, timeout: float) -> None:
        """Block up to ``timeout`` seconds for the compile (only when the engine is idle)."""
        try:
            self._grammar.exception(timeout=timeout)
        except TimeoutError:
            pass

    def accept_tokens(self, token_ids: list[int]) -> bool:
        """Advance the matcher; False when a token breaks the grammar (the mask forbids that)."""
        for t in token_ids:
            if self.matcher.is_terminated() or not self.matcher.accept_token(t):
                logger.error("structured output: token %d is not allowed by the grammar", t)
                return False
        return True

    def fill_bitmask(self, bitmask: np.ndarray, row: int) -> None:
        self.matcher.fill_next_token_bitmask(bitmask, row)

    def is_terminated(self) -> bool:
        return self.matcher is not None and self.matcher.is_terminated()
