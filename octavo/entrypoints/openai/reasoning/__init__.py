"""``--reasoning-parser``: split a reasoning model's ``<think> ... </think>`` off its answer into
``reasoning_content`` (its own ``delta.reasoning_content`` when streaming); the rest is the
content that tool parsers and JSON clients see. The markers and each parser's rule are in
``octavo.structured_output.reasoning`` (the engine uses them to start constraints after it)."""

from __future__ import annotations

from octavo.structured_output.reasoning import REASONING_MARKERS, check_reasoning_parser


class ReasoningParser:
    def __init__(self, name: str) -> None:
        check_reasoning_parser(name)
        self.name = name
        self.start, self.end = REASONING_MARKERS[name]

    def extract(self, text: str) -> tuple[str | None, str | None]:
        """Whole output -> (reasoning or None, content or None)."""
        body = text.lstrip()
        opened = body.startswith(self.start)
        if opened:
            body = body[len(self.start):]
        elif self.name != "deepseek_r1":
            return None, text  # qwen3 without <think>: no reasoning at all
        if self.end in body:
            reasoning, content = body.split(self.end, 1)
        else:
            reasoning, content = body, ""  # still thinking when the output ended
        content = content.lstrip("\n")
        return reasoning.strip("\n") or None, content or None

    def streamer(self) -> ReasoningStreamer:
        return ReasoningStreamer(self)


class ReasoningStreamer:
    """Text deltas -> (reasoning delta, content delta), holding back a possible partial marker."""

    def __init__(self, parser: ReasoningParser) -> None:
        self.p = parser
        self.text = ""
        self.sent = 0  # characters of text handled
        self.state = "start"  # start -> reasoning -> content

    def _held(self, text: str, marker: str) -> int:
        for k in range(min(len(marker) - 1, len(text)), 0, -1):
            if text.endswith(marker[:k]):
                return k
        return 0

    def feed(self, delta: str, final: bool) -> tuple[str, str]:
        self.text += delta
        reasoning = content = ""
        if self.state == "start":
            body = self.text.lstrip()
            if not final and (not body or (self.p.start.startswith(body) and body != self.p.start)):
                return "", ""  # could still become <think>
            if body.startswith(self.p.start):
                self.sent = len(self.text) - len(body) + len(self.p.start)
                self.state = "reasoning"
            elif self.p.name == "deepseek_r1":
                self.state = "reasoning"
            else:
                self.state = "content"
        if self.state == "reasoning":
            pos = self.text.find(self.p.end, self.sent)
            if pos < 0:
                end = len(self.text) - (0 if final else self._held(self.text, self.p.end))
                reasoning, self.sent = self.text[self.sent:end], max(self.sent, end)
                return reasoning, ""
            reasoning = self.text[self.sent:pos]
            self.sent = pos + len(self.p.end)
            self.state = "after"
        if self.state == "after":  # drop the newlines that follow the end marker
            rest = self.text[self.sent:]
            if not rest.strip("\n") and not final:
                return reasoning, ""
            self.sent += len(rest) - len(rest.lstrip("\n"))
            self.state = "content"
        content, self.sent = self.text[self.sent:], len(self.text)
        return reasoning, content


__all__ = ["ReasoningParser", "ReasoningStreamer"]
