"""Engine liveness of ``octavo serve``: the engine process killed (``kill -9``) or stopped
(``SIGSTOP``) while requests are in flight. Requests in flight fail at once, new ones and
``/health`` get 503 (OpenAI-shaped, code ``engine_dead``), and the server exits with code 1
after its short grace period — or, with ``--keep-alive-on-engine-death``, keeps answering 503.

Each test needs its own server (they end it); the model is the tiny fixture Llama.
"""

from __future__ import annotations

import os
import signal
import threading
import time

import httpx
import pytest

from tests.entrypoints.openai.utils import RemoteServer

ARGS = ["--dtype", "float32", "--max-model-len", "2048"]
LONG = {"prompt": "never finishes", "max_tokens": 2000, "ignore_eos": True}


def start(llama_dir: str, *extra: str) -> RemoteServer:
    return RemoteServer([llama_dir, *ARGS, *extra])


def assert_engine_dead(resp: httpx.Response) -> None:
    assert resp.status_code == 503, resp.text
    err = resp.json()["error"]
    assert err["code"] == "engine_dead" and err["type"] == "service_unavailable", err


def in_flight(url: str) -> tuple[threading.Thread, dict, httpx.Response]:
    """One non-streaming request running in a thread and one stream that has begun."""
    result: dict = {}

    def blocking() -> None:
        try:
            result["resp"] = httpx.post(url + "/v1/completions", json=LONG, timeout=120)
        except httpx.HTTPError as e:
            result["error"] = e
        result["t"] = time.monotonic()

    t = threading.Thread(target=blocking)
    t.start()
    client = httpx.Client(timeout=120)
    stream = client.send(client.build_request("POST", url + "/v1/completions", json={**LONG, "stream": True}),
                         stream=True)
    lines = stream.iter_lines()
    assert next(lines).startswith("data: ")  # the stream is running
    return t, result, lines


def test_kill_9_fails_in_flight_then_503_then_exit_1(llama_dir):
    srv = start(llama_dir)
    try:
        t, result, lines = in_flight(srv.url)
        time.sleep(0.2)  # 2000 tokens each: far longer than this
        os.kill(srv.engine_pid, signal.SIGKILL)
        killed = time.monotonic()
        events = [line for line in lines if line.startswith("data: ")]
        stream_end = time.monotonic()
        assert events[-1] == "data: [DONE]" and "engine_dead" in events[-2], events[-3:]
        t.join(30)
        assert result["resp"].status_code == 503 and result["resp"].json()["error"]["code"] == "engine_dead"
        # in-flight requests fail within a second of the kill
        assert stream_end - killed < 1.0 and result["t"] - killed < 1.0
        for path, body in (("/v1/completions", {"prompt": "x", "max_tokens": 2}), ("/tokenize", {"prompt": "x"}),
                           ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}]})):
            assert_engine_dead(httpx.post(srv.url + path, json=body, timeout=10))
        assert_engine_dead(httpx.get(srv.url + "/v1/models", timeout=10))
        assert_engine_dead(httpx.get(srv.url + "/health", timeout=10))
        assert srv.proc.wait(30) == 1  # exits non-zero after the grace period
    finally:
        srv.stop()


def test_keep_alive_on_engine_death_keeps_answering_503(llama_dir):
    srv = start(llama_dir, "--keep-alive-on-engine-death")
    try:
        os.kill(srv.engine_pid, signal.SIGKILL)
        deadline = time.monotonic() + 5
        while httpx.get(srv.url + "/health", timeout=10).status_code == 200:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        time.sleep(4)  # twice the grace period after which the server would otherwise exit
        assert srv.proc.poll() is None
        assert_engine_dead(httpx.get(srv.url + "/health", timeout=10))
        assert_engine_dead(httpx.post(srv.url + "/v1/completions", json={"prompt": "x"}, timeout=10))
    finally:
        assert srv.stop() == 0


@pytest.mark.parametrize("timeout_s", [3.0])
def test_sigstop_engine_is_declared_dead_within_the_timeout(llama_dir, timeout_s):
    srv = start(llama_dir, "--engine-timeout", str(timeout_s))
    pid = srv.engine_pid
    try:
        # a busy engine keeps beating: a request of many steps finishes normally
        r = httpx.post(srv.url + "/v1/completions", json={"prompt": "x", "max_tokens": 300, "ignore_eos": True},
                       timeout=120)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 300
        t, result, lines = in_flight(srv.url)
        os.kill(pid, signal.SIGSTOP)
        stopped = time.monotonic()
        while httpx.get(srv.url + "/health", timeout=10).status_code == 200:
            time.sleep(0.05)
        detected = time.monotonic() - stopped
        # the bound is the timeout plus the watcher's poll and one heartbeat interval
        assert detected < timeout_s + 1.0, detected
        events = [line for line in lines if line.startswith("data: ")]
        assert "engine_dead" in events[-2]
        t.join(30)
        assert result["resp"].status_code == 503
        assert srv.proc.wait(30) == 1
    finally:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        srv.stop()
