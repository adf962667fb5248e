"""The startup profiler's dummy batches (CPU-checkable part; the profile itself runs on GPUs)."""

from __future__ import annotations

import pytest

from octavo.worker.memory_profile import _split


@pytest.mark.parametrize("max_model_len,max_num_seqs,max_batched", [(512, 256, 2048), (64, 3, 2048), (300, 7, 100),
                                                                    (4096, 1, 4096), (16, 5, 80), (16, 5, 79)])
def test_dummy_requests_are_never_longer_than_max_model_len(max_model_len, max_num_seqs, max_batched):
    """The dummy forwards (the activation peak, a mixed graph's pool) index RoPE tables of
    max_model_len rows with each request's positions: no request may be longer (on a GPU an
    index past the table is an illegal memory access that can surface in a later call)."""
    num_tokens = min(max_batched, max_num_seqs * max_model_len)
    lengths = _split(num_tokens, max_num_seqs)
    assert sum(lengths) == num_tokens and len(lengths) <= max_num_seqs
    assert max(lengths) <= max_model_len
