"""``--reasoning-parser deepseek_r1`` through a real server: the shipped model's answer (it never
closes a ``<think>`` the template opened) is all reasoning, returned as ``reasoning_content`` and
streamed as ``delta.reasoning_content``; a grammar does not constrain it (it would apply after
``</think>``)."""

from __future__ import annotations

import openai
import pytest

from tests.entrypoints.openai.utils import RemoteServer

MODEL = "octavo-default"
TEMPLATE = "{% for m in messages %}{{ m.content }}\n{% endfor %}<think>\n"


@pytest.fixture(scope="module")
def client():
    srv = RemoteServer(["--dtype", "float32", "--max-model-len", "256", "--reasoning-parser", "deepseek_r1",
                        "--chat-template", TEMPLATE])
    yield openai.OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0, timeout=120)
    srv.stop()


def test_reasoning_content_whole_and_streamed(client):
    kw = dict(model=MODEL, messages=[{"role": "user", "content": "def add(a, b):"}], max_tokens=12,
              temperature=0, extra_body={"guided_regex": "[0-9]{5}"})
    msg = client.chat.completions.create(**kw).choices[0].message
    assert msg.content is None and msg.reasoning_content
    assert not msg.reasoning_content.isdigit()  # the grammar waits for </think>
    reasoning = ""
    for chunk in client.chat.completions.create(**kw, stream=True):
        if chunk.choices:
            d = chunk.choices[0].delta
            assert not d.content
            reasoning += getattr(d, "reasoning_content", None) or ""
    assert reasoning.strip("\n") == msg.reasoning_content
