"""A model-runner step whose sampled tokens may still be on their way to the host.

``ModelRunner.execute_model_async`` launches a step (inputs, forward, sampling) and returns a
``StepHandle`` without waiting for the device; the engine schedules and launches the next
step, then calls ``result()``. On an accelerator the sampled tokens (and logprobs) are copied
into pinned host memory with non-blocking copies followed by an event, so ``result()`` waits
for exactly this step, never for the one launched after it. On the CPU everything is already
computed at launch and ``result()`` only does the bookkeeping.

Invariant: a runner has at most one step launched and not yet resulted when it launches the
next one, so the tokens a step leaves pending are always those of the step just before.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from octavo.core.sampler import LogprobsTensors
from octavo.core.scheduler_output import ModelRunnerOutput


@dataclass
class PendingTokens:
    """The sampled tokens of the last launched step, still on the device.

    ``index[(row, serial)]`` is the position in ``sampled`` of that row occupancy's token.
    """

    sampled: torch.Tensor
    index: dict[tuple[int, int], int]


class StepHandle:
    """One launched step; ``result()`` returns its ``ModelRunnerOutput`` (once)."""

    def __init__(
        self,
        runner,
        req_ids: list[str],
        sample_pos: np.ndarray,
        sample_keys: list[tuple[int, int]],
        sampled_host: torch.Tensor | None,
        logprobs_host: LogprobsTensors | None,
        num_logprobs: np.ndarray | None,
        event,
        prompt_logprobs,
    ) -> None:
        self._runner = runner
        self._req_ids = req_ids
        self._sample_pos = sample_pos
        self._sample_keys = sample_keys
        self._sampled_host = sampled_host
        self._logprobs_host = logprobs_host
        self._num_logprobs = num_logprobs
        self._event = event
        self._prompt_logprobs = prompt_logprobs
        self._output: ModelRunnerOutput | None = None

    @classmethod
    def done(cls, runner, output: ModelRunnerOutput) -> StepHandle:
        h = cls(runner, output.req_ids, np.zeros(0, np.int64), [], None, None, None, None, None)
        h._output = output
        return h

    def result(self) -> ModelRunnerOutput:
        if self._output is not None:
            return self._output
        runner = self._runner
        if self._event is not None:
            self._event.synchronize()
        sampled = self._sampled_host.numpy().copy() if self._sampled_host is not None else None
        runner._finish_step(self)
        sampled_lists: list[list[int]] = [[] for _ in self._req_ids]
        logprobs_lists = None
        if sampled is not None:
            batch = runner.input_batch
            # Append to the rows that still hold the requests this step sampled for.
            keep = np.fromiter(
                (batch.serial[row] == serial for row, serial in self._sample_keys), dtype=bool,
                count=len(self._sample_keys),
            )
            rows = np.fromiter((row for row, _ in self._sample_keys), dtype=np.int64, count=len(self._sample_keys))
            batch.append_tokens(rows[keep], sampled[keep])
            for i, t in zip(self._sample_pos.tolist(), sampled.tolist(), strict=True):
                sampled_lists[i] = [t]
            if self._logprobs_host is not None:
                per_row = runner._logprobs_lists(self._logprobs_host, self._num_logprobs)
                logprobs_lists = [None] * len(self._req_ids)
                for i, lp in zip(self._sample_pos.tolist(), per_row, strict=True):
                    logprobs_lists[i] = lp
        self._output = ModelRunnerOutput(
            req_ids=self._req_ids,
            sampled_token_ids=sampled_lists,
            logprobs=logprobs_lists,
            prompt_logprobs=self._prompt_logprobs,
        )
        self._runner = None
        return self._output
