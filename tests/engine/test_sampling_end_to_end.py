"""Seeded sampling is reproducible and independent of the rest of the batch."""

from octavo import LLM, SamplingParams
from tests.hf_reference import random_prompts


def test_seeded_sampling_independent_of_batch(llama_dir):
    llm = LLM(llama_dir, dtype="float32", max_num_batched_tokens=48, max_num_seqs=4)
    vocab = llm.llm_engine.config.model_config.vocab_size
    target = {"prompt_token_ids": random_prompts(vocab, [20], seed=1)[0]}
    seeded = SamplingParams(temperature=1.0, top_p=0.9, top_k=50, seed=1234, max_tokens=16, ignore_eos=True)

    alone = llm.generate(target, seeded, use_tqdm=False)[0].outputs[0].token_ids
    again = llm.generate(target, seeded, use_tqdm=False)[0].outputs[0].token_ids
    assert alone == again

    others = [{"prompt_token_ids": p} for p in random_prompts(vocab, [5, 40, 70, 9], seed=2)]
    mixed_params = [SamplingParams(temperature=1.0, max_tokens=10)] * 2 + [
        SamplingParams(temperature=0.7, seed=7, max_tokens=20)
    ] * 2
    outs = llm.generate(others[:2] + [target] + others[2:], mixed_params[:2] + [seeded] + mixed_params[2:], use_tqdm=False)
    assert outs[2].outputs[0].token_ids == alone


def test_different_seeds_differ_and_unseeded_runs(llama_dir):
    llm = LLM(llama_dir, dtype="float32")
    p = {"prompt_token_ids": [10, 11, 12, 13]}
    a = llm.generate(p, SamplingParams(temperature=1.5, seed=1, max_tokens=24, ignore_eos=True), use_tqdm=False)
    b = llm.generate(p, SamplingParams(temperature=1.5, seed=2, max_tokens=24, ignore_eos=True), use_tqdm=False)
    assert a[0].outputs[0].token_ids != b[0].outputs[0].token_ids


def test_unseeded_sampling_draws_from_the_distribution(llama_dir):
    """Unseeded rows really sample: over two allowed tokens at a temperature that makes them
    near-equally likely, 48 draws contain both, and two runs differ (each failure has
    probability ~2^-47)."""
    llm = LLM(llama_dir, dtype="float32")
    p = {"prompt_token_ids": [10, 11, 12, 13]}
    params = SamplingParams(temperature=1000.0, allowed_token_ids=[20, 21], max_tokens=48, ignore_eos=True)
    runs = [llm.generate(p, params, use_tqdm=False)[0].outputs[0].token_ids for _ in range(2)]
    for toks in runs:
        assert len(toks) == 48 and set(toks) == {20, 21}
    assert runs[0] != runs[1]


def test_max_tokens_and_eos(llama_dir):
    llm = LLM(llama_dir, dtype="float32")
    eos = llm.get_tokenizer().eos_token_id
    out = llm.generate({"prompt_token_ids": [4, 5, 6]}, SamplingParams(temperature=0, max_tokens=7, ignore_eos=True), use_tqdm=False)
    c = out[0].outputs[0]
    assert len(c.token_ids) == 7 and c.finish_reason == "length"
    # Force EOS through allowed logits: a stop token id ends generation with reason "stop".
    first = c.token_ids[0]
    out = llm.generate({"prompt_token_ids": [4, 5, 6]}, SamplingParams(temperature=0, max_tokens=7, stop_token_ids=[first]), use_tqdm=False)
    c2 = out[0].outputs[0]
    assert c2.token_ids == [first] and c2.finish_reason == "stop" and c2.stop_reason == first
    # EOS stops generation (finish_reason "stop", no stop_reason) unless ignore_eos is set.
    assert eos is not None
    only_eos = SamplingParams(temperature=0, max_tokens=7, allowed_token_ids=[eos])
    c3 = llm.generate({"prompt_token_ids": [4, 5, 6]}, only_eos, use_tqdm=False)[0].outputs[0]
    assert c3.token_ids == [eos] and c3.finish_reason == "stop" and c3.stop_reason is None
    only_eos.ignore_eos = True
    c4 = llm.generate({"prompt_token_ids": [4, 5, 6]}, only_eos, use_tqdm=False)[0].outputs[0]
    assert c4.token_ids == [eos] * 7 and c4.finish_reason == "length"
