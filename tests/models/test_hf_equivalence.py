"""Greedy outputs are token-identical to HF transformers in float32, for every architecture.

The batch mixes prompt lengths from 1 to 300 (some crossing block boundaries), with a token
budget small enough to force chunked prefill and a sequence cap small enough that requests
queue. HF runs one prompt at a time.
"""

import pytest

from octavo import LLM, SamplingParams
from tests.conftest import ARCHS
from tests.hf_reference import hf_greedy, random_prompts

LENGTHS = [1, 15, 16, 17, 33, 64, 100, 300]
MAX_TOKENS = 12


@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_matches_transformers(arch, checkpoints):
    path = checkpoints[arch]
    llm = LLM(path, dtype="float32", block_size=16, max_num_batched_tokens=64, max_num_seqs=3)
    vocab = llm.llm_engine.config.model_config.vocab_size
    prompts = random_prompts(vocab, LENGTHS, seed=hash(arch) % 1000)
    outs = llm.generate(
        [{"prompt_token_ids": p} for p in prompts],
        SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS),
        use_tqdm=False,
    )
    assert [o.prompt_token_ids for o in outs] == prompts
    for p, o in zip(prompts, outs, strict=True):
        expected = hf_greedy(path, p, MAX_TOKENS)
        assert o.outputs[0].token_ids == expected, f"{arch}: prompt of {len(p)} tokens"
    # Everything finished: the KV cache is empty again.
    kv = llm.llm_engine.core.scheduler.kv_cache_manager
    assert kv.block_pool.get_num_free_blocks() == kv.num_usable_blocks


def test_text_prompts_match_transformers(llama_dir):
    llm = LLM(llama_dir, dtype="float32")
    tok = llm.get_tokenizer()
    prompts = ["def hello(world):", "import data model", "the cache"]
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=8), use_tqdm=False)
    for p, o in zip(prompts, outs, strict=True):
        assert o.prompt == p
        ids = tok.encode(p)
        assert o.prompt_token_ids == ids
        assert o.outputs[0].token_ids == hf_greedy(llama_dir, ids, 8)
        assert o.outputs[0].text == tok.decode(o.outputs[0].token_ids, skip_special_tokens=True)
