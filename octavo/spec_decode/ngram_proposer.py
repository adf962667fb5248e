"""Prompt-lookup (n-gram) drafts, on the host, vectorised with numpy.

For a context ``t[0..L)`` the proposer looks for an earlier occurrence of its last ``n``
tokens, longest ``n`` first (``prompt_lookup_max`` down to ``prompt_lookup_min``), and
proposes the (up to ``k``) tokens that followed that occurrence. Among occurrences of the
longest matching suffix the earliest wins (vLLM's choice: for code editing that is the
original text in the prompt).

Vectorised: for every candidate end position ``e < L - 1`` the match length
``m[e] = #{j : t[e - i] == t[L - 1 - i] for all i <= j}`` (capped at ``prompt_lookup_max``)
comes from ``prompt_lookup_max`` whole-array comparisons and a cumulative product; there is no
Python loop over the history.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from octavo.config import SpeculativeConfig
from octavo.core.request import Request


class NgramProposer:
    def __init__(self, config: SpeculativeConfig) -> None:
        self.k = config.num_speculative_tokens
        self.min_n = config.prompt_lookup_min
        self.max_n = config.prompt_lookup_max

    def propose(self, token_ids: np.ndarray, max_tokens: int | None = None) -> list[int]:
        """Draft tokens to follow ``token_ids`` (at most ``min(k, max_tokens)``; maybe none)."""
        k = self.k if max_tokens is None else min(self.k, max_tokens)
        t = np.asarray(token_ids)
        n_ctx = t.shape[0]
        if k <= 0 or n_ctx <= self.min_n:
            return []
        end = longest_match_end(t, self.min_n, self.max_n)
        if end < 0:
            return []
        return t[end + 1 : end + 1 + k].tolist()

    def propose_batch(self, requests: Sequence[Request], max_tokens: Sequence[int]) -> list[list[int]]:
        """The proposer interface the engine calls once per step: drafts for each request."""
        return [self.propose(r.all_token_ids, m) for r, m in zip(requests, max_tokens, strict=True)]


def longest_match_end(t: np.ndarray, min_n: int, max_n: int) -> int:
    """End index ``e < len(t) - 1`` of the earliest occurrence of the longest suffix of ``t``
    with ``min_n <= n <= max_n`` tokens that also ends at ``e``; -1 when there is none."""
    n_ctx = t.shape[0]
    max_n = min(max_n, n_ctx - 1)
    if max_n < min_n:
        return -1
    ends = np.arange(n_ctx - 1)  # candidate end positions (the suffix itself excluded)
    run = np.ones(n_ctx - 1, dtype=bool)
    length = np.zeros(n_ctx - 1, dtype=np.int64)
    for i in range(max_n):  # at most prompt_lookup_max whole-array passes
        idx = ends - i
        ok = idx >= 0
        run &= ok & (t[np.where(ok, idx, 0)] == t[n_ctx - 1 - i])
        length += run
        if not run.any():
            break
    best = int(length.max()) if length.size else 0
    if best < min_n:
        return -1
    return int(np.argmax(length == best))
