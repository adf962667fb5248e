"""Verification of draft tokens, on the device, vectorised over the whole batch.

Layout: the ``T`` sampling positions of a step are flat and grouped per request; a request
with ``k`` drafts has ``k + 1`` consecutive positions (the logits after its last known token
and after each draft), a request without drafts one. Position ``j`` of a request is sampled by
the ordinary sampler as if drafts ``0..j-1`` were accepted (temperature, top-k/top-p/min-p,
penalties, bad words, ``min_tokens``, seeds all apply), giving ``x_j``.

Drafts from a proposer without a distribution (n-gram: the draft distribution is one-hot on
the draft token ``d``) are verified by *coupled* rejection sampling: accept ``d_j`` iff
``x_j == d_j``; the first position where they differ emits ``x_j``; if every draft is accepted
the last position's ``x_k`` is the bonus token. This is exact: ``P(accept) = p(d_j) = min(1,
p(d_j) / q(d_j))`` for ``q = onehot(d_j)``, and given a rejection ``x_j`` is distributed as
``p`` without ``d_j``, renormalised, which is the residual ``max(0, p - q)`` normalised, as in
the standard algorithm (and in vLLM's, which draws a uniform instead of reusing ``x_j``). A
seeded request's ``x_j`` is drawn from ``(seed, output index)``, so with a seed it produces the
same tokens with speculation as without; greedy is exact match against the argmax.

Verification needs no probabilities: per request it is the first position where the sampled
token differs from the draft (an argmax over a [requests, positions] grid). On a device it is a
few tensor ops and nothing is read back to the host; where the device is the host (the CPU)
the same rule runs in numpy on the same memory (``verify_one_hot_drafts_host``), which at
decode sizes costs a fraction of the torch dispatches.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from itertools import chain

import numpy as np
import torch


@dataclass
class DraftLayout:
    """Where each request's positions sit in the flat sampling layout (host arrays)."""

    counts: np.ndarray  # [B] positions per request (drafts + 1)
    starts: np.ndarray  # [B] first flat position of each request
    seg: np.ndarray  # [T] request index of each flat position
    offsets: np.ndarray  # [T] drafts before the position (0..k)
    # [B, W] (W = max counts): flat position of request i's j-th position; past its last
    # position (j >= counts[i]) its last position again.
    grid: np.ndarray
    # [B, W] the draft verified at grid[i, j]; -1 at a request's last position and past it, so
    # every row has a first mismatch (sampled tokens are >= 0) at or before its last position.
    grid_drafts: np.ndarray

    @property
    def has_drafts(self) -> bool:
        return bool((self.counts > 1).any())


def make_layout(num_drafts: np.ndarray, drafts: list[list[int]]) -> DraftLayout:
    """Layout for requests with ``num_drafts[i]`` drafts each; ``drafts`` holds the draft lists
    of the requests with ``num_drafts[i] > 0``, in order."""
    counts, starts, seg, offsets, grid, draft_mask = layout_structure(num_drafts)
    n = int(offsets.shape[0]) - len(counts)
    grid_drafts = np.full(grid.shape, -1, dtype=np.int64)
    if n:
        grid_drafts[draft_mask] = np.fromiter(chain.from_iterable(drafts), dtype=np.int64, count=n)
    return DraftLayout(counts, starts, seg, offsets, grid, grid_drafts)


def layout_structure(num_drafts: np.ndarray) -> tuple[np.ndarray, ...]:
    """(counts, starts, seg, offsets, grid, draft_mask) of ``DraftLayout`` for these draft
    counts (``draft_mask``: the grid cells holding a draft). They depend on the counts only, and
    a decoding batch repeats the same counts step after step, so they are cached: shared
    arrays that nobody writes (torch refuses read-only ones, so they are not flagged). At
    decode sizes the dozen small numpy calls cost more than the verification itself."""
    return _layout_structure(np.ascontiguousarray(num_drafts, dtype=np.int64).tobytes())


@functools.lru_cache(maxsize=256)
def _layout_structure(key: bytes) -> tuple[np.ndarray, ...]:
    counts = np.frombuffer(key, dtype=np.int64) + 1
    starts = np.cumsum(counts) - counts
    seg = np.repeat(np.arange(len(counts)), counts)
    offsets = np.arange(seg.shape[0]) - starts[seg]
    col = np.arange(int(counts.max()) if len(counts) else 0)
    grid = starts[:, None] + np.minimum(col, counts[:, None] - 1)
    draft_mask = col < counts[:, None] - 1
    return counts, starts, seg, offsets, grid, draft_mask


def verify_one_hot_drafts(sampled: torch.Tensor, grid: torch.Tensor, grid_drafts: torch.Tensor) -> torch.Tensor:
    """Tokens each request emits [B] under the coupled rule above, on the device: its accepted
    drafts plus one, ``sampled[starts[i] : starts[i] + emitted[i]]`` (``grid``/``grid_drafts``
    from ``DraftLayout``; ``sampled`` flat [T])."""
    mismatch = (sampled[grid] != grid_drafts).to(torch.uint8)
    return mismatch.argmax(dim=1) + 1  # the first maximum: the first mismatch


def verify_one_hot_drafts_host(sampled: np.ndarray, layout: DraftLayout) -> np.ndarray:
    """``verify_one_hot_drafts`` in numpy, for sampled tokens already in host memory."""
    return (sampled[layout.grid] != layout.grid_drafts).argmax(axis=1) + 1
