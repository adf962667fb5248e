"""One request's grammar state: the compile future, then an xgrammar ``GrammarMatcher``.

Invariant: once ready, the matcher has accepted exactly the request's output tokens that
count for the constraint (all of them, or those after the reasoning section when a reasoning
parser is set, up to the grammar's stop token), in order. Preemption by recompute keeps the
output tokens, so the matcher keeps its state; nothing is ever removed from the output.

Speculative decoding looks ahead without breaking the invariant: ``validate_drafts`` (the
longest prefix of a proposal the grammar accepts) and ``fill_bitmask_rows`` (one mask per
verified position) advance the matcher and the reasoning state tentatively through the
drafts, then roll both back (xgrammar >= 0.2.9, the required version, rolls back any number of
steps: its ``max_rollback_tokens`` is deprecated and always unlimited).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from contextlib import contextmanager

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
        matcher took a step (rolled back by ``_tentative``). Tokens go, in turn:

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

    @contextmanager
    def _tentative(self) -> Iterator[Callable[[int], bool]]:
        """``with self._tentative() as step``: ``step(token)`` advances as ``accept_tokens``
        would (False, changing nothing, where the constraint refuses the token); on exit the
        matcher rolls back every step taken and the reasoning state is restored, so the
        invariant (the matcher has accepted exactly the request's output) holds again."""
        state, tail, steps = self.reasoning_state, self._reasoning_tail, 0

        def step(token: int) -> bool:
            nonlocal steps
            moved = self._advance(token)
            steps += bool(moved)
            return moved is not None

        try:
            yield step
        finally:
            if steps:
                self.matcher.rollback(steps)
            self.reasoning_state, self._reasoning_tail = state, tail

    def validate_drafts(self, drafts: list[int]) -> list[int]:
        """The longest prefix of ``drafts`` the constraint accepts after the output so far
        (the state is unchanged): the drafts worth scheduling, since a masked position can
        never sample a token the grammar refuses, so verification would reject it anyway."""
        n = 0
        with self._tentative() as step:
            while n < len(drafts) and step(drafts[n]):
                n += 1
        return drafts[:n]

    def fill_bitmask_rows(self, bitmask: np.ndarray, row: int, drafts: list[int]) -> bool:
        """Fill rows ``row .. row + len(drafts)``: row ``row + i`` is the mask of the position
        after ``drafts[:i]`` (its logits verify ``drafts[i]``, or give the bonus token). Rows
        where nothing is masked (reasoning, a terminated grammar) are all ones. The drafts must
        have passed ``validate_drafts`` (RuntimeError otherwise); the state is unchanged.
        Returns whether any row masks something."""
        masked = False
        with self._tentative() as step:
            for i in range(len(drafts) + 1):
                if i and not step(drafts[i - 1]):
                    raise RuntimeError(
                        f"structured output: draft token {drafts[i - 1]} (position {i - 1}) is not allowed "
                        "by the grammar; drafts must pass validate_drafts before they are scheduled"
                    )
                if self.constrains_next:
                    self.fill_bitmask(bitmask, row + i)
                    masked = True
                else:
                    bitmask[row + i] = -1
        return masked

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
