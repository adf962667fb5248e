"""A real server with --speculative-config: completions work and /metrics reports vLLM's
spec_decode counters (under octavo: and vllm:) that add up."""

import httpx
import pytest

from tests.entrypoints.openai.utils import RemoteServer
from tests.hf_reference import random_prompts


@pytest.fixture(scope="module")
def server(llama_dir):
    srv = RemoteServer(
        ["--dtype", "float32", "--max-model-len", "512", "--speculative-config",
         '{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 3}'],
        env={"OCTAVO_DEFAULT_MODEL": llama_dir},
    )
    yield srv
    srv.stop()


def test_spec_decode_metrics(server):
    prompts = [(p * 6)[:30] for p in random_prompts(512, [5, 7, 9], seed=3)]
    for p in prompts:
        r = httpx.post(server.url + "/v1/completions", timeout=60,
                       json={"prompt": p, "max_tokens": 32, "temperature": 0, "ignore_eos": True})
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 32
    m = server.metrics()
    drafts, tokens = m["octavo:spec_decode_num_drafts_total"], m["octavo:spec_decode_num_draft_tokens_total"]
    accepted = m["octavo:spec_decode_num_accepted_tokens_total"]
    assert 0 < drafts <= tokens <= 3 * drafts
    assert 0 < accepted <= tokens
    assert m["octavo:spec_decode_num_accepted_tokens_per_pos_total"] == accepted  # summed over positions
    text = httpx.get(server.url + "/metrics", timeout=10).text
    assert 'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name=' in text
    assert "vllm:spec_decode_num_drafts_total" in text


def test_draft_model_server(llama_dir):
    """``"model"`` without ``"method"`` is a draft model (vLLM's inference); with the target as
    its own draft, served from the engine process, every draft is accepted."""
    _assert_every_draft_accepted(llama_dir, {"model": llama_dir, "num_speculative_tokens": 3})


def _assert_every_draft_accepted(target: str, spec: dict) -> None:
    """Serve ``target`` with ``spec`` from the engine process: greedy completions of full
    length, every draft accepted (the draft is the target itself, or mirrors it)."""
    import json

    srv = RemoteServer(["--dtype", "float32", "--max-model-len", "512", "--speculative-config", json.dumps(spec)],
                       env={"OCTAVO_DEFAULT_MODEL": target})
    try:
        for p in random_prompts(512, [5, 19], seed=4):
            r = httpx.post(srv.url + "/v1/completions", timeout=60,
                           json={"prompt": p, "max_tokens": 24, "temperature": 0, "ignore_eos": True})
            assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 24
        m = srv.metrics()
    finally:
        srv.stop()
    tokens = m["octavo:spec_decode_num_draft_tokens_total"]
    assert 0 < tokens == m["octavo:spec_decode_num_accepted_tokens_total"]


def test_eagle_server(tmp_path, attention_free_target):
    """A head folder named ``EAGLE-...`` without ``"method"`` is an EAGLE head (vLLM's
    inference); served from the engine process, the mirror head's drafts are all accepted."""
    import shutil

    target, head = attention_free_target
    named = shutil.copytree(head, tmp_path / "EAGLE-mirror")
    _assert_every_draft_accepted(target, {"model": str(named), "num_speculative_tokens": 3})
