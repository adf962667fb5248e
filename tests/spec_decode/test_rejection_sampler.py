"""Draft verification against a per-request Python reference: the device version (torch) and
the host version (numpy) give the same emitted counts."""

import numpy as np
import pytest
import torch

from octavo.spec_decode.rejection_sampler import (
    layout_structure,
    make_layout,
    verify_one_hot_drafts,
    verify_one_hot_drafts_host,
)


def _reference(drafts: list[list[int]], sampled: np.ndarray, starts: np.ndarray) -> list[list[int]]:
    """Each request's emitted tokens: its accepted drafts plus the first mismatch (or bonus)."""
    expected = []
    for i, d in enumerate(drafts):
        x = sampled[starts[i] : starts[i] + len(d) + 1].tolist()
        a = 0
        while a < len(d) and x[a] == d[a]:
            a += 1
        expected.append(x[: a + 1])
    return expected


@pytest.mark.parametrize("seed", range(20))
def test_verify_matches_reference(seed):
    rng = np.random.default_rng(seed)
    num_drafts = rng.integers(0, 5, size=int(rng.integers(1, 9)))
    drafts = [rng.integers(0, 3, size=k).tolist() for k in num_drafts]
    layout = make_layout(num_drafts, [d for d in drafts if d])
    sampled = rng.integers(0, 3, size=len(layout.seg))
    expected = _reference(drafts, sampled, layout.starts)
    emitted = verify_one_hot_drafts(torch.from_numpy(sampled), torch.from_numpy(layout.grid),
                                    torch.from_numpy(layout.grid_drafts))
    assert emitted.tolist() == [len(e) for e in expected]
    assert verify_one_hot_drafts_host(sampled, layout).tolist() == [len(e) for e in expected]
    kept = layout.grid[np.arange(layout.grid.shape[1]) < emitted.numpy()[:, None]]
    assert sampled[kept].tolist() == [t for e in expected for t in e]
    assert layout.offsets.tolist() == [j for k in num_drafts for j in range(k + 1)]
    assert layout.seg.tolist() == [i for i, k in enumerate(num_drafts) for _ in range(k + 1)]


def test_every_draft_accepted_emits_the_bonus_token():
    layout = make_layout(np.array([3, 0]), [[7, 8, 9]])
    sampled = np.array([7, 8, 9, 4, 5])  # request 0: all three drafts match, 4 is the bonus
    assert verify_one_hot_drafts_host(sampled, layout).tolist() == [4, 1]
    assert verify_one_hot_drafts(torch.from_numpy(sampled), torch.from_numpy(layout.grid),
                                 torch.from_numpy(layout.grid_drafts)).tolist() == [4, 1]


def test_layout_structure_is_shared_between_steps_and_handles_no_requests():
    a, b = layout_structure(np.array([2, 0])), layout_structure(np.array([2, 0]))
    assert all(x is y for x, y in zip(a, b, strict=True))  # cached: computed once per counts
    assert a[0].tolist() == [3, 1] and a[4].tolist() == [[0, 1, 2], [3, 3, 3]]
    assert [x.size for x in layout_structure(np.array([], dtype=np.int64))] == [0] * 6
