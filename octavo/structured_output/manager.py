"""What the engine core asks of structured outputs, once per request and once per step.

- ``attach(request)``: start compiling its grammar (thread pool) and give the request its
  ``StructuredOutputRequest``; the scheduler leaves it waiting, in its place, until ready.
- ``poll()``: requests whose grammar failed to compile (the engine finishes them with the
  error; the input processor has already refused anything that does not parse, so this is
  rare).
- ``grammar_bitmask(scheduler_output)``: packed rows (int32, bit ``t % 32`` of word
  ``t // 32`` set when token ``t`` is allowed) for each structured request that samples in
  this step, filled from its matcher: one row, or ``1 + k`` when it verifies ``k`` drafts (one
  per verified position, the drafts accepted tentatively, then rolled back); the runner hands
  the rows to the sampler, which masks every position before rejection sampling.

Speculative decoding: the engine passes a grammar request's proposed drafts through
``StructuredOutputRequest.validate_drafts`` first (the longest prefix the grammar accepts), so
every scheduled draft is grammar-valid and each row above is well defined.

Async scheduling: a structured request's next mask needs its previous token on the host, so
``SamplingParams.needs_output_history`` is true for it and the engine does not overlap steps
while one runs (the same rule as penalties). Hence, at ``grammar_bitmask`` time, a
structured request has no token in flight, and it samples in this step exactly when the
scheduler gave it an output placeholder.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import numpy as np

from octavo.core.request import Request
from octavo.core.scheduler_output import SchedulerOutput
from octavo.structured_output.compiler import GrammarCompilerPool
from octavo.structured_output.grammar import check_backend
from octavo.structured_output.reasoning import (
    REASONING_MARKERS,
    check_reasoning_parser,
    initial_state,
)
from octavo.structured_output.request import StructuredOutputRequest

logger = logging.getLogger(__name__)

IDLE_WAIT_S = 0.01  # how long an otherwise idle engine blocks on a compile before re-polling


class StructuredOutputManager:
    def __init__(
        self,
        load_tokenizer: Callable[[], Any],
        vocab_size: int,
        stop_token_ids: list[int],
        backend: str = "auto",
        reasoning_parser: str | None = None,
    ) -> None:
        check_backend(backend)
        check_reasoning_parser(reasoning_parser)
        self.reasoning_parser = reasoning_parser
        self._reasoning_ids: tuple[list[int], list[int]] | None = None
        self.vocab_size = vocab_size
        self.bitmask_width = (vocab_size + 31) // 32
        self._pool_args = (load_tokenizer, vocab_size, stop_token_ids)
        self._pool: GrammarCompilerPool | None = None
        self._pending: list[Request] = []  # attached, grammar not ready yet
        self._batch_matcher = None

    @property
    def pool(self) -> GrammarCompilerPool:
        if self._pool is None:
            self._pool = GrammarCompilerPool(*self._pool_args)
        return self._pool

    def attach(self, request: Request) -> None:
        params = request.sampling_params.structured_outputs
        if params is None:
            return
        reasoning = None
        if self.reasoning_parser is not None:
            start_ids, end_ids = self.reasoning_ids()
            state = initial_state(self.reasoning_parser, request.prompt_token_ids, start_ids, end_ids)
            reasoning = (state, start_ids, end_ids)
        request.structured_output_request = StructuredOutputRequest(self.pool.submit(params), reasoning)
        self._pending.append(request)

    def reasoning_ids(self) -> tuple[list[int], list[int]]:
        """Token ids of the reasoning start and end markers (the tokenizer is loaded once)."""
        if self._reasoning_ids is None:
            tok = self.pool.tokenizer()
            start, end = REASONING_MARKERS[self.reasoning_parser]
            self._reasoning_ids = tuple(tok.encode(m, add_special_tokens=False) for m in (start, end))
        return self._reasoning_ids

    def poll(self) -> list[tuple[Request, str]]:
        """Forget requests whose grammar is ready; return those whose compile failed."""
        failed, still = [], []
        for req in self._pending:
            sor = req.structured_output_request
            if req.is_finished():
                continue
            if sor.is_ready():
                continue
            if sor.error is not None:
                failed.append((req, sor.error))
            else:
                still.append(req)
        self._pending = still
        return failed

    def wait_for_compile(self) -> None:
        """Called when a step scheduled nothing: block briefly on the oldest pending compile."""
        if self._pending:
            self._pending[0].structured_output_request.wait(IDLE_WAIT_S)

    def grammar_bitmask(self, so: SchedulerOutput) -> None:
        """Set ``so.structured_output_request_ids`` and ``so.grammar_bitmask``: for each listed
        request, in that order, ``1 + k`` rows when it verifies ``k`` drafts this step (row ``i``:
        the mask after drafts ``0..i-1``; see ``StructuredOutputRequest.fill_bitmask_rows``),
        else one. A request none of whose positions is masked (reasoning) is not listed."""
        spec = so.scheduled_spec_decode_tokens
        listed: list[tuple[str, StructuredOutputRequest, list[int]]] = []
        for rid, req in so.scheduled_requests.items():
            sor = req.structured_output_request
            if sor is None or req.num_output_placeholders == 0:
                continue
            drafts = spec.get(rid, []) if spec else []
            if drafts or sor.constrains_next:  # drafts may cross the reasoning end marker
                listed.append((rid, sor, drafts))
        if not listed:
            return
        counts = np.fromiter((len(d) + 1 for _, _, d in listed), dtype=np.int64, count=len(listed))
        starts = np.cumsum(counts) - counts
        bitmask = np.full((int(counts.sum()), self.bitmask_width), -1, dtype=np.int32)
        masked = np.ones(len(listed), dtype=bool)
        single: list[int] = []  # requests with one position: filled in one batch call
        for i, (_, sor, drafts) in enumerate(listed):
            if drafts:
                masked[i] = sor.fill_bitmask_rows(bitmask, int(starts[i]), drafts)
            else:
                single.append(i)
        self._fill_single_rows(bitmask, [listed[i][1] for i in single], starts[single].tolist())
        if not masked.all():  # every position of these is reasoning: no rows
            keep = np.repeat(masked, counts)
            bitmask = bitmask[keep]
            listed = [entry for entry, m in zip(listed, masked.tolist(), strict=True) if m]
            if not listed:
                return
        so.structured_output_request_ids = [rid for rid, _, _ in listed]
        so.grammar_bitmask = bitmask

    def _fill_single_rows(self, bitmask: np.ndarray, sors: list[StructuredOutputRequest], rows: list[int]) -> None:
        """Fill ``rows[i]`` from ``sors[i]``'s current state (each ``constrains_next``)."""
        if not sors:
            return
        if len(sors) == 1:
            sors[0].matcher.fill_next_token_bitmask(bitmask, rows[0])
        else:
            if self._batch_matcher is None:
                import xgrammar as xgr

                self._batch_matcher = xgr.BatchGrammarMatcher()
            self._batch_matcher.batch_fill_next_token_bitmask([s.matcher for s in sors], bitmask, rows)
        for row, sor in zip(rows, sors, strict=True):
            sor.allow_reasoning_start(bitmask, row)

    def shutdown(self) -> None:
        if self._pool is not None:
            self._pool.shutdown()
