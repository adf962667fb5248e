"""EAGLE-3 speculation (``method: eagle3``): greedy output equals speculation off, token for
token (float32), with random-weight heads (a draft vocabulary of half the target's, mapped by
``d2t``) on 4-layer Llama, Qwen2 and Qwen3 targets; the target's auxiliary hidden states equal
HF transformers' ``hidden_states`` of those layers; every draft is a token of the draft
vocabulary; errors for what octavo does not run."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from octavo import LLM, SamplingParams
from tests.spec_decode.test_greedy_equivalence import _generate, _prompts

GREEDY = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)


def eagle3_spec(path: str, k: int = 3) -> dict:
    return {"method": "eagle3", "model": path, "num_speculative_tokens": k}


def _token_ids(outs) -> list[list[int]]:
    return [list(c.token_ids) for o in outs for c in o.outputs]


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_greedy_identical_with_a_random_head(eagle3_setups, arch):
    target, head = eagle3_setups[arch]
    base, _ = _generate(target, None, GREEDY)
    spec, stats = _generate(target, eagle3_spec(head), GREEDY)
    assert _token_ids(spec) == _token_ids(base)
    assert stats.spec_num_draft_tokens > 0


def test_drafts_come_from_the_draft_vocabulary(eagle3_setups):
    target, head = eagle3_setups["llama"]
    from safetensors.torch import load_file

    t2d = load_file(f"{head}/model.safetensors")["t2d"]
    llm = LLM(target, dtype="float32", speculative_config=eagle3_spec(head, k=4), max_num_batched_tokens=8)
    drafter, seen = llm.llm_engine.core.runner.drafter, []
    propose = drafter.propose

    def spy(batch, rows, num_drafts):
        drafts = propose(batch, rows, num_drafts)
        seen.extend(t for d in drafts for t in d)
        return drafts

    drafter.propose = spy
    outs = llm.generate(_prompts(llm.llm_engine.config.model_config.vocab_size), GREEDY, use_tqdm=False)
    assert _token_ids(outs) == _token_ids(_generate(target, None, GREEDY)[0])
    assert len(seen) > 20 and bool(t2d[torch.tensor(seen)].all())


def test_target_keeps_the_hidden_states_the_head_reads(eagle3_setups):
    """``aux_out`` after a prefill: the residual stream entering layers 0, 1, 3 (the head's
    ids, ascending), as HF transformers' ``hidden_states[i]``."""
    import transformers

    target, head = eagle3_setups["qwen3"]
    prompt = list(range(5, 45))
    llm = LLM(target, dtype="float32", speculative_config=eagle3_spec(head))
    llm.generate([{"prompt_token_ids": prompt}], SamplingParams(max_tokens=1), use_tqdm=False)
    aux = llm.llm_engine.core.runner.model.model.aux_out[: len(prompt)]
    hf = transformers.AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32)
    with torch.no_grad():
        hs = hf(torch.tensor([prompt]), output_hidden_states=True).hidden_states
    want = torch.cat([hs[i][0] for i in (0, 1, 3)], dim=-1)
    torch.testing.assert_close(aux, want, atol=2e-4, rtol=2e-4)


def test_greedy_identical_under_chunked_prefill_preemption_and_n(eagle3_setups):
    from tests.spec_decode.test_greedy_equivalence import assert_same_outputs

    target, head = eagle3_setups["llama"]
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, n=2, logprobs=2)
    kw = dict(max_num_batched_tokens=8, num_gpu_blocks_override=8, block_size=16, max_num_seqs=6)
    base, _ = _generate(target, None, params, **kw)
    spec, stats = _generate(target, eagle3_spec(head), params, **kw)
    assert stats.num_preemptions > 0 and stats.spec_num_draft_tokens > 0
    assert_same_outputs(base, spec, ranks=False)


def _edit(src: str, dst, **config) -> str:
    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    cfg.update(config)
    (dst / "config.json").write_text(json.dumps(cfg))
    return str(dst)


def test_errors_name_what_is_not_run(tmp_path, eagle3_setups, eagle_heads):
    target, head = eagle3_setups["llama"]
    cases = [
        (eagle3_spec(_edit(head, tmp_path / "ids", eagle_config={"eagle_aux_hidden_state_layer_ids": [0, 1, 4]})),
         "reads target layers \\[0, 1, 4\\]"),
        (eagle3_spec(_edit(head, tmp_path / "nbr", norm_before_residual=True)), "norm_before_residual"),
        (eagle3_spec(_edit(head, tmp_path / "th", target_hidden_size=32)), "target_hidden_size 32"),
        ({"method": "eagle", "model": head, "num_speculative_tokens": 2}, "is an EAGLE-3 head.*use method eagle3"),
        (eagle3_spec(eagle_heads["llama", "random"]), "is not an EAGLE-3 head.*use method eagle\\b"),
    ]
    for spec, message in cases:
        with pytest.raises(ValueError, match=message):
            LLM(target, dtype="float32", speculative_config=spec)
