"""One request's grammar state: the compile future, then an xgrammar ``GrammarMatcher``.

Invariant: once ready, the matcher has accepted exactly the request's output tokens that
count for the constraint (all of them, or those after the reasoning section when a reasoning
parser is set, up to the grammar's stop token), in order. Preemption by recompute keeps the
output tokens, so the matcher keeps its state; nothing is ever removed from the output.
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
        """The next token is masked: always but while thinking, and once the grammar has
        terminated (accepted its stop token; see ``_advance``)."""
        return self.reasoning_state != "thinking" and not self.matcher.is_terminated()

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
        """Advance by the step's new tokens (accepted drafts, then the sampled one); False when
        a token breaks the grammar (the mask forbids that, so it means a bug; logged)."""
        for t in token_ids:
            if self._advance(t) is None:
                logger.error("structured output: token %d is not allowed by the grammar", t)
                return False
        return True

    def _advance(self, token: int) -> bool | None:
        """Feed one token. None: the constraint refuses it (nothing changed); else whether the
        matcher took a step. Tokens go, in turn:

        - state ``maybe``: the start marker's first token opens the reasoning section,
          anything else is the answer's first token (the grammar's, from here on);
        - ``thinking``: free text, kept in a short tail searched for the end marker; the
          first complete end marker ends the section (the grammar sees the next token first);
        - ``ended``: the matcher; once it has accepted a stop token (terminated) the grammar
          constrains nothing more (vLLM's rule; only ``ignore_eos`` keeps a request going past
          its stop token), so later tokens pass unchecked.
        """
        if self.reasoning_state == "maybe" and token == self._start_ids[0]:
            self.reasoning_state = "thinking"
            return False
        if self.reasoning_state == "thinking":
            end = self._end_ids
            tail = (self._reasoning_tail + [token])[-len(end):]  # a new list: snapshots stay valid
            if tail == end:
                self.reasoning_state, self._reasoning_tail = "ended", []
            else:
                self._reasoning_tail = tail
            return False
        if self.matcher.is_terminated():
            return False
        if not self.matcher.accept_token(token):
            return None
        self.reasoning_state = "ended"  # from ``maybe``: the answer has begun
        return True

    def fill_bitmask(self, bitmask: np.ndarray, row: int) -> None:
        """The mask of the next token (only while ``constrains_next``)."""
        self.matcher.fill_next_token_bitmask(bitmask, row)
        self.allow_reasoning_start(bitmask, row)

    def allow_reasoning_start(self, bitmask: np.ndarray, row: int) -> None:
        """In state ``maybe`` the reasoning start marker's first token is allowed too."""
        if self.reasoning_state == "maybe":
            t = self._start_ids[0]
            bitmask[row, t // 32] |= np.int32(np.uint32(1 << (t % 32)).view(np.int32))

    def is_terminated(self) -> bool:
        return self.matcher is not None and self.matcher.is_terminated()
