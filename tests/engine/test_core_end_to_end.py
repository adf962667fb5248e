"""The core features end to end on the tiny llama fixture: prefix caching, preemption,
parallel sampling, logprobs, prompt logprobs, sampling controls, abort."""

import numpy as np
import pytest
import torch

from octavo import LLM, SamplingParams
from octavo.engine.output_processor import OutputKind
from tests.hf_reference import hf_model, random_prompts

COMMON = dict(dtype="float32", block_size=16, max_model_len=256)


@pytest.fixture(scope="module")
def llm(llama_dir):
    return LLM(llama_dir, max_num_batched_tokens=256, max_num_seqs=8, **COMMON)


@pytest.fixture(scope="module")
def llm_small(llama_dir):
    """8 blocks (7 usable = 112 tokens) and a 32-token budget: chunks and preemptions."""
    return LLM(llama_dir, num_gpu_blocks_override=8, max_num_batched_tokens=32, max_num_seqs=4, **COMMON)


@pytest.fixture(scope="module")
def vocab(llm):
    return llm.llm_engine.config.model_config.vocab_size


def tokens(outs):
    return [[c.token_ids for c in o.outputs] for o in outs]


def assert_idle(llm):
    kv = llm.llm_engine.core.scheduler.kv_cache_manager
    assert not llm.llm_engine.has_unfinished_requests()
    assert kv.block_pool.get_num_free_blocks() == kv.num_usable_blocks


def test_shared_prefix_same_tokens_with_and_without_caching(llm, llama_dir, vocab):
    prefix = random_prompts(vocab, [100], seed=11)[0]
    suffixes = random_prompts(vocab, [3, 9, 17, 4, 12], seed=12)
    prompts = [{"prompt_token_ids": prefix + s} for s in suffixes]
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)

    before = llm.get_stats()
    cached = llm.generate(prompts, params, use_tqdm=False)
    after = llm.get_stats()
    # 100 tokens = 6 full blocks of 16: every request after the first hits all of them.
    assert after.prefix_cache_hits - before.prefix_cache_hits >= 4 * 96
    assert after.prefix_cache_queries - before.prefix_cache_queries == sum(len(p["prompt_token_ids"]) for p in prompts)
    assert sorted(o.num_cached_tokens for o in cached)[1:] == [96] * 4

    nocache = LLM(llama_dir, enable_prefix_caching=False, max_num_batched_tokens=256, **COMMON)
    plain = nocache.generate(prompts, params, use_tqdm=False)
    assert tokens(cached) == tokens(plain)
    st = nocache.get_stats()
    assert st.prefix_cache_hits == 0 and st.prefix_cache_queries == 0
    # A second round is served from the cache and is still identical.
    assert tokens(llm.generate(prompts, params, use_tqdm=False)) == tokens(plain)
    assert_idle(llm)


def test_tiny_pool_preempts_and_matches_an_unconstrained_run(llm, llm_small, vocab):
    prompts = [{"prompt_token_ids": p} for p in random_prompts(vocab, [20, 17, 27, 12], seed=21)]
    # Each request grows to 36..51 tokens = 3-4 blocks; together they need 14 of the 7 blocks.
    greedy = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    seeded = [SamplingParams(temperature=1.0, top_k=40, seed=100 + i, max_tokens=24, ignore_eos=True) for i in range(4)]
    before = llm_small.get_stats().num_preemptions
    assert tokens(llm_small.generate(prompts, greedy, use_tqdm=False)) == tokens(llm.generate(prompts, greedy, use_tqdm=False))
    mid = llm_small.get_stats().num_preemptions
    assert mid > before
    # Seeded sampling survives preemption and recompute too.
    assert tokens(llm_small.generate(prompts, seeded, use_tqdm=False)) == tokens(llm.generate(prompts, seeded, use_tqdm=False))
    assert llm_small.get_stats().num_preemptions > mid
    assert_idle(llm_small)


def test_num_gpu_blocks_override_sizes_the_pool_and_rejects_what_never_fits(llm_small, vocab):
    kv = llm_small.llm_engine.core.scheduler.kv_cache_manager
    assert kv.block_pool.num_blocks == 8 and kv.max_num_tokens == 112
    with pytest.raises(ValueError, match="never fit"):
        llm_small.generate({"prompt_token_ids": [5] * 112}, SamplingParams(max_tokens=1), use_tqdm=False)
    assert_idle(llm_small)
    # A prompt that fits but would outgrow the pool stops with "length" at 112 tokens.
    out = llm_small.generate({"prompt_token_ids": [5] * 106}, SamplingParams(max_tokens=50, ignore_eos=True), use_tqdm=False)
    assert out[0].outputs[0].finish_reason == "length" and len(out[0].outputs[0].token_ids) == 6


def test_parallel_sampling_shares_the_prompt_and_groups_outputs(llm, vocab):
    prompt = {"prompt_token_ids": random_prompts(vocab, [40], seed=31)[0]}
    params = SamplingParams(n=3, temperature=1.0, seed=5, max_tokens=8, ignore_eos=True)
    before = llm.get_stats()
    out = llm.generate(prompt, params, use_tqdm=False)
    after = llm.get_stats()
    assert len(out) == 1 and [c.index for c in out[0].outputs] == [0, 1, 2]
    # Children 1 and 2 hit both full blocks of the 40-token prompt: computed once, not 3 times.
    assert after.prefix_cache_hits - before.prefix_cache_hits == 2 * 32
    assert out[0].num_cached_tokens == 32
    # Child i samples exactly like a single request seeded with seed + i.
    singles = llm.generate([prompt] * 3, [SamplingParams(temperature=1.0, seed=5 + i, max_tokens=8, ignore_eos=True) for i in range(3)], use_tqdm=False)
    assert [c.token_ids for c in out[0].outputs] == [o.outputs[0].token_ids for o in singles]
    assert len({tuple(c.token_ids) for c in out[0].outputs}) > 1


# fp32 through chunked paged attention vs transformers' one dense pass: summation order differs,
# so |logprob| values near 20 differ by a few 1e-5 (relative ~1e-6); 3e-4 absolute leaves room for
# thread-count-dependent reductions and still fails any real error (those are >= 1e-2).
LOGPROB_TOL = 3e-4


def test_logprobs_and_prompt_logprobs_match_transformers(llm_small, llama_dir, vocab):
    prompt = random_prompts(vocab, [70], seed=41)[0]  # 3 chunks of the 32-token budget
    params = SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True, logprobs=3, prompt_logprobs=2)
    out = llm_small.generate({"prompt_token_ids": prompt}, params, use_tqdm=False)[0]
    gen = out.outputs[0].token_ids
    with torch.no_grad():
        ref = hf_model(llama_dir)(torch.tensor([prompt + gen])).logits[0].float().log_softmax(-1)

    plp = out.prompt_logprobs
    assert len(plp) == len(prompt) and plp[0] is None
    for i in range(1, len(prompt)):
        row, tok = ref[i - 1], prompt[i]
        d = plp[i]
        assert d[tok].logprob == pytest.approx(float(row[tok]), abs=LOGPROB_TOL)
        assert d[tok].rank == int((row >= row[tok]).sum())
        top = row.topk(2).indices.tolist()
        assert set(top) <= set(d) and len(d) <= 3
    for j, (tok, d) in enumerate(zip(gen, out.outputs[0].logprobs, strict=True)):
        row = ref[len(prompt) - 1 + j]
        assert tok == int(row.argmax()) and d[tok].rank == 1
        assert d[tok].logprob == pytest.approx(float(row[tok]), abs=LOGPROB_TOL)
        assert list(d)[:1] == [tok] and len(d) == 3  # the sampled token is one of the top 3
    assert out.outputs[0].cumulative_logprob == pytest.approx(sum(d[t].logprob for t, d in zip(gen, out.outputs[0].logprobs, strict=True)))


def test_sampling_controls_end_to_end(llm, vocab):
    tok = llm.get_tokenizer()
    eos = tok.eos_token_id
    p = {"prompt_token_ids": [10, 11, 12, 13]}
    out = llm.generate(p, SamplingParams(temperature=0, max_tokens=4, logit_bias={77: 100.0}), use_tqdm=False)
    assert out[0].outputs[0].token_ids == [77] * 4
    out = llm.generate(p, SamplingParams(temperature=1.0, seed=3, max_tokens=12, allowed_token_ids=[40, 41, 42]), use_tqdm=False)
    assert set(out[0].outputs[0].token_ids) <= {40, 41, 42}
    # min_tokens holds EOS back even when it is by far the most likely token.
    out = llm.generate(p, SamplingParams(temperature=0, max_tokens=10, min_tokens=3, logit_bias={eos: 100.0}), use_tqdm=False)
    c = out[0].outputs[0]
    assert c.token_ids[:3] != [eos] * 3 and eos not in c.token_ids[:3]
    assert c.token_ids[3] == eos and c.finish_reason == "stop" and len(c.token_ids) == 4
    # bad_words: the greedy favourite is banned.
    base = llm.generate(p, SamplingParams(temperature=0, max_tokens=6, ignore_eos=True), use_tqdm=False)[0].outputs[0]
    word = tok.decode([base.token_ids[0]])
    banned = llm.generate(p, SamplingParams(temperature=0, max_tokens=6, ignore_eos=True, bad_words=[word]), use_tqdm=False)[0].outputs[0]
    assert base.token_ids[0] not in banned.token_ids
    # Penalties change a greedy continuation that repeats itself.
    rep = llm.generate(p, SamplingParams(temperature=0, max_tokens=20, ignore_eos=True), use_tqdm=False)[0].outputs[0]
    pen = llm.generate(p, SamplingParams(temperature=0, max_tokens=20, ignore_eos=True, frequency_penalty=2.0), use_tqdm=False)[0].outputs[0]
    assert np.bincount(pen.token_ids).max() <= np.bincount(rep.token_ids).max()


def test_stop_strings_end_to_end(llm):
    prompt = "def hello(world):"
    base = llm.generate(prompt, SamplingParams(temperature=0, max_tokens=16, ignore_eos=True), use_tqdm=False)[0].outputs[0]
    text = base.text
    stop = text[3:6]
    assert len(stop) == 3 and stop.strip()
    cut = llm.generate(prompt, SamplingParams(temperature=0, max_tokens=16, ignore_eos=True, stop=[stop]), use_tqdm=False)[0].outputs[0]
    i = text.find(stop)
    assert cut.text == text[:i] and cut.finish_reason == "stop" and cut.stop_reason == stop
    assert len(cut.token_ids) < len(base.token_ids)
    inc = llm.generate(prompt, SamplingParams(temperature=0, max_tokens=16, ignore_eos=True, stop=[stop], include_stop_str_in_output=True), use_tqdm=False)[0].outputs[0]
    assert inc.text == text[: i + len(stop)]
    assert_idle(llm)


def test_abort_waiting_running_and_mid_prefill(llm_small, vocab):
    engine = llm_small.llm_engine
    prompts = random_prompts(vocab, [20, 60, 10, 10, 10], seed=51)
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    for i, p in enumerate(prompts):
        engine.add_request(f"ab{i}", {"prompt_token_ids": p}, params, output_kind=OutputKind.DELTA)
    engine.step()  # budget 32: ab0 runs, ab1 is mid-prefill, the rest wait
    sched = engine.core.scheduler
    assert sched.requests["ab1"].num_computed_tokens < 60
    engine.abort_request(["ab1", "ab4"])
    engine.step()
    engine.abort_request("ab0")
    seen = set()
    while engine.has_unfinished_requests():
        for o in engine.step():
            seen.add(o.request_id)
    assert seen <= {"ab2", "ab3"} and {"ab2", "ab3"} <= seen
    engine.abort_request("no-such-request")
    assert_idle(llm_small)


def test_generate_takes_one_params_or_one_per_prompt(llm):
    prompts = [{"prompt_token_ids": [5, 6, 7]}, {"prompt_token_ids": [8, 9]}]
    outs = llm.generate(prompts, [SamplingParams(max_tokens=2, ignore_eos=True), SamplingParams(max_tokens=5, ignore_eos=True)], use_tqdm=False)
    assert [len(o.outputs[0].token_ids) for o in outs] == [2, 5]
    outs = llm.generate(prompts, SamplingParams(max_tokens=3, ignore_eos=True), use_tqdm=False)
    assert [len(o.outputs[0].token_ids) for o in outs] == [3, 3]
    with pytest.raises(ValueError, match="sampling params"):
        llm.generate(prompts, [SamplingParams()], use_tqdm=False)
