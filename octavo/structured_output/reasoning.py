"""Where a reasoning model's thinking ends, for ``--reasoning-parser`` (vLLM's names).

Structured-output constraints apply only after the reasoning section, as in vLLM: the matcher
sees no token before the end marker, and the sampler masks nothing for the request until then.
The engine finds the end by token ids (the marker's ids as the tokenizer encodes it; one
special token on DeepSeek-R1 and Qwen3), in the prompt or the output.

Both parsers take ``<think> ... </think>``. ``deepseek_r1``: the chat template opens the
section, so text before ``</think>`` is reasoning even without ``<think>``. ``qwen3``: the
model opens it; output that does not start with ``<think>`` is all content (its first token is
then already constrained: the first mask allows the grammar's tokens and ``<think>``'s first).
"""

from __future__ import annotations

REASONING_MARKERS: dict[str, tuple[str, str]] = {
    "deepseek_r1": ("<think>", "</think>"),
    "qwen3": ("<think>", "</think>"),
}


def check_reasoning_parser(name: str | None) -> None:
    if name is not None and name not in REASONING_MARKERS:
        raise ValueError(f"--reasoning-parser {name!r} is unknown; choose one of {sorted(REASONING_MARKERS)}")


def find_last(haystack: list[int], needle: list[int]) -> int:
    """Index just past the last occurrence of ``needle`` in ``haystack``; -1 if absent."""
    n = len(needle)
    for i in range(len(haystack) - n, -1, -1):
        if haystack[i:i + n] == needle:
            return i + n
    return -1


def initial_state(parser: str, prompt: list[int], start_ids: list[int], end_ids: list[int]) -> str:
    """Where a request starts: ``ended`` (the prompt closes the section, e.g. thinking disabled
    by the template), ``thinking`` (the prompt opens it, or deepseek_r1, whose template does),
    or ``maybe`` (qwen3: the first output token decides: the start marker opens reasoning,
    anything else is the answer, already under the grammar; only when the marker is a single
    token, as on Qwen3; otherwise ``ended``: constrained from the first token)."""
    end = find_last(prompt, end_ids)
    start = find_last(prompt, start_ids)
    if end >= 0 and end > start:
        return "ended"
    if start >= 0 or parser == "deepseek_r1":
        return "thinking"
    # One token can open the section only where the marker is one (special) token.
    return "maybe" if len(start_ids) == 1 else "ended"
