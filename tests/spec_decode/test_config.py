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
        ({"method": "ngram", "num_speculative_tokens": 2, "model": "x"}, "keys ['model'] are not supported"),
        ({"method": "eagle", "num_speculative_tokens": 2}, "method 'eagle' is not supported by octavo"),
        ({"method": "draft_model", "num_speculative_tokens": 2}, "method 'draft_model' is not supported"),
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


def test_engine_args_validate_and_refuse_explicit_async(llama_dir):
    spec = json.dumps({"method": "ngram", "num_speculative_tokens": 3})
    cfg = EngineArgs(model=llama_dir, speculative_config=spec).create_engine_config()
    assert cfg.speculative_config == SpeculativeConfig("ngram", 3, 5, 5)
    assert not cfg.scheduler_config.async_scheduling
    with pytest.raises(ValueError, match="unknown keys"):
        EngineArgs(model=llama_dir, speculative_config={"method": "ngram", "k": 3}).create_engine_config()
    with pytest.raises(ValueError, match="async.scheduling.*speculative.config"):
        EngineArgs(model=llama_dir, speculative_config=spec, async_scheduling=True).create_engine_config()


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
