"""What every tool-call parser does, and the streaming wrapper they all share.

A parser recognises where the tool-call section of a model's text starts (``find_start``) and
turns that section into calls (``parse``: ``None`` when it is not valid tool-call syntax, and
then the whole text is plain content, as in vLLM). ``ToolCallStreamer`` feeds text deltas to
any parser: content is streamed until the section starts (holding back a tail that may be the
start of a marker), complete calls are emitted as soon as ``complete_prefix`` says they are
closed, the rest when the output ends.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any


@dataclass
class ParsedToolCall:
    name: str
    arguments: str  # JSON text of the arguments object
    id: str = field(default_factory=lambda: f"chatcmpl-tool-{uuid.uuid4().hex}")


def arguments_json(args: Any) -> str:
    """Arguments as the JSON text OpenAI returns (already-JSON strings pass through)."""
    if isinstance(args, str):
        try:
            json.loads(args)
            return args
        except ValueError:
            pass
    return json.dumps({} if args is None else args, ensure_ascii=False)


def call_from_object(obj: Any, args_keys: tuple[str, ...] = ("arguments", "parameters")) -> ParsedToolCall | None:
    """``{"name": ..., "arguments"|"parameters": {...}}`` -> a call (None if it is not one)."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args = next((obj[k] for k in args_keys if k in obj), {})
    if not isinstance(args, (dict, str)):
        return None
    return ParsedToolCall(obj["name"], arguments_json(args))


class ToolParser:
    """Subclasses set ``markers`` (text that opens the tool-call section) and ``parse``."""

    name = ""
    markers: tuple[str, ...] = ()
    # True: a tool call section can only open the output (after whitespace), never later.
    only_at_start = False

    def __init__(self, tools: list[dict[str, Any]] | None = None) -> None:
        self.tools = tools or []

    def find_start(self, text: str) -> int | None:
        if self.only_at_start:
            stripped = text.lstrip()
            ok = any(stripped.startswith(m) for m in self.markers)
            return len(text) - len(stripped) if ok else None
        found = [i for i in (text.find(m) for m in self.markers) if i >= 0]
        return min(found) if found else None

    def content_end(self, text: str) -> int:
        """How much of ``text`` (no section started yet) is surely content."""
        if self.only_at_start:
            stripped = text.lstrip()
            undecided = not stripped or any(m.startswith(stripped) for m in self.markers)
            return 0 if undecided else len(text)
        hold = 0
        for m in self.markers:
            for k in range(min(len(m) - 1, len(text)), 0, -1):
                if text.endswith(m[:k]):
                    hold = max(hold, k)
                    break
        return len(text) - hold

    def parse(self, section: str) -> list[ParsedToolCall] | None:
        raise NotImplementedError

    def complete_prefix(self, section: str) -> int:
        """Length of the leading part of ``section`` that holds only complete calls (0: none)."""
        return 0

    def extract(self, text: str) -> tuple[str | None, list[ParsedToolCall]]:
        """Whole output -> (content or None, calls)."""
        start = self.find_start(text)
        if start is None:
            return text, []
        calls = self.parse(text[start:])
        if not calls:
            return text, []
        content = text[:start].strip()
        return content or None, calls


class ToolCallStreamer:
    """Turns a stream of text deltas into content deltas and completed calls."""

    def __init__(self, parser: ToolParser) -> None:
        self.parser = parser
        self.text = ""
        self.sent = 0  # characters of text already emitted as content
        self.start: int | None = None
        self.num_calls = 0

    def feed(self, delta: str, final: bool) -> tuple[str, list[ParsedToolCall]]:
        self.text += delta
        content = ""
        if self.start is None:
            self.start = self.parser.find_start(self.text)
            if self.start is None:
                end = len(self.text) if final else self.parser.content_end(self.text)
                content, self.sent = self.text[self.sent:end], max(self.sent, end)
                return content, []
            content, self.sent = self.text[self.sent:self.start], self.start
        section = self.text[self.start:]
        if final:
            calls = self.parser.parse(section)
            if not calls and self.num_calls == 0:  # not tool-call syntax after all: plain content
                return content + section, []
        else:
            n = self.parser.complete_prefix(section)
            calls = (self.parser.parse(section[:n]) or []) if n else []
        new = (calls or [])[self.num_calls:]
        self.num_calls += len(new)
        return content, new
