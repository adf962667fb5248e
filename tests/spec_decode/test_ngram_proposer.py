"""The vectorised prompt lookup against a plain Python reference, on random histories."""

import numpy as np
import pytest

from octavo.config import SpeculativeConfig
from octavo.spec_decode.ngram_proposer import NgramProposer, longest_match_end


def _reference(t: list[int], lo: int, hi: int) -> int:
    n_ctx = len(t)
    for n in range(min(hi, n_ctx - 1), lo - 1, -1):
        suffix = t[n_ctx - n :]
        for start in range(n_ctx - n - 1, -1, -1):  # latest occurrence first, the suffix itself excluded
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
    # [7, 2, 3] never occurred before; [2, 3] ends at indices 2 and 5: the latest, 5, is followed
    # by 4, 5, 7
    assert p.propose(history) == [4, 5, 7]
    assert p.propose(history, max_tokens=1) == [4]
    assert p.propose([9, 1, 2, 1, 2]) == [1, 2]  # fewer than k tokens follow the latest match
    assert p.propose([1, 2, 3, 4]) == []  # no earlier occurrence of any suffix
    assert p.propose([5, 5]) == [5]  # only one token follows the match
    longer = NgramProposer(SpeculativeConfig("ngram", 2, 2, 2))
    assert longer.propose([7, 1, 8, 2, 1, 8]) == [2, 1]
    assert longer.propose([7, 1, 8, 2, 9, 8]) == []  # a 1-token match is below prompt_lookup_min


@pytest.mark.parametrize("seed", range(5))
def test_long_histories_match_reference(seed):
    """Contexts as long as a code-editing prompt plus output, with common repeated tokens."""
    rng = np.random.default_rng(100 + seed)
    t = rng.integers(0, 12, size=600)
    t[-40:] = t[100:140]  # a copied span: long matches exist
    for lo, hi in ((1, 5), (2, 5), (5, 5), (3, 8)):
        assert longest_match_end(t, lo, hi) == _reference(t.tolist(), lo, hi)


def test_propose_batch_follows_a_growing_request():
    """The per-request token buffer takes in the tokens appended between proposals."""
    from octavo.core.request import Request
    from octavo.sampling_params import SamplingParams

    p = NgramProposer(SpeculativeConfig("ngram", 3, 1, 3))
    req = Request("r", [1, 2, 3, 9, 2], SamplingParams(), None)
    assert p.propose_batch([req], [3]) == [[3, 9, 2]]
    rng = np.random.default_rng(0)
    for _ in range(200):  # past the buffer's first capacity (64), so it grows
        req.append_output_token_ids(rng.integers(0, 6, size=int(rng.integers(1, 4))).tolist())
        assert p.propose_batch([req], [2]) == [p.propose(req.all_token_ids, 2)]
