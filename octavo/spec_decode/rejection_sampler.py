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

Nothing here reads a tensor back to the host.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


@dataclass
class DraftLayout:
    """Where each request's positions sit in the flat sampling layout (host arrays)."""

    counts: np.ndarray  # [B] positions per request (drafts + 1)
    starts: np.ndarray  # [B] first flat position of each request
    seg: np.ndarray  # [T] request index of each flat position
    offsets: np.ndarray  # [T] drafts before the position (0..k)
    draft_ids: np.ndarray  # [T] the draft verified at the position, -1 at a request's last

    @property
    def has_drafts(self) -> bool:
        return bool((self.counts > 1).any())


def make_layout(num_drafts: np.ndarray, drafts: list[list[int]]) -> DraftLayout:
    """Layout for requests with ``num_drafts[i] == len(drafts[i])`` drafts each."""
    counts = num_drafts.astype(np.int64) + 1
    starts = np.cumsum(counts) - counts
    seg = np.repeat(np.arange(len(counts)), counts)
    offsets = np.arange(int(counts.sum())) - starts[seg]
    draft_ids = np.full(len(seg), -1, dtype=np.int64)
    if num_drafts.any():
        flat = np.fromiter((t for d in drafts for t in d), dtype=np.int64, count=int(num_drafts.sum()))
        draft_ids[offsets < (counts - 1)[seg]] = flat
    return DraftLayout(counts, starts, seg, offsets, draft_ids)


def verify_one_hot_drafts(
    sampled: torch.Tensor, draft_ids: torch.Tensor, seg: torch.Tensor, starts: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(tokens emitted per request [B], keep mask [T]) for the coupled rule above.

    ``sampled``/``draft_ids``/``seg`` are flat [T]; ``draft_ids`` is -1 at each request's last
    position, so every request has a first mismatch and emits ``accepted + 1`` tokens:
    ``sampled[starts[i] : starts[i] + emitted[i]]``.
    """
    t = sampled.shape[0]
    idx = torch.arange(t, device=sampled.device)
    mismatch_at = torch.where(sampled != draft_ids, idx, torch.full_like(idx, t))
    first = torch.full((starts.shape[0],), t, dtype=idx.dtype, device=idx.device)
    first.scatter_reduce_(0, seg, mismatch_at, reduce="amin")
    keep = idx <= first[seg]
    return first - starts + 1, keep
