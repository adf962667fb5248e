"""Structured outputs with ``--reasoning-parser``: the grammar sees no token of the reasoning
section and applies from the first token after ``</think>`` (found in the output, or already
in the prompt when the template disables thinking)."""

from __future__ import annotations

import re

import numpy as np
import pytest

from octavo import LLM, SamplingParams
from octavo.sampling_params import StructuredOutputsParams
from octavo.structured_output.manager import StructuredOutputManager
from tests.core.utils import make_request, make_scheduler

REGEX = "[0-9]{5}"


def _params(max_tokens: int = 12) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0,
                          structured_outputs=StructuredOutputsParams(regex=REGEX))


@pytest.fixture(scope="module")
def manager():
    from octavo.engine.model_files import DEFAULT_MODEL_DIR
    from octavo.engine.tokenizer import load_tokenizer

    m = StructuredOutputManager(lambda: load_tokenizer(str(DEFAULT_MODEL_DIR)), 4096, [0],
                                reasoning_parser="deepseek_r1")
    yield m
    m.shutdown()


def test_qwen3_with_a_multi_token_marker_constrains_from_the_start(manager):
    start_ids, end_ids = manager.reasoning_ids()
    from octavo.structured_output.reasoning import initial_state

    assert initial_state("qwen3", [5, 6], start_ids, end_ids) == "ended"
    assert initial_state("qwen3", [5, *start_ids], start_ids, end_ids) == "thinking"
    assert initial_state("deepseek_r1", [5, 6], start_ids, end_ids) == "thinking"


def test_grammar_starts_after_the_end_marker(manager):
    tok = manager.pool.tokenizer()
    req = make_request("R", 4, structured_outputs=StructuredOutputsParams(regex=REGEX))
    manager.attach(req)
    sor = req.structured_output_request
    sor._grammar.result(timeout=60)
    assert sor.is_ready() and not sor.reasoning_ended
    _, end_ids = manager.reasoning_ids()
    assert len(end_ids) > 1  # plain text for this tokenizer (one special token on R1 / Qwen3)
    thinking = tok.encode("let me think ", add_special_tokens=False) + end_ids[:1]
    assert sor.accept_tokens(thinking)  # free text: not checked against the grammar
    assert not sor.reasoning_ended
    s = make_scheduler()
    s.add_request(req)
    so = s.schedule()
    manager.grammar_bitmask(so)
    assert so.structured_output_request_ids == []  # not constrained while reasoning
    rest = end_ids[1:] + tok.encode("12", add_special_tokens=False)
    assert sor.accept_tokens(rest) and sor.reasoning_ended  # the marker spans two deltas
    bitmask = np.zeros((1, 128), dtype=np.int32)
    sor.fill_bitmask(bitmask, 0)
    allowed = [t for t in range(4096) if bitmask[0, t // 32] >> (t % 32) & 1]
    assert allowed and all(tok.decode([t]).isdigit() for t in allowed)  # "12" was accepted: digits follow


def test_prompt_that_closes_thinking_constrains_from_the_start(manager):
    tok = manager.pool.tokenizer()
    prompt = tok.encode("question<think>\n\n</think>\n\n", add_special_tokens=False)
    req = make_request("P", 0, prompt=prompt, structured_outputs=StructuredOutputsParams(regex=REGEX))
    manager.attach(req)
    assert req.structured_output_request.reasoning_ended


def test_qwen3_first_token_decides(tokenizer_dir):
    from transformers import AutoTokenizer

    def load():  # <think> and </think> as single special tokens, as in Qwen3's tokenizer
        tok = AutoTokenizer.from_pretrained(tokenizer_dir)
        tok.add_special_tokens({"additional_special_tokens": ["<think>", "</think>"]})
        return tok

    m = StructuredOutputManager(load, 1024, [0], reasoning_parser="qwen3")
    tok = m.pool.tokenizer()
    start_ids, end_ids = m.reasoning_ids()
    assert len(start_ids) == 1 and start_ids[0] < 1024
    reqs = [make_request(r, 4, structured_outputs=StructuredOutputsParams(regex=REGEX)) for r in "AB"]
    for r in reqs:
        m.attach(r)
        r.structured_output_request._grammar.result(timeout=60)
        assert r.structured_output_request.is_ready()
        assert r.structured_output_request.reasoning_state == "maybe"
    s = make_scheduler()
    for r in reqs:
        s.add_request(r)
    so = s.schedule()
    m.grammar_bitmask(so)
    assert so.structured_output_request_ids == ["A", "B"]
    allowed = {t for t in range(1024) if so.grammar_bitmask[0, t // 32] >> (t % 32) & 1}
    assert start_ids[0] in allowed and all(t == start_ids[0] or tok.decode([t]).isdigit() for t in allowed)
    a, b = (r.structured_output_request for r in reqs)
    assert a.accept_tokens(start_ids) and a.reasoning_state == "thinking"
    assert b.accept_tokens(tok.encode("1", add_special_tokens=False)) and b.reasoning_ended
    m.shutdown()


def test_engine_applies_the_grammar_only_after_reasoning():
    llm = LLM(dtype="float32", reasoning_parser="deepseek_r1")
    thinking, closed = llm.generate(
        ["def f(x):\n<think>\n", "def f(x):\n<think>\n\n</think>\n\n"], _params(), use_tqdm=False)
    assert re.fullmatch(REGEX, closed.outputs[0].text)
    assert not re.fullmatch(REGEX, thinking.outputs[0].text)  # free reasoning text
    assert thinking.outputs[0].finish_reason == "length"
