"""The published OpenAPI schema states what the server enforces for the model it serves.

The request models mark the fields whose bounds depend on the served model with
``x-octavo`` (see ``protocol.py``); ``served_openapi`` fills them in once per app:

- ``token_id``: ``maximum`` = vocabulary size - 1 (prompt ids, stop/allowed ids, /detokenize)
- ``token_id_key``: a ``pattern`` matching exactly the decimal ids below the vocabulary size
  (``logit_bias`` keys)
- ``max_tokens``: ``maximum`` = max_model_len - 1 (a prompt has at least one token)
- ``prompt_text``: ``maxLength`` = max_prompt_chars
- ``model_name``: ``enum`` = the served model names (any other name is a 404)

Constraints across fields (prompt tokens + max_tokens within the context, min_tokens <=
max_tokens, best_of = n, a chat template's own rules) cannot be written in JSON Schema; they
are 400s with messages naming the fields.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi


def below_pattern(n: int) -> str:
    """A regex matching the decimal integers in ``[0, n)`` without leading zeros (n >= 1)."""
    top = str(n - 1)
    alts = [r"[0-9]"] if len(top) > 1 else [f"[0-{top}]"]
    for width in range(2, len(top)):
        alts.append(f"[1-9][0-9]{{{width - 1}}}")
    if len(top) > 1:  # numbers with as many digits as n - 1, digit by digit
        for i, d in enumerate(top):
            prefix, rest = top[:i], len(top) - i - 1
            lo = "1" if i == 0 else "0"
            if i == len(top) - 1:
                alts.append(f"{prefix}[{lo}-{d}]")
            elif int(d) > int(lo):
                alts.append(f"{prefix}[{lo}-{int(d) - 1}][0-9]{{{rest}}}" if rest else f"{prefix}[{lo}-{int(d) - 1}]")
    return "^(" + "|".join(alts) + ")$"


# pydantic writes a bound on an integer with a before-validator (``protocol.Int``) under its
# own keyword; JSON Schema's names for them:
_BOUND_KEYS = {"ge": "minimum", "le": "maximum", "gt": "exclusiveMinimum", "lt": "exclusiveMaximum"}


def _fill(node: Any, limits: dict[str, dict[str, Any]]) -> None:
    if isinstance(node, dict):
        if node.get("type") in ("integer", "number"):
            for key, name in _BOUND_KEYS.items():
                if key in node:
                    node.setdefault(name, node.pop(key))
        mark = node.pop("x-octavo", None)
        if mark in limits:
            for key, value in limits[mark].items():  # the served model's bound, if tighter
                old = node.get(key)
                node[key] = value if old is None or not isinstance(value, int) else min(old, value)
        for v in node.values():
            _fill(v, limits)
    elif isinstance(node, list):
        for v in node:
            _fill(v, limits)


def served_openapi(
    app: FastAPI, vocab_size: int, max_model_len: int, max_prompt_chars: int, model_names: list[str]
) -> None:
    """Replace ``app.openapi`` by one that writes the served model's limits into the schema."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=app.version, summary=app.summary, routes=app.routes)
            _fill(schema, {
                "token_id": {"maximum": vocab_size - 1},
                "token_id_key": {"pattern": below_pattern(vocab_size)},
                "max_tokens": {"maximum": max(max_model_len - 1, 1)},
                "prompt_text": {"maxLength": max_prompt_chars},
                "model_name": {"enum": list(model_names)},
            })
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
