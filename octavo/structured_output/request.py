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
    def __init__(
        self,
        grammar: Future,
        reasoning: tuple[str, list[int], list[int]] | None = None,
    ) -> None:
        """``reasoning``: (initial state, start marker ids, end marker ids) with
        ``--reasoning-parser`` (see ``octavo.structured_output.reasoning.initial_state``);
        the grammar sees the tokens after the end marker only. None: no reasoning section."""
        self._grammar = grammar
        self.matcher = None
        self.error: str | None = None
        self.reasoning_state, self._start_ids, self._end_ids = reasoning or ("ended", [], [])
        self._reasoning_tail: list[int] = []

    @property
    def reasoning_ended(self) -> bool:
        return self.reasoning_state == "ended"

    @property
    def constrains_next(self) -> bool:
        """The next token is masked (always but while thinking)."""
        return self.reasoning_state != "thinking"

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
        """Advance the matcher; False when a token breaks the grammar (the mask forbids that).

        While reasoning, tokens only go to a short tail that is searched for the end marker;
        the tokens after the marker are the first the grammar sees."""
        if self.reasoning_state == "maybe" and token_ids:
            opened = token_ids[0] == self._start_ids[0]
            self.reasoning_state = "thinking" if opened else "ended"
        if self.reasoning_state == "thinking":
            token_ids = self._after_reasoning(token_ids)
        for t in token_ids:
            if self.matcher.is_terminated() or not self.matcher.accept_token(t):
                logger.error("structured output: token %d is not allowed by the grammar", t)
                return False
        return True

    def _after_reasoning(self, token_ids: list[int]) -> list[int]:
        from octavo.structured_output.reasoning import find_last

        end = self._end_ids
        keep = len(end) - 1
        tail = self._reasoning_tail + list(token_ids)
        pos = find_last(tail, end)
        if pos < 0:
            self._reasoning_tail = tail[-keep:] if keep else []
            return []
        self.reasoning_state = "ended"
        self._reasoning_tail = []
        return tail[pos:]

    def fill_bitmask(self, bitmask: np.ndarray, row: int) -> None:
        self.matcher.fill_next_token_bitmask(bitmask, row)
        self.allow_reasoning_start(bitmask, row)

    def allow_reasoning_start(self, bitmask: np.ndarray, row: int) -> None:
        """In state ``maybe`` the reasoning start marker's first token is allowed too."""
        if self.reasoning_state == "maybe":
            t = self._start_ids[0]
            bitmask[row, t // 32] |= np.int32(np.uint32(1 << (t % 32)).view(np.int32))

    def is_terminated(self) -> bool:
        return self.matcher is not None and self.matcher.is_terminated()
