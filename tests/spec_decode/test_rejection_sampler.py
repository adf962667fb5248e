"""Draft verification against a per-request Python reference."""

import numpy as np
import pytest
import torch

from octavo.spec_decode.rejection_sampler import make_layout, verify_one_hot_drafts


@pytest.mark.parametrize("seed", range(20))
def test_verify_matches_reference(seed):
    rng = np.random.default_rng(seed)
    num_drafts = rng.integers(0, 5, size=int(rng.integers(1, 9)))
    drafts = [rng.integers(0, 3, size=k).tolist() for k in num_drafts]
    layout = make_layout(num_drafts, drafts)
    sampled = rng.integers(0, 3, size=len(layout.seg))
    emitted, keep = verify_one_hot_drafts(torch.from_numpy(sampled), torch.from_numpy(layout.draft_ids),
                                          torch.from_numpy(layout.seg), torch.from_numpy(layout.starts))
    expected = []
    for i, d in enumerate(drafts):
        x = sampled[layout.starts[i] : layout.starts[i] + len(d) + 1].tolist()
        a = 0
        while a < len(d) and x[a] == d[a]:
            a += 1
        expected.append(x[: a + 1])
    assert emitted.tolist() == [len(e) for e in expected]
    assert sampled[keep.numpy()].tolist() == [t for e in expected for t in e]
    assert layout.offsets.tolist() == [j for k in num_drafts for j in range(k + 1)]
