"""Pythonic tool calls (Llama 3.2/4, ToolACE): the output is a Python list of calls with
keyword arguments, ``[get_weather(city="Paris"), get_time()]``; values must be literals."""

from __future__ import annotations

import ast

from octavo.entrypoints.openai.tool_parsers.base import ParsedToolCall, ToolParser, arguments_json


def _name(func: ast.expr) -> str | None:
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        base = _name(func.value)
        return f"{base}.{func.attr}" if base else None
    return None


class PythonicToolParser(ToolParser):
    name = "pythonic"
    markers = ("[",)
    only_at_start = True

    def parse(self, section: str) -> list[ParsedToolCall] | None:
        try:
            tree = ast.parse(section.strip().removeprefix("<|python_start|>").removesuffix("<|python_end|>"),
                             mode="eval")
        except SyntaxError:
            return None
        if not isinstance(tree.body, ast.List):
            return None
        calls = []
        for node in tree.body.elts:
            if not isinstance(node, ast.Call) or node.args or _name(node.func) is None:
                return None
            try:
                args = {kw.arg: ast.literal_eval(kw.value) for kw in node.keywords if kw.arg}
            except ValueError:
                return None
            calls.append(ParsedToolCall(_name(node.func), arguments_json(args)))
        return calls or None
