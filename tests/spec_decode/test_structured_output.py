"""Speculative decoding for structured-output requests, through the offline ``LLM`` with the
shipped model (float32, CPU): drafts are cut to what the grammar accepts, every verified
position is masked with its own row, and the output equals speculation off token for token
(greedy, and seeded sampling at temperature 1, whose rejection sampling is coupled to the
sampler's noise), for n-gram and draft-model proposals, alone and in a batch with plain
requests; every constrained output parses under its grammar.

The prompts hold earlier instances of the wanted format, so prompt lookup drafts from them;
the draft model is the shipped model drafting for itself (greedily, without the grammar: its
drafts that the grammar refuses are dropped before verification, the rest are accepted)."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest

from octavo import LLM, SamplingParams
from octavo.sampling_params import StructuredOutputsParams

SO_CONFIG = {"disable_any_whitespace": True}  # the tiny model otherwise pads JSON with newlines
NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1, "prompt_lookup_max": 3}
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 10},
        "size": {"type": "integer", "minimum": 0, "maximum": 99},
        "tags": {"type": "array", "items": {"type": "string", "enum": ["red", "green", "blue"]}, "maxItems": 3},
    },
    "required": ["name", "size", "tags"],
}
REGEX = r"(ab|cd){2,6}-[0-9]{2}"
CHOICES = ["get_value", "set_value", "delete_value"]
_RECORD = '{"name": "box", "size": 12, "tags": ["red", "blue"]}'
PROMPTS = [  # one per kind: JSON, regex, choice
    f"records = [\n    {_RECORD},\n    {_RECORD},\n    ",
    'codes = ["abcdab-12", "abcdab-12", "',
    "def get_value(self):\n    return self._value\n\n\ndef ",
]


def draft_spec() -> dict:
    from octavo.engine.model_files import resolve_model_path

    return {"method": "draft_model", "model": resolve_model_path(None), "num_speculative_tokens": 3}


SPECS = {"ngram": lambda: NGRAM, "draft_model": draft_spec}


def structured_params(temperature: float = 0.0, seed: int | None = None) -> list[SamplingParams]:
    """JSON schema, regex, choice (the order of ``PROMPTS``)."""
    kinds = [(60, {"json": SCHEMA}), (30, {"regex": REGEX}), (10, {"choice": CHOICES})]
    return [SamplingParams(max_tokens=n, temperature=temperature, seed=seed,
                           structured_outputs=StructuredOutputsParams(**kind)) for n, kind in kinds]


def assert_valid(outs, params: list[SamplingParams]) -> None:
    """Every constrained completion that stopped parses under its grammar."""
    for out, p in zip(outs, params, strict=True):
        so, c = p.structured_outputs, out.outputs[0]
        if so is None:
            continue
        assert c.finish_reason == "stop", c.text
        if so.json is not None:
            jsonschema.validate(json.loads(c.text), so.json)
        elif so.regex is not None:
            assert re.fullmatch(so.regex, c.text), c.text
        else:
            assert c.text in so.choice


def generate(spec: dict | None, prompts: list[str], params: list[SamplingParams], **kw):
    """(token ids of each completion, outputs, engine stats) of one engine."""
    llm = LLM(dtype="float32", speculative_config=spec, structured_outputs_config=SO_CONFIG, **kw)
    outs = llm.generate(prompts, params, use_tqdm=False)
    stats = llm.llm_engine.get_stats()
    llm.shutdown()
    return [list(o.outputs[0].token_ids) for o in outs], outs, stats


@pytest.mark.parametrize("method", sorted(SPECS))
def test_greedy_structured_output_identical_with_speculation(method):
    """Only structured requests in the engine: its spec metrics are theirs."""
    params = structured_params() * 2
    base, outs, _ = generate(None, PROMPTS * 2, params)
    spec, spec_outs, stats = generate(SPECS[method](), PROMPTS * 2, params)
    assert spec == base
    assert_valid(spec_outs, params)
    assert stats.spec_num_drafts > 0 and stats.spec_num_draft_tokens > 0
    assert 0 < stats.spec_num_accepted_tokens <= stats.spec_num_draft_tokens
    assert sum(stats.spec_num_accepted_tokens_per_pos) == stats.spec_num_accepted_tokens


@pytest.mark.parametrize("method", sorted(SPECS))
def test_seeded_sampling_identical_with_speculation_and_valid(method):
    """Temperature 1, a seed per request: position ``j`` of a verifying request samples with
    the seed's noise for its output index and its own mask, so the same tokens come out."""
    params = [p for seed in range(4) for p in structured_params(temperature=1.0, seed=seed)]
    prompts = PROMPTS * 4
    base, outs, _ = generate(None, prompts, params)
    spec, spec_outs, stats = generate(SPECS[method](), prompts, params)
    assert spec == base
    assert_valid(outs, params)
    assert_valid(spec_outs, params)
    assert 0 < stats.spec_num_accepted_tokens < stats.spec_num_draft_tokens


def test_mixed_batch_identical_under_a_small_token_budget():
    """Structured and plain requests interleaved (constrained rows at varying positions), a
    budget of 16 tokens (chunked prefill, drafts cut by the budget): equal to speculation off."""
    plain = SamplingParams(max_tokens=30, temperature=0, ignore_eos=True)
    params = [p for pair in zip(structured_params(), [plain] * 3, strict=True) for p in pair]
    prompts = [p for p in PROMPTS for _ in range(2)]
    base, _, _ = generate(None, prompts, params, max_num_batched_tokens=16)
    spec, outs, stats = generate(NGRAM, prompts, params, max_num_batched_tokens=16)
    assert spec == base
    assert_valid(outs, params)
    assert stats.spec_num_accepted_tokens > 0


def test_drafts_the_grammar_refuses_never_reach_verification():
    """A proposer that appends a token the grammars refuse ('x') to every proposal: the engine
    schedules only the grammar-valid prefix (never the 'x'), and the output is unchanged."""
    params = structured_params()[1:]  # regex and choice: no 'x' anywhere in their language
    prompts = PROMPTS[1:]
    base, _, _ = generate(None, prompts, params)
    llm = LLM(dtype="float32", speculative_config=NGRAM, structured_outputs_config=SO_CONFIG)
    core = llm.llm_engine.core
    bad = llm.get_tokenizer().encode("x", add_special_tokens=False)
    assert len(bad) == 1
    proposed, scheduled = [], []
    propose, schedule = core.proposer.propose_batch, core.scheduler.schedule

    def propose_with_bad(reqs, rooms):
        drafts = [d + bad for d in propose(reqs, rooms)]
        proposed.extend(drafts)
        return drafts

    def record(*a, **kw):
        so = schedule(*a, **kw)
        scheduled.extend(so.scheduled_spec_decode_tokens.values())
        return so

    core.proposer.propose_batch, core.scheduler.schedule = propose_with_bad, record
    outs = llm.generate(prompts, params, use_tqdm=False)
    assert [list(o.outputs[0].token_ids) for o in outs] == base
    assert proposed and scheduled and all(bad[0] not in d for d in scheduled)
    assert any(len(d) > 1 for d in proposed) and any(scheduled)  # valid prefixes were kept
    llm.shutdown()


def test_reasoning_section_with_speculation():
    """``--reasoning-parser``: drafts inside the reasoning section are free text, those after
    its end are the grammar's; output equals speculation off."""
    params = SamplingParams(max_tokens=16, temperature=0,
                            structured_outputs=StructuredOutputsParams(regex="[0-9]{5}"))
    prompts = ["def f(x):\n<think>\n", "def f(x):\n<think>\n\n</think>\n\n"]
    outs = {}
    for spec in (None, NGRAM):
        llm = LLM(dtype="float32", speculative_config=spec, reasoning_parser="deepseek_r1")
        outs[spec is None] = llm.generate(prompts, params, use_tqdm=False)
        llm.shutdown()
    assert [o.outputs[0].token_ids for o in outs[False]] == [o.outputs[0].token_ids for o in outs[True]]
    assert re.fullmatch("[0-9]{5}", outs[False][1].outputs[0].text)


@pytest.mark.parametrize("in_step", [False, True], ids=["after_step", "in_step"])
def test_device_drafts_of_grammar_requests_are_read_back(in_step):
    """The accelerator's path for a draft model (drafts kept on the device, placeholders to
    the scheduler; ``in_step``: the draft's passes queued inside the verifying step), switched
    on on the CPU as tests/spec_decode/test_device_drafts.py does: a grammar request's drafts
    come back as values (the engine validates them and masks each position), a plain
    request's stay placeholders; the output equals the host path's."""
    from octavo.spec_decode.device_drafts import DEVICE_DRAFT, DeviceDrafts

    plain = SamplingParams(max_tokens=30, temperature=0, ignore_eos=True)
    params, prompts = structured_params() + [plain], PROMPTS + PROMPTS[:1]
    host, _, _ = generate(draft_spec(), prompts, params)
    llm = LLM(dtype="float32", speculative_config=draft_spec(), structured_outputs_config=SO_CONFIG)
    core, runner = llm.llm_engine.core, llm.llm_engine.core.runner
    runner.device_drafts = DeviceDrafts(llm.llm_engine.config.scheduler_config.max_num_seqs, 3, runner.device,
                                        runner.transfer)
    if in_step:
        runner.drafter.step_buffers = runner.drafter.make_step_buffers()
    seen = {True: [], False: []}  # grammar request? -> its scheduled drafts
    launches_with_grammar = []
    schedule, launch = core.scheduler.schedule, runner.drafter.in_step.launch

    def record(*a, **kw):
        so = schedule(*a, **kw)
        for rid, drafts in so.scheduled_spec_decode_tokens.items():
            seen[so.scheduled_requests[rid].structured_output_request is not None].append(drafts)
        return so

    def record_launch(batch, step, sampled):
        launched = launch(batch, step, sampled)
        launches_with_grammar.append(launched and bool(batch.has_grammar[step.rows].any()))
        return launched

    core.scheduler.schedule, runner.drafter.in_step.launch = record, record_launch
    outs = llm.generate(prompts, params, use_tqdm=False)
    assert [list(o.outputs[0].token_ids) for o in outs] == host
    assert seen[True] and all(DEVICE_DRAFT not in d for d in seen[True])
    assert seen[False] and all(set(d) == {DEVICE_DRAFT} for d in seen[False])
    assert any(launches_with_grammar) == in_step
    llm.shutdown()


@pytest.mark.parametrize("on_device", [False, True], ids=["host", "device"])
def test_eagle_drafts_for_grammar_requests(attention_free_target, on_device):
    """EAGLE (the mirror head: every draft is the target's unconstrained greedy token) on the
    fixture Llama under a grammar that changes its output: the drafts the grammar refuses are
    dropped, the rest all accepted; output equals speculation off, with the head's drafts on
    the host or kept on the device (read back for these requests)."""
    from octavo.spec_decode.device_drafts import DeviceDrafts
    from tests.spec_decode.test_eagle import eagle_spec

    target, head = attention_free_target
    regex = "[a-z ]{1,80}"
    params = SamplingParams(max_tokens=30, temperature=0, structured_outputs=StructuredOutputsParams(regex=regex))
    prompts = ["abc-12 ab abc", "def f(x): return x"]
    outs = {}
    for spec in (None, eagle_spec(head, k=3)):
        llm = LLM(target, dtype="float32", speculative_config=spec)
        runner = llm.llm_engine.core.runner
        if spec is not None and on_device:
            runner.device_drafts = DeviceDrafts(llm.llm_engine.config.scheduler_config.max_num_seqs, 3,
                                                runner.device, runner.transfer)
        outs[spec is None] = [o.outputs[0] for o in llm.generate(prompts, params, use_tqdm=False)]
        stats = llm.llm_engine.get_stats()
        llm.shutdown()
    assert [c.token_ids for c in outs[False]] == [c.token_ids for c in outs[True]]
    assert all(re.fullmatch(regex, c.text) for c in outs[False])
    assert 0 < stats.spec_num_accepted_tokens == stats.spec_num_draft_tokens
