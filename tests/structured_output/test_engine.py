"""Structured outputs end to end through the offline ``LLM`` with the shipped model, which was
trained on Python and never writes JSON on its own: the grammar does all the work.

One engine serves every test of the module (the 200 schema requests go through it in one
batch); a second, deliberately starved engine (tiny KV cache, tiny token budget) checks that
chunked prefill, preemption and prefix caching leave the constrained outputs unchanged.
"""

from __future__ import annotations

import json
import re

import jsonschema
import pytest

from octavo import LLM, SamplingParams
from octavo.sampling_params import StructuredOutputsParams
from tests.structured_output.schemas import make_schemas

PROMPTS = ["def parse(data):", "Return the record as JSON:", "# config\n", "class Item:"]
SO_CONFIG = {"disable_any_whitespace": True}  # a tiny model otherwise pads JSON with newlines


@pytest.fixture(scope="module")
def llm():
    return LLM(dtype="float32", max_num_seqs=256, structured_outputs_config=SO_CONFIG)


def _json_params(schema, i: int, max_tokens: int = 160, **kw) -> SamplingParams:
    return SamplingParams(
        max_tokens=max_tokens, temperature=(0.0, 0.7, 1.0)[i % 3], seed=i,
        structured_outputs=StructuredOutputsParams(json=schema), **kw,
    )


def test_200_requests_over_varied_json_schemas_all_validate(llm):
    schemas = make_schemas(50)
    params = [_json_params(schemas[i % 50], i) for i in range(200)]
    outs = llm.generate([PROMPTS[i % 4] for i in range(200)], params, use_tqdm=False)
    for i, out in enumerate(outs):
        c = out.outputs[0]
        assert c.finish_reason == "stop", (i, c.text)
        jsonschema.validate(json.loads(c.text), schemas[i % 50])


def test_regex_and_choice(llm):
    regexes = [r"[a-c]{3}-[0-9]{2}", r"(yes|no), because [a-z ]{1,20}\.", r"0x[0-9A-F]{4}", r"[A-Z][a-z]{1,8} [0-9]{1,3}"]
    choices = ["alpha", "beta gamma", "δ", 'quote"d']
    params = [SamplingParams(max_tokens=40, temperature=1.0, seed=i,
                             structured_outputs=StructuredOutputsParams(regex=regexes[i % 4])) for i in range(20)]
    params += [SamplingParams(max_tokens=20, temperature=1.0, seed=i,
                              structured_outputs=StructuredOutputsParams(choice=choices)) for i in range(20)]
    # Unconstrained requests interleaved: constrained rows sit at varying batch positions.
    plain = SamplingParams(max_tokens=30, temperature=0, ignore_eos=True)
    mixed = [p for pair in zip(params, [plain] * 40, strict=True) for p in pair]
    outs = llm.generate([PROMPTS[i // 2 % 4] for i in range(80)], mixed, use_tqdm=False)
    free = llm.generate(PROMPTS[0], plain, use_tqdm=False)[0].outputs[0].text
    assert outs[1].outputs[0].text == free  # the plain rows were not masked
    outs = outs[::2]
    for i, out in enumerate(outs[:20]):
        assert re.fullmatch(regexes[i % 4], out.outputs[0].text), out.outputs[0].text
        assert out.outputs[0].finish_reason == "stop"
    assert all(o.outputs[0].text in choices for o in outs[20:])


def test_ebnf_grammar_and_json_object(llm):
    grammar = 'root ::= "SELECT " col (", " col)* " FROM t;"\ncol ::= "a" | "b" | "c"'
    out = llm.generate("x", SamplingParams(max_tokens=40, temperature=1.0, seed=3,
                                           structured_outputs=StructuredOutputsParams(grammar=grammar)),
                       use_tqdm=False)[0].outputs[0]
    assert re.fullmatch(r"SELECT [abc](, [abc])* FROM t;", out.text)
    outs = llm.generate(PROMPTS, SamplingParams(max_tokens=40, temperature=1.0, seed=0,
                                                structured_outputs=StructuredOutputsParams(json_object=True)),
                        use_tqdm=False)
    for out in outs:  # any JSON object, whatever the prompt
        c = out.outputs[0]
        if c.finish_reason == "stop":
            assert isinstance(json.loads(c.text), dict)
        else:
            assert c.text.startswith("{") and len(c.token_ids) == 40


def test_n_greater_than_one_each_sample_is_constrained(llm):
    schema = make_schemas(1, seed=7)[0]
    out = llm.generate("def f():", _json_params(schema, 1, n=4), use_tqdm=False)[0]
    assert len(out.outputs) == 4
    for c in out.outputs:
        jsonschema.validate(json.loads(c.text), schema)


def test_max_tokens_mid_object_finishes_with_length(llm):
    schema = {"type": "object", "properties": {"a": {"type": "string", "minLength": 30, "maxLength": 40}},
              "required": ["a"]}
    c = llm.generate("x", _json_params(schema, 0, max_tokens=5), use_tqdm=False)[0].outputs[0]
    assert c.finish_reason == "length" and len(c.token_ids) == 5
    assert c.text.startswith('{"a":')
    with pytest.raises(json.JSONDecodeError):
        json.loads(c.text)


def test_ignore_eos_goes_on_unconstrained_after_the_grammar_ends(llm, caplog):
    """The grammar's stop token (EOS) ends it; ``ignore_eos`` keeps the request going, and the
    rest is not masked (vLLM's rule: a terminated xgrammar matcher has no next-token mask; the
    engine loop used to raise there)."""
    params = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True,
                            structured_outputs=StructuredOutputsParams(regex="[a-c]{3}"))
    c = llm.generate("x", params, use_tqdm=False)[0].outputs[0]
    assert c.finish_reason == "length" and len(c.token_ids) == 12
    eos = llm.get_tokenizer().eos_token_id
    assert c.token_ids[3] == eos and re.fullmatch("[a-c]{3}", llm.get_tokenizer().decode(c.token_ids[:3]))
    assert "not allowed by the grammar" not in caplog.text


def test_stop_string_inside_constrained_output(llm):
    schema = {"type": "object", "properties": {"k": {"type": "string", "pattern": "^[a-z]{6}$"}}, "required": ["k"]}
    full = llm.generate("x", _json_params(schema, 0), use_tqdm=False)[0].outputs[0].text
    value = json.loads(full)["k"]
    stop = value[2:4]
    c = llm.generate("x", _json_params(schema, 0, stop=[stop]), use_tqdm=False)[0].outputs[0]
    assert c.finish_reason == "stop" and c.stop_reason == stop
    assert c.text == full[: full.index(stop)]


def test_invalid_constraints_are_refused_naming_the_problem(llm):
    bad = [
        (StructuredOutputsParams(json={"type": "object", "properties": {"a": {"type": "strin"}}}), "strin"),
        (StructuredOutputsParams(json="{not json"), "not valid JSON"),
        (StructuredOutputsParams(regex="(ab"), "regex"),
        (StructuredOutputsParams(grammar="root ::= undefined_rule"), "undefined_rule"),
    ]
    for so, needle in bad:
        with pytest.raises(ValueError, match=re.escape(needle)):
            llm.generate("x", SamplingParams(max_tokens=4, structured_outputs=so), use_tqdm=False)
    with pytest.raises(ValueError, match="exactly one of"):
        StructuredOutputsParams(json={}, regex="a")
    # The engine still serves.
    out = llm.generate("x", SamplingParams(max_tokens=8, structured_outputs=StructuredOutputsParams(regex="[0-9]{3}")),
                       use_tqdm=False)
    assert re.fullmatch("[0-9]{3}", out[0].outputs[0].text)


def test_chunked_prefill_preemption_prefix_cache_do_not_change_outputs(llm):
    schemas = make_schemas(6, seed=3)
    long_prompt = "import os\nimport sys\n" * 8  # several blocks: chunked, then cached
    prompts = [long_prompt + PROMPTS[i % 4] for i in range(6)]
    params = [SamplingParams(max_tokens=120, temperature=0.0,
                             structured_outputs=StructuredOutputsParams(json=s)) for s in schemas]
    want_outs = llm.generate(prompts, params, use_tqdm=False)
    assert all(o.outputs[0].finish_reason == "stop" for o in want_outs)
    want = [o.outputs[0].text for o in want_outs]
    starved = LLM(dtype="float32", structured_outputs_config=SO_CONFIG, block_size=16,
                  num_gpu_blocks_override=12, max_num_batched_tokens=32, enable_prefix_caching=True)
    got = [o.outputs[0].text for o in starved.generate(prompts, params, use_tqdm=False)]
    stats = starved.get_stats()
    assert stats.num_preemptions > 0 and stats.prefix_cache_hits > 0
    assert got == want
    for text, schema in zip(got, schemas, strict=True):
        jsonschema.validate(json.loads(text), schema)


def test_a_grammar_that_fails_to_compile_aborts_only_its_request(llm, monkeypatch, caplog):
    pool = llm.llm_engine.core.structured_outputs.pool

    def fail(params):
        raise RuntimeError("compiler exploded")

    monkeypatch.setattr(pool, "_compile", fail)
    so = StructuredOutputsParams(regex="[a-f]{7}")  # a spec no other test compiled
    bad, good = llm.generate(["x", "y"], [SamplingParams(max_tokens=4, structured_outputs=so),
                                          SamplingParams(max_tokens=4, ignore_eos=True)], use_tqdm=False)
    assert bad.outputs[0].finish_reason == "abort" and bad.outputs[0].token_ids == []
    assert "compiler exploded" in caplog.text
    assert len(good.outputs[0].token_ids) == 4
    assert llm.llm_engine.core.scheduler.kv_cache_manager.usage == 0.0
