"""Pieces of structured outputs without a model: the sampler's bitmask against its plain
definition, the compile cache, the scheduler holding a request until its grammar is ready
(keeping its place), the matcher following accepted tokens, and the batch bitmask rows."""

from __future__ import annotations

import json
from concurrent.futures import Future

import numpy as np
import pytest
import torch
import xgrammar as xgr

from octavo.core.sampler import (
    apply_token_bitmask,
    apply_token_bitmask_reference,
    apply_token_bitmask_xgrammar,
)
from octavo.sampling_params import StructuredOutputsParams
from octavo.structured_output.compiler import GrammarCompilerPool
from octavo.structured_output.grammar import build_grammar, choice_ebnf, grammar_key
from octavo.structured_output.manager import StructuredOutputManager
from octavo.structured_output.request import StructuredOutputRequest
from tests.core.utils import make_request, make_scheduler, step


@pytest.mark.parametrize("kernel", [apply_token_bitmask, apply_token_bitmask_xgrammar])
@pytest.mark.parametrize("vocab", [64, 100, 4096])
def test_bitmask_kernel_matches_the_reference(vocab, kernel):
    g = torch.Generator().manual_seed(vocab)
    words = (vocab + 31) // 32
    bitmask = torch.randint(-(2**31), 2**31 - 1, (5, words), dtype=torch.int32, generator=g)
    bitmask[0, 0], bitmask[2, -1] = 0, -1  # whole words banned / allowed
    logits = torch.randn(5, vocab, generator=g)
    rows = [4, 0, 2]
    a, b = logits.clone(), logits.clone()
    kernel(a, rows, bitmask)
    apply_token_bitmask_reference(b, rows, bitmask)
    assert torch.equal(a, b)
    assert torch.equal(a[[1, 3]], logits[[1, 3]])  # unconstrained rows untouched
    bits = ((bitmask[4, 0] >> torch.arange(32, dtype=torch.int32)) & 1).bool()[: min(32, vocab)]
    assert torch.equal(torch.isinf(a[4, : len(bits)]), ~bits)
    # every row constrained (the decode batch): no gather, same result
    a, b = logits.clone(), logits.clone()
    kernel(a, [0, 1, 2, 3, 4], bitmask)
    apply_token_bitmask_reference(b, [0, 1, 2, 3, 4], bitmask)
    assert torch.equal(a, b)
    assert torch.isinf(a[0, :32]).all() and not torch.isinf(a[0, 32:]).all()


def test_grammar_bits_past_the_vocabulary_are_ignored():
    """A bitmask wider than the logits (vocab not a multiple of 32) and one narrower: the
    spare bits change nothing; tokens without bits are banned (the reference's rule)."""
    logits = torch.zeros(2, 40)
    wide = torch.full((2, 2), -1, dtype=torch.int32)
    apply_token_bitmask(logits, [0, 1], wide)
    assert not torch.isinf(logits).any()
    narrow = torch.full((2, 1), -1, dtype=torch.int32)
    apply_token_bitmask(logits, [1], narrow)
    assert torch.isinf(logits[1, 32:]).all() and not torch.isinf(logits[1, :32]).any()
    assert not torch.isinf(logits[0]).any()


def test_runner_picks_the_torch_kernel_on_the_host():
    from octavo.platforms.cpu import CpuPlatform
    from octavo.platforms.cuda import CudaPlatform
    from octavo.worker.model_runner import _bitmask_kernel

    assert _bitmask_kernel(CpuPlatform) is apply_token_bitmask
    assert _bitmask_kernel(CudaPlatform) is apply_token_bitmask_xgrammar


def test_grammar_keys_and_choice_escaping():
    a = StructuredOutputsParams(json={"type": "object", "properties": {"a": {}, "b": {}}})
    b = StructuredOutputsParams(json='{"properties": {"b": {}, "a": {}}, "type": "object"}')
    assert grammar_key(a) == grammar_key(b)
    assert grammar_key(a) != grammar_key(StructuredOutputsParams(json=a.json, disable_any_whitespace=True))
    assert choice_ebnf(['a"b', "c\\d"]) == 'root ::= "a\\"b" | "c\\\\d"'
    build_grammar(StructuredOutputsParams(choice=['a"b', "c\\d", "new\nline"]))


@pytest.fixture(scope="module")
def pool(tokenizer_dir):
    from transformers import AutoTokenizer

    p = GrammarCompilerPool(lambda: AutoTokenizer.from_pretrained(tokenizer_dir), 512, [0])
    yield p
    p.shutdown()


def test_equal_specs_share_one_compile(pool):
    s = {"type": "object", "properties": {"x": {"type": "integer"}}}
    f1 = pool.submit(StructuredOutputsParams(json=s))
    f2 = pool.submit(StructuredOutputsParams(json=json.dumps(s)))
    assert f1 is f2
    assert isinstance(f1.result(timeout=60), xgr.CompiledGrammar)
    assert pool.submit(StructuredOutputsParams(regex="[0-9]+")) is not f1


def test_matcher_follows_accepted_tokens(pool, tokenizer_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    sor = StructuredOutputRequest(pool.submit(StructuredOutputsParams(regex="ab|cd")))
    sor._grammar.result(timeout=60)
    assert sor.is_ready()
    bitmask = np.zeros((1, 16), dtype=np.int32)
    sor.fill_bitmask(bitmask, 0)
    allowed = {t for t in range(512) if bitmask[0, t // 32] >> (t % 32) & 1}
    assert allowed and all(tok.decode([t]) and tok.decode([t])[0] in "ac" for t in allowed)
    ids = tok.encode("ab", add_special_tokens=False)
    assert not sor.accept_tokens(tok.encode("x", add_special_tokens=False))  # refused: an error
    assert sor.accept_tokens(ids)
    assert sor.accept_tokens([0]) and sor.is_terminated()  # EOS ends the grammar
    assert not sor.constrains_next  # ... and its mask (ignore_eos goes on unconstrained)
    assert sor.accept_tokens([ids[0]])


def test_scheduler_holds_a_request_until_its_grammar_is_ready(pool):
    s = make_scheduler()
    compiled = Future()
    a = make_request("A", 5, structured_outputs=StructuredOutputsParams(regex="[0-9]+"))
    a.structured_output_request = StructuredOutputRequest(compiled)
    s.add_request(a)
    s.add_request(make_request("B", 5))
    so, _ = step(s)
    assert list(so.num_scheduled_tokens) == ["B"]
    assert [r.request_id for r in s.waiting] == ["A"]
    compiled.set_result(pool.submit(StructuredOutputsParams(regex="[0-9]+")).result(timeout=60))
    so = s.schedule()
    assert "A" in so.num_scheduled_tokens


def test_manager_bitmask_rows_only_for_sampling_requests(tokenizer_dir):
    from transformers import AutoTokenizer

    m = StructuredOutputManager(lambda: AutoTokenizer.from_pretrained(tokenizer_dir), 512, [0])
    s = make_scheduler(budget=6)
    long = make_request("L", 10, structured_outputs=StructuredOutputsParams(regex="x+"))
    short = make_request("S", 3, structured_outputs=StructuredOutputsParams(regex="y+"))
    plain = make_request("P", 2)
    for r in (short, plain, long):
        s.add_request(r)
        m.attach(r)
    for r in (short, long):
        r.structured_output_request._grammar.result(timeout=60)
    so = s.schedule()  # budget 6: S (3) and P (2) sample, L gets a 1-token chunk
    m.grammar_bitmask(so)
    assert so.structured_output_request_ids == ["S"]
    assert so.grammar_bitmask.shape == (1, 16)
    assert m.poll() == []
    m.shutdown()


def test_unknown_backend_is_refused():
    with pytest.raises(ValueError, match="'outlines' is not available"):
        StructuredOutputManager(lambda: None, 10, [0], backend="outlines")


def test_manager_bitmask_has_a_row_per_verified_position(tokenizer_dir):
    """A request verifying k drafts gets k + 1 rows (the masks after each draft prefix), one
    without drafts one row, in scheduling order; the matchers end where they started."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    m = StructuredOutputManager(lambda: tok, 512, [0])
    s = make_scheduler()
    reqs = [make_request(r, 3, structured_outputs=StructuredOutputsParams(regex="(ab|cd)+")) for r in "DN"]
    plain = make_request("P", 3)
    for r in (reqs[0], plain, reqs[1]):
        s.add_request(r)
        m.attach(r)
    for r in reqs:
        r.structured_output_request._grammar.result(timeout=60)
    ab = tok.encode("ab", add_special_tokens=False)
    step(s, token=ab[0])  # the prefills; each samples ab[0], which its matcher accepts
    drafts = ab[1:] + tok.encode("cdab", add_special_tokens=False)
    assert reqs[0].structured_output_request.validate_drafts(drafts) == drafts
    reqs[0].spec_token_ids = list(drafts)
    so = s.schedule()
    assert so.scheduled_spec_decode_tokens == {"D": drafts}
    m.grammar_bitmask(so)
    assert so.structured_output_request_ids == ["D", "N"]
    assert so.grammar_bitmask.shape == (len(drafts) + 2, 16)
    ref = np.zeros((len(drafts) + 1, 16), dtype=np.int32)
    reqs[0].structured_output_request.fill_bitmask_rows(ref, 0, drafts)
    np.testing.assert_array_equal(so.grammar_bitmask[: len(drafts) + 1], ref)
    one = np.zeros((1, 16), dtype=np.int32)
    reqs[1].structured_output_request.fill_bitmask(one, 0)
    np.testing.assert_array_equal(so.grammar_bitmask[-1], one[0])
    assert not (ref[0] == ref[1]).all()  # the rows really differ along the drafts
    m.shutdown()
