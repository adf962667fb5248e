"""Mistral: ``[TOOL_CALLS]`` then a JSON array of ``{"name", "arguments"}`` (v3 tokenizers), or
``[TOOL_CALLS]name[ARGS]{...}`` / ``[TOOL_CALLS]name{...}`` per call (v11+). Call ids are 9
alphanumeric characters, as Mistral's chat templates require."""

from __future__ import annotations

import re
import uuid

from octavo.entrypoints.openai.tool_parsers.base import (
    ParsedToolCall,
    ToolParser,
    arguments_json,
    call_from_object,
)
from octavo.entrypoints.openai.tool_parsers.llama3_json import json_objects

_NAMED = re.compile(r"\s*([A-Za-z0-9_.\-]+)\s*(?:\[ARGS\])?\s*(\{.*)", re.DOTALL)


def _mistral_id() -> str:
    return uuid.uuid4().hex[:9]


class MistralToolParser(ToolParser):
    name = "mistral"
    markers = ("[TOOL_CALLS]",)

    def parse(self, section: str) -> list[ParsedToolCall] | None:
        parts = [p for p in section.split("[TOOL_CALLS]") if p.strip()]
        calls: list[ParsedToolCall] = []
        for part in parts:
            objs = json_objects(part) if part.lstrip().startswith("[") else None
            if objs is not None and len(objs) == 1 and isinstance(objs[0], list):
                found = [call_from_object(o) for o in objs[0]]
            else:
                m = _NAMED.match(part)
                args = json_objects(m.group(2)) if m else None
                if not args or len(args) != 1 or not isinstance(args[0], dict):
                    return None
                found = [ParsedToolCall(m.group(1), arguments_json(args[0]))]
            if any(c is None for c in found):
                return None
            calls.extend(found)
        for c in calls:
            c.id = _mistral_id()
        return calls or None

