"""Every tool-call parser on its format: whole outputs, and the same outputs streamed in
small deltas must give the same content and calls; text that is not tool-call syntax stays
content."""

from __future__ import annotations

import json

import pytest

from octavo.entrypoints.openai.tool_parsers import TOOL_PARSERS, ToolCallStreamer, get_tool_parser

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"},
                                     "metric": {"type": "boolean"}}}}}]

CASES = {
    "hermes": (
        'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}\n</tool_call>\n'
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>',
        "Let me check.",
    ),
    "llama3_json": (
        '{"name": "get_weather", "parameters": {"city": "Paris", "days": 2}}; '
        '{"name": "get_weather", "parameters": {"city": "Oslo"}}',
        None,
    ),
    "mistral": (
        '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}, '
        '{"name": "get_weather", "arguments": {"city": "Oslo"}}]',
        None,
    ),
    "pythonic": ('[get_weather(city="Paris", days=2), get_weather(city=\'Oslo\')]', None),
    "qwen3_coder": (
        "Checking.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
        "<parameter=days>\n2\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=get_weather>\n"
        "<parameter=city>\nOslo\n</parameter>\n</function>\n</tool_call>",
        "Checking.",
    ),
}
CASES["qwen3_xml"] = CASES["qwen3_coder"]
WANT = [("get_weather", {"city": "Paris", "days": 2}), ("get_weather", {"city": "Oslo"})]


def test_every_registered_parser_has_a_case():
    assert set(TOOL_PARSERS) == set(CASES)
    with pytest.raises(ValueError, match="unknown"):
        get_tool_parser("nope")


@pytest.mark.parametrize("name", sorted(CASES))
def test_whole_output(name):
    text, content = CASES[name]
    got_content, calls = get_tool_parser(name)(TOOLS).extract(text)
    assert got_content == content
    assert [(c.name, json.loads(c.arguments)) for c in calls] == WANT
    assert len({c.id for c in calls}) == 2


@pytest.mark.parametrize("step", [1, 3, 7])
@pytest.mark.parametrize("name", sorted(CASES))
def test_streamed_equals_whole(name, step):
    text, content = CASES[name]
    streamer = ToolCallStreamer(get_tool_parser(name)(TOOLS))
    got, calls = "", []
    for i in range(0, len(text), step):
        piece = text[i:i + step]
        c, new = streamer.feed(piece, final=i + step >= len(text))
        got += c
        calls += new
    assert got.strip() == (content or "")
    assert [(c.name, json.loads(c.arguments)) for c in calls] == WANT


def test_hermes_streams_each_call_when_it_closes():
    streamer = ToolCallStreamer(get_tool_parser("hermes")())
    first = '<tool_call>{"name": "a", "arguments": {}}</tool_call>'
    assert streamer.feed("Hi <tool_", False) == ("Hi ", [])  # marker prefix held back
    c, calls = streamer.feed(first[len("<tool_"):], False)
    assert c == "" and [x.name for x in calls] == ["a"]
    c, calls = streamer.feed('<tool_call>{"name": "b", "arguments": {"x": 1}}', True)
    assert [x.name for x in calls] == ["b"]


@pytest.mark.parametrize("name", sorted(CASES))
def test_plain_text_stays_content(name):
    text = "def f(x):\n    return [x, {1: 2}]"
    assert get_tool_parser(name)(TOOLS).extract(text) == (text, [])
    streamer = ToolCallStreamer(get_tool_parser(name)(TOOLS))
    out = "".join(streamer.feed(text[i:i + 4], i + 4 >= len(text))[0] for i in range(0, len(text), 4))
    assert out == text


@pytest.mark.parametrize("name,text", [
    ("hermes", "<tool_call>{not json}</tool_call>"),
    ("llama3_json", '{"nam": "x"}'),
    ("pythonic", "[x + 1]"),
    ("mistral", "[TOOL_CALLS]oops"),
])
def test_broken_tool_syntax_is_content(name, text):
    assert get_tool_parser(name)(TOOLS).extract(text) == (text, [])


def test_qwen3_coder_converts_by_schema():
    text = ("<tool_call>\n<function=get_weather>\n<parameter=city>\n42\n</parameter>\n<parameter=days>\n3\n"
            "</parameter>\n<parameter=metric>\ntrue\n</parameter>\n</function>\n</tool_call>")
    _, (call,) = get_tool_parser("qwen3_coder")(TOOLS).extract(text)
    assert json.loads(call.arguments) == {"city": "42", "days": 3, "metric": True}


def test_mistral_named_format_and_ids():
    _, calls = get_tool_parser("mistral")().extract('[TOOL_CALLS]get_weather[ARGS]{"city": "Rome"}')
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("get_weather", {"city": "Rome"})]
    assert len(calls[0].id) == 9 and calls[0].id.isalnum()
