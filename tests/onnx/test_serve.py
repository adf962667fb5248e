"""``octavo serve DIR --model-impl onnxruntime``: an exported model behind the OpenAI API, through
the real ``openai`` client on loopback, answering what octavo's torch path answers (greedy)."""

from __future__ import annotations

import openai
import pytest

from octavo import LLM, SamplingParams
from tests.entrypoints.openai.utils import RemoteServer

PROMPTS = ["def hello(", "the model token cache"]


@pytest.fixture(scope="module")
def server(onnx_exports):
    srv = RemoteServer([onnx_exports["llama"], "--model-impl", "onnxruntime", "--served-model-name", "tiny-onnx",
                        "--max-model-len", "128", "--shutdown-timeout", "1"])
    yield srv
    assert srv.stop() == 0


def test_completions_match_octavo(server, llama_dir):
    llm = LLM(llama_dir, dtype="float32", max_model_len=128)
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    expected = [o.outputs[0].text for o in llm.generate(PROMPTS, params, use_tqdm=False)]
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused")
    for prompt, text in zip(PROMPTS, expected, strict=True):
        out = client.completions.create(model="tiny-onnx", prompt=prompt, max_tokens=8, temperature=0,
                                        extra_body={"ignore_eos": True})
        assert out.usage.completion_tokens == 8
        assert out.choices[0].text == text
    stream = client.completions.create(model="tiny-onnx", prompt=PROMPTS[0], max_tokens=8, temperature=0,
                                       stream=True, extra_body={"ignore_eos": True})
    assert "".join(c.choices[0].text for c in stream) == expected[0]


def test_metrics_count_onnx_requests(server):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused")
    client.completions.create(model="tiny-onnx", prompt="x", max_tokens=2, temperature=0)
    metrics = server.metrics()
    assert metrics["octavo:generation_tokens_total"] >= 2
    assert metrics["octavo:prompt_tokens_total"] >= 1


def test_bad_request_is_answered_and_serving_continues(server):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused")
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model="tiny-onnx", prompt="x " * 400, max_tokens=4)
    out = client.completions.create(model="tiny-onnx", prompt="x", max_tokens=2, temperature=0)
    assert out.usage.completion_tokens == 2
