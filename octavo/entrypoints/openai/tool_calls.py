"""Tool calling on ``/v1/chat/completions``: ``tools``, ``tool_choice``, ``parallel_tool_calls``.

- ``none``: tools are rendered into the prompt (the chat template decides how), the answer is
  plain content.
- named function (``{"type": "function", "function": {"name": ...}}``): the output is
  constrained by a grammar from the function's ``parameters`` schema; it *is* the arguments.
- ``required``: the output is constrained to a JSON array of ``{"name", "parameters"}`` objects,
  an ``anyOf`` over the tools (one item at most when ``parallel_tool_calls`` is false), so the
  arguments always parse and validate; when ``max_tokens`` cuts the array, the calls completed
  before the cut are returned (finish_reason ``length``).
- ``auto`` (the default when tools are given): the model writes freely and the server's
  ``--tool-call-parser`` extracts calls; it needs ``--enable-auto-tool-choice``, as in vLLM.

finish_reason is ``tool_calls`` when calls were made (``stop`` for a named function, as
OpenAI does); streamed calls arrive as ``delta.tool_calls`` items keyed by ``index``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from octavo.entrypoints.openai.errors import OpenAIError
from octavo.entrypoints.openai.tool_parsers import ParsedToolCall, ToolCallStreamer, get_tool_parser
from octavo.sampling_params import StructuredOutputsParams


@dataclass(frozen=True)
class ToolServerConfig:
    """``--enable-auto-tool-choice`` and ``--tool-call-parser``."""

    enable_auto_tool_choice: bool = False
    tool_call_parser: str | None = None

    def __post_init__(self) -> None:
        if self.enable_auto_tool_choice and not self.tool_call_parser:
            raise ValueError("--enable-auto-tool-choice requires --tool-call-parser")
        if self.tool_call_parser:
            get_tool_parser(self.tool_call_parser)


def _parameters(tool: dict[str, Any]) -> dict[str, Any]:
    return tool["function"].get("parameters") or {"type": "object", "properties": {}}


def required_schema(tools: list[dict[str, Any]], parallel: bool) -> dict[str, Any]:
    """A JSON array of ``{"name": <one of the tools>, "parameters": <its schema>}``."""
    items = [
        {"type": "object",
         "properties": {"name": {"type": "string", "enum": [t["function"]["name"]]}, "parameters": _parameters(t)},
         "required": ["name", "parameters"], "additionalProperties": False}
        for t in tools
    ]
    schema: dict[str, Any] = {"type": "array", "minItems": 1, "items": {"anyOf": items}}
    if not parallel:
        schema["maxItems"] = 1
    return schema


def complete_items(text: str) -> list[Any]:
    """The complete items of a JSON array, even when the array itself was cut off."""
    dec, i, items = json.JSONDecoder(), text.find("[") + 1, []
    if i == 0:
        return items
    while True:
        while i < len(text) and text[i] in " \t\r\n,":
            i += 1
        try:
            item, i = dec.raw_decode(text, i)
        except ValueError:
            return items
        items.append(item)


def template_messages(conv: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Assistant ``tool_calls`` arguments as objects: chat templates render them with ``tojson``."""
    for m in conv:
        for tc in m.get("tool_calls") or ():
            fn = tc.get("function") if isinstance(tc, dict) else None
            if isinstance(fn, dict) and isinstance(fn.get("arguments"), str):
                try:
                    fn["arguments"] = json.loads(fn["arguments"])
                except ValueError:
                    pass
    return conv


def _call_dict(call: ParsedToolCall, index: int) -> dict[str, Any]:
    return {"index": index, "id": call.id, "type": "function",
            "function": {"name": call.name, "arguments": call.arguments}}


class ToolCallPlan:
    """What one chat request does with tools: its constraint, and how its text becomes calls."""

    def __init__(self, req: Any, config: ToolServerConfig) -> None:
        self.tools = [t.model_dump(exclude_none=True) for t in req.tools or []]
        self.parallel = req.parallel_tool_calls is not False
        choice = req.tool_choice
        self.function: str | None = None
        if isinstance(choice, str) or choice is None:
            self.mode = choice or ("auto" if self.tools else "none")
        else:
            self.mode, self.function = "named", choice.function.name
        if self.mode != "none" and not self.tools:
            raise OpenAIError(f"tool_choice {self.mode!r} needs tools", param="tool_choice")
        names = [t["function"]["name"] for t in self.tools]
        if self.function is not None and self.function not in names:
            raise OpenAIError(f"tool_choice names the function {self.function!r}, which is not among the tools "
                              f"{names}", param="tool_choice")
        if self.mode == "auto" and not config.enable_auto_tool_choice:
            raise OpenAIError('"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be '
                              "set on the server (or send tool_choice \"required\", \"none\" or a named function)",
                              param="tool_choice")
        self.parser_cls = get_tool_parser(config.tool_call_parser) if self.mode == "auto" else None

    @property
    def template_tools(self) -> list[dict[str, Any]] | None:
        return self.tools or None

    def constraint(self, user: StructuredOutputsParams | None) -> StructuredOutputsParams | None:
        """The grammar for required / named (which the request may not constrain otherwise)."""
        if self.mode not in ("required", "named"):
            return user
        if user is not None:
            raise OpenAIError(f"tool_choice {self.mode!r} constrains the output itself; drop response_format / "
                              "structured_outputs / guided_*", param="tool_choice")
        if self.mode == "named":
            tool = next(t for t in self.tools if t["function"]["name"] == self.function)
            return StructuredOutputsParams(json=_parameters(tool))
        return StructuredOutputsParams(json=required_schema(self.tools, self.parallel))

    def _calls(self, text: str) -> tuple[str | None, list[ParsedToolCall]]:
        if self.mode == "named":
            return None, [ParsedToolCall(self.function, text)]
        if self.mode == "required":
            items = complete_items(text)
            if not items:  # cut off by max_tokens before the first call closed
                return text, []
            return None, [ParsedToolCall(i["name"], json.dumps(i["parameters"], ensure_ascii=False)) for i in items]
        if self.mode == "auto":
            content, calls = self.parser_cls(self.tools).extract(text)
            return content, calls if self.parallel else calls[:1]
        return text, []

    def finish_reason(self, reason: str | None, called: bool) -> str | None:
        if called and reason == "stop" and self.mode in ("auto", "required"):
            return "tool_calls"
        return reason

    def message(self, text: str, reason: str | None) -> tuple[str | None, list[dict[str, Any]], str | None]:
        """Whole output -> (content, tool_calls as OpenAI objects, finish_reason)."""
        content, calls = self._calls(text)
        out = [{k: v for k, v in _call_dict(c, i).items() if k != "index"} for i, c in enumerate(calls)]
        return content, out, self.finish_reason(reason, bool(calls))

    def streamer(self) -> ToolDeltaStreamer:
        return ToolDeltaStreamer(self)


class ToolDeltaStreamer:
    """One choice's stream: text deltas -> (content delta, ``delta.tool_calls`` items)."""

    def __init__(self, plan: ToolCallPlan) -> None:
        self.plan = plan
        self.buffer = ""
        self.num_calls = 0
        self.named_id: str | None = None
        self.auto = ToolCallStreamer(plan.parser_cls(plan.tools)) if plan.mode == "auto" else None

    def feed(self, delta: str, final: bool) -> tuple[str, list[dict[str, Any]]]:
        mode = self.plan.mode
        if mode == "none":
            return delta, []
        if mode == "named":
            if self.named_id is None:
                call = ParsedToolCall(self.plan.function, delta)
                self.named_id, self.num_calls = call.id, 1
                return "", [_call_dict(call, 0)]
            return "", [{"index": 0, "function": {"arguments": delta}}] if delta else []
        if mode == "required":  # each call as soon as its object closes
            self.buffer += delta
            content, calls = self.plan._calls(self.buffer)
            content = content if final else ""
            calls = calls[self.num_calls:]
        else:
            content, calls = self.auto.feed(delta, final)
            if not self.plan.parallel:
                calls = calls[: max(0, 1 - self.num_calls)]
        items = [_call_dict(c, self.num_calls + i) for i, c in enumerate(calls)]
        self.num_calls += len(items)
        return content or "", items
