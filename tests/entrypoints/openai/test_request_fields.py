"""Request fields octavo does not implement are refused with a 400 naming them, through a real
``octavo serve`` on loopback and the official ``openai`` client: a client asking for a feature must
never get a 200 that silently ignored it. The documented harmless OpenAI fields are accepted."""

from __future__ import annotations

import httpx
import openai
import pytest

from tests.entrypoints.openai.utils import RemoteServer

MODEL = "octavo-default"


@pytest.fixture(scope="module")
def server(llama_dir):
    srv = RemoteServer(["--dtype", "float32", "--max-model-len", "256"], env={"OCTAVO_DEFAULT_MODEL": llama_dir})
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=120)


def _bad_request(call) -> dict:
    with pytest.raises(openai.BadRequestError) as e:
        call()
    assert e.value.status_code == 400
    return e.value.body


def test_unknown_field_is_refused_and_named(client):
    chat = dict(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    body = _bad_request(lambda: client.chat.completions.create(**chat, extra_body={"guided_foo": "x"}))
    assert "guided_foo" in body["message"] and body["param"] == "guided_foo"
    body = _bad_request(lambda: client.completions.create(
        model=MODEL, prompt="def", max_tokens=2, extra_body={"guided_foo": "x"}))
    assert "guided_foo" in body["message"] and body["param"] == "guided_foo"


def test_every_unknown_field_is_named(server):
    r = httpx.post(server.url + "/v1/completions",
                   json={"prompt": "x", "max_tokens": 1, "guided_foo": 1, "frobnicate": True})
    assert r.status_code == 400
    msg = r.json()["error"]["message"]
    assert "'guided_foo'" in msg and "'frobnicate'" in msg


def test_best_of_is_refused(client):
    body = _bad_request(lambda: client.completions.create(model=MODEL, prompt="def", max_tokens=2, best_of=3))
    assert body["param"] == "best_of" and "best_of" in body["message"]
    chat = dict(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    body = _bad_request(lambda: client.chat.completions.create(**chat, extra_body={"best_of": 3}))
    assert body["param"] == "best_of"


@pytest.mark.parametrize("field,value", [
    ("echo", True), ("spaces_between_special_tokens", False),
])
def test_known_field_at_unimplemented_value_is_refused(client, field, value):
    chat = dict(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    body = _bad_request(lambda: client.chat.completions.create(**chat, extra_body={field: value}))
    assert body["param"] == field and "not supported" in body["message"]


def test_harmless_openai_fields_are_accepted(client):
    r = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=2, user="u-1", store=False,
        metadata={"team": "a"},
    )
    assert r.choices[0].finish_reason in ("length", "stop")
    r = client.completions.create(model=MODEL, prompt="def", max_tokens=2, user="u-1", best_of=1)
    assert r.choices[0].text is not None
