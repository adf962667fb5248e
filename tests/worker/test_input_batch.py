"""InputBatch: rows, serials, block tables and token appends, and per-feature sampling metadata."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from octavo.core.scheduler_output import NewRequestData
from octavo.platforms.cpu import CpuPlatform
from octavo.sampling_params import SamplingParams
from octavo.worker.input_batch import InputBatch
from octavo.worker.transfer import DeviceTransfer

CPU = DeviceTransfer(CpuPlatform, torch.device("cpu"))


def new(req_id, prompt, params=None, blocks=(1,), out=(), computed=0, eos=None):
    return NewRequestData(req_id, list(prompt), list(out), params or SamplingParams(), [list(blocks)], computed, eos)


def test_rows_are_reused_and_serials_name_each_occupancy():
    b = InputBatch(max_num_reqs=2, max_model_len=16, block_size=4)
    ra = b.add_request(new("a", [1, 2, 3]))
    rb = b.add_request(new("b", [4, 5], out=[6]))
    assert {ra, rb} == {0, 1} and len(b) == 2
    with pytest.raises(RuntimeError, match="full"):
        b.add_request(new("c", [1]))
    serial_a = b.serial[ra]
    b.remove_request("a")
    b.remove_request("a")  # twice is harmless
    rc = b.add_request(new("c", [7, 8, 9, 10]))
    assert rc == ra and b.serial[rc] > serial_a and b.req_ids[rc] == "c"
    # prompt + earlier output tokens, prompt length kept apart
    assert b.token_ids[rb, : b.num_tokens[rb]].tolist() == [4, 5, 6] and b.num_prompt_tokens[rb] == 2
    assert b.output_token_ids(rb).tolist() == [6]


def test_block_ids_append_in_position_order_and_tokens_stop_at_max_model_len():
    b = InputBatch(max_num_reqs=2, max_model_len=4, block_size=2)
    r = b.add_request(new("a", [1, 2, 3], blocks=[5, 9]))
    b.append_block_ids(r, [[]])
    assert b.block_table[r, : b.num_blocks[r]].tolist() == [5, 9]
    b.append_tokens(np.array([r]), np.array([42]))
    b.append_tokens(np.array([r]), np.array([43]))  # already at max_model_len: dropped
    assert b.token_ids[r, : b.num_tokens[r]].tolist() == [1, 2, 3, 42]


def test_sampling_metadata_sets_only_the_features_some_row_uses():
    b = InputBatch(max_num_reqs=4, max_model_len=32, block_size=4)
    g = b.add_request(new("g", [1, 2], SamplingParams(temperature=0)))
    md = b.make_sampling_metadata(np.array([g]), 10, CPU)
    assert md.all_greedy and md.top_k is None and md.generators == {} and md.presence_penalties is None
    assert md.allowed_token_ids_mask is None and md.logit_bias is None and md.max_num_logprobs is None
    s = b.add_request(new("s", [1, 2, 3], SamplingParams(temperature=0.8, top_k=5, seed=7, logprobs=2,
                                                        allowed_token_ids=[3, 4], logit_bias={1: 2.0},
                                                        presence_penalty=0.5)))
    rows = np.array([g, s])
    md = b.make_sampling_metadata(rows, 10, CPU)
    assert not md.all_greedy and not md.all_random and md.top_k.tolist() == [0, 5]
    assert list(md.generators) == [1] and md.max_num_logprobs == 2
    assert md.allowed_token_ids_mask[0].sum() == 0 and md.allowed_token_ids_mask[1].tolist() == [
        True, True, True, False, False, True, True, True, True, True]
    assert [t.tolist() for t in md.logit_bias] == [[1], [1], [2.0]]
    # penalties: all five fields together, prompt/output padded with the vocab size
    assert md.presence_penalties.tolist() == [0.0, 0.5]
    assert md.prompt_token_ids[1].tolist() == [1, 2, 3] and md.prompt_token_ids[0].tolist() == [1, 2, 10]


def test_seeded_generator_follows_the_output_position_including_pending_tokens():
    b = InputBatch(max_num_reqs=2, max_model_len=32, block_size=4)
    r = b.add_request(new("s", [1, 2], SamplingParams(temperature=1.0, seed=3), out=[5]))
    a = b.make_sampling_metadata(np.array([r]), 10, CPU, num_pending=np.array([1]))
    b.append_tokens(np.array([r]), np.array([6]))
    c = b.make_sampling_metadata(np.array([r]), 10, CPU)
    # one pending token counts like an appended one: the same draw either way
    assert torch.equal(torch.rand(4, generator=a.generators[0]), torch.rand(4, generator=c.generators[0]))


def test_min_tokens_forbids_stop_tokens_until_reached():
    b = InputBatch(max_num_reqs=2, max_model_len=32, block_size=4)
    r = b.add_request(new("m", [1], SamplingParams(min_tokens=2, stop_token_ids=[7]), eos=2))
    rows, toks = b.make_sampling_metadata(np.array([r]), 10, CPU).min_tokens_mask
    assert rows.tolist() == [0, 0] and toks.tolist() == [2, 7]
    b.append_tokens(np.array([r]), np.array([4]))
    b.append_tokens(np.array([r]), np.array([4]))
    assert b.make_sampling_metadata(np.array([r]), 10, CPU).min_tokens_mask is None


def test_min_tokens_mask_leaves_out_rows_with_no_stop_token():
    """ignore_eos without stop_token_ids: nothing to forbid, so such rows never enter the mask
    (and a batch of only those has none)."""
    b = InputBatch(max_num_reqs=3, max_model_len=32, block_size=4)
    free = b.add_request(new("f", [1], SamplingParams(min_tokens=3, ignore_eos=True), eos=2))
    stop = b.add_request(new("s", [1], SamplingParams(min_tokens=3, stop_token_ids=[5, 6]), eos=2))
    assert b.make_sampling_metadata(np.array([free]), 10, CPU).min_tokens_mask is None
    rows, toks = b.make_sampling_metadata(np.array([free, stop]), 10, CPU).min_tokens_mask
    assert rows.tolist() == [1, 1, 1] and toks.tolist() == [2, 5, 6]


def _fields(md):
    out = {}
    for k, v in vars(md).items():
        if isinstance(v, torch.Tensor):
            v = ("tensor", v.dtype, v.tolist())
        elif isinstance(v, tuple):
            v = tuple(x.tolist() if isinstance(x, torch.Tensor) else x for x in v)
        elif isinstance(v, dict):
            v = sorted(v)
        out[k] = v
    return out


PLAIN = [SamplingParams(temperature=0), SamplingParams(temperature=0, seed=3), SamplingParams(temperature=0.7),
         SamplingParams(temperature=0.5, min_tokens=4, ignore_eos=True), SamplingParams(top_p=1.0, top_k=-1)]
SPECIAL = [SamplingParams(temperature=0.7, seed=3), SamplingParams(top_k=3), SamplingParams(top_p=0.9),
           SamplingParams(min_p=0.1), SamplingParams(logprobs=0), SamplingParams(repetition_penalty=1.1),
           SamplingParams(logit_bias={2: 1.0}), SamplingParams(allowed_token_ids=[1, 2]),
           SamplingParams(bad_words=["x"]), SamplingParams(min_tokens=2)]


@pytest.mark.parametrize("extra", [None, *SPECIAL])
def test_plain_rows_take_the_short_path_with_the_same_metadata(extra):
    """Rows that sample with their temperature alone skip the per-feature checks; the metadata
    is field for field what the full pass gives. One row using any feature turns it off."""
    b = InputBatch(max_num_reqs=8, max_model_len=32, block_size=4)
    rows = [b.add_request(new(f"p{i}", [1, 2, 3], p, eos=2)) for i, p in enumerate(PLAIN)]
    if extra is not None:
        if extra.bad_words:
            extra._bad_words_token_ids = [[5]]  # what the input processor fills in
        rows.append(b.add_request(new("x", [1, 2, 3], extra, eos=2)))
    rows = np.array(rows)
    assert b.plain[rows].all() == (extra is None)
    got = _fields(b.make_sampling_metadata(rows, 10, CPU))
    b.plain[:] = False  # force the full pass
    assert got == _fields(b.make_sampling_metadata(rows, 10, CPU))
