"""Qwen3-Coder XML tool calls::

    <tool_call>
    <function=get_weather>
    <parameter=city>
    Paris
    </parameter>
    </function>
    </tool_call>

Parameter values are text; they are converted to the type the tool's JSON schema gives the
parameter (integer, number, boolean, object, array, null), strings stay as written."""

from __future__ import annotations

import ast
import json
import re
from typing import Any

from octavo.entrypoints.openai.tool_parsers.base import ParsedToolCall, ToolParser, arguments_json

_CALL = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.DOTALL)
_FUNC = re.compile(r"<function=([^>\s]+)>(.*?)(?:</function>|$)", re.DOTALL)
_PARAM = re.compile(r"<parameter=([^>\s]+)>\n?(.*?)\n?(?:</parameter>|(?=<parameter=)|$)", re.DOTALL)


def _convert(value: str, schema: dict[str, Any] | None) -> Any:
    kind = (schema or {}).get("type")
    if kind in (None, "string") or isinstance(kind, list):
        return value
    try:
        return json.loads(value)
    except ValueError:
        try:
            return ast.literal_eval(value)
        except (ValueError, SyntaxError):
            return value


class Qwen3CoderToolParser(ToolParser):
    name = "qwen3_coder"
    markers = ("<tool_call>",)

    def _param_schemas(self, name: str) -> dict[str, Any]:
        for t in self.tools:
            fn = t.get("function", {})
            if fn.get("name") == name:
                return (fn.get("parameters") or {}).get("properties", {})
        return {}

    def parse(self, section: str) -> list[ParsedToolCall] | None:
        calls = []
        for body in _CALL.findall(section):
            m = _FUNC.search(body)
            if m is None:
                return None
            props = self._param_schemas(m.group(1))
            args = {k: _convert(v, props.get(k)) for k, v in _PARAM.findall(m.group(2))}
            calls.append(ParsedToolCall(m.group(1), arguments_json(args)))
        return calls or None

    def complete_prefix(self, section: str) -> int:
        end = section.rfind("</tool_call>")
        return end + len("</tool_call>") if end >= 0 else 0


class Qwen3XmlToolParser(Qwen3CoderToolParser):
    """vLLM's ``qwen3_xml``: the same format, another name."""

    name = "qwen3_xml"
