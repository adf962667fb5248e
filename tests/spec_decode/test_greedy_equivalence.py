"""Greedy output with n-gram speculation equals greedy output without it, token for token
(float32, every fixture architecture), and the drafts are really verified (some accepted,
some rejected). Prompts repeat patterns so that prompt lookup finds matches, and the tiny
random models' greedy outputs repeat themselves, so drafts get accepted."""

import pytest

from octavo import LLM, SamplingParams
from tests.fixtures.checkpoints import ARCH_SPECS
from tests.hf_reference import random_prompts

SPEC = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 3}
KWARGS = {"phi3": {"max_model_len": 1024}}  # longrope: exact up to its original context


def _prompts(vocab: int) -> list[dict]:
    base = random_prompts(vocab, [6, 9, 40], seed=3)
    return [{"prompt_token_ids": (p * 8)[:n]} for p, n in zip(base, (20, 45, 70), strict=True)]


def _generate(path: str, spec: dict | None, params: SamplingParams, **kw):
    llm = LLM(path, dtype="float32", speculative_config=spec, **kw)
    vocab = llm.llm_engine.config.model_config.vocab_size
    outs = llm.generate(_prompts(vocab), params, use_tqdm=False)
    return outs, llm.llm_engine.get_stats()


def assert_same_outputs(base, spec, ranks: bool) -> None:
    """Every completion's tokens equal, its logprobs close (and their ranks equal if ``ranks``)."""
    for a, b in zip(base, spec, strict=True):
        for x, y in zip(a.outputs, b.outputs, strict=True):
            assert y.token_ids == x.token_ids
            for lx, ly in zip(x.logprobs, y.logprobs, strict=True):
                assert lx.keys() == ly.keys()
                for t in lx:
                    assert ly[t].logprob == pytest.approx(lx[t].logprob, abs=1e-4)
                    if ranks:
                        assert ly[t].rank == lx[t].rank


def _length_dependent_rope(path: str, kw: dict) -> bool:
    from octavo.engine.arg_utils import EngineArgs
    from octavo.engine.core import _kv_key_fn

    return _kv_key_fn(EngineArgs(model=path, **kw).create_engine_config()) is not None


@pytest.mark.parametrize("arch", sorted(ARCH_SPECS))
def test_greedy_identical_with_ngram_speculation(checkpoints, arch):
    params = SamplingParams(temperature=0, max_tokens=48, ignore_eos=True)
    kw = KWARGS.get(arch, {})
    base, _ = _generate(checkpoints[arch], None, params, **kw)
    spec, stats = _generate(checkpoints[arch], SPEC, params, **kw)
    for a, b in zip(base, spec, strict=True):
        assert b.outputs[0].token_ids == a.outputs[0].token_ids
    if _length_dependent_rope(checkpoints[arch], kw):  # not drafted for (see core/scheduler.py)
        assert stats.spec_num_draft_tokens == 0
        return
    assert stats.spec_num_draft_tokens > 0
    assert 0 < stats.spec_num_accepted_tokens <= stats.spec_num_draft_tokens
    assert sum(stats.spec_num_accepted_tokens_per_pos) == stats.spec_num_accepted_tokens


def test_greedy_identical_under_chunked_prefill_preemption_and_n(llama_dir):
    """A small token budget (chunks, drafts cut by the budget), a pool small enough to preempt,
    prefix caching, n > 1 and logprobs: output and logprobs equal speculation off."""
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True, n=2, logprobs=2)
    kw = dict(max_num_batched_tokens=8, num_gpu_blocks_override=12, block_size=16, max_num_seqs=4)
    base, base_stats = _generate(llama_dir, None, params, **kw)
    spec, stats = _generate(llama_dir, SPEC, params, **kw)
    assert stats.num_preemptions > 0 and stats.spec_num_accepted_tokens > 0
    assert_same_outputs(base, spec, ranks=True)


def test_penalties_min_tokens_and_stop_tokens_with_speculation(llama_dir):
    """Repetition/frequency penalties see the drafts before each position as output; greedy
    stays identical. A stop token inside the accepted drafts ends the output there."""
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True, repetition_penalty=1.3,
                            frequency_penalty=0.2, min_tokens=5)
    base, _ = _generate(llama_dir, None, params)
    spec, _ = _generate(llama_dir, SPEC, params)
    assert [o.outputs[0].token_ids for o in spec] == [o.outputs[0].token_ids for o in base]
    plain = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    ref, _ = _generate(llama_dir, None, plain)
    stop = ref[2].outputs[0].token_ids[9]
    stopped = SamplingParams(temperature=0, max_tokens=40, stop_token_ids=[stop])
    base, _ = _generate(llama_dir, None, stopped)
    spec, _ = _generate(llama_dir, SPEC, stopped)
    for a, b in zip(base, spec, strict=True):
        assert b.outputs[0].token_ids == a.outputs[0].token_ids
        assert b.outputs[0].finish_reason == a.outputs[0].finish_reason


def test_structured_output_requests_run_beside_speculation(llama_dir):
    """A grammar-constrained request speculates beside unconstrained ones (its drafts cut to
    what the grammar accepts, every verified position masked) and stays valid; the batch's
    output equals speculation off (tests/spec_decode/test_structured_output.py has more)."""
    import re

    from octavo.sampling_params import StructuredOutputsParams

    plain = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)
    regex = SamplingParams(temperature=0, max_tokens=30, structured_outputs=StructuredOutputsParams(regex="[a-e]{3}-[0-9]{2}"))
    outs = {}
    for spec in (None, SPEC):
        llm = LLM(llama_dir, dtype="float32", speculative_config=spec)
        prompts = _prompts(llm.llm_engine.config.model_config.vocab_size)
        outs[spec is None] = llm.generate(prompts + prompts[:1], [plain] * 3 + [regex], use_tqdm=False)
        assert re.fullmatch("[a-e]{3}-[0-9]{2}", outs[spec is None][3].outputs[0].text)
    stats = llm.llm_engine.get_stats()
    assert stats.spec_num_accepted_tokens > 0
    assert [o.outputs[0].token_ids for o in outs[True]] == [o.outputs[0].token_ids for o in outs[False]]


@pytest.mark.usefixtures("cpu_platform")  # gloo on CPU: 2 workers receive the drafts
def test_tensor_parallel_workers_verify_drafts(llama_dir):
    params = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
    base, _ = _generate(llama_dir, None, params)
    llm = LLM(llama_dir, dtype="float32", speculative_config=SPEC, tensor_parallel_size=2)
    outs = llm.generate(_prompts(llm.llm_engine.config.model_config.vocab_size), params, use_tqdm=False)
    assert llm.llm_engine.get_stats().spec_num_accepted_tokens > 0
    llm.shutdown()
    assert [o.outputs[0].token_ids for o in outs] == [o.outputs[0].token_ids for o in base]
