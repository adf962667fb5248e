"""Llama 3.x JSON tool calls: the output is ``{"name": ..., "parameters": {...}}`` (optionally
after ``<|python_tag|>``), several separated by ``;``."""

from __future__ import annotations

import json

from octavo.entrypoints.openai.tool_parsers.base import ParsedToolCall, ToolParser, call_from_object


def json_objects(text: str, separators: str = " \t\r\n;,") -> list | None:
    """Consecutive JSON values in ``text`` (None if anything else is there)."""
    dec, i, out = json.JSONDecoder(), 0, []
    while True:
        while i < len(text) and text[i] in separators:
            i += 1
        if i == len(text):
            return out
        try:
            obj, i = dec.raw_decode(text, i)
        except ValueError:
            return None
        out.append(obj)


class Llama3JsonToolParser(ToolParser):
    name = "llama3_json"
    markers = ("<|python_tag|>", "{")
    only_at_start = True

    def parse(self, section: str) -> list[ParsedToolCall] | None:
        objs = json_objects(section.strip().removeprefix("<|python_tag|>"))
        if not objs:
            return None
        calls = [call_from_object(o) for o in objs]
        return None if any(c is None for c in calls) else calls
