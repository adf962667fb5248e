"""``--generation-config``: request defaults from the model's generation_config.json, as vLLM
applies them (only the sampling fields; a request's own values win), and clear errors."""

import json
import shutil

import pytest

from octavo import LLM, SamplingParams
from octavo.engine.arg_utils import EngineArgs


@pytest.fixture(scope="module")
def model_with_defaults(llama_dir, tmp_path_factory):
    d = tmp_path_factory.mktemp("genmodel") / "llama"
    shutil.copytree(llama_dir, d)
    (d / "generation_config.json").write_text(json.dumps(
        {"do_sample": True, "temperature": 0.7, "top_p": 0.8, "top_k": 1, "repetition_penalty": 1.3,
         "max_new_tokens": 5}))
    return str(d)


def defaults_of(model: str, **kw) -> dict:
    return EngineArgs(model=model, dtype="float32", **kw).create_engine_config().model_config.sampling_defaults


def test_defaults_read_from_the_model_folder(model_with_defaults, llama_dir, tmp_path):
    # max_new_tokens is not taken (a default length could exceed what a prompt leaves).
    assert defaults_of(model_with_defaults) == {"temperature": 0.7, "top_p": 0.8, "top_k": 1, "repetition_penalty": 1.3}
    assert defaults_of(model_with_defaults, generation_config="vllm") == {}
    assert defaults_of(llama_dir, generation_config=model_with_defaults)["top_k"] == 1
    with pytest.raises(ValueError, match="generation.config"):
        defaults_of(llama_dir, generation_config=str(tmp_path / "missing"))
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "generation_config.json").write_text(json.dumps({"repetition_penalty": -1.0}))
    with pytest.raises(ValueError, match="generation.config"):
        defaults_of(llama_dir, generation_config=str(bad))


def test_llm_uses_them_when_given_no_params(model_with_defaults):
    llm = LLM(model_with_defaults, dtype="float32", max_model_len=128)
    p = llm.get_default_sampling_params()
    assert (p.temperature, p.top_p, p.top_k, p.repetition_penalty, p.max_tokens) == (0.7, 0.8, 1, 1.3, 16)
    prompt = {"prompt_token_ids": [5, 9, 33, 7, 5, 9]}
    default = llm.generate(prompt, use_tqdm=False)[0].outputs[0].token_ids
    # top_k 1 is the penalised argmax whatever the temperature.
    expected = llm.generate(prompt, SamplingParams(temperature=0.0, repetition_penalty=1.3, max_tokens=16),
                            use_tqdm=False)[0].outputs[0].token_ids
    assert default == expected
    assert LLM(model_with_defaults, dtype="float32", max_model_len=128, generation_config="vllm") \
        .get_default_sampling_params().top_k == 0
