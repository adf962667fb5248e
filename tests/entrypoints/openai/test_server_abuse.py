"""``octavo serve`` under abusive requests, on one real server: huge prompts, chat messages,
``/tokenize`` bodies and bad-word lists are each answered while ``/health`` keeps answering
(the worst gap between health answers is measured, not slept on); lone surrogates in any text
field are a 400 on a keep-alive connection that stays usable; callers' request ids are echoed
but never collide with another caller's request.
"""

from __future__ import annotations

import http.client
import json
import threading
import time

import httpx
import pytest

from tests.entrypoints.openai.utils import RemoteServer

MAX_MODEL_LEN = 256
TEN_MB = 10 * 1024 * 1024


@pytest.fixture(scope="module")
def server(llama_dir):
    srv = RemoteServer([llama_dir, "--dtype", "float32", "--max-model-len", str(MAX_MODEL_LEN)])
    yield srv
    srv.stop()


class HealthPoller:
    """Polls ``/health`` from a separate process (so nothing in the test process can delay
    it) every ``interval`` seconds on one keep-alive connection, and reports the largest time
    between two consecutive answers (each must be a 200)."""

    SCRIPT = r"""
import http.client, os, select, sys, time
conn = http.client.HTTPConnection("127.0.0.1", int(sys.argv[1]), timeout=30)
interval = float(sys.argv[2])
worst, count, last = 0.0, 0, time.monotonic()
while not select.select([sys.stdin], [], [], 0)[0]:
    conn.request("GET", "/health")
    resp = conn.getresponse()
    resp.read()
    assert resp.status == 200, resp.status
    now = time.monotonic()
    worst, count, last = max(worst, now - last), count + 1, now
    time.sleep(interval)
print(worst, count, flush=True)
"""

    def __init__(self, port: int, interval: float = 0.01) -> None:
        import subprocess
        import sys

        self.proc = subprocess.Popen([sys.executable, "-c", self.SCRIPT, str(port), str(interval)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.worst = float("inf")
        self.count = 0

    def __enter__(self) -> HealthPoller:
        time.sleep(0.3)  # the poller is running
        return self

    def __exit__(self, *exc) -> None:
        out, _ = self.proc.communicate("stop\n", timeout=60)
        assert self.proc.returncode == 0, out
        worst, count = out.split()
        self.worst, self.count = float(worst), int(count)


def test_huge_requests_do_not_stall_health(server):
    big = "hello world " * (TEN_MB // 12)
    bodies = [  # encoded up front, so the test's own JSON encoding cannot delay its poller
        ("/v1/completions", {"prompt": big, "max_tokens": 2}),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": big}], "max_tokens": 2}),
        ("/tokenize", {"prompt": big}),
        ("/v1/completions", {"prompt": "x", "max_tokens": 2, "bad_words": [f"w{i}" for i in range(200_000)]}),
        ("/v1/completions", {"prompt": "x", "max_tokens": 2, "bad_words": [f"w{i}" for i in range(1024)]}),
        ("/detokenize", {"tokens": [i % 500 for i in range(MAX_MODEL_LEN)] * 64}),
    ]
    encoded = [(path, json.dumps(body).encode()) for path, body in bodies]
    answers = []
    with httpx.Client(base_url=server.url, timeout=120) as c:  # first-use costs are not stalls
        for path, body in (("/v1/completions", {"prompt": "warm", "max_tokens": 1, "bad_words": ["w"]}),
                           ("/v1/chat/completions", {"messages": [{"role": "user", "content": "w"}], "max_tokens": 1}),
                           ("/tokenize", {"prompt": "warm"}), ("/detokenize", {"tokens": [1, 2]})):
            assert c.post(path, json=body).status_code == 200
    with HealthPoller(server.port) as baseline:  # the machine's own noise, same run
        time.sleep(1.0)
    worst: dict[int, float] = {}
    with httpx.Client(base_url=server.url, timeout=120) as c:
        for i, (path, content) in enumerate(encoded):
            # A stall of the server repeats on every attempt; another process taking the shared
            # CPU does not: each request is measured up to 3 times and its best attempt counts.
            for _ in range(3):
                with HealthPoller(server.port) as poller:
                    r = c.post(path, content=content, headers={"content-type": "application/json"})
                worst[i] = min(worst.get(i, float("inf")), poller.worst)
                if worst[i] < 0.1 + baseline.worst:
                    break
            answers.append((path, r.status_code, r.json()))
    statuses = [s for _, s, _ in answers]
    assert statuses == [400, 400, 400, 400, 200, 200], answers[:4]
    for _, _, body in answers[:3]:
        assert "max_prompt_chars" in body["error"]["message"]
    assert "at most 1024" in answers[3][2]["error"]["message"]
    # Before request preparation left the event loop these stalls were 11-21 s. The bound is
    # 100 ms over the worst gap of an idle server measured just before (a shared CI machine's
    # scheduling noise is no stall of the server's).
    gaps = {i: f"{encoded[i][0]}: {w * 1000:.0f} ms" for i, w in worst.items()}
    assert max(worst.values()) < 0.1 + baseline.worst, (gaps, f"idle baseline {baseline.worst * 1000:.0f} ms")


SURROGATE_BODIES = [
    ("/v1/completions", '{"prompt": "a\\ud800b", "max_tokens": 1}'),
    ("/v1/completions", '{"prompt": ["ok", "\\udfff"], "max_tokens": 1}'),
    ("/v1/completions", '{"prompt": "x", "max_tokens": 1, "stop": ["\\ud800"]}'),
    ("/v1/completions", '{"prompt": "x", "max_tokens": 1, "bad_words": ["\\ud800"]}'),
    ("/v1/completions", '{"prompt": "x", "max_tokens": 1, "request_id": "\\ud800"}'),
    ("/v1/completions", '{"prompt": "x", "max_tokens": 1, "user": "\\ud800"}'),
    ("/v1/chat/completions", '{"messages": [{"role": "user", "content": "\\ud800"}], "max_tokens": 1}'),
    ("/v1/chat/completions",
     '{"messages": [{"role": "user", "content": [{"type": "text", "text": "\\ud800"}]}], "max_tokens": 1}'),
    ("/v1/chat/completions", '{"messages": [{"role": "user", "content": "x", "name": "\\udc00"}]}'),
    ("/v1/chat/completions",
     '{"messages": [{"role": "user", "content": "x"}], "chat_template_kwargs": {"k": "\\ud800"}}'),
    ("/tokenize", '{"prompt": "\\ud800"}'),
    ("/tokenize", '{"messages": [{"role": "user", "content": "\\ud800"}]}'),
]


def test_lone_surrogates_are_400_and_keep_alive_survives(server):
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    conn.connect()
    sock = conn.sock
    for path, raw in SURROGATE_BODIES:
        conn.request("POST", path, body=raw.encode(), headers={"content-type": "application/json"})
        resp = conn.getresponse()
        body = json.loads(resp.read())
        assert resp.status == 400, (path, raw, body)
        assert "surrogate" in body["error"]["message"], body
        assert resp.getheader("connection") != "close"
    # the same connection still serves a real request
    conn.request("POST", "/v1/completions", body=b'{"prompt": "fine", "max_tokens": 2}',
                 headers={"content-type": "application/json"})
    resp = conn.getresponse()
    assert resp.status == 200 and json.loads(resp.read())["usage"]["completion_tokens"] == 2
    assert conn.sock is sock  # never reconnected
    conn.close()


def test_callers_request_ids_never_collide(server):
    results: list[tuple[str, int, httpx.Response]] = []

    def call(rid: str, n: int) -> None:
        body = {"prompt": "ids", "max_tokens": 40, "n": n, "ignore_eos": True, "request_id": rid}
        results.append((rid, n, httpx.post(server.url + "/v1/completions", json=body, timeout=120)))

    a = threading.Thread(target=call, args=("victim", 2))
    a.start()
    time.sleep(0.05)
    call("0_victim", 1)  # was: 400 "already in use", and A's first sample aborted
    call("victim", 1)  # the very same id while A may still run
    a.join(120)
    assert sorted((rid, n) for rid, n, _ in results) == [("0_victim", 1), ("victim", 1), ("victim", 2)]
    ids = set()
    for rid, n, r in results:
        assert r.status_code == 200, r.text
        assert r.headers["x-request-id"] == rid
        body = r.json()
        assert body["id"].startswith("cmpl-") and rid not in body["id"]
        ids.add(body["id"])
        assert [c["finish_reason"] for c in body["choices"]] == ["length"] * n
        assert body["usage"]["completion_tokens"] == 40 * n
    assert len(ids) == 3
    # the X-Request-Id header is echoed too; without either, octavo's own id is
    r = httpx.post(server.url + "/v1/completions", json={"prompt": "x", "max_tokens": 1},
                   headers={"X-Request-Id": "trace-7"}, timeout=60)
    assert r.headers["x-request-id"] == "trace-7"
    r = httpx.post(server.url + "/v1/completions", json={"prompt": "x", "max_tokens": 1}, timeout=60)
    assert r.headers["x-request-id"] == r.json()["id"]
