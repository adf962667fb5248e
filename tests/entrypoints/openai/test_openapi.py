"""The served-model bounds written into the OpenAPI schema (no server needed)."""

from __future__ import annotations

import re

import pytest

from octavo.entrypoints.openai.openapi import below_pattern, served_openapi
from octavo.entrypoints.openai.protocol import CompletionRequest


@pytest.mark.parametrize("n", [1, 2, 9, 10, 11, 99, 100, 101, 512, 1000, 32000, 128256, 151936])
def test_below_pattern_matches_exactly_the_ids_below_n(n):
    p = re.compile(below_pattern(n))
    probe = list(range(0, min(n, 3000))) + list(range(max(n - 3000, 0), n + 3000))
    assert {i for i in probe if p.match(str(i))} == {i for i in probe if i < n}
    for bad in ("", "-1", "01", "1.0", " 1", "1e3"):
        assert not p.match(bad)


def test_served_schema_names_the_served_models_and_bounds():
    """``model`` is an enum of the served names (schema-valid data never gets a 404), and the
    vocabulary / context bounds are filled in."""
    from fastapi import FastAPI

    app = FastAPI()

    @app.post("/v1/completions")
    async def completions(req: CompletionRequest) -> dict:
        return {}

    served_openapi(app, vocab_size=512, max_model_len=128, max_prompt_chars=1000, model_names=["a", "b"])
    props = app.openapi()["components"]["schemas"]["CompletionRequest"]["properties"]
    assert props["model"]["anyOf"][0]["enum"] == ["a", "b"]
    assert props["max_tokens"]["anyOf"][0]["maximum"] == 127
    assert "x-octavo" not in str(props)
