"""``octavo serve MODEL --api-key ...`` with the engine core on a thread of the API process
(``OCTAVO_ENGINE_INPROC=1``): it serves the same API, and SIGTERM with a request in flight
lets the request finish or aborts it with an error event within ``--shutdown-timeout``, then
exits 0."""

from __future__ import annotations

import json
import signal
import time

import httpx
import openai
import pytest

from tests.entrypoints.openai.utils import RemoteServer, child_pids


def test_serve_bad_model_is_a_clear_error(tmp_path):
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "octavo.entrypoints.cli", "serve", str(tmp_path / "nope")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    assert "error:" in r.stderr and "model" in r.stderr

API_KEY = "inproc-key"
AUTH = {"Authorization": f"Bearer {API_KEY}"}


TEMPLATE = "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}"


@pytest.fixture(scope="module")
def server(llama_dir, tmp_path_factory):
    template = tmp_path_factory.mktemp("template") / "chat.jinja"
    template.write_text(TEMPLATE)
    srv = RemoteServer(
        [llama_dir, "--served-model-name", "tiny", "--api-key", API_KEY, "--dtype", "float32",
         "--max-model-len", "512", "--shutdown-timeout", "1", "--chat-template", str(template)],
        env={"OCTAVO_ENGINE_INPROC": "1"},
    )
    yield srv
    srv.stop()


def test_inproc_serves(server):
    assert child_pids(server.proc.pid) == []  # no engine process
    client = openai.OpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0)
    assert [m.id for m in client.models.list().data] == ["tiny"]
    r = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=4,
                                       n=2, extra_body={"ignore_eos": True})
    assert r.usage.completion_tokens == 8
    assert httpx.post(server.url + "/v1/completions", json={"prompt": "x"}).status_code == 401


def test_chat_template_override(server):
    msgs = [{"role": "system", "content": "sys"}, {"role": "user", "content": "hi"}]
    ids = httpx.post(server.url + "/tokenize", json={"messages": msgs}).json()["tokens"]
    text = httpx.post(server.url + "/detokenize", json={"tokens": ids}).json()["prompt"]
    assert text == "[system] sys\n[user] hi\n"


def test_sigterm_with_a_request_in_flight(server):
    body = {"model": "tiny", "prompt": "slow", "max_tokens": 500, "ignore_eos": True, "stream": True}
    events = []
    with httpx.Client(base_url=server.url, timeout=60, headers=AUTH) as c:
        with c.stream("POST", "/v1/completions", json=body) as resp:
            lines = resp.iter_lines()
            for line in lines:
                if line.startswith("data: "):
                    break
            t0 = time.monotonic()
            server.proc.send_signal(signal.SIGTERM)
            events = [json.loads(x[6:]) if x[6:] != "[DONE]" else "[DONE]" for x in lines if x.startswith("data: ")]
    assert events[-1] == "[DONE]"
    last = events[-2]
    if "error" in last:  # aborted after the grace period
        assert last["error"]["code"] == "server_shutting_down"
    else:
        assert last["choices"][0]["finish_reason"] == "length"
    assert server.proc.wait(60) == 0
    assert time.monotonic() - t0 < 30
