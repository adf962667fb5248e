"""EAGLE speculation (``method: eagle``): greedy output equals speculation off, token for
token (float32), with random-weight heads built from a fixed seed (exactness never depends on
the head being trained) for the architectures whose EAGLE heads are Llama-style (Llama, Qwen2,
Qwen3); heads whose drafts are known in advance check the wiring of the hidden states (an
identity head drafts the target's own last token; a mirror head of an attention-free target
drafts exactly the target's next tokens, so every draft is accepted). Also: chunked prefill,
preemption, prefix caching, n > 1, logprobs, the accelerator's staged inputs, no block leaks,
and the errors for what octavo does not run."""

from __future__ import annotations

import json
import shutil

import pytest

from octavo import LLM, SamplingParams
from tests.spec_decode.test_greedy_equivalence import _generate, _prompts, assert_same_outputs


def eagle_spec(path: str, k: int = 3) -> dict:
    return {"method": "eagle", "model": path, "num_speculative_tokens": k}


def _token_ids(outs) -> list[list[int]]:
    return [list(c.token_ids) for o in outs for c in o.outputs]


GREEDY = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
_BASE: dict[str, list[list[int]]] = {}


def _base(path: str) -> list[list[int]]:
    """Greedy output with speculation off (once per checkpoint)."""
    if path not in _BASE:
        _BASE[path] = _token_ids(_generate(path, None, GREEDY)[0])
    return _BASE[path]


@pytest.mark.parametrize(("arch", "kind"), [("llama", "random"), ("llama", "bias"), ("qwen2", "random"),
                                            ("qwen3", "random"), ("mixtral", "random")])
def test_greedy_identical_with_a_random_head(checkpoints, eagle_heads, arch, kind):
    spec, stats = _generate(checkpoints[arch], eagle_spec(eagle_heads[arch, kind], k=3), GREEDY)
    assert _token_ids(spec) == _base(checkpoints[arch])
    assert stats.spec_num_draft_tokens > 0
    assert 0 <= stats.spec_num_accepted_tokens <= stats.spec_num_draft_tokens


def test_identity_head_drafts_the_targets_last_token(checkpoints, eagle_heads):
    """The identity head's output is the target's hidden state at position n - 2, whose greedy
    token is the last known token: every proposal is that token k times. This pins the
    hidden state fed (the target's output, at the right position) and the feedback of the
    head's own output for later drafts."""
    llm = LLM(checkpoints["qwen3"], dtype="float32", speculative_config=eagle_spec(eagle_heads["qwen3", "identity"], k=3))
    runner = llm.llm_engine.core.runner
    drafter, seen = runner.drafter, []
    propose = drafter.propose

    def spy(batch, rows, num_drafts):
        drafts = propose(batch, rows, num_drafts)
        last = batch.token_ids[rows, batch.num_tokens[rows] - 1]
        seen.extend((d, int(t), int(n)) for d, t, n in zip(drafts, last, num_drafts, strict=True))
        return drafts

    drafter.propose = spy
    outs = llm.generate(_prompts(llm.llm_engine.config.model_config.vocab_size), GREEDY, use_tqdm=False)
    assert _token_ids(outs) == _base(checkpoints["qwen3"])
    assert len(seen) > 20 and all(d == [t] * n for d, t, n in seen)


def test_mirror_head_drafts_are_all_accepted(attention_free_target):
    """A two-layer head (the second with its input norm) whose drafts are the target's own."""
    target, head = attention_free_target
    spec, stats = _generate(target, eagle_spec(head, k=4), GREEDY)
    assert _token_ids(spec) == _base(target)
    assert 0 < stats.spec_num_accepted_tokens == stats.spec_num_draft_tokens


def test_greedy_identical_under_chunked_prefill_preemption_and_n(llama_dir, eagle_heads):
    """A token budget of 8 (prompts absorbed by the head chunk by chunk; drafts cut by the
    budget), a pool small enough to preempt, prefix caching, n > 1 and logprobs."""
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, n=2, logprobs=2)
    kw = dict(max_num_batched_tokens=8, num_gpu_blocks_override=8, block_size=16, max_num_seqs=6)
    base, _ = _generate(llama_dir, None, params, **kw)
    spec, stats = _generate(llama_dir, eagle_spec(eagle_heads["llama", "identity"]), params, **kw)
    assert stats.num_preemptions > 0 and stats.spec_num_draft_tokens > 0
    assert_same_outputs(base, spec, ranks=False)


def test_staged_input_path_proposes_the_same_drafts(llama_dir, eagle_heads):
    """The accelerator's input path, run on the CPU: the target's steps staged in persistent
    buffers (the head then reads views of them) and the head's passes too (block tables at the
    widest a row can need, device-side drafts copied in): the same drafts and output."""
    from octavo.worker.cuda_graph import StepBuffers

    results = []
    for staged in (False, True):
        llm = LLM(llama_dir, dtype="float32", speculative_config=eagle_spec(eagle_heads["llama", "random"], k=4),
                  max_num_batched_tokens=16)
        runner = llm.llm_engine.core.runner
        d, sc = runner.drafter, llm.llm_engine.config.scheduler_config
        if staged:
            d.step_buffers = d.make_step_buffers()
            runner.step_buffers = StepBuffers(sc.max_num_batched_tokens, sc.max_num_seqs,
                                              runner.input_batch.max_blocks_per_req, runner.block_size,
                                              runner.device, runner.platform)
        outs = llm.generate(_prompts(llm.llm_engine.config.model_config.vocab_size), GREEDY, use_tqdm=False)
        st = llm.get_stats()
        results.append((_token_ids(outs), st.spec_num_draft_tokens, st.spec_num_accepted_tokens_per_pos))
    assert results[0] == results[1] and results[0][1] > 0


def test_blocks_hold_the_heads_kv(llama_dir, eagle_heads):
    """One pool block's bytes count the target's and the head's K/V (one layer); the head's
    tensors have the pool's blocks plus scratch blocks; its parameters are its own only."""
    llm = LLM(llama_dir, dtype="float32", speculative_config=eagle_spec(eagle_heads["llama", "random"]))
    runner = llm.llm_engine.core.runner
    head = runner.drafter
    bs = runner.block_size
    assert head.kv_bytes_per_block() == 1 * 2 * bs * 2 * 16 * 4  # llama: 2 KV heads of 16 dims
    assert head.kv_caches[0].shape[0] == runner.num_blocks + head.num_rows * head.scratch_per_row
    names = {n for n, _ in head.model.named_parameters()}
    assert "fc.weight" in names and not any("embed" in n or "lm_head" in n for n in names)


def test_no_block_leaks_with_aborts_and_preemptions(llama_dir, eagle_heads):
    from tests.spec_decode.test_draft_model import (
        LEAK_HUNT_KW,
        _random_workload,
        assert_finished_as_without_speculation,
    )

    llm = LLM(llama_dir, speculative_config=eagle_spec(eagle_heads["llama", "identity"], k=4), **LEAK_HUNT_KW)
    prompts, done, spec_steps = _random_workload(llm, 80, seed=11)
    kv = llm.llm_engine.core.scheduler.kv_cache_manager
    assert kv.block_pool.get_num_free_blocks() == kv.num_usable_blocks
    assert llm.get_stats().num_preemptions > 0 and spec_steps > 0
    assert_finished_as_without_speculation(llama_dir, prompts, done, 10)


def _edited_head(src: str, dst, config: dict | None = None, add: dict | None = None, drop: str | None = None) -> str:
    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst)
    if config:
        cfg = json.loads((dst / "config.json").read_text())
        cfg.update(config)
        (dst / "config.json").write_text(json.dumps(cfg))
    tensors = load_file(str(dst / "model.safetensors"))
    tensors.update(add or {})
    if drop:
        tensors.pop(drop)
    save_file(tensors, str(dst / "model.safetensors"))
    return str(dst)


def test_errors_name_what_is_not_run(tmp_path, llama_dir, small_draft_dir, eagle_heads):
    import torch

    head = eagle_heads["llama", "random"]
    cases = [
        (dict(model=small_draft_dir), "hidden_size 32, the target .* has 64"),
        (dict(model=_edited_head(head, tmp_path / "e3", {"architectures": ["Eagle3LlamaForCausalLM"]})),
         "EAGLE-3 head"),
        (dict(model=_edited_head(head, tmp_path / "hass", {"add_para_norm": True})), "add_para_norm"),
        (dict(model=_edited_head(head, tmp_path / "gemma", {"model_type": "gemma2"})), "model_type 'gemma2'"),
        (dict(model=head, tensor_parallel_size=2), "not supported with --tensor-parallel-size 2"),
        (dict(model=_edited_head(head, tmp_path / "norm", add={"norm.weight": torch.ones(64)})),
         "does not use.*norm.weight"),
        (dict(model=_edited_head(head, tmp_path / "inorm", add={"layers.0.input_layernorm.weight": torch.ones(64)})),
         "first layer has no input_layernorm"),
        (dict(model=_edited_head(head, tmp_path / "nofc", drop="fc.weight")), "missing tensors: fc.weight"),
    ]
    for kw, message in cases:
        tp = kw.pop("tensor_parallel_size", 1)
        with pytest.raises(ValueError, match=message):
            LLM(llama_dir, dtype="float32", speculative_config=eagle_spec(kw["model"]), tensor_parallel_size=tp)


def test_targets_without_llama_style_heads_are_refused(checkpoints, eagle_heads):
    with pytest.raises(ValueError, match="not supported for a Gemma2ForCausalLM target"):
        LLM(checkpoints["gemma2"], dtype="float32", speculative_config=eagle_spec(eagle_heads["gemma2", "random"]))


def test_shared_tensors_in_the_head_are_taken_from_the_target(tmp_path, llama_dir, eagle_heads):
    """A head checkpoint that carries a copy of the target's embedding (as EAGLE's do) loads
    and drafts exactly as without it; a copy that differs is refused, named (the head drafts
    with the target's, so it would be ignored)."""
    import torch
    from safetensors.torch import load_file

    target = load_file(f"{llama_dir}/model.safetensors")
    head = _edited_head(eagle_heads["llama", "random"], tmp_path / "emb",
                        add={"embed_tokens.weight": target["model.embed_tokens.weight"]})
    a, with_copy = _generate(llama_dir, eagle_spec(head), GREEDY)
    b, without = _generate(llama_dir, eagle_spec(eagle_heads["llama", "random"]), GREEDY)
    assert _token_ids(a) == _token_ids(b) == _base(llama_dir)
    assert with_copy.spec_num_accepted_tokens_per_pos == without.spec_num_accepted_tokens_per_pos
    assert with_copy.spec_num_draft_tokens == without.spec_num_draft_tokens > 0
    other = _edited_head(eagle_heads["llama", "random"], tmp_path / "zeros",
                         add={"embed_tokens.weight": torch.zeros_like(target["model.embed_tokens.weight"])})
    with pytest.raises(ValueError, match=r"'embed_tokens.weight': the head's copy differs from the target's"):
        LLM(llama_dir, dtype="float32", speculative_config=eagle_spec(other))
