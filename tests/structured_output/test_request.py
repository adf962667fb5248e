"""``StructuredOutputRequest``'s look-ahead for speculative decoding, with real xgrammar and
the shipped model's tokenizer: ``validate_drafts`` keeps the longest prefix the grammar
accepts; ``fill_bitmask_rows`` makes row ``i`` the mask after drafts ``0..i-1``; both leave the
matcher and the reasoning state exactly as they found them. Drafts that cross the reasoning
end marker, the ``maybe`` state, and a grammar that has terminated."""

from __future__ import annotations

import numpy as np
import pytest

from octavo.sampling_params import StructuredOutputsParams
from octavo.structured_output.compiler import GrammarCompilerPool
from octavo.structured_output.request import StructuredOutputRequest

REGEX = "(ab|cd){3,8}-[0-9]{2}"
EOS = 0  # the shipped tokenizer's <|endoftext|>
VOCAB = 4096


@pytest.fixture(scope="module")
def tok():
    from octavo.engine.model_files import DEFAULT_MODEL_DIR
    from octavo.engine.tokenizer import load_tokenizer

    return load_tokenizer(str(DEFAULT_MODEL_DIR))


@pytest.fixture(scope="module")
def pool(tok):
    p = GrammarCompilerPool(lambda: tok, VOCAB, [EOS])
    yield p
    p.shutdown()


def _sor(pool, reasoning=None, **kind) -> StructuredOutputRequest:
    sor = StructuredOutputRequest(pool.submit(StructuredOutputsParams(**kind)), reasoning)
    sor._grammar.result(timeout=60)
    assert sor.is_ready()
    return sor


def _enc(tok, text: str) -> list[int]:
    return tok.encode(text, add_special_tokens=False)


def _row(sor: StructuredOutputRequest) -> np.ndarray:
    """The current state's mask (all ones where nothing is masked)."""
    bitmask = np.full((1, (VOCAB + 31) // 32), -1, dtype=np.int32)
    if sor.constrains_next:
        sor.fill_bitmask(bitmask, 0)
    return bitmask[0]


def _allowed(row: np.ndarray) -> set[int]:
    bits = (row.view(np.uint32)[:, None] >> np.arange(32, dtype=np.uint32)) & 1
    return set(np.flatnonzero(bits.reshape(-1)).tolist())


def _rows(sor: StructuredOutputRequest, drafts: list[int]) -> tuple[np.ndarray, bool]:
    bitmask = np.zeros((len(drafts) + 1, (VOCAB + 31) // 32), dtype=np.int32)
    masked = sor.fill_bitmask_rows(bitmask, 0, drafts)
    return bitmask, masked


def test_validate_keeps_the_longest_accepted_prefix_and_changes_nothing(pool, tok):
    sor = _sor(pool, regex=REGEX)
    good, bad = _enc(tok, "abcd"), _enc(tok, "x")
    before = _row(sor)
    assert sor.validate_drafts(good + bad + _enc(tok, "ab")) == good  # drafts after a refused one go too
    assert sor.validate_drafts(bad + good) == []
    assert sor.validate_drafts([]) == []
    np.testing.assert_array_equal(_row(sor), before)  # rolled back: the state is the output's
    assert sor.accept_tokens(good) and not sor.accept_tokens(bad)  # a refused token is an error
    assert sor.validate_drafts(_enc(tok, "cd-12") + [EOS]) == _enc(tok, "cd-12") + [EOS]


def test_bitmask_rows_are_the_masks_after_each_draft_prefix(pool, tok):
    sor = _sor(pool, regex=REGEX)
    drafts = _enc(tok, "abcdcd-1")
    rows, masked = _rows(sor, drafts)
    assert masked
    ref = _sor(pool, regex=REGEX)  # a second matcher walks the drafts for real
    for i in range(len(drafts) + 1):
        np.testing.assert_array_equal(rows[i], _row(ref), err_msg=f"row {i}")
        if i < len(drafts):
            assert drafts[i] in _allowed(rows[i])  # every draft is allowed where it is verified
            assert ref.accept_tokens([drafts[i]])
    assert _allowed(rows[-1]) and all(tok.decode([t]).isdigit() for t in _allowed(rows[-1]))
    np.testing.assert_array_equal(_row(sor), rows[0])  # the request's own matcher did not move
    with pytest.raises(RuntimeError, match="must pass validate_drafts"):
        _rows(sor, drafts[:2] + _enc(tok, "x"))
    np.testing.assert_array_equal(_row(sor), rows[0])  # rolled back after the error too


def test_drafts_crossing_the_reasoning_end_marker(pool, tok):
    """Thinking: drafts are free text up to the first complete end marker (which here spans
    four tokens); the grammar checks and masks from the next token on."""
    start_ids, end_ids = _enc(tok, "<think>"), _enc(tok, "</think>")
    sor = _sor(pool, ("thinking", start_ids, end_ids), regex="[0-9]{5}")
    assert sor.accept_tokens(_enc(tok, "hmm ") + end_ids[:2])  # half the marker in the output
    tail = list(sor._reasoning_tail)
    think = end_ids[2:]
    drafts = think + _enc(tok, "12") + _enc(tok, "x")
    assert sor.validate_drafts(drafts) == think + _enc(tok, "12")
    assert sor.reasoning_state == "thinking"  # unchanged
    valid = think + _enc(tok, "12")
    rows, masked = _rows(sor, valid)
    assert masked
    assert (rows[: len(think)] == -1).all()  # still reasoning there: nothing masked
    for row in rows[len(think):]:
        assert _allowed(row) and all(tok.decode([t]).isdigit() for t in _allowed(row))
    assert sor.reasoning_state == "thinking" and sor._reasoning_tail == tail
    rows, masked = _rows(sor, _enc(tok, "more text"))  # all reasoning: no mask at all
    assert not masked and (rows == -1).all()
    assert sor.accept_tokens(valid) and sor.reasoning_ended  # then for real, in one call


def test_first_end_marker_ends_reasoning_within_one_call(pool, tok):
    """Tokens after the first end marker are the grammar's even when they arrive together (a
    step's accepted drafts), as the per-position masks assumed."""
    end_ids = _enc(tok, "</think>")
    sor = _sor(pool, ("thinking", _enc(tok, "<think>"), end_ids), regex="[0-9]{5}")
    assert not sor.accept_tokens(_enc(tok, "a") + end_ids + _enc(tok, "x") + end_ids)
    sor = _sor(pool, ("thinking", _enc(tok, "<think>"), end_ids), regex="[0-9]{5}")
    assert sor.accept_tokens(end_ids + _enc(tok, "12")) and sor.reasoning_ended


def test_maybe_state_decided_by_the_first_draft(tokenizer_dir):
    """qwen3 (single-token markers): a first draft opening ``<think>`` makes the rest
    reasoning; a first draft of the answer is checked by the grammar."""
    from transformers import AutoTokenizer

    qtok = AutoTokenizer.from_pretrained(tokenizer_dir)
    qtok.add_special_tokens({"additional_special_tokens": ["<think>", "</think>"]})
    p = GrammarCompilerPool(lambda: qtok, 1024, [EOS])
    start, end = (qtok.encode(m, add_special_tokens=False) for m in ("<think>", "</think>"))
    sor = _sor(p, ("maybe", start, end), regex="[0-9]{5}")
    digit, letter = qtok.encode("1", add_special_tokens=False), qtok.encode("a", add_special_tokens=False)
    assert sor.validate_drafts(start + letter + end + digit) == start + letter + end + digit
    assert sor.validate_drafts(digit + letter) == digit
    bitmask = np.zeros((4, 32), dtype=np.int32)
    assert sor.fill_bitmask_rows(bitmask, 0, start + letter + end)
    assert start[0] in _allowed(bitmask[0]) and (bitmask[1:3] == -1).all()
    assert _allowed(bitmask[3]) == _allowed(bitmask[0]) - set(start)  # the answer, under the grammar
    assert sor.reasoning_state == "maybe"
    p.shutdown()


def test_a_terminated_grammar_masks_nothing_more(pool, tok):
    """After its stop token (kept going by ``ignore_eos``) the grammar constrains nothing:
    no row, drafts pass unchecked, tokens are accepted (vLLM's rule; filling a mask from a
    terminated xgrammar matcher raises)."""
    sor = _sor(pool, regex="ab")
    ab = _enc(tok, "ab")
    rows, masked = _rows(sor, ab + [EOS, 90])
    assert masked and _allowed(rows[1]) == {EOS} and (rows[2:] == -1).all()
    assert sor.accept_tokens(ab + [EOS]) and sor.is_terminated() and not sor.constrains_next
    assert sor.validate_drafts([90, 91]) == [90, 91]
    rows, masked = _rows(sor, [90])
    assert not masked and (rows == -1).all()
    assert sor.accept_tokens([90])
