"""Tool calling through a real ``octavo serve`` (the shipped model) and the ``openai`` client.

The server runs a fixture chat template that renders tools and tool messages Hermes-style, with
``--enable-auto-tool-choice --tool-call-parser hermes`` (and ``--reasoning-parser qwen3``, which
leaves answers without ``<think>`` as content). ``required`` and named functions are
grammar-constrained, so their arguments always validate; for ``auto`` the shipped model (which
never learnt tool calling) is scripted through a test grammar into writing a Hermes
``<tool_call>`` block, which the parser must turn into ``tool_calls``, streamed and not."""

from __future__ import annotations

import json
import re
from pathlib import Path

import httpx
import jsonschema
import openai
import pytest

from octavo.entrypoints.openai.tool_parsers import TOOL_PARSERS
from tests.entrypoints.openai.utils import RemoteServer

MODEL = "octavo-default"
TEMPLATE = Path(__file__).parents[2] / "fixtures" / "hermes_tool_template.jinja"

WEATHER = {"type": "object", "properties": {
    "city": {"type": "string", "pattern": "^[A-Z][a-z]{2,8}$"},
    "unit": {"enum": ["celsius", "fahrenheit"]}}, "required": ["city", "unit"], "additionalProperties": False}
TIME = {"type": "object", "properties": {"utc_offset": {"type": "integer", "minimum": -12, "maximum": 14}},
        "required": ["utc_offset"], "additionalProperties": False}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city", "parameters": WEATHER}},
    {"type": "function", "function": {"name": "get_time", "parameters": TIME}},
]
SCHEMAS = {"get_weather": WEATHER, "get_time": TIME}
MESSAGES = [{"role": "user", "content": "What is the weather in Paris?"}]
HERMES_REGEX = (r'Sure\.\n<tool_call>\n\{"name": "get_weather", "arguments": \{"city": "[A-Z][a-z]{2,6}", '
                r'"unit": "celsius"\}\}\n</tool_call>')


@pytest.fixture(scope="module")
def server():
    srv = RemoteServer(["--dtype", "float32", "--max-model-len", "1024", "--chat-template", str(TEMPLATE),
                        "--enable-auto-tool-choice", "--tool-call-parser", "hermes", "--reasoning-parser", "qwen3",
                        "--structured-outputs-config", '{"disable_any_whitespace": true}'])
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=120)


def _check_calls(calls):
    assert calls
    for call in calls:
        assert call.type == "function" and call.id
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])


def test_required_calls_always_validate(client):
    # This model never stops adding calls: max_tokens cuts the array, the complete calls remain.
    r = client.chat.completions.create(model=MODEL, messages=MESSAGES, tools=TOOLS, tool_choice="required",
                                       max_tokens=100, temperature=1.0, seed=5, n=3)
    for c in r.choices:
        assert c.finish_reason in ("tool_calls", "length") and c.message.content is None
        _check_calls(c.message.tool_calls)
    assert {call.function.name for c in r.choices for call in c.message.tool_calls} == set(SCHEMAS)
    r = client.chat.completions.create(model=MODEL, messages=MESSAGES, tools=TOOLS, tool_choice="required",
                                       parallel_tool_calls=False, max_tokens=100, temperature=1.0, seed=5, n=3)
    for c in r.choices:
        assert c.finish_reason == "tool_calls" and len(c.message.tool_calls) == 1
        _check_calls(c.message.tool_calls)


def test_required_streamed_matches_non_streamed(client):
    kw = dict(model=MODEL, messages=MESSAGES, tools=TOOLS, tool_choice="required", max_tokens=50, temperature=0)
    want = client.chat.completions.create(**kw).choices[0].message.tool_calls
    got, finish = {}, None
    for chunk in client.chat.completions.create(**kw, stream=True):
        for tc in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
            got.setdefault(tc.index, ["", ""])
            got[tc.index][0] += tc.function.name or ""
            got[tc.index][1] += tc.function.arguments or ""
        if chunk.choices and chunk.choices[0].finish_reason:
            finish = chunk.choices[0].finish_reason
    assert [tuple(v) for _, v in sorted(got.items())] == [(c.function.name, c.function.arguments) for c in want]
    assert finish in ("tool_calls", "length")


def test_named_function(client):
    choice = {"type": "function", "function": {"name": "get_time"}}
    r = client.chat.completions.create(model=MODEL, messages=MESSAGES, tools=TOOLS, tool_choice=choice,
                                       max_tokens=60, temperature=1.0, seed=2)
    (call,) = r.choices[0].message.tool_calls
    assert call.function.name == "get_time" and r.choices[0].finish_reason == "stop"
    _check_calls([call])
    stream = client.chat.completions.create(model=MODEL, messages=MESSAGES, tools=TOOLS, tool_choice=choice,
                                            max_tokens=60, temperature=0, stream=True)
    names, args, ids = [], "", set()
    for chunk in stream:
        for tc in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
            assert tc.index == 0
            ids.add(tc.id) if tc.id else None
            names.append(tc.function.name) if tc.function.name else None
            args += tc.function.arguments or ""
    assert names == ["get_time"] and len(ids) == 1
    jsonschema.validate(json.loads(args), TIME)


def test_auto_with_the_hermes_parser(client):
    kw = dict(model=MODEL, messages=MESSAGES, tools=TOOLS, max_tokens=200, temperature=0,
              extra_body={"guided_regex": HERMES_REGEX})
    r = client.chat.completions.create(**kw)  # tool_choice defaults to "auto"
    msg = r.choices[0].message
    assert msg.content == "Sure."
    assert r.choices[0].finish_reason == "tool_calls"
    (call,) = msg.tool_calls
    assert call.function.name == "get_weather"
    _check_calls([call])

    content, calls = "", {}
    finish = None
    for chunk in client.chat.completions.create(**kw, stream=True):
        if not chunk.choices:
            continue
        d = chunk.choices[0].delta
        content += d.content or ""
        for tc in d.tool_calls or []:
            calls.setdefault(tc.index, {"name": "", "arguments": ""})
            calls[tc.index]["name"] += tc.function.name or ""
            calls[tc.index]["arguments"] += tc.function.arguments or ""
        finish = chunk.choices[0].finish_reason or finish
    assert content == "Sure.\n" or content.strip() == "Sure."
    assert list(calls.values()) == [{"name": "get_weather", "arguments": call.function.arguments}]
    assert finish == "tool_calls"


def test_auto_without_a_call_is_plain_content(client):
    r = client.chat.completions.create(model=MODEL, messages=MESSAGES, tools=TOOLS, max_tokens=20, temperature=0,
                                       extra_body={"guided_regex": "It is sunny[.]"})
    assert r.choices[0].message.content == "It is sunny." and not r.choices[0].message.tool_calls
    assert r.choices[0].finish_reason == "stop"


def test_tool_messages_and_tools_in_the_template(server, client):
    conversation = MESSAGES + [
        {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {
            "name": "get_weather", "arguments": '{"city": "Paris", "unit": "celsius"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "21 degrees"},
    ]
    r = client.chat.completions.create(model=MODEL, messages=conversation, tools=TOOLS, tool_choice="none",
                                       max_tokens=5, temperature=0)
    assert r.choices[0].message.tool_calls == [] or r.choices[0].message.tool_calls is None
    tok = httpx.post(server.url + "/tokenize", json={"messages": conversation, "tools": TOOLS}).json()
    text = httpx.post(server.url + "/detokenize", json={"tokens": tok["tokens"]}).json()["prompt"]
    assert "get_time" in text and '<tool_response id="call_1">' in text
    assert '"arguments": {"city": "Paris", "unit": "celsius"}' in text  # arguments rendered as an object
    assert r.usage.prompt_tokens == tok["count"]


@pytest.mark.parametrize("kw,needle", [
    ({"tool_choice": {"type": "function", "function": {"name": "nope"}}}, "'nope'"),
    ({"tool_choice": "required", "response_format": {"type": "json_object"}}, "constrains the output"),
    ({"tool_choice": "maybe"}, "tool_choice"),
])
def test_bad_tool_requests_are_400s(client, kw, needle):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL, messages=MESSAGES, tools=TOOLS, max_tokens=4, **kw)
    assert needle in e.value.body["message"]


def test_required_without_tools_is_a_400(client):
    with pytest.raises(openai.BadRequestError, match="needs tools"):
        client.chat.completions.create(model=MODEL, messages=MESSAGES, tool_choice="required", max_tokens=4)


def test_cli_choices_match_the_registry():
    import argparse

    from octavo.entrypoints.openai.cli_args import add_serve_args

    p = argparse.ArgumentParser()
    add_serve_args(p)
    action = next(a for a in p._actions if a.dest == "tool_call_parser")
    assert set(action.choices) == set(TOOL_PARSERS)


def test_thinking_disabled_by_the_template_constrains_from_the_start(client):
    r = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=12, temperature=0,
                                       extra_body={"guided_regex": "[0-9]{5}",
                                                   "chat_template_kwargs": {"enable_thinking": False}})
    msg = r.choices[0].message
    assert re.fullmatch("[0-9]{5}", msg.content) and msg.reasoning_content is None
