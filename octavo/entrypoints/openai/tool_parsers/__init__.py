"""Tool-call parsers for ``tool_choice="auto"``, selected by ``--tool-call-parser NAME``
(vLLM's names): hermes, llama3_json, mistral, pythonic, qwen3_coder, qwen3_xml."""

from __future__ import annotations

from octavo.entrypoints.openai.tool_parsers.base import ParsedToolCall, ToolCallStreamer, ToolParser
from octavo.entrypoints.openai.tool_parsers.hermes import HermesToolParser
from octavo.entrypoints.openai.tool_parsers.llama3_json import Llama3JsonToolParser
from octavo.entrypoints.openai.tool_parsers.mistral import MistralToolParser
from octavo.entrypoints.openai.tool_parsers.pythonic import PythonicToolParser
from octavo.entrypoints.openai.tool_parsers.qwen3_coder import (
    Qwen3CoderToolParser,
    Qwen3XmlToolParser,
)

TOOL_PARSERS: dict[str, type[ToolParser]] = {
    p.name: p
    for p in (HermesToolParser, Llama3JsonToolParser, MistralToolParser, PythonicToolParser,
              Qwen3CoderToolParser, Qwen3XmlToolParser)
}


def get_tool_parser(name: str) -> type[ToolParser]:
    if name not in TOOL_PARSERS:
        raise ValueError(f"--tool-call-parser {name!r} is unknown; choose one of {sorted(TOOL_PARSERS)}")
    return TOOL_PARSERS[name]


__all__ = ["TOOL_PARSERS", "ParsedToolCall", "ToolCallStreamer", "ToolParser", "get_tool_parser"]
