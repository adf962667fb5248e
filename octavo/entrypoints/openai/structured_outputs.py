"""Request fields that constrain the output -> ``StructuredOutputsParams``.

Accepted, with vLLM's and OpenAI's names (at most one source per request):
- ``response_format``: ``{"type": "text"}`` (no constraint), ``{"type": "json_object"}``,
  ``{"type": "json_schema", "json_schema": {"name": ..., "schema": {...}, "strict": ...}}``,
  ``{"type": "structural_tag", ...}`` (the rest of the object is xgrammar's structural tag);
- ``structured_outputs``: ``{"json" | "regex" | "choice" | "grammar" | "json_object" |
  "structural_tag": ..., "disable_any_whitespace": bool}``;
- the older ``guided_json`` / ``guided_regex`` / ``guided_choice`` / ``guided_grammar``.

Whether the schema/regex/grammar itself is valid is checked by the input processor (it parses
it with xgrammar); every problem is an ``OpenAIError`` (400) naming the field.
"""

from __future__ import annotations

from typing import Any

from octavo.entrypoints.openai.errors import OpenAIError
from octavo.sampling_params import STRUCTURED_OUTPUT_KINDS, StructuredOutputsParams

GUIDED_ALIASES = {"guided_json": "json", "guided_regex": "regex", "guided_choice": "choice",
                  "guided_grammar": "grammar"}
_OPTIONS = ("disable_any_whitespace",)


def _from_response_format(rf: dict[str, Any]) -> dict[str, Any] | None:
    kind = rf.get("type")
    if kind in (None, "text"):
        if set(rf) - {"type"}:
            raise OpenAIError("response_format of type 'text' takes no other keys", param="response_format")
        return None
    if kind == "json_object":
        return {"json_object": True}
    if kind == "json_schema":
        js = rf.get("json_schema")
        if not isinstance(js, dict) or not isinstance(js.get("schema", {}), (dict, bool)):
            raise OpenAIError(
                "response_format.json_schema must be an object with a 'schema' object",
                param="response_format.json_schema",
            )
        # OpenAI treats a missing schema as "any JSON object".
        return {"json": js["schema"]} if "schema" in js else {"json_object": True}
    if kind == "structural_tag":
        return {"structural_tag": {k: v for k, v in rf.items() if k != "type"}}
    raise OpenAIError(
        f"response_format.type must be text, json_object, json_schema or structural_tag; got {kind!r}",
        param="response_format.type",
    )


def _from_structured_outputs(so: dict[str, Any]) -> dict[str, Any]:
    unknown = sorted(set(so) - set(STRUCTURED_OUTPUT_KINDS) - set(_OPTIONS))
    if unknown:
        raise OpenAIError(
            f"structured_outputs: unsupported keys {unknown}; known: {[*STRUCTURED_OUTPUT_KINDS, *_OPTIONS]}",
            param=f"structured_outputs.{unknown[0]}",
        )
    return {k: v for k, v in so.items() if v is not None}


def structured_outputs_from_request(req: Any) -> StructuredOutputsParams | None:
    """The constraint the request asks for (None for none); 400 on conflicts and bad shapes."""
    sources: dict[str, dict[str, Any]] = {}
    rf = getattr(req, "response_format", None)
    if rf is not None:
        spec = _from_response_format(rf)
        if spec is not None:
            sources["response_format"] = spec
    if getattr(req, "structured_outputs", None) is not None:
        sources["structured_outputs"] = _from_structured_outputs(req.structured_outputs)
    for field, kind in GUIDED_ALIASES.items():
        value = getattr(req, field, None)
        if value is not None:
            sources[field] = {kind: value}
    if not sources:
        return None
    if len(sources) > 1:
        names = sorted(sources)
        raise OpenAIError(f"set only one of {', '.join(names)} (each constrains the output)", param=names[1])
    (field, spec), = sources.items()
    try:
        return StructuredOutputsParams(**spec)
    except (TypeError, ValueError) as e:
        raise OpenAIError(f"{field}: {e}", param=field) from None
