"""What the engine core asks of structured outputs, once per request and once per step.

- ``attach(request)``: start compiling its grammar (thread pool) and give the request its
  ``StructuredOutputRequest``; the scheduler leaves it waiting, in its place, until ready.
- ``poll()``: requests whose grammar failed to compile (the engine finishes them with the
  error; the input processor has already refused anything that does not parse, so this is
  rare).
- ``grammar_bitmask(scheduler_output)``: one packed row (int32, bit ``t % 32`` of word
  ``t // 32`` set when token ``t`` is allowed) per structured request that samples in this
  step, filled from its matcher; the runner hands the rows to the sampler.

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
        """Set ``so.structured_output_request_ids`` and ``so.grammar_bitmask`` (rows in that order)."""
        sampling = [
            (rid, req.structured_output_request)
            for rid, req in so.scheduled_requests.items()
            if req.structured_output_request is not None and req.num_output_placeholders > 0
            and req.structured_output_request.constrains_next
        ]
        if not sampling:
            return
        bitmask = np.full((len(sampling), self.bitmask_width), -1, dtype=np.int32)
        matchers = [sor.matcher for _, sor in sampling]
        if len(matchers) == 1:
            matchers[0].fill_next_token_bitmask(bitmask, 0)
        else:
            if self._batch_matcher is None:
                import xgrammar as xgr

                self._batch_matcher = xgr.BatchGrammarMatcher()
            self._batch_matcher.batch_fill_next_token_bitmask(matchers, bitmask)
        for row, (_, sor) in enumerate(sampling):
            sor.allow_reasoning_start(bitmask, row)
        so.structured_output_request_ids = [rid for rid, _ in sampling]
        so.grammar_bitmask = bitmask

    def shutdown(self) -> None:
        if self._pool is not None:
            self._pool.shutdown()
