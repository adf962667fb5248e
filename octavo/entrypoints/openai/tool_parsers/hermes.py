"""Hermes / Qwen2.5 style: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, one
block per call; text before the first block is content. A last block left open when the
output ends is still parsed."""

from __future__ import annotations

import json
import re

from octavo.entrypoints.openai.tool_parsers.base import ParsedToolCall, ToolParser, call_from_object

_BLOCK = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.DOTALL)


class HermesToolParser(ToolParser):
    name = "hermes"
    markers = ("<tool_call>",)

    def parse(self, section: str) -> list[ParsedToolCall] | None:
        calls = []
        for body in _BLOCK.findall(section):
            try:
                call = call_from_object(json.loads(body))
            except ValueError:
                return None
            if call is None:
                return None
            calls.append(call)
        return calls or None

    def complete_prefix(self, section: str) -> int:
        end = section.rfind("</tool_call>")
        return end + len("</tool_call>") if end >= 0 else 0
