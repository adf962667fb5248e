"""Bad input raises ValueError naming the field, before anything is scheduled."""

import json
import shutil

import pytest

from octavo import LLM, SamplingParams


@pytest.fixture(scope="module")
def llm(llama_dir):
    return LLM(llama_dir, dtype="float32", max_model_len=128)


def test_unknown_model_path():
    with pytest.raises(ValueError, match="model"):
        LLM("/definitely/not/a/model/folder")


def test_unsupported_architecture(llama_dir, tmp_path):
    d = tmp_path / "gpt"
    shutil.copytree(llama_dir, d)
    cfg = json.loads((d / "config.json").read_text())
    cfg["architectures"] = ["GPT2LMHeadModel"]
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="unsupported model architecture.*GPT2LMHeadModel"):
        LLM(str(d))


def test_prompt_longer_than_max_model_len(llm):
    with pytest.raises(ValueError, match="max_model_len"):
        llm.generate({"prompt_token_ids": [5] * 200}, use_tqdm=False)
    assert not llm.llm_engine.has_unfinished_requests()


def test_max_tokens_overflowing_context(llm):
    with pytest.raises(ValueError, match="max_tokens"):
        llm.generate({"prompt_token_ids": [5] * 100}, SamplingParams(max_tokens=50), use_tqdm=False)


def test_bad_prompt_in_batch_schedules_nothing(llm):
    good = {"prompt_token_ids": [5, 6, 7]}
    bad = {"prompt_token_ids": [5] * 500}
    with pytest.raises(ValueError):
        llm.generate([good, bad], use_tqdm=False)
    assert not llm.llm_engine.has_unfinished_requests()
    kv = llm.llm_engine.core.scheduler.kv_cache_manager
    assert kv.block_pool.get_num_free_blocks() == kv.num_usable_blocks
    # The engine still works afterwards.
    out = llm.generate(good, SamplingParams(max_tokens=3, ignore_eos=True), use_tqdm=False)
    assert len(out[0].outputs[0].token_ids) == 3


def test_out_of_vocab_prompt_token(llm):
    with pytest.raises(ValueError, match="prompt_token_ids"):
        llm.generate({"prompt_token_ids": [1, 10**7]}, use_tqdm=False)


@pytest.mark.parametrize(
    "kwargs, flag",
    [
        ({"block_size": 7}, "block_size"),
        ({"max_num_seqs": 0}, "max_num_seqs"),
        ({"dtype": "int8"}, "dtype"),
        ({"max_model_len": 10**7}, "max_model_len"),
        ({"gpu_memory_utilization": 1.5}, "gpu_memory_utilization"),
    ],
)
def test_bad_engine_args(llama_dir, kwargs, flag):
    with pytest.raises(ValueError, match=flag):
        LLM(llama_dir, **kwargs)


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"logit_bias": {10**6: 1.0}}, "logit_bias"),
        ({"logit_bias": {-1: 1.0}}, "logit_bias"),
        ({"allowed_token_ids": [3, 10**6]}, "allowed_token_ids"),
        ({"stop_token_ids": [10**6]}, "stop_token_ids"),
        ({"logprobs": 10**6}, "logprobs"),
        ({"prompt_logprobs": 10**6}, "prompt_logprobs"),
    ],
)
def test_token_ids_outside_the_vocabulary(llm, kwargs, field):
    with pytest.raises(ValueError, match=field):
        llm.generate({"prompt_token_ids": [5, 6]}, SamplingParams(**kwargs), use_tqdm=False)
    assert not llm.llm_engine.has_unfinished_requests()


@pytest.mark.parametrize(
    "field, value",
    [
        ("max_tokens", 0),
        ("temperature", -0.5),
        ("top_p", 1.5),
        ("top_k", -2),
        ("min_p", 1.5),
        ("presence_penalty", 5.0),
        ("repetition_penalty", 0.0),
        ("n", 0),
    ],
)
def test_sampling_params_changed_after_construction_are_refused(llm, field, value):
    """The engine validates every request's parameters itself: a SamplingParams is mutable, so
    a value set after construction is refused by ``LLM.generate`` naming the field, nothing is
    scheduled, and the engine keeps serving."""
    params = SamplingParams(max_tokens=3, ignore_eos=True)
    setattr(params, field, value)
    with pytest.raises(ValueError, match=rf"\b{field}\b"):
        llm.generate({"prompt_token_ids": [5, 6]}, params, use_tqdm=False)
    assert not llm.llm_engine.has_unfinished_requests()
    out = llm.generate({"prompt_token_ids": [5, 6]}, SamplingParams(max_tokens=3, ignore_eos=True), use_tqdm=False)
    assert len(out[0].outputs[0].token_ids) == 3
