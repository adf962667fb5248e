"""The vectorised prompt lookup against a plain Python reference, on random histories."""

import numpy as np
import pytest

from octavo.config import SpeculativeConfig
from octavo.spec_decode.ngram_proposer import NgramProposer, longest_match_end


def _reference(t: list[int], lo: int, hi: int) -> int:
    n_ctx = len(t)
    for n in range(min(hi, n_ctx - 1), lo - 1, -1):
        suffix = t[n_ctx - n :]
        for start in range(0, n_ctx - n):  # earliest occurrence first, the suffix itself excluded
            if t[start : start + n] == suffix:
                return start + n - 1
    return -1


@pytest.mark.parametrize("seed", range(40))
def test_matches_reference(seed):
    rng = np.random.default_rng(seed)
    t = rng.integers(0, 4 + seed % 6, size=int(rng.integers(1, 60)))
    lo = int(rng.integers(1, 4))
    hi = lo + int(rng.integers(0, 4))
    assert longest_match_end(t, lo, hi) == _reference(t.tolist(), lo, hi)


def test_proposes_what_followed_the_longest_match():
    p = NgramProposer(SpeculativeConfig("ngram", 3, 1, 3))
    #            0  1  2  3  4  5  6  7  8  9
    history = [1, 2, 3, 9, 2, 3, 4, 5, 7, 2, 3]
    # [7, 2, 3] never occurred before; [2, 3] first ends at index 2, followed by 9, 2, 3
    assert p.propose(history) == [9, 2, 3]
    assert p.propose(history, max_tokens=1) == [9]
    assert p.propose([1, 2, 3, 4]) == []  # no earlier occurrence of any suffix
    assert p.propose([5, 5]) == [5]  # only one token follows the match
    longer = NgramProposer(SpeculativeConfig("ngram", 2, 2, 2))
    assert longer.propose([7, 1, 8, 2, 1, 8]) == [2, 1]
    assert longer.propose([7, 1, 8, 2, 9, 8]) == []  # a 1-token match is below prompt_lookup_min
