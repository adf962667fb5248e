"""The runner's input preparation: one flattened batch from a SchedulerOutput, by hand-checked tables.

No model is loaded: ``_update_states`` + ``_prepare_inputs`` only lay the batch out.
"""

from __future__ import annotations

import numpy as np
import pytest

from octavo.core.scheduler_output import CachedRequestData, NewRequestData, SchedulerOutput
from octavo.engine.arg_utils import EngineArgs
from octavo.platforms import use_platform
from octavo.platforms.cpu import CpuPlatform
from octavo.sampling_params import SamplingParams
from octavo.worker.model_runner import ModelRunner

BS = 16


@pytest.fixture
def runner(llama_dir):
    with use_platform(CpuPlatform):
        config = EngineArgs(model=llama_dir, dtype="float32", max_model_len=64, block_size=BS).create_engine_config()
        return ModelRunner(config, CpuPlatform)


def step(runner, so):
    runner._update_states(so)
    return runner._prepare_inputs(so)


def so_of(new=(), cached=(), scheduled=None, finished=()):
    scheduled = scheduled or {}
    return SchedulerOutput(list(new), list(cached), scheduled, sum(scheduled.values()), set(finished))


def test_prefill_chunk_and_short_prompt_in_one_step(runner):
    p = SamplingParams(temperature=0)
    a = NewRequestData("a", list(range(100, 120)), [], p, [[3, 1]], 0)  # 20 tokens over blocks 3, 1
    b = NewRequestData("b", [7, 8, 9], [], p, [[2]], 0)
    s = step(runner, so_of([a, b], scheduled={"a": 18, "b": 3}))
    assert s.req_ids == ["a", "b"]
    assert s.positions.tolist() == list(range(18)) + [0, 1, 2]
    assert s.input_ids.tolist() == list(range(100, 118)) + [7, 8, 9]
    assert s.metadata.slot_mapping.tolist() == [3 * BS + i for i in range(16)] + [BS, BS + 1] + [2 * BS + i for i in range(3)]
    assert s.metadata.query_start_loc_cpu.tolist() == [0, 18, 21] and s.metadata.seq_lens_cpu.tolist() == [18, 3]
    assert s.metadata.block_table.tolist() == [[3, 1], [2, 0]]
    assert s.sample_mask.tolist() == [False, True]  # "a" is mid-prompt: it samples nothing
    assert s.logits_indices.tolist() == [20]
    assert not s.has_pending.any()


def test_next_step_finishes_the_prompt_and_decodes(runner):
    p = SamplingParams(temperature=0)
    step(runner, so_of([NewRequestData("a", list(range(100, 120)), [], p, [[3, 1]], 0),
                        NewRequestData("b", [7, 8, 9], [], p, [[2]], 0)], scheduled={"a": 18, "b": 3}))
    batch = runner.input_batch
    batch.append_tokens(np.array([batch.row_of["b"]]), np.array([77]))  # "b" sampled 77
    s = step(runner, so_of(cached=[CachedRequestData("a", [[]], 18), CachedRequestData("b", [[]], 3)],
                           scheduled={"b": 1, "a": 2}))
    assert s.req_ids == ["b", "a"]  # scheduler order, not admission order
    assert s.positions.tolist() == [3, 18, 19] and s.input_ids.tolist() == [77, 118, 119]
    assert s.metadata.slot_mapping.tolist() == [2 * BS + 3, BS + 2, BS + 3]
    assert s.sample_mask.tolist() == [True, True] and s.logits_indices.tolist() == [0, 2]


def test_a_step_beyond_the_known_tokens_is_refused(runner):
    a = NewRequestData("a", [1, 2, 3], [], SamplingParams(), [[1]], 0)
    with pytest.raises(RuntimeError, match="neither known nor in flight"):
        step(runner, so_of([a], scheduled={"a": 4}))


def test_finished_requests_free_their_rows(runner):
    a = NewRequestData("a", [1, 2, 3], [], SamplingParams(), [[1]], 0)
    step(runner, so_of([a], scheduled={"a": 3}))
    assert "a" in runner.input_batch.row_of
    runner._update_states(so_of(finished=["a"]))
    assert "a" not in runner.input_batch.row_of


def test_logits_indices_without_drafts_match_the_draft_layout_with_none():
    """The draft-free fast path (speculative decoding off) picks the same tokens as the general
    layout given zero drafts per request."""
    from octavo.worker.model_runner import _logits_indices

    cu = np.cumsum([5, 1, 3, 1])
    mask = np.array([True, False, True, True])
    fast = _logits_indices(cu, mask, None)
    assert fast.tolist() == [4, 8, 9]
    assert np.array_equal(fast, _logits_indices(cu, mask, np.zeros(4, dtype=np.int64)))
    # with drafts: each verifying request samples after its predecessor and every draft
    assert _logits_indices(cu, mask, np.array([0, 0, 2, 0])).tolist() == [4, 6, 7, 8, 9]


def test_a_step_with_drafts_lays_out_every_verified_position(runner):
    p = SamplingParams(temperature=0)
    step(runner, so_of([NewRequestData("a", [1, 2, 3], [], p, [[1]], 0),
                        NewRequestData("b", [4, 5], [], p, [[2]], 0)], scheduled={"a": 3, "b": 2}))
    batch = runner.input_batch
    batch.append_tokens(np.array([batch.row_of["a"], batch.row_of["b"]]), np.array([9, 8]))
    so = so_of(cached=[CachedRequestData("a", [[]], 3), CachedRequestData("b", [[]], 2)], scheduled={"a": 3, "b": 1})
    so.scheduled_spec_decode_tokens = {"a": [6, 7]}
    s = step(runner, so)
    assert s.input_ids.tolist() == [9, 6, 7, 8] and s.positions.tolist() == [3, 4, 5, 2]
    assert s.num_drafts.tolist() == [2, 0] and s.sample_mask.tolist() == [True, True]
    assert s.logits_indices.tolist() == [0, 1, 2, 3]
    # both drafts rejected ("a" emits 6 in place of the first, its computed count rolls back to
    # 4); the next step verifies none: the fast path, num_drafts still names every request
    batch.append_tokens(np.array([batch.row_of["a"], batch.row_of["b"]]), np.array([6, 3]))
    s = step(runner, so_of(cached=[CachedRequestData("a", [[]], 4), CachedRequestData("b", [[]], 3)],
                           scheduled={"a": 1, "b": 1}))
    assert s.num_drafts.tolist() == [0, 0] and s.logits_indices.tolist() == [0, 1]
    assert s.input_ids.tolist() == [6, 3]


def test_grammar_rows_land_on_each_verified_position(runner):
    """The scheduler's packed rows (1 + k per listed request, listed order) go to the flat
    sampling positions of those requests; other positions stay all ones; a row count that
    does not match the positions is refused."""
    from types import SimpleNamespace

    from octavo.spec_decode.rejection_sampler import make_layout

    req_ids = ["a", "b", "c", "d"]  # "b" is mid-prompt (samples nothing), "d" is plain
    st = SimpleNamespace(req_ids=req_ids, sample_mask=np.array([True, False, True, True]))
    layout = make_layout(np.array([2, 1, 0]), [[5, 6], [7]])  # a: positions 0-2, c: 3-4, d: 5
    so = so_of(scheduled={r: 1 for r in req_ids})
    so.structured_output_request_ids = ["c", "a"]  # any order: rows follow the listed ids
    so.grammar_bitmask = np.arange(5 * 2, dtype=np.int32).reshape(5, 2)  # c: rows 0-1, a: rows 2-4
    rows, bitmask = runner._token_bitmask(so, st, layout)
    assert rows == [3, 4, 0, 1, 2]
    expected = np.full((6, 2), -1, dtype=np.int32)
    expected[rows] = so.grammar_bitmask
    assert np.array_equal(bitmask.numpy(), expected)
    so.structured_output_request_ids = ["d"]  # without drafts: one row at its position
    so.grammar_bitmask = [[1, 2]]  # as msgpack delivers it to a worker
    rows, bitmask = runner._token_bitmask(so, st, layout)
    assert rows == [5] and bitmask.numpy()[5].tolist() == [1, 2] and (bitmask.numpy()[:5] == -1).all()
    so.structured_output_request_ids = ["a"]
    with pytest.raises(RuntimeError, match="1 rows for 3 positions"):
        runner._token_bitmask(so, st, layout)
