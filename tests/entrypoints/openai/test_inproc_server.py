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


# Request defaults this server takes from --generation-config: top_k 1 makes unseeded sampling
# at temperature 1 deterministic, so the test below can see that they apply.
GENERATION_CONFIG = {"do_sample": True, "top_k": 1, "repetition_penalty": 1.3}


@pytest.fixture(scope="module")
def server(llama_dir, tmp_path_factory):
    template = tmp_path_factory.mktemp("template") / "chat.jinja"
    template.write_text(TEMPLATE)
    gen = tmp_path_factory.mktemp("genconfig")
    (gen / "generation_config.json").write_text(json.dumps(GENERATION_CONFIG))
    srv = RemoteServer(
        [llama_dir, "--served-model-name", "tiny", "--api-key", API_KEY, "--dtype", "float32",
         "--max-model-len", "512", "--shutdown-timeout", "1", "--chat-template", str(template),
         "--generation-config", str(gen)],
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


def test_generation_config_defaults_fill_unset_fields(server):
    def complete(**extra):
        body = {"prompt": "def f(x):", "max_tokens": 12, "ignore_eos": True, **extra}
        r = httpx.post(server.url + "/v1/completions", json=body, headers=AUTH)
        assert r.status_code == 200, r.text
        return r.json()["choices"][0]["text"]

    # Unset temperature/top_k/repetition_penalty: the defaults (top_k 1, penalty 1.3) apply,
    # so any seed gives the penalised greedy text.
    greedy_penalised = complete(temperature=0.0, repetition_penalty=1.3)
    assert complete(seed=1) == complete(seed=2) == greedy_penalised
    # A field the request sets wins over the default.
    assert complete(temperature=0.0, repetition_penalty=1.0) == complete(temperature=0.0, top_k=0, repetition_penalty=1.0)


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
