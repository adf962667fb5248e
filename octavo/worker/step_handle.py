"""A model-runner step whose sampled tokens may still be on their way to the host.

``ModelRunner.execute_model_async`` launches a step (inputs, forward, sampling) and returns a
``StepHandle`` without waiting for the device; the engine schedules and launches the next
step, then calls ``result()``. On an accelerator the sampled tokens (and logprobs) are copied
into pinned host memory with non-blocking copies followed by an event, so ``result()`` waits
for exactly this step, never for the one launched after it. On the CPU everything is already
computed at launch and ``result()`` only does the bookkeeping.

Invariant: a runner has at most one step launched and not yet resulted when it launches the
next one, so the tokens a step leaves pending are always those of the last unresulted step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from octavo.core.sampler import LogprobsTensors
from octavo.core.scheduler_output import ModelRunnerOutput
from octavo.spec_decode.rejection_sampler import DraftLayout


def logprob_dicts(lp: LogprobsTensors, counts) -> list[dict[int, tuple[float, int]] | None]:
    """Row ``i`` as ``{token_id: (logprob, rank)}``: the sampled (or target) token first with
    its rank, then the top ``counts[i]`` tokens with ranks 1..k; None where ``counts[i] < 0``."""
    ids, lps, ranks = lp.token_ids.tolist(), lp.logprobs.tolist(), lp.sampled_ranks.tolist()
    out: list[dict[int, tuple[float, int]] | None] = []
    for i, k in enumerate(np.asarray(counts).tolist()):
        if k < 0:
            out.append(None)
            continue
        d = {ids[i][0]: (lps[i][0], ranks[i])}
        for j in range(1, k + 1):
            d.setdefault(ids[i][j], (lps[i][j], j))
        out.append(d)
    return out


class ReadyStep:
    """A step already computed (nothing to wait for)."""

    def __init__(self, output: ModelRunnerOutput) -> None:
        self._output = output

    def result(self) -> ModelRunnerOutput:
        return self._output


@dataclass
class SampledTokens:
    """One step's sampled tokens: on the device (inputs of the next step) and on their way
    to the host. Entry ``i`` belongs to the occupancy ``serials[i]`` of input-batch row
    ``rows[i]``; ``host`` and ``logprobs_host`` may be read once ``event`` has completed."""

    device: torch.Tensor  # [S] int64
    rows: np.ndarray  # [S] int64
    serials: np.ndarray  # [S] int64
    host: torch.Tensor
    logprobs_host: LogprobsTensors | None
    num_logprobs: np.ndarray | None
    event: Any  # a platform event, None on the CPU
    # Speculative decoding: tokens each row emits [len(rows)] (accepted drafts + 1); then
    # ``host`` holds every verified position, row by row, and each row keeps its first ones.
    # None when no row verified drafts (``host`` has one token per row).
    num_emitted_host: torch.Tensor | None = None
    layout: DraftLayout | None = None  # where each row's positions sit in ``host``
    num_emitted_device: torch.Tensor | None = None  # ``num_emitted_host`` still on the device

    @property
    def position_starts(self) -> np.ndarray | None:
        """[len(rows)] flat index of each row's first position (None without drafts)."""
        return None if self.layout is None else self.layout.starts

    def emitted(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(tokens each row emits, flat index of each row's first position, emitted tokens
        row by row) once the step has completed."""
        tokens = self.host.numpy()
        if self.num_emitted_host is None:
            return np.ones(len(tokens), dtype=np.int64), np.arange(len(tokens)), tokens
        counts = self.num_emitted_host.numpy().astype(np.int64, copy=False)
        grid = self.layout.grid
        return counts, self.layout.starts, tokens[grid[np.arange(grid.shape[1]) < counts[:, None]]]


class StepHandle:
    """One launched step; ``result()`` returns its ``ModelRunnerOutput`` (once computed, cached)."""

    def __init__(self, runner, req_ids: list[str], sample_pos: np.ndarray, prompt_logprobs,
                 sampled: SampledTokens | None) -> None:
        self._runner = runner
        self._req_ids = req_ids
        self._sample_pos = sample_pos  # positions in req_ids of the sampled requests
        self._prompt_logprobs = prompt_logprobs
        self.sampled = sampled
        self._output: ModelRunnerOutput | None = None

    @property
    def collected(self) -> bool:
        """Its tokens are in the input batch (``collect`` ran)."""
        return self._output is not None

    def result(self) -> ModelRunnerOutput:
        out = self.collect()
        if self._runner is not None:
            self._runner._finish_step(self)
            self._runner = None
        return out

    def collect(self) -> ModelRunnerOutput:
        """Wait for the step's sampled tokens and append them to the runner's input batch (once;
        ``result`` calls it, and a runner that must stage the next step from exact token counts
        calls it earlier: speculative decoding with async scheduling)."""
        if self._output is None:
            self._output = self._collect()
        return self._output

    def _collect(self) -> ModelRunnerOutput:
        runner, s = self._runner, self.sampled
        sampled_lists: list[list[int]] = [[] for _ in self._req_ids]
        logprobs_lists = None
        if s is not None:
            if s.event is not None:
                s.event.synchronize()
            batch = runner.input_batch
            keep = batch.serial[s.rows] == s.serials  # rows not freed and reused meanwhile
            pos = self._sample_pos.tolist()
            if s.num_emitted_host is None:  # one token per row (no drafts verified)
                tokens = s.host.numpy()
                batch.append_tokens(s.rows[keep], tokens[keep])
                for i, t in zip(pos, tokens.tolist(), strict=True):
                    sampled_lists[i] = [t]
                per_row = None
                if s.logprobs_host is not None:
                    per_row = [None if d is None else [d] for d in logprob_dicts(s.logprobs_host, s.num_logprobs)]
            else:
                per_row = self._emit_runs(batch, s, keep, pos, sampled_lists)
            if per_row is not None:
                logprobs_lists = [None] * len(self._req_ids)
                for i, lp in zip(pos, per_row, strict=True):
                    logprobs_lists[i] = lp
        return ModelRunnerOutput(
            req_ids=self._req_ids,
            sampled_token_ids=sampled_lists,
            logprobs=logprobs_lists,
            prompt_logprobs=self._prompt_logprobs,
        )

    @staticmethod
    def _emit_runs(batch, s: SampledTokens, keep: np.ndarray, pos: list[int], sampled_lists: list) -> list | None:
        """Speculative decoding: each row emits its accepted drafts plus one token. Fills
        ``sampled_lists`` and the input batch; returns the logprobs per row (None without)."""
        counts, starts, flat = s.emitted()
        batch.append_token_runs(s.rows[keep], flat[np.repeat(keep, counts)], counts[keep])
        tokens, ends = flat.tolist(), np.cumsum(counts).tolist()
        for i, a, b in zip(pos, [0, *ends[:-1]], ends, strict=True):
            sampled_lists[i] = tokens[a:b]
        if s.logprobs_host is None:
            return None
        dicts = logprob_dicts(s.logprobs_host, s.num_logprobs)
        return [None if dicts[a] is None else dicts[a : a + c]
                for a, c in zip(starts.tolist(), counts.tolist(), strict=True)]
