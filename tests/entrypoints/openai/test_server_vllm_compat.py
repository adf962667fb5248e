"""Details where ``octavo serve`` matches vLLM, on one real server: Prometheus metrics under
vLLM's names with vLLM's types and labels, ``prompt_logprobs`` and ``echo`` + ``logprobs`` in
vLLM's response shape, ``stream_options.continuous_usage_stats``, ``allowed_token_ids`` kept
when every allowed token is otherwise masked, and a body shorter than its Content-Length.
"""

from __future__ import annotations

import json
import re
import socket
import time
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.entrypoints.openai.utils import RemoteServer


@pytest.fixture(scope="module")
def server(llama_dir):
    srv = RemoteServer([llama_dir, "--dtype", "float32", "--max-model-len", "256", "--body-read-timeout", "1"])
    yield srv
    srv.stop()


def post(server, path: str, body: dict) -> dict:
    r = httpx.post(server.url + path, json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def sse(server, path: str, body: dict) -> list[dict]:
    with httpx.stream("POST", server.url + path, json={**body, "stream": True}, timeout=120) as r:
        assert r.status_code == 200
        return [json.loads(line[6:]) for line in r.iter_lines()
                if line.startswith("data: ") and line != "data: [DONE]"]


VLLM_METRICS = {
    "vllm:num_requests_running": "gauge", "vllm:num_requests_waiting": "gauge",
    "vllm:kv_cache_usage_perc": "gauge", "vllm:prefix_cache_queries": "counter",
    "vllm:prefix_cache_hits": "counter", "vllm:num_preemptions": "counter",
    "vllm:prompt_tokens": "counter", "vllm:generation_tokens": "counter", "vllm:request_success": "counter",
    "vllm:time_to_first_token_seconds": "histogram", "vllm:inter_token_latency_seconds": "histogram",
    "vllm:e2e_request_latency_seconds": "histogram", "vllm:request_queue_time_seconds": "histogram",
    "vllm:request_prefill_time_seconds": "histogram", "vllm:request_decode_time_seconds": "histogram",
    "vllm:request_inference_time_seconds": "histogram", "vllm:request_prompt_tokens": "histogram",
    "vllm:request_generation_tokens": "histogram",
}


def test_vllm_named_metrics_have_vllm_types_and_labels(server):
    post(server, "/v1/completions", {"prompt": "metrics", "max_tokens": 5, "ignore_eos": True})
    text = httpx.get(server.url + "/metrics", timeout=30).text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    for name, kind in VLLM_METRICS.items():
        assert name in families, name
        fam = families[name]
        assert fam.type == kind, (name, fam.type)
        for sample in fam.samples:
            assert sample.labels["model_name"] == "llama" or sample.labels["model_name"], sample
            assert sample.labels["engine"] == "0", sample
    success = [s for s in families["vllm:request_success"].samples if s.name.endswith("_total")]
    assert any(s.labels["finished_reason"] == "length" and s.value >= 1 for s in success)
    for hist in ("request_queue_time_seconds", "request_prefill_time_seconds", "request_decode_time_seconds",
                 "request_inference_time_seconds", "time_to_first_token_seconds"):
        count = [s for s in families[f"vllm:{hist}"].samples if s.name.endswith("_count")][0]
        assert count.value >= 1, hist
    gen = [s for s in families["vllm:request_generation_tokens"].samples if s.name.endswith("_sum")][0]
    assert gen.value >= 5
    # every series the shipped Grafana dashboard queries is one this server exports
    dashboard = (Path(__file__).parents[3] / "docs" / "grafana_dashboard.json").read_text()
    exported = {s.name for f in families.values() for s in f.samples}
    used = set(re.findall(r"vllm:[a-z0-9_]+", dashboard))
    assert len(used) >= 12 and used <= exported, used - exported


def test_prompt_logprobs_in_vllm_shape(server):
    ids = post(server, "/tokenize", {"prompt": "the cat sat"})["tokens"]
    body = post(server, "/v1/completions", {"prompt": "the cat sat", "max_tokens": 1, "prompt_logprobs": 2})
    plp = body["choices"][0]["prompt_logprobs"]
    assert len(plp) == len(ids) and plp[0] is None
    for pos, d in enumerate(plp[1:], start=1):
        assert str(ids[pos]) in d  # the prompt's own token, plus the top 2
        assert 1 <= len(d) <= 3
        for entry in d.values():
            assert set(entry) == {"logprob", "rank", "decoded_token"} and entry["logprob"] <= 0
    chat = post(server, "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                                                 "max_tokens": 1, "prompt_logprobs": 0})
    assert chat["prompt_logprobs"][0] is None and len(chat["prompt_logprobs"]) == chat["usage"]["prompt_tokens"]
    assert body["choices"][0].get("prompt_logprobs") is not None
    plain = post(server, "/v1/completions", {"prompt": "x", "max_tokens": 1})
    assert plain["choices"][0]["prompt_logprobs"] is None


def test_echo_with_logprobs_covers_prompt_then_output(server):
    prompt = "the cat sat"
    n_prompt = post(server, "/tokenize", {"prompt": prompt})["count"]
    body = post(server, "/v1/completions", {"prompt": prompt, "max_tokens": 3, "echo": True, "logprobs": 1,
                                            "temperature": 0, "ignore_eos": True})
    choice = body["choices"][0]
    lp = choice["logprobs"]
    assert choice["text"].startswith(prompt)
    assert len(lp["tokens"]) == n_prompt + 3 == len(lp["token_logprobs"]) == len(lp["top_logprobs"])
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    assert all(x is not None for x in lp["token_logprobs"][1:])
    assert lp["text_offset"] == sorted(lp["text_offset"]) and lp["text_offset"][0] == 0
    # streamed: the first event carries the prompt and its logprobs, the rest the same output
    events = sse(server, "/v1/completions", {"prompt": prompt, "max_tokens": 3, "echo": True, "logprobs": 1,
                                             "temperature": 0, "ignore_eos": True})
    streamed = [t for e in events for c in e["choices"] if c["logprobs"] for t in c["logprobs"]["tokens"]]
    assert streamed == lp["tokens"]
    assert "".join(c["text"] for e in events for c in e["choices"]) == choice["text"]


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_continuous_usage_stats(server, path):
    base = {"prompt": "usage"} if path == "/v1/completions" else {"messages": [{"role": "user", "content": "u"}]}
    events = sse(server, path, {**base, "max_tokens": 4, "ignore_eos": True,
                                "stream_options": {"include_usage": True, "continuous_usage_stats": True}})
    with_choices = [e for e in events if e["choices"]]
    assert with_choices and all("usage" in e for e in with_choices)
    counts = [e["usage"]["completion_tokens"] for e in with_choices]
    assert counts == sorted(counts) and counts[-1] == 4
    assert events[-1]["choices"] == [] and events[-1]["usage"]["completion_tokens"] == 4
    plain = sse(server, path, {**base, "max_tokens": 2, "stream_options": {"include_usage": True}})
    assert all("usage" not in e for e in plain[:-1]) and "usage" in plain[-1]


def test_allowed_token_ids_hold_when_every_allowed_token_is_a_bad_word(server):
    # a token that is one whole word: as a bad word it is banned at every position
    ids = post(server, "/tokenize", {"prompt": "the cat sat on the mat", "add_special_tokens": False})["tokens"]
    text = {t: post(server, "/detokenize", {"tokens": [t]})["prompt"] for t in ids}
    tid = next(t for t in ids if text[t].startswith(" ") and len(text[t]) > 2)
    word = text[tid]
    body = post(server, "/v1/completions", {"prompt": "the", "max_tokens": 4, "allowed_token_ids": [tid],
                                            "bad_words": [word], "ignore_eos": True, "logprobs": 0})
    tokens = body["choices"][0]["logprobs"]["tokens"]
    assert tokens == [word] * 4, (word, tokens)


def test_body_shorter_than_content_length_is_408_and_closed(server):
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 100\r\n\r\n{\"prompt\":")
        t0 = time.monotonic()
        data = b""
        while chunk := s.recv(65536):  # the server answers, then closes the connection
            data += chunk
        assert time.monotonic() - t0 < 20
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408"), head
    assert json.loads(body)["error"]["code"] == "request_timeout"
