"""``octavo serve`` end to end: a real server process on a free loopback port, the official
``openai`` client, raw httpx for streaming/concurrency, Prometheus metrics adding up, client
disconnects freeing blocks, bad input, API keys, and — last, since they end the server — the
engine process dying mid-request and SIGTERM.

The server runs the fixture Llama through the *default model* path (no model argument,
``OCTAVO_DEFAULT_MODEL`` pointing at the fixture), so the model is called ``octavo-default``
exactly as with the shipped model; its API key comes from ``OCTAVO_API_KEY``.
"""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import threading
import time

import httpx
import openai
import pytest

from tests.entrypoints.openai.utils import RemoteServer

MODEL = "octavo-default"
MAX_MODEL_LEN = 256
API_KEY = "test-key-123"
AUTH = {"Authorization": f"Bearer {API_KEY}"}


@pytest.fixture(scope="module")
def server(llama_dir):
    srv = RemoteServer(
        ["--dtype", "float32", "--max-model-len", str(MAX_MODEL_LEN), "--shutdown-timeout", "2",
         "--max-request-bytes", str(1 << 20)],
        env={"OCTAVO_DEFAULT_MODEL": llama_dir, "OCTAVO_API_KEY": API_KEY},
    )
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0, timeout=120)


def wait_idle(server: RemoteServer, timeout: float = 30.0) -> dict[str, float]:
    deadline = time.monotonic() + timeout
    while True:
        m = server.metrics()
        idle = m["octavo:num_requests_running"] == 0 and m["octavo:num_requests_waiting"] == 0
        if idle and m["octavo:kv_cache_usage_perc"] == 0.0:
            return m
        assert time.monotonic() < deadline, f"engine not idle: {m}"
        time.sleep(0.1)


def sse_events(lines) -> list:
    events = []
    for line in lines:
        if not line.startswith("data: "):
            continue
        data = line[len("data: "):]
        events.append(data if data == "[DONE]" else json.loads(data))
    return events


# -- OpenAI client: completions and chat -----------------------------------------------------
def test_models_version_health_docs(server, client):
    assert [m.id for m in client.models.list().data] == [MODEL]
    assert httpx.get(server.url + "/health").status_code == 200
    assert httpx.get(server.url + "/version").json()["version"]
    assert httpx.get(server.url + "/docs").status_code == 200
    paths = httpx.get(server.url + "/openapi.json").json()["paths"]
    for p in ("/v1/completions", "/v1/chat/completions", "/v1/models", "/tokenize", "/detokenize"):
        assert p in paths


def test_completion_usage_and_tokenize(server, client):
    prompt = "def fibonacci(n):"
    r = client.completions.create(model=MODEL, prompt=prompt, max_tokens=7, temperature=0,
                                  extra_body={"ignore_eos": True})
    tok = httpx.post(server.url + "/tokenize", json={"prompt": prompt}).json()
    assert tok["count"] == len(tok["tokens"]) and tok["max_model_len"] == MAX_MODEL_LEN
    assert r.object == "text_completion" and r.model == MODEL
    assert r.usage.prompt_tokens == tok["count"]
    assert r.usage.completion_tokens == 7
    assert r.usage.total_tokens == tok["count"] + 7
    assert r.choices[0].finish_reason == "length"
    detok = httpx.post(server.url + "/detokenize", json={"tokens": tok["tokens"]}).json()
    assert detok["prompt"] == prompt
    echoed = client.completions.create(model=MODEL, prompt=prompt, max_tokens=7, temperature=0, echo=True,
                                       extra_body={"ignore_eos": True})
    assert echoed.choices[0].text == prompt + r.choices[0].text


def test_chat_completion(client):
    r = client.chat.completions.create(
        model=MODEL, messages=[{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello"}],
        max_completion_tokens=6, temperature=0, extra_body={"ignore_eos": True},
    )
    assert r.object == "chat.completion"
    assert r.choices[0].message.role == "assistant"
    assert isinstance(r.choices[0].message.content, str)
    assert r.usage.completion_tokens == 6 and r.usage.prompt_tokens > 5
    assert r.choices[0].finish_reason == "length"


def test_streamed_equals_non_streamed_greedy(client):
    kw = dict(model=MODEL, max_tokens=20, temperature=0, extra_body={"ignore_eos": True})
    full = client.completions.create(prompt="import os\nclass", **kw)
    chunks = list(client.completions.create(prompt="import os\nclass", stream=True,
                                            stream_options={"include_usage": True}, **kw))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == full.choices[0].text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].usage.completion_tokens == 20 and not chunks[-1].choices
    assert chunks[-1].usage.prompt_tokens == full.usage.prompt_tokens

    msgs = [{"role": "user", "content": "the cache block"}]
    full = client.chat.completions.create(messages=msgs, **kw)
    chunks = list(client.chat.completions.create(messages=msgs, stream=True,
                                                 stream_options={"include_usage": True}, **kw))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == full.choices[0].message.content
    assert chunks[-1].usage.completion_tokens == 20


def test_n3_streaming_and_not(client):
    kw = dict(model=MODEL, prompt="hello world", max_tokens=6, n=3, temperature=1.0, seed=7,
              extra_body={"ignore_eos": True})
    r = client.completions.create(**kw)
    assert sorted(c.index for c in r.choices) == [0, 1, 2]
    assert r.usage.completion_tokens == 18
    texts: dict[int, str] = {}
    for chunk in client.completions.create(stream=True, **kw):
        for c in chunk.choices:
            texts[c.index] = texts.get(c.index, "") + c.text
    assert texts == {c.index: c.text for c in r.choices}  # same seed -> same samples
    chat = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}],
                                          n=3, max_tokens=4, extra_body={"ignore_eos": True})
    assert sorted(c.index for c in chat.choices) == [0, 1, 2]
    assert chat.usage.completion_tokens == 12


def test_batch_prompts(client):
    r = client.completions.create(model=MODEL, prompt=["a b", "data model", "x y"], max_tokens=3, n=2,
                                  temperature=0, extra_body={"ignore_eos": True})
    assert [c.index for c in r.choices] == list(range(6))
    assert r.choices[0].text == r.choices[1].text  # greedy samples of one prompt agree
    assert r.usage.completion_tokens == 18


def test_seed_reproducibility(client):
    kw = dict(model=MODEL, prompt="for key in", max_tokens=16, temperature=1.2, top_p=0.95,
              extra_body={"ignore_eos": True, "top_k": 50, "min_p": 0.01, "repetition_penalty": 1.1})
    a = client.completions.create(seed=1234, **kw).choices[0].text
    b = client.completions.create(seed=1234, **kw).choices[0].text
    c = client.completions.create(seed=4321, **kw).choices[0].text
    assert a == b
    assert a != c


def test_logprobs(client):
    r = client.completions.create(model=MODEL, prompt="the kernel", max_tokens=5, logprobs=3, temperature=0,
                                  extra_body={"ignore_eos": True})
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 5
    assert "".join(lp.tokens) == r.choices[0].text
    for tok, val, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs, strict=True):
        assert val <= 0.0 and 3 <= len(top) <= 4
        assert abs(max(top.values()) - val) < 1e-4  # greedy: the chosen token is the most likely
        assert tok in top
    assert lp.text_offset == sorted(lp.text_offset) and lp.text_offset[0] == 0
    streamed = [c.choices[0] for c in client.completions.create(
        model=MODEL, prompt="the kernel", max_tokens=5, logprobs=3, temperature=0, stream=True,
        extra_body={"ignore_eos": True}) if c.choices]
    assert [t for c in streamed for t in c.logprobs.tokens] == lp.tokens
    assert [t for c in streamed for t in c.logprobs.token_logprobs] == pytest.approx(lp.token_logprobs, abs=1e-4)
    assert [t for c in streamed for t in c.logprobs.text_offset] == lp.text_offset

    c = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}],
                                       max_tokens=4, logprobs=True, top_logprobs=2, temperature=0,
                                       extra_body={"ignore_eos": True})
    content = c.choices[0].logprobs.content
    assert len(content) == 4
    assert all(len(t.top_logprobs) == 2 and t.logprob <= 0 and t.bytes is not None for t in content)
    assert "".join(t.token for t in content) == c.choices[0].message.content


def test_stop_strings(client):
    kw = dict(model=MODEL, prompt="def main(self):", max_tokens=24, temperature=0, extra_body={"ignore_eos": True})
    text = client.completions.create(**kw).choices[0].text
    stop = text[8:10]
    assert stop
    expected = text[: text.index(stop)]
    r = client.completions.create(stop=[stop, "NEVER-SEEN"], **kw)
    assert r.choices[0].text == expected
    assert r.choices[0].finish_reason == "stop"
    streamed = "".join(c.choices[0].text for c in client.completions.create(stop=stop, stream=True, **kw)
                       if c.choices)
    assert streamed == expected
    kw["extra_body"] = {"ignore_eos": True, "include_stop_str_in_output": True}
    assert client.completions.create(stop=stop, **kw).choices[0].text == expected + stop


def test_vllm_extras_accepted(client):
    r = client.completions.create(
        model=MODEL, prompt="hello", max_tokens=4, presence_penalty=0.5, frequency_penalty=0.5,
        extra_body={"min_tokens": 4, "cache_salt": "tenant-a", "top_k": 5, "min_p": 0.05, "priority": 0},
    )
    assert r.usage.completion_tokens == 4


# -- concurrency and metrics -----------------------------------------------------------------
def test_64_concurrent_streams_and_metrics(server):
    before = wait_idle(server)
    max_tokens = 5

    async def one(client: httpx.AsyncClient, i: int) -> tuple[int, int, str]:
        chat = i % 2 == 1
        body = {"model": MODEL, "max_tokens": max_tokens, "stream": True, "ignore_eos": True,
                "stream_options": {"include_usage": True}, "temperature": 0.8, "seed": i}
        if chat:
            body["messages"] = [{"role": "user", "content": f"request {i} of the batch"}]
        else:
            body["prompt"] = f"{i} paged attention"
        path = "/v1/chat/completions" if chat else "/v1/completions"
        async with client.stream("POST", path, json=body) as resp:
            assert resp.status_code == 200
            events = sse_events([line async for line in resp.aiter_lines()])
        assert events[-1] == "[DONE]"
        usage = events[-2]["usage"]
        finish = [c["finish_reason"] for e in events[:-2] for c in e["choices"] if c["finish_reason"]]
        assert finish == ["length"]
        return usage["prompt_tokens"], usage["completion_tokens"], finish[0]

    async def run_all():
        limits = httpx.Limits(max_connections=100)
        async with httpx.AsyncClient(base_url=server.url, timeout=180, limits=limits, headers=AUTH) as c:
            return await asyncio.gather(*(one(c, i) for i in range(64)))

    results = asyncio.run(run_all())
    assert all(r[1] == max_tokens for r in results)
    after = wait_idle(server)
    assert after["octavo:prompt_tokens_total"] - before["octavo:prompt_tokens_total"] == sum(r[0] for r in results)
    assert after["octavo:generation_tokens_total"] - before["octavo:generation_tokens_total"] == 64 * max_tokens
    key = "octavo:request_success_total|length"
    assert after[key] - before.get(key, 0.0) == 64
    assert after["octavo:time_to_first_token_seconds_count"] - before["octavo:time_to_first_token_seconds_count"] == 64
    assert after["octavo:e2e_request_latency_seconds_count"] - before["octavo:e2e_request_latency_seconds_count"] == 64
    assert (after["octavo:inter_token_latency_seconds_count"]
            - before["octavo:inter_token_latency_seconds_count"]) == 64 * (max_tokens - 1)
    assert after["octavo:prefix_cache_queries_total"] > before["octavo:prefix_cache_queries_total"]
    assert 0.0 <= after["octavo:prefix_cache_hit_rate"] <= 1.0
    assert "octavo:num_preemptions_total" in after


# -- disconnects ------------------------------------------------------------------------------
def test_disconnect_mid_stream_frees_blocks(server):
    before = wait_idle(server)
    body = {"model": MODEL, "prompt": "abort me please", "max_tokens": 200, "ignore_eos": True, "stream": True}

    async def run():
        async with httpx.AsyncClient(base_url=server.url, timeout=60, headers=AUTH) as c:
            streams = [c.stream("POST", "/v1/completions", json=body) for _ in range(4)]
            responses = [await s.__aenter__() for s in streams]
            for r in responses:
                lines = r.aiter_lines()
                got = 0
                while got < 2:
                    if (await lines.__anext__()).startswith("data: "):
                        got += 1
            during = server.metrics()
            for s in streams:
                await s.__aexit__(None, None, None)  # closes the connection mid-stream
            return during

    during = asyncio.run(run())
    assert during["octavo:kv_cache_usage_perc"] > 0.0
    after = wait_idle(server, timeout=20)
    assert after["octavo:kv_cache_usage_perc"] == 0.0
    generated = after["octavo:generation_tokens_total"] - before["octavo:generation_tokens_total"]
    assert generated < 4 * 200  # aborted long before max_tokens
    key = "octavo:request_success_total|length"
    assert after.get(key, 0.0) == before.get(key, 0.0)


def test_disconnect_non_streaming_aborts(server):
    before = wait_idle(server)
    # A raw socket sends one non-streaming request and is closed as soon as the engine runs it:
    # no client timeout, so the test does not depend on how fast the kernels are.
    n, max_tokens = 16, MAX_MODEL_LEN - 16
    body = json.dumps({"model": MODEL, "prompt": "a long one", "max_tokens": max_tokens, "ignore_eos": True,
                       "n": n}).encode()
    head = (f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Authorization: {AUTH['Authorization']}\r\nContent-Length: {len(body)}\r\n\r\n").encode()
    sock = socket.create_connection(("127.0.0.1", server.port))
    try:
        sock.sendall(head + body)
        deadline = time.monotonic() + 30
        while server.metrics()["octavo:num_requests_running"] == 0:
            assert time.monotonic() < deadline, "request never started running"
    finally:
        sock.close()
    after = wait_idle(server, timeout=20)
    assert after["octavo:generation_tokens_total"] - before["octavo:generation_tokens_total"] < n * max_tokens
    key = "octavo:request_success_total|length"
    assert after.get(key, 0.0) == before.get(key, 0.0)


# -- bad input --------------------------------------------------------------------------------
def assert_openai_error(resp: httpx.Response, status: int) -> dict:
    assert resp.status_code == status, resp.text
    err = resp.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert isinstance(err["message"], str) and err["message"]
    assert isinstance(err["type"], str)
    return err


BAD_REQUESTS = [
    # (path, body, status, substring of the message)
    ("/v1/completions", {"model": "nope", "prompt": "x"}, 404, "nope"),
    ("/v1/chat/completions", {"model": "nope", "messages": [{"role": "user", "content": "x"}]}, 404, "nope"),
    ("/v1/completions", {"prompt": "x", "max_tokens": "abc"}, 400, "max_tokens"),
    ("/v1/completions", {"prompt": {"a": 1}}, 400, "prompt"),
    ("/v1/completions", {}, 400, "prompt"),
    ("/v1/chat/completions", {"messages": "hi"}, 400, "messages"),
    ("/v1/chat/completions", {"messages": []}, 400, "messages"),
    ("/v1/chat/completions", {"messages": [{"role": "wizard", "content": "x"}]}, 400, "role"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, 400, "text"),
    ("/v1/completions", {"prompt": ""}, 400, "at least 1 character"),
    ("/v1/completions", {"prompt": []}, 400, "at least 1"),
    ("/v1/completions", {"prompt": "x", "max_tokens": True}, 400, "max_tokens"),
    ("/v1/completions", {"prompt": "x", "max_tokens": 2.5}, 400, "max_tokens"),  # 2.0 is an integer
    ("/v1/completions", {"prompt": "x", "max_tokens": "2"}, 400, "max_tokens"),
    ("/v1/completions", {"prompt": "x", "allowed_token_ids": []}, 400, "allowed_token_ids"),
    ("/v1/completions", {"prompt": "x", "stop": ["s"] * 129}, 400, "at most 128"),
    ("/v1/completions", {"prompt": "x", "stop": "s" * 4097}, 400, "at most 4096"),
    ("/v1/completions", {"prompt": "x", "logit_bias": {str(i): 1 for i in range(1025)}}, 400, "at most 1024"),
    ("/v1/completions", {"prompt": [10, 999999]}, 400, "999999"),
    ("/v1/completions", {"prompt": "x", "max_tokens": 100000}, 400, str(MAX_MODEL_LEN)),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 100000},
     400, str(MAX_MODEL_LEN)),
    ("/v1/completions", {"prompt": "x", "max_tokens": 0}, 400, "max_tokens"),
    ("/v1/completions", {"prompt": "x", "temperature": -1}, 400, "temperature"),
    ("/v1/completions", {"prompt": "x", "top_p": 0}, 400, "top_p"),
    ("/v1/completions", {"prompt": "x", "top_p": 1.5}, 400, "top_p"),
    ("/v1/completions", {"prompt": "x", "top_k": -2}, 400, "top_k"),
    ("/v1/completions", {"prompt": "x", "min_p": 2}, 400, "min_p"),
    ("/v1/completions", {"prompt": "x", "presence_penalty": 3}, 400, "presence_penalty"),
    ("/v1/completions", {"prompt": "x", "frequency_penalty": -3}, 400, "frequency_penalty"),
    ("/v1/completions", {"prompt": "x", "repetition_penalty": 0}, 400, "repetition_penalty"),
    ("/v1/completions", {"prompt": "x", "logprobs": 21}, 400, "logprobs"),
    ("/v1/completions", {"prompt": "x", "seed": 2**80}, 400, "seed"),
    ("/v1/completions", {"prompt": "x", "n": 0}, 400, "n"),
    ("/v1/completions", {"prompt": "x", "n": 100000}, 400, "n"),
    ("/v1/completions", {"prompt": ["x"] * 20, "n": 100}, 400, "n"),
    ("/v1/completions", {"prompt": "x", "min_tokens": 20, "max_tokens": 5}, 400, "min_tokens"),
    ("/v1/completions", {"prompt": "x", "stop": [""]}, 400, "stop"),
    ("/v1/completions", {"prompt": "x", "logit_bias": {"abc": 1}}, 400, "logit_bias"),
    ("/v1/completions", {"prompt": "x", "logit_bias": {"99999999": 1}}, 400, "logit_bias"),
    ("/v1/completions", {"prompt": "x", "stop_token_ids": [99999999]}, 400, "stop_token_ids"),
    ("/v1/completions", {"prompt": "x", "priority": 5}, 400, "priority"),
    ("/v1/completions", {"prompt": "x", "best_of": 3}, 400, "best_of"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "top_logprobs": 99}, 400,
     "top_logprobs"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2}, 400, "logprobs"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}],
                              "tools": [{"type": "function", "function": {"name": "f"}}]}, 400, "tool"),
    ("/tokenize", {"prompt": 5}, 400, "prompt"),
    ("/detokenize", {"tokens": [99999999]}, 400, "tokens"),
    ("/detokenize", {"tokens": [-1]}, 400, "tokens"),
]


def test_bad_inputs_are_openai_errors_and_do_not_disturb_others(server, client):
    # A long request stays in flight while every bad input is answered.
    result: dict = {}

    def long_request():
        result["r"] = client.completions.create(model=MODEL, prompt="keep going", max_tokens=30,
                                                extra_body={"ignore_eos": True})

    t = threading.Thread(target=long_request)
    t.start()
    with httpx.Client(base_url=server.url, timeout=60, headers=AUTH) as c:
        for path, body, status, needle in BAD_REQUESTS:
            err = assert_openai_error(c.post(path, json=body), status)
            assert needle.lower() in err["message"].lower(), (body, err)
        # the prompt is longer than the context: both numbers in the message
        long_prompt = " ".join(["hello world"] * 200)
        err = assert_openai_error(c.post("/v1/completions", json={"prompt": long_prompt}), 400)
        n_tokens = c.post("/tokenize", json={"prompt": long_prompt}).json()["count"]
        assert str(n_tokens) in err["message"] and str(MAX_MODEL_LEN) in err["message"]
        # malformed JSON, non-object bodies, NaN, wrong content
        headers = {"content-type": "application/json"}
        for raw in (b"{", b'{"prompt": "x",}', b"[1, 2]", b'"text"', b"null", b"\xff\xfe",
                    b'{"prompt": "x", "temperature": NaN}', b'{"prompt": "x", "top_p": Infinity}'):
            assert_openai_error(c.post("/v1/completions", content=raw, headers=headers), 400)
        # a body over the size cap: declared, and streamed without a Content-Length
        big = json.dumps({"prompt": "x" * (2 << 20)}).encode()
        err = assert_openai_error(c.post("/v1/completions", content=big, headers=headers), 413)
        assert err["code"] == "request_too_large"

        def chunks():
            for _ in range(40):
                yield b" " * 65536

        assert_openai_error(c.post("/v1/completions", content=chunks(), headers=headers), 413)
        # unknown route and method
        assert_openai_error(c.get("/v1/nothing"), 404)
        assert_openai_error(c.get("/v1/completions"), 405)
    t.join(120)
    assert result["r"].usage.completion_tokens == 30
    assert result["r"].choices[0].finish_reason == "length"
    r = client.completions.create(model=MODEL, prompt="still fine", max_tokens=3)
    assert r.usage.completion_tokens >= 1


def test_bad_streaming_request_is_rejected_before_the_stream(server):
    r = httpx.post(server.url + "/v1/completions",
                   json={"prompt": "x", "stream": True, "max_tokens": 10**6}, timeout=30, headers=AUTH)
    assert_openai_error(r, 400)


def test_fuzzed_bodies(server):
    """Random junk against every POST route of the OpenAPI schema: each answer is a 2xx or an
    OpenAI-shaped 4xx, never a 5xx; the server keeps serving afterwards."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    schema = httpx.get(server.url + "/openapi.json").json()
    routes = {p: ops["post"] for p, ops in schema["paths"].items() if "post" in ops}
    assert "/v1/completions" in routes and "/v1/chat/completions" in routes
    components = schema["components"]["schemas"]

    def fields_of(op) -> list[str]:
        content = op["requestBody"]["content"]["application/json"]["schema"]
        refs = [content] if "$ref" in content else content.get("anyOf", content.get("oneOf", []))
        names: set[str] = set()
        for ref in refs:
            names |= set(components[ref["$ref"].rsplit("/", 1)[1]].get("properties", {}))
        return sorted(names)

    valid = {
        "/v1/completions": {"model": MODEL, "prompt": "fuzz", "max_tokens": 2},
        "/v1/chat/completions": {"model": MODEL, "messages": [{"role": "user", "content": "fuzz"}],
                                 "max_tokens": 2},
        "/tokenize": {"prompt": "fuzz"},
        "/detokenize": {"tokens": [1, 2]},
    }
    fields = {p: fields_of(op) for p, op in routes.items()}
    json_values = st.recursive(
        st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False, allow_infinity=False)
        | st.text(max_size=20),
        lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
        max_leaves=12,
    )
    length_keys = {"max_tokens", "max_completion_tokens", "min_tokens", "n", "best_of", "ignore_eos"}
    client = httpx.Client(base_url=server.url, timeout=60, headers=AUTH)

    def check(resp: httpx.Response) -> None:
        assert resp.status_code < 500, resp.text
        if resp.status_code >= 400:
            assert_openai_error(resp, resp.status_code)

    @settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(data=st.data())
    def mutate_one_field(data):
        path = data.draw(st.sampled_from(sorted(valid)))
        body = dict(valid[path])
        key = data.draw(st.sampled_from(fields[path]))
        value = data.draw(json_values)
        if key in length_keys and (value is None or isinstance(value, (bool, int, float))):
            value = data.draw(st.sampled_from([-1, 0, "x", [], {}, 10**9]))
        body[key] = value
        if body.get("stream") and path in ("/tokenize", "/detokenize"):
            body.pop("stream")
        check(client.post(path, json=body))

    @settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(path=st.sampled_from(sorted(routes)), body=json_values | st.binary(max_size=64))
    def junk_body(path, body):
        if isinstance(body, bytes):
            resp = client.post(path, content=body, headers={"content-type": "application/json"})
        else:
            resp = client.post(path, json=body)
        check(resp)
        assert resp.status_code != 200 or path in ("/tokenize", "/detokenize")

    mutate_one_field()
    junk_body()
    r = client.post("/v1/completions", json={"model": MODEL, "prompt": "after the fuzz", "max_tokens": 2})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] >= 1
    assert client.get("/health").status_code == 200
    client.close()


# -- API key ------------------------------------------------------------------------------------
def test_api_key_required_on_v1_only(server):
    body = {"model": MODEL, "prompt": "x", "max_tokens": 1}
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": API_KEY},
                    {"Authorization": f"bearer {API_KEY}x"}):
        err = assert_openai_error(httpx.post(server.url + "/v1/completions", json=body, headers=headers), 401)
        assert err["code"] == "invalid_api_key"
        assert_openai_error(httpx.get(server.url + "/v1/models", headers=headers), 401)
    assert httpx.post(server.url + "/v1/completions", json=body, headers=AUTH).status_code == 200
    for scheme in ("bearer", "BEARER", "BeArEr"):  # auth schemes are case-insensitive
        headers = {"Authorization": f"{scheme} {API_KEY}"}
        assert httpx.post(server.url + "/v1/completions", json=body, headers=headers).status_code == 200
    bad = openai.OpenAI(base_url=server.url + "/v1", api_key="nope", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()
    # health, metrics, version and the utilities are not under /v1
    for path in ("/health", "/metrics", "/version"):
        assert httpx.get(server.url + path).status_code == 200


# -- SIGTERM (keep last: it ends the module's server; engine death: test_server_engine_death.py) --
def test_sigterm_exits_zero(server):
    t0 = time.monotonic()
    server.proc.send_signal(signal.SIGTERM)
    assert server.proc.wait(60) == 0
    assert time.monotonic() - t0 < 30
