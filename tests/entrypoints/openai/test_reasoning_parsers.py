"""``--reasoning-parser`` text splitting: whole outputs and the same outputs streamed in small
deltas give the same reasoning and content."""

from __future__ import annotations

import pytest

from octavo.entrypoints.openai.reasoning import ReasoningParser

CASES = [
    ("<think>\nhmm, let me see\n</think>\n\nThe answer is 4.", ("hmm, let me see", "The answer is 4."),
     ("hmm, let me see", "The answer is 4.")),
    ("hmm</think>answer", ("hmm", "answer"), (None, "hmm</think>answer")),
    ("no think here", ("no think here", None), (None, "no think here")),
    ("<think>unfinished", ("unfinished", None), ("unfinished", None)),
    ("<thinking is fun", ("<thinking is fun", None), (None, "<thinking is fun")),
]


@pytest.mark.parametrize("text,r1,qwen3", CASES)
@pytest.mark.parametrize("name", ["deepseek_r1", "qwen3"])
def test_whole_and_streamed(name, text, r1, qwen3):
    parser = ReasoningParser(name)
    want = r1 if name == "deepseek_r1" else qwen3
    assert parser.extract(text) == want
    for step in (1, 2, 5):
        s = parser.streamer()
        reasoning = content = ""
        for i in range(0, len(text), step):
            a, b = s.feed(text[i:i + step], final=i + step >= len(text))
            reasoning += a
            content += b
        assert (reasoning.strip("\n") or None, content or None) == want


def test_unknown_parser():
    with pytest.raises(ValueError, match="unknown"):
        ReasoningParser("o1")
