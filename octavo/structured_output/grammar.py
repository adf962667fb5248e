"""A request's constraint as an xgrammar ``Grammar``, and the key it is cached under.

``build_grammar`` only parses (JSON Schema -> grammar, regex -> grammar, EBNF): it needs no
tokenizer and takes microseconds to milliseconds, so the input processor runs it on every
request to turn an invalid constraint into a ``ValueError`` naming the problem (a 400 on the
server). Compiling against the vocabulary (the expensive part) happens in the engine core.
"""

from __future__ import annotations

import json
import re
from typing import Any

from octavo.sampling_params import StructuredOutputsParams

BACKENDS = ("auto", "xgrammar")
# xgrammar's messages start with "[time] /path/file.cc:line: "; the reason follows.
_SOURCE_PREFIX = re.compile(r"^\[[\d:]+\]\s+\S+:\d+:\s*")


def _load_json(value: str | dict, what: str) -> Any:
    if isinstance(value, dict):
        return value
    try:
        return json.loads(value)
    except (TypeError, ValueError) as e:
        raise ValueError(f"structured_outputs.{what} is not valid JSON: {e}") from None


def choice_ebnf(choices: list[str]) -> str:
    """``root ::= "a" | "b"``: JSON string escapes are valid EBNF string literals."""
    return "root ::= " + " | ".join(json.dumps(c, ensure_ascii=False) for c in choices)


def grammar_key(params: StructuredOutputsParams) -> str:
    """Equal keys <=> the same grammar (JSON with sorted keys, so dict order does not matter)."""
    kind = params.kind
    value = getattr(params, kind)
    if kind in ("json", "structural_tag"):
        value = _load_json(value, kind)
    return json.dumps([kind, value, params.disable_any_whitespace], sort_keys=True, ensure_ascii=False)


def _structural_tag(value: Any):
    import xgrammar as xgr

    if isinstance(value, dict) and "structures" in value:  # vLLM's original format
        tags = [
            xgr.StructuralTagItem(begin=s["begin"], schema=json.dumps(s.get("schema", {})), end=s["end"])
            for s in value["structures"]
        ]
        return xgr.Grammar.from_structural_tag(tags, list(value.get("triggers", [])))
    return xgr.Grammar.from_structural_tag(value)


def build_grammar(params: StructuredOutputsParams):
    """The ``xgrammar.Grammar`` for ``params``; ``ValueError`` naming the field when invalid."""
    import xgrammar as xgr

    kind = params.kind
    try:
        if kind == "json":
            schema = _load_json(params.json, "json")
            if not isinstance(schema, (dict, bool)):
                raise ValueError(f"structured_outputs.json must be a JSON Schema object, got {type(schema).__name__}")
            return xgr.Grammar.from_json_schema(
                json.dumps(schema), any_whitespace=not params.disable_any_whitespace
            )
        if kind == "json_object":  # any object (OpenAI's json_object mode), not any JSON value
            return xgr.Grammar.from_json_schema(
                '{"type": "object"}', any_whitespace=not params.disable_any_whitespace, strict_mode=False
            )
        if kind == "regex":
            return xgr.Grammar.from_regex(params.regex)
        if kind == "choice":
            return xgr.Grammar.from_ebnf(choice_ebnf(params.choice))
        if kind == "grammar":
            return xgr.Grammar.from_ebnf(params.grammar)
        return _structural_tag(_load_json(params.structural_tag, "structural_tag"))
    except ValueError:
        raise
    except Exception as e:  # xgrammar raises RuntimeError / its own errors with the reason
        lines = str(e).strip().splitlines()
        reason = _SOURCE_PREFIX.sub("", lines[0]) if lines else type(e).__name__
        raise ValueError(f"structured_outputs.{kind} is invalid: {reason}") from None


def check_backend(backend: str) -> None:
    if backend not in BACKENDS:
        raise ValueError(
            f"structured outputs backend {backend!r} is not available; octavo implements "
            f"{', '.join(BACKENDS)} (auto = xgrammar)"
        )
