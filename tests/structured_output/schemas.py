"""A varied, deterministic set of JSON Schemas for the structured-output tests: nested objects,
arrays with min/max items, enums, anyOf, string patterns and lengths, numbers with bounds,
required and optional fields. Strings and arrays are bounded so that a tiny model finishes an
object within a test's max_tokens."""

from __future__ import annotations

import random
from typing import Any

LEAVES: list[dict[str, Any]] = [
    {"type": "string", "maxLength": 8},
    {"type": "string", "pattern": "^[a-z]{2,5}$"},
    {"type": "string", "pattern": "^[A-Z][0-9]{3}$"},
    {"type": "string", "enum": ["red", "green", "blue"]},
    {"type": "integer", "minimum": 0, "maximum": 100},
    {"type": "integer", "minimum": -50, "maximum": 50},
    {"type": "number", "minimum": 0, "maximum": 1},
    {"type": "boolean"},
    {"type": "null"},
    {"enum": [1, "two", None, True]},
    {"anyOf": [{"type": "integer", "minimum": 1, "maximum": 9}, {"type": "string", "maxLength": 4}]},
    {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9}, "minItems": 1, "maxItems": 3},
    {"type": "array", "items": {"type": "string", "enum": ["x", "y"]}, "minItems": 2, "maxItems": 2},
]


def _object(rng: random.Random, depth: int) -> dict[str, Any]:
    n = rng.randint(1, 3)
    props: dict[str, Any] = {}
    for i in range(n):
        if depth > 0 and rng.random() < 0.35:
            value = _object(rng, depth - 1)
            if rng.random() < 0.3:
                value = {"type": "array", "items": value, "minItems": 1, "maxItems": 2}
        else:
            value = dict(rng.choice(LEAVES))
        props[f"{rng.choice(['id', 'name', 'tag', 'score', 'kind', 'item'])}_{i}"] = value
    names = list(props)
    required = [k for k in names if rng.random() < 0.7] or names[:1]
    return {"type": "object", "properties": props, "required": required, "additionalProperties": False}


def make_schemas(count: int, seed: int = 0) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    return [_object(rng, depth=rng.randint(0, 2)) for _ in range(count)]
