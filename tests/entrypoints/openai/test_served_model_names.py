"""``octavo serve --model M --served-model-name a b``: vLLM's flag form and several names."""

from __future__ import annotations

import openai
import pytest

from tests.entrypoints.openai.utils import RemoteServer


@pytest.fixture(scope="module")
def server(llama_dir):
    srv = RemoteServer(["--model", llama_dir, "--served-model-name", "first", "second",
                        "--dtype", "float32", "--max-model-len", "128", "--shutdown-timeout", "1"])
    yield srv
    assert srv.stop() == 0


def test_every_name_is_listed_and_answers(server):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused")
    assert [m.id for m in client.models.list().data] == ["first", "second"]
    for name in ("first", "second"):
        out = client.completions.create(model=name, prompt="def f(", max_tokens=3, temperature=0)
        assert out.model == "first"  # responses carry the first name, as in vLLM
        assert out.usage.completion_tokens == 3
    with pytest.raises(openai.NotFoundError, match="'first', 'second'"):
        client.completions.create(model="third", prompt="x", max_tokens=1)
