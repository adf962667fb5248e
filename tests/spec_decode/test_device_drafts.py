"""Drafts kept on the device (``octavo.spec_decode.device_drafts``), the accelerator's path for
the draft model and EAGLE, run on the CPU by switching it on in the runner: the scheduler sees
placeholders, the verifying step's inputs and verification grid read the drafts from the
device store, rows with penalties read them back. Same drafts, same acceptance, same output
as host drafts; and the pieces on their own."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from octavo import LLM, SamplingParams
from octavo.spec_decode.device_drafts import DEVICE_DRAFT, DeviceDrafts, grid_drafts_from_inputs
from octavo.spec_decode.rejection_sampler import make_layout
from tests.spec_decode.test_draft_model import draft_spec
from tests.spec_decode.test_eagle import eagle_spec
from tests.spec_decode.test_greedy_equivalence import _prompts


class _Host:
    host, pin = True, False

    @staticmethod
    def to_device(a):
        return torch.from_numpy(np.ascontiguousarray(a))


def _run(path: str, spec: dict, params: SamplingParams, on_device: bool, in_step: bool = False, **kw):
    """(tokens, draft tokens, accepted per position); ``on_device``: the device-drafts path;
    ``in_step``: also the draft's staged inputs, so that its passes are queued inside the step."""
    llm = LLM(path, dtype="float32", speculative_config=spec, max_num_batched_tokens=16, **kw)
    runner = llm.llm_engine.core.runner
    if on_device:
        sc = llm.llm_engine.config.scheduler_config
        runner.device_drafts = DeviceDrafts(sc.max_num_seqs, spec["num_speculative_tokens"], runner.device,
                                            runner.transfer)
    if in_step:
        runner.drafter.step_buffers = runner.drafter.make_step_buffers()
    outs = llm.generate(_prompts(llm.llm_engine.config.model_config.vocab_size), params, use_tqdm=False)
    st = llm.get_stats()
    if in_step:
        assert runner.drafter.in_step.launches > 0
    return [list(c.token_ids) for o in outs for c in o.outputs], st.spec_num_draft_tokens, \
        st.spec_num_accepted_tokens_per_pos


@pytest.mark.parametrize("params", [
    SamplingParams(temperature=0, max_tokens=32, ignore_eos=True),
    SamplingParams(temperature=0, max_tokens=32, ignore_eos=True, repetition_penalty=1.3),  # read back
    SamplingParams(temperature=0.8, seed=7, max_tokens=32, ignore_eos=True, n=2),
], ids=["greedy", "penalty", "seeded"])
@pytest.mark.parametrize("method", ["self_draft", "small_draft", "eagle"])
def test_device_drafts_equal_host_drafts(llama_dir, small_draft_dir, eagle_heads, method, params):
    spec = {"self_draft": draft_spec(llama_dir, k=3), "small_draft": draft_spec(small_draft_dir, k=4),
            "eagle": eagle_spec(eagle_heads["llama", "random"], k=3)}[method]
    host = _run(llama_dir, spec, params, on_device=False)
    device = _run(llama_dir, spec, params, on_device=True)
    assert device == host
    assert host[1] > 0
    if method == "self_draft":  # the target as its own draft: accepted where sampling is its argmax
        plain_greedy = params.temperature == 0 and params.repetition_penalty == 1.0
        assert sum(host[2]) > 0 and (sum(host[2]) == host[1] or not plain_greedy)


@pytest.mark.parametrize("k", [1, 3])
def test_in_step_proposals_equal_proposals_after_the_step(llama_dir, small_draft_dir, k):
    """The draft's catch-up and drafts queued inside the verifying step (uniform two-token
    catch-up at device-computed positions): the target as its own draft accepts every draft as
    after the step; a small draft gives the same output. Chunked prefill (budget 16) and
    several requests make steps that do not qualify (prefill chunks), which fall back."""
    greedy = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
    host = _run(llama_dir, draft_spec(llama_dir, k=k), greedy, on_device=False)
    queued = _run(llama_dir, draft_spec(llama_dir, k=k), greedy, on_device=True, in_step=True)
    assert queued == host and sum(host[2]) == host[1] > 0
    host = _run(llama_dir, draft_spec(small_draft_dir, k=k), greedy, on_device=False)
    queued = _run(llama_dir, draft_spec(small_draft_dir, k=k), greedy, on_device=True, in_step=True)
    assert queued[0] == host[0] and queued[1] > 0


def test_take_hands_out_only_the_last_launch_for_the_same_occupancies():
    from types import SimpleNamespace

    from octavo.spec_decode.draft_in_step import InStepLauncher

    d = SimpleNamespace(k=2, block_size=16, transfer=_Host(), computed=np.zeros(4, dtype=np.int64),
                        fed=np.zeros(4, dtype=np.int64), serial=np.zeros(4, dtype=np.int64))
    batch = SimpleNamespace(max_num_reqs=4, serial=np.array([5, 6, 7, 8]), num_tokens=np.array([10, 20, 30, 40]),
                            num_blocks=np.array([1, 2, 2, 3]))
    launcher = InStepLauncher(d)
    drafts = torch.tensor([[1, 2], [3, 4]])
    launcher._launched = (np.array([2, 0]), batch.serial[[2, 0]].copy(), drafts)
    got, counts = launcher.take(batch, np.array([0]), np.array([1]))  # a subset of the launch's rows
    assert got.tolist() == [[3, 4]] and counts.tolist() == [1]
    assert (d.computed[0], d.fed[0], d.serial[0]) == (10, 11, 5)  # as ``propose`` records it
    assert launcher.take(batch, np.array([0]), np.array([1])) is None  # taken once
    launcher._launched = (np.array([2]), np.array([99]), drafts[:1])
    assert launcher.take(batch, np.array([2]), np.array([2])) is None  # another occupancy of the row
    launcher._launched = (np.array([2]), batch.serial[[2]].copy(), drafts[:1])
    launcher.forget()  # the next step started before the proposal
    assert launcher.take(batch, np.array([2]), np.array([2])) is None


def test_keep_hands_out_placeholders_and_keeps_old_ids_under_padding():
    dd = DeviceDrafts(4, 3, torch.device("cpu"), _Host())
    ph = dd.keep(np.array([2, 0]), torch.tensor([[5, 6, 7], [8, -1, -1]]), np.array([3, 1]))
    assert ph == [[DEVICE_DRAFT] * 3, [DEVICE_DRAFT]]
    assert dd.store[2].tolist() == [5, 6, 7] and dd.store[0].tolist() == [8, 0, 0]  # never -1
    host, dev = DeviceDrafts.split({"a": [DEVICE_DRAFT, DEVICE_DRAFT], "b": [4], "c": []})
    assert host == {"b": [4], "c": []} and dev == {"a": 2}
    assert dd.materialize(np.array([2, 0]), np.array([2, 1])) == [[5, 6], [8]]


def test_write_inputs_puts_drafts_after_each_requests_last_token():
    dd = DeviceDrafts(4, 3, torch.device("cpu"), _Host())
    dd.store[3] = torch.tensor([30, 31, 32])
    dd.store[1] = torch.tensor([10, 11, 12])
    # Step: row 1 prefills 3 tokens (no drafts), row 3 verifies 2 drafts, row 0 decodes.
    ids = torch.tensor([1, 1, 1, 9, 0, 0, 4])
    qsl = np.array([0, 3, 6, 7])
    dd.write_inputs(ids, np.array([1, 3, 0]), qsl, np.array([3]), np.array([2]))
    assert ids.tolist() == [1, 1, 1, 9, 30, 31, 4]


def test_grid_drafts_read_from_inputs_equal_the_host_layout():
    # Requests: 2 drafts, none, 1 draft; tokens [t0, d0, d1 | u0 | v0, e0].
    ids = torch.tensor([100, 7, 8, 200, 300, 9])
    layout = make_layout(np.array([2, 0, 1]), [[7, 8], [9]])
    logits_indices = np.array([0, 1, 2, 3, 4, 5])
    got = grid_drafts_from_inputs(ids, logits_indices, layout.grid, layout.counts, _Host.to_device)
    assert got.tolist() == layout.grid_drafts.tolist()
