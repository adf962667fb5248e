"""Structured outputs through a real ``octavo serve`` (the shipped model) and the official
``openai`` client: response_format json_schema / json_object / text, vLLM's
structured_outputs and guided_* fields, the client's ``chat.completions.parse`` with a
Pydantic model, and 400s naming what is wrong."""

from __future__ import annotations

import json
import re
from typing import Literal

import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field

from tests.entrypoints.openai.utils import RemoteServer

MODEL = "octavo-default"


@pytest.fixture(scope="module")
def server():
    srv = RemoteServer(["--dtype", "float32", "--max-model-len", "512",
                        "--structured-outputs-config", '{"disable_any_whitespace": true}'])
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=120)


def chat(client, **kw):
    kw.setdefault("max_tokens", 120)
    return client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Describe a user."}], **kw
    )


SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "pattern": "^[A-Z][a-z]{1,8}$"},
        "age": {"type": "integer", "minimum": 18, "maximum": 99},
        "roles": {"type": "array", "items": {"enum": ["admin", "dev", "ops"]}, "minItems": 1, "maxItems": 2},
    },
    "required": ["name", "age", "roles"],
    "additionalProperties": False,
}


def test_response_format_json_schema(client):
    rf = {"type": "json_schema", "json_schema": {"name": "user", "schema": SCHEMA, "strict": True}}
    r = chat(client, response_format=rf, temperature=0.8, seed=1, n=3)
    for c in r.choices:
        assert c.finish_reason == "stop"
        jsonschema.validate(json.loads(c.message.content), SCHEMA)


def test_response_format_json_object_and_text(client):
    r = chat(client, response_format={"type": "json_object"}, temperature=0, max_tokens=30)
    c = r.choices[0]
    assert c.message.content.startswith("{")
    if c.finish_reason == "stop":
        assert isinstance(json.loads(c.message.content), dict)
    r = chat(client, response_format={"type": "text"}, temperature=0, max_tokens=5)
    assert r.choices[0].finish_reason in ("stop", "length")


def test_vllm_fields_on_completions_and_chat(client):
    r = client.completions.create(model=MODEL, prompt="x =", max_tokens=20, temperature=1.0, seed=4,
                                  extra_body={"guided_regex": "[0-9]{2}-[a-z]{2}"})
    assert re.fullmatch("[0-9]{2}-[a-z]{2}", r.choices[0].text)
    r = chat(client, extra_body={"guided_choice": ["left", "right"]})
    assert r.choices[0].message.content in ("left", "right")
    r = chat(client, extra_body={"structured_outputs": {"choice": ["up", "down"]}})
    assert r.choices[0].message.content in ("up", "down")
    r = chat(client, extra_body={"guided_json": SCHEMA})
    jsonschema.validate(json.loads(r.choices[0].message.content), SCHEMA)
    r = client.completions.create(model=MODEL, prompt="q:", max_tokens=20, temperature=0,
                                  extra_body={"guided_grammar": 'root ::= "a" bc bc "."\nbc ::= "b" | "c"'})
    assert re.fullmatch(r"a[bc]{2}\.", r.choices[0].text)


def test_streamed_structured_output(client):
    stream = chat(client, stream=True, temperature=0, extra_body={"guided_json": SCHEMA})
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    jsonschema.validate(json.loads(text), SCHEMA)


class Pet(BaseModel):
    species: Literal["cat", "dog", "bird"]
    name: str = Field(max_length=10)
    legs: int = Field(ge=0, le=4)


def test_openai_parse_with_a_pydantic_model(client):
    parse = getattr(client.chat.completions, "parse", None) or client.beta.chat.completions.parse
    r = parse(model=MODEL, messages=[{"role": "user", "content": "A pet, please."}], response_format=Pet,
              max_tokens=100, temperature=0)
    pet = r.choices[0].message.parsed
    assert isinstance(pet, Pet) and pet.species in ("cat", "dog", "bird") and 0 <= pet.legs <= 4


@pytest.mark.parametrize("body,needle,param", [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "strin"}}}},
     "strin", None),
    ({"guided_regex": "(ab"}, "parenthesis", "structured_outputs.regex"),
    ({"guided_json": "{nope"}, "not valid JSON", "structured_outputs.json"),
    ({"guided_grammar": "root ::= missing"}, "missing", "structured_outputs.grammar"),
    ({"guided_choice": []}, "choice", "guided_choice"),
    ({"structured_outputs": {"jsn": {}}}, "'jsn'", "structured_outputs.jsn"),
    ({"response_format": {"type": "yaml"}}, "yaml", "response_format.type"),
    ({"guided_json": {}, "guided_regex": "a"}, "only one of", "guided_regex"),
])
def test_invalid_constraints_are_400s_naming_the_problem(client, body, needle, param):
    with pytest.raises(openai.BadRequestError) as e:
        chat(client, extra_body=body)
    err = e.value.body
    assert needle in err["message"]
    if param is not None:
        assert err["param"] == param
    # and the server keeps serving
    assert chat(client, max_completion_tokens=2).choices[0].finish_reason in ("length", "stop")


def test_auto_tool_choice_needs_the_server_flags(client):
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    with pytest.raises(openai.BadRequestError, match="--enable-auto-tool-choice"):
        chat(client, tools=tools)
    r = chat(client, tools=tools, tool_choice={"type": "function", "function": {"name": "f"}}, max_tokens=20)
    assert r.choices[0].message.tool_calls[0].function.name == "f"


WEATHER = {
    "type": "object",
    "properties": {"city": {"enum": ["Paris", "Oslo", "Lima"]}, "days": {"type": "integer", "minimum": 1, "maximum": 7}},
    "required": ["city", "days"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def no_blank_tokens():
    """logit_bias banning whitespace-only tokens. xgrammar's structural tags always allow free
    whitespace inside JSON (there is no disable_any_whitespace for them), and the shipped
    model, trained on Python, pads JSON with newlines and indentation until max_tokens
    (tests/structured_output/test_whitespace.py shows that is the model, not the mask)."""
    from transformers import AutoTokenizer

    from octavo.engine.model_files import DEFAULT_MODEL_DIR

    tok = AutoTokenizer.from_pretrained(DEFAULT_MODEL_DIR)
    return {str(i): -100 for i in range(len(tok)) if tok.decode([i]).strip() == ""}


def _tag(begin: str, schema: dict, end: str = "</tool_call>") -> dict:
    return {"type": "tag", "begin": begin, "content": {"type": "json_schema", "json_schema": schema}, "end": end}


def _tag_bodies(text: str, begin: str, end: str) -> list[str]:
    return [part.split(end, 1)[0] for part in text.split(begin)[1:]]


def test_structural_tag_response_format_forces_a_tool_call(client, no_blank_tokens):
    """xgrammar's structural tag format: one of two tool-call tags, arguments valid for that
    tool's schema, then the end tag and nothing else; streamed and not."""
    other = {"type": "object", "properties": {"q": {"type": "string", "maxLength": 12}}, "required": ["q"],
             "additionalProperties": False}
    rf = {"type": "structural_tag", "format": {"type": "or", "elements": [
        _tag('<tool_call>{"name": "weather", "arguments": ', WEATHER, "}</tool_call>"),
        _tag('<tool_call>{"name": "search", "arguments": ', other, "}</tool_call>"),
    ]}}
    kw = {"response_format": rf, "max_tokens": 80, "logit_bias": no_blank_tokens}
    r = chat(client, temperature=1.0, seed=7, n=4, **kw)
    streamed = "".join(c.choices[0].delta.content or "" for c in chat(client, temperature=0, stream=True, **kw)
                       if c.choices)
    for text in [c.message.content for c in r.choices] + [streamed]:
        m = re.fullmatch(r'<tool_call>\{"name": "(weather|search)", "arguments": (.*)\}</tool_call>', text, re.S)
        assert m, text
        jsonschema.validate(json.loads(m[2]), WEATHER if m[1] == "weather" else other)
    assert all(c.finish_reason == "stop" for c in r.choices)


def test_structural_tag_triggers_constrain_only_after_the_trigger(client, no_blank_tokens):
    """vLLM's original format (structures + triggers): free text until a trigger, then the tag
    it begins, its schema, its end. The trigger is the start of the model's own greedy text,
    so the greedy run must meet it and everything after it is the grammar's."""
    kw = {"model": MODEL, "prompt": "def f(x):", "temperature": 0, "logit_bias": no_blank_tokens}
    free = client.completions.create(max_tokens=4, **kw)
    trigger = free.choices[0].text[:2]
    begin = trigger + "<call>"
    rf = {"type": "structural_tag", "triggers": [trigger],
          "structures": [{"begin": begin, "schema": WEATHER, "end": "</call>"}]}
    r = client.completions.create(max_tokens=60, extra_body={"response_format": rf}, **kw)
    text = r.choices[0].text
    assert text.startswith(begin), text
    body = _tag_bodies(text, begin, "</call>")[0]
    jsonschema.validate(json.loads(body), WEATHER)
    assert text.startswith(begin + body + "</call>")
    # the same constraint through structured_outputs on chat: every tag that opens is valid
    r = chat(client, temperature=1.0, seed=3, max_tokens=60, logit_bias=no_blank_tokens,
             extra_body={"structured_outputs": {"structural_tag": rf}})
    for body in _tag_bodies(r.choices[0].message.content, begin, "</call>")[:-1]:
        jsonschema.validate(json.loads(body), WEATHER)
