"""n-gram, draft-model, EAGLE and EAGLE-3 speculation on a GPU (CUDA graphs captured for the plain decode
steps and the draft's single-token passes, verify steps eager): greedy output equals
speculation off on the same device, every fixture architecture of the quick set, float32;
seeded sampling draws the same tokens. Draft models and EAGLE heads run with async
scheduling (the default on a GPU); n-gram speculation keeps synchronous scheduling."""

from __future__ import annotations

import pytest
import torch

from tests.spec_decode.test_greedy_equivalence import SPEC, _prompts

needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")


def _run(path: str, spec: dict | None, params, before=None, after=None, **kw):
    """Greedy/seeded outputs and stats of one engine; ``before(llm)`` / ``after(llm)`` check
    it before and after generating."""
    from octavo import LLM

    kw.setdefault("num_gpu_blocks_override", 256)
    llm = LLM(path, dtype="float32", speculative_config=spec, **kw)
    if before is not None:
        before(llm)
    outs = llm.generate(_prompts(llm.llm_engine.config.model_config.vocab_size), params, use_tqdm=False)
    stats = llm.llm_engine.get_stats()
    assert llm.llm_engine.core.async_scheduling == kw.get("async_scheduling", spec is None or spec["method"] != "ngram")
    if after is not None:
        after(llm)
    llm.shutdown()
    return [o.outputs[0].token_ids for o in outs], stats


@pytest.mark.cuda
@needs_gpu
@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3", "mistral", "gemma2"])
def test_greedy_identical_on_cuda(checkpoints, arch):
    from octavo import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=48, ignore_eos=True)
    base, _ = _run(checkpoints[arch], None, params)
    spec, stats = _run(checkpoints[arch], SPEC, params)
    assert spec == base
    assert stats.spec_num_accepted_tokens > 0


@pytest.mark.cuda
@needs_gpu
def test_seeded_sampling_identical_on_cuda(llama_dir):
    from octavo import SamplingParams

    params = SamplingParams(temperature=1.0, top_p=0.9, top_k=5, seed=7, max_tokens=32, ignore_eos=True)
    base, _ = _run(llama_dir, None, params)
    spec, stats = _run(llama_dir, SPEC, params)
    assert spec == base and stats.spec_num_drafts > 0


def _draft_graphs_captured(llm) -> None:
    drafter = llm.llm_engine.core.runner.drafter
    assert drafter.graph_runner is not None and drafter.graph_runner.graphs  # single-token passes captured


def _verify_steps_replayed(llm) -> None:
    # k drafts for every request: the verify steps are uniform and replay captured graphs.
    assert llm.llm_engine.core.runner.graph_runner.verify_replays > 0


def _run_draft(path: str, draft: str, params, k: int = 3):
    spec = {"method": "draft_model", "model": draft, "num_speculative_tokens": k}
    return _run(path, spec, params, _draft_graphs_captured, _verify_steps_replayed, max_num_seqs=16)


@pytest.mark.cuda
@needs_gpu
@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3", "mistral", "gemma2"])
def test_draft_model_greedy_identical_on_cuda(checkpoints, small_draft_dir, arch):
    """Itself as draft (graphs for the draft's single-token passes): every draft accepted;
    a one-layer draft: drafts accepted and rejected; both identical to speculation off."""
    from octavo import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=48, ignore_eos=True)
    base, _ = _run(checkpoints[arch], None, params)
    same, stats = _run_draft(checkpoints[arch], checkpoints[arch], params)
    assert same == base
    assert 0 < stats.spec_num_accepted_tokens == stats.spec_num_draft_tokens
    small, stats = _run_draft(checkpoints[arch], small_draft_dir, params, k=4)
    assert small == base
    assert stats.spec_num_draft_tokens > stats.spec_num_accepted_tokens


@pytest.mark.cuda
@needs_gpu
def test_draft_model_seeded_sampling_identical_on_cuda(llama_dir, small_draft_dir):
    from octavo import SamplingParams

    params = SamplingParams(temperature=1.0, top_p=0.9, top_k=5, seed=7, max_tokens=32, ignore_eos=True)
    base, _ = _run(llama_dir, None, params)
    spec, stats = _run_draft(llama_dir, small_draft_dir, params)
    assert spec == base and stats.spec_num_drafts > 0


def _eagle_staged(llm) -> None:
    runner = llm.llm_engine.core.runner
    assert runner.graph_runner is not None and runner.graph_runner.graphs  # the target's decode graphs
    assert runner.drafter.step_buffers is not None  # the head's passes staged in persistent buffers


def _run_eagle(path: str, head: str, params, k: int = 3):
    spec = {"method": "eagle", "model": head, "num_speculative_tokens": k}
    return _run(path, spec, params, _eagle_staged, max_num_seqs=16)


@pytest.mark.cuda
@needs_gpu
@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_eagle_greedy_identical_on_cuda(checkpoints, eagle_heads, arch):
    """EAGLE heads on the GPU (the target's plain decode steps replayed from graphs, verify
    steps and the head's passes eager): a random head and an identity head (drafts the last
    token), both identical to speculation off."""
    from octavo import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=48, ignore_eos=True)
    base, _ = _run(checkpoints[arch], None, params)
    for kind in ("random", "identity"):
        spec, stats = _run_eagle(checkpoints[arch], eagle_heads[arch, kind], params)
        assert spec == base
        assert stats.spec_num_draft_tokens > 0


@pytest.mark.cuda
@needs_gpu
def test_eagle_mirror_head_all_accepted_on_cuda(attention_free_target):
    """The mirror head of an attention-free target drafts exactly its next tokens: every
    draft accepted on the GPU too (the hidden states and next tokens wired right)."""
    from octavo import SamplingParams

    target, head = attention_free_target
    params = SamplingParams(temperature=0, max_tokens=48, ignore_eos=True)
    base, _ = _run(target, None, params)
    spec, stats = _run_eagle(target, head, params, k=4)
    assert spec == base
    assert 0 < stats.spec_num_accepted_tokens == stats.spec_num_draft_tokens


@pytest.mark.cuda
@needs_gpu
def test_eagle_seeded_sampling_identical_on_cuda(llama_dir, eagle_heads):
    from octavo import SamplingParams

    params = SamplingParams(temperature=1.0, top_p=0.9, top_k=5, seed=7, max_tokens=32, ignore_eos=True)
    base, _ = _run(llama_dir, None, params)
    spec, stats = _run_eagle(llama_dir, eagle_heads["llama", "identity"], params)
    assert spec == base and stats.spec_num_drafts > 0


@pytest.mark.cuda
@needs_gpu
@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_eagle3_greedy_identical_on_cuda(eagle3_setups, arch):
    """EAGLE-3 on the GPU (the target's decode graphs captured with the write of the auxiliary
    hidden states): identical output."""
    from octavo import LLM, SamplingParams

    target, head = eagle3_setups[arch]
    params = SamplingParams(temperature=0, max_tokens=48, ignore_eos=True)
    base, _ = _run(target, None, params)
    spec = {"method": "eagle3", "model": head, "num_speculative_tokens": 3}
    llm = LLM(target, dtype="float32", speculative_config=spec, num_gpu_blocks_override=256, max_num_seqs=16)
    assert llm.llm_engine.core.runner.graph_runner.graphs
    outs = llm.generate(_prompts(llm.llm_engine.config.model_config.vocab_size), params, use_tqdm=False)
    stats = llm.llm_engine.get_stats()
    llm.shutdown()
    assert [o.outputs[0].token_ids for o in outs] == base
    assert stats.spec_num_draft_tokens > 0


def _drafts_with_plain_steps_between(path: str, spec: dict, eager: bool) -> tuple[list, list]:
    """(outputs, every proposal) when every other proposal is dropped, so that plain decode
    steps (replayed from graphs unless ``eager``) feed the head the next proposal's state."""
    from octavo import LLM, SamplingParams

    llm = LLM(path, dtype="float32", speculative_config=spec, num_gpu_blocks_override=256, max_num_seqs=16,
              enforce_eager=eager, async_scheduling=False)  # proposals dropped after the step
    assert (llm.llm_engine.core.runner.graph_runner is None) == eager
    drafter, seen, calls = llm.llm_engine.core.runner.drafter, [], [0]
    propose = drafter.propose_on_device  # what the runner calls on a GPU

    def every_other(batch, rows, num_drafts):
        calls[0] += 1
        drafts, counts = propose(batch, rows, num_drafts)
        host = drafts.cpu().numpy()
        seen.append([host[i, : int(n)].tolist() for i, n in enumerate(counts)])
        return (drafts, counts) if calls[0] % 2 else (drafts, 0 * counts)

    drafter.propose_on_device = every_other
    params = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
    outs = llm.generate(_prompts(llm.llm_engine.config.model_config.vocab_size), params, use_tqdm=False)
    llm.shutdown()
    return [o.outputs[0].token_ids for o in outs], seen


@pytest.mark.cuda
@needs_gpu
def test_eagle_heads_read_hidden_states_of_graph_replays(eagle3_setups, eagle_heads, checkpoints):
    """The head's state after a decode step replayed from a CUDA graph (EAGLE-1: the graph's
    output hidden states; EAGLE-3: the auxiliary buffer the graph writes) proposes the same
    drafts as after the same step run eagerly."""
    for path, spec in ((checkpoints["llama"], {"method": "eagle", "model": eagle_heads["llama", "random"]}),
                       (eagle3_setups["llama"][0], {"method": "eagle3", "model": eagle3_setups["llama"][1]})):
        spec = {**spec, "num_speculative_tokens": 3}
        graphs = _drafts_with_plain_steps_between(path, spec, eager=False)
        eager = _drafts_with_plain_steps_between(path, spec, eager=True)
        assert graphs[0] == eager[0]
        assert graphs[1] == eager[1] and sum(len(d) for p in graphs[1] for d in p) > 0


@pytest.mark.cuda
@needs_gpu
@pytest.mark.parametrize("method", ["draft_model", "eagle"])
def test_async_scheduling_identical_on_cuda(llama_dir, small_draft_dir, eagle_heads, method):
    """Speculation with async scheduling on the GPU (the next step scheduled while the verify
    step and its draft passes run; graphs replayed): the same output as synchronous scheduling
    and as speculation off, also when the KV pool forces preemptions; nothing left allocated."""
    from octavo import SamplingParams

    model = small_draft_dir if method == "draft_model" else eagle_heads["llama", "random"]
    spec = {"method": method, "model": model, "num_speculative_tokens": 3}
    params = SamplingParams(temperature=0, max_tokens=48, ignore_eos=True)
    launched = []

    def in_step_used(llm) -> None:
        core = llm.llm_engine.core
        assert core.scheduler.kv_cache_manager.usage == 0.0 and core._inflight is None
        launched.append(core.runner.drafter.in_step.launches)

    for kw in ({}, {"num_gpu_blocks_override": 10, "block_size": 16, "max_model_len": 128}):
        base, _ = _run(llama_dir, None, params, **kw)
        sync, _ = _run(llama_dir, spec, params, async_scheduling=False, max_num_seqs=16, **kw)
        got, stats = _run(llama_dir, spec, params, after=in_step_used, max_num_seqs=16, **kw)
        assert got == sync == base and stats.spec_num_draft_tokens > 0
    assert method == "eagle" or launched[0] > 0  # a draft model's passes queued inside the steps
