"""The served-model bounds written into the OpenAPI schema (no server needed)."""

from __future__ import annotations

import re

import pytest

from octavo.entrypoints.openai.openapi import below_pattern


@pytest.mark.parametrize("n", [1, 2, 9, 10, 11, 99, 100, 101, 512, 1000, 32000, 128256, 151936])
def test_below_pattern_matches_exactly_the_ids_below_n(n):
    p = re.compile(below_pattern(n))
    probe = list(range(0, min(n, 3000))) + list(range(max(n - 3000, 0), n + 3000))
    assert {i for i in probe if p.match(str(i))} == {i for i in probe if i < n}
    for bad in ("", "-1", "01", "1.0", " 1", "1e3"):
        assert not p.match(bad)
