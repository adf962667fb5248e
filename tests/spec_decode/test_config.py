"""--speculative-config: vLLM's keys, clear errors for what octavo does not run."""

import json

import pytest

from octavo.config import SpeculativeConfig
from octavo.engine.arg_utils import EngineArgs
from octavo.spec_decode.config import parse_speculative_config


def test_parse_defaults_and_json():
    assert parse_speculative_config(None) is None
    cfg = parse_speculative_config('{"method": "ngram", "num_speculative_tokens": 4}')
    assert cfg == SpeculativeConfig("ngram", 4, 5, 5)
    assert parse_speculative_config({"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 3}) == \
        SpeculativeConfig("ngram", 2, 3, 3)
    assert parse_speculative_config({"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 2}) == \
        SpeculativeConfig("ngram", 2, 2, 2)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ({"method": "ngram", "num_speculative_tokens": 2, "lookahead": 1}, "unknown keys ['lookahead']"),
        ({"method": "ngram", "num_speculative_tokens": 2, "model": "x"}, "keys ['model'] do not apply to method 'ngram'"),
        ({"method": "draft_model", "num_speculative_tokens": 2, "prompt_lookup_min": 2},
         "keys ['prompt_lookup_min'] do not apply to method 'draft_model'"),
        ({"method": "draft_model", "num_speculative_tokens": 2}, "method 'draft_model' needs 'model'"),
        ({"model": "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B", "num_speculative_tokens": 2,
          "prompt_lookup_min": 2}, "keys ['prompt_lookup_min'] do not apply to method 'eagle3'"),
        ({"method": "draft_model", "model": "d", "num_speculative_tokens": 2, "draft_tensor_parallel_size": 1},
         "keys ['draft_tensor_parallel_size'] are not supported"),
        ({"method": "eagle", "num_speculative_tokens": 2}, "method 'eagle' needs 'model'"),
        ({"method": "eagle3", "num_speculative_tokens": 2}, "method 'eagle3' needs 'model'"),
        ({"method": "medusa", "model": "h", "num_speculative_tokens": 2}, "method 'medusa' is not supported by octavo"),
        ({"method": "eagle", "model": "h", "num_speculative_tokens": 2, "prompt_lookup_max": 2},
         "keys ['prompt_lookup_max'] do not apply to method 'eagle'"),
        ({"method": "ngarm", "num_speculative_tokens": 2}, "method 'ngarm' is unknown"),
        ({"num_speculative_tokens": 2}, "'method' is required"),
        ({"method": "ngram"}, "num_speculative_tokens is required"),
        ({"method": "ngram", "num_speculative_tokens": 0}, "num_speculative_tokens must be an integer >= 1"),
        ({"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 4, "prompt_lookup_max": 2},
         "prompt_lookup_max (2) must be >= prompt_lookup_min (4)"),
        ("{not json", "must be a JSON object"),
        ("[1]", "must be a JSON object"),
    ],
)
def test_errors_name_the_problem(value, message):
    with pytest.raises(ValueError) as e:
        parse_speculative_config(value)
    assert message in str(e.value) and "--speculative-config" in str(e.value)


def test_engine_args_validate_and_refuse_explicit_async_with_ngram(llama_dir):
    spec = json.dumps({"method": "ngram", "num_speculative_tokens": 3})
    cfg = EngineArgs(model=llama_dir, speculative_config=spec).create_engine_config()
    assert cfg.speculative_config == SpeculativeConfig("ngram", 3, 5, 5)
    assert not cfg.scheduler_config.async_scheduling
    with pytest.raises(ValueError, match="unknown keys"):
        EngineArgs(model=llama_dir, speculative_config={"method": "ngram", "k": 3}).create_engine_config()
    with pytest.raises(ValueError, match="async.scheduling.*speculative.config.*'ngram'"):
        EngineArgs(model=llama_dir, speculative_config=spec, async_scheduling=True).create_engine_config()
    draft = {"method": "draft_model", "model": llama_dir, "num_speculative_tokens": 2}
    cfg = EngineArgs(model=llama_dir, speculative_config=draft, async_scheduling=True).create_engine_config()
    assert cfg.scheduler_config.async_scheduling  # drafts on the device: async scheduling runs with them


def test_cli_flag_and_worker_forwarding(llama_dir):
    import argparse

    from octavo.entrypoints.engine_cli import add_engine_args
    from octavo.executor.multiproc import engine_args_dict

    parser = argparse.ArgumentParser()
    add_engine_args(parser)
    args = parser.parse_args(["--speculative-config", '{"method": "ngram", "num_speculative_tokens": 2}'])
    assert EngineArgs.from_cli_args(args).speculative_config == '{"method": "ngram", "num_speculative_tokens": 2}'

    spec = {"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 1, "prompt_lookup_max": 4}
    cfg = EngineArgs(model=llama_dir, speculative_config=spec).create_engine_config()
    forwarded = engine_args_dict(cfg)
    assert forwarded["speculative_config"] == spec
    assert EngineArgs(**forwarded).create_engine_config().speculative_config == cfg.speculative_config


def test_method_inferred_from_model_as_vllm_does():
    """No ``method``: ``model`` "ngram"/"[ngram]" is prompt lookup, any other model a draft model."""
    assert parse_speculative_config({"model": "ngram", "num_speculative_tokens": 2}) == SpeculativeConfig("ngram", 2, 5, 5)
    assert parse_speculative_config({"model": "[ngram]", "num_speculative_tokens": 2}).method == "ngram"
    cfg = parse_speculative_config({"model": "some/draft", "num_speculative_tokens": 3})
    assert (cfg.method, cfg.model, cfg.num_speculative_tokens) == ("draft_model", "some/draft", 3)


def test_draft_model_config_resolved_and_forwarded(checkpoints):
    """The draft's ModelConfig shares the target's dtype and length; workers rebuild the same."""
    from octavo.executor.multiproc import engine_args_dict

    spec = {"model": checkpoints["qwen3"], "num_speculative_tokens": 2}
    cfg = EngineArgs(model=checkpoints["llama"], dtype="float32", speculative_config=spec).create_engine_config()
    sc = cfg.speculative_config
    assert (sc.method, sc.model) == ("draft_model", checkpoints["qwen3"])
    draft = sc.draft_model_config
    assert draft.architecture == "Qwen3ForCausalLM" and draft.model == checkpoints["qwen3"]
    assert (draft.dtype, draft.max_model_len) == (cfg.model_config.dtype, cfg.model_config.max_model_len)
    forwarded = engine_args_dict(cfg)
    assert forwarded["speculative_config"] == {"method": "draft_model", "num_speculative_tokens": 2,
                                               "model": checkpoints["qwen3"]}
    assert EngineArgs(**forwarded).create_engine_config().speculative_config == sc


def _copy_with(src: str, dst, config_edit=None, vocab_edit=None) -> str:
    """A copy of checkpoint ``src`` with its config.json / tokenizer.json edited."""
    import shutil

    shutil.copytree(src, dst)
    for name, edit in (("config.json", config_edit), ("tokenizer.json", vocab_edit)):
        if edit is not None:
            path = dst / name
            d = json.loads(path.read_text())
            edit(d)
            path.write_text(json.dumps(d))
    return str(dst)


def test_draft_must_share_the_vocabulary(checkpoints, tmp_path):
    target = checkpoints["llama"]

    def bigger_vocab(d):
        d["vocab_size"] += 8

    def swap_two_tokens(d):
        vocab = d["model"]["vocab"]
        a, b = sorted(vocab, key=vocab.get)[100:102]
        vocab[a], vocab[b] = vocab[b], vocab[a]

    other_size = _copy_with(checkpoints["qwen3"], tmp_path / "size", config_edit=bigger_vocab)
    with pytest.raises(ValueError, match=r"draft model .* has vocab_size \d+, the target .* has \d+"):
        EngineArgs(model=target, speculative_config={"model": other_size, "num_speculative_tokens": 2}).create_engine_config()
    other_ids = _copy_with(checkpoints["qwen3"], tmp_path / "ids", vocab_edit=swap_two_tokens)
    with pytest.raises(ValueError, match="tokenizer maps tokens to other ids than the target's"):
        EngineArgs(model=target, speculative_config={"model": other_ids, "num_speculative_tokens": 2}).create_engine_config()


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"max_model_len": 1024, "draft": "llama_longrope"}, "has a context of 512 tokens, less than --max-model-len"),
        ({"max_model_len": 256, "draft": "llama_dynamic"}, "RoPE depends on the sequence length"),
    ],
)
def test_draft_model_refusals(checkpoints, kw, message):
    draft = checkpoints[kw.pop("draft", "qwen3")]
    with pytest.raises(ValueError, match=message):
        EngineArgs(model=checkpoints["llama"], speculative_config={"model": draft, "num_speculative_tokens": 2},
                   **kw).create_engine_config()
