"""The CPU graph mode: decode steps compiled by torch.compile give exactly eager's greedy tokens.

Each architecture compiles two graphs (batch 1, static; batch 2..max_num_seqs, dynamic) of a
tiny float32 fixture, ~10-20 s of both cores on a cold inductor cache, so CI runs two
architectures (plain Llama; Qwen3 with q/k RMSNorm and qkv without bias) and the full sweep over
every fixture architecture is marked slow (``nox -s test-slow``).
"""

from __future__ import annotations

import pytest
import torch

from octavo import LLM, SamplingParams
from tests.fixtures.checkpoints import ARCH_SPECS, MOE_ARCHS
from tests.hf_reference import random_prompts

COMMON = dict(dtype="float32", block_size=16, max_model_len=128, max_num_seqs=4)
CI_ARCHS = ("llama", "qwen3")
DENSE = [a for a in ARCH_SPECS if a not in MOE_ARCHS]
ARCH_PARAMS = [a if a in CI_ARCHS else pytest.param(a, marks=pytest.mark.slow) for a in DENSE]


def _compiles() -> int:
    from torch._dynamo.utils import counters

    return counters["stats"]["unique_graphs"]


def _tokens(llm: LLM, prompts, max_tokens: int = 12) -> list[list[int]]:
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outs]


@pytest.mark.parametrize("arch", ARCH_PARAMS)
def test_compiled_greedy_equals_eager(arch, checkpoints, monkeypatch):
    monkeypatch.setenv("OCTAVO_CPU_GRAPH_MODE", "torch_compile")
    compiled = LLM(checkpoints[arch], **COMMON)
    graph = compiled.llm_engine.core.runner.cpu_graph
    assert graph is not None, compiled.llm_engine.core.executor.worker_infos[0]["graphs"]
    eager = LLM(checkpoints[arch], enforce_eager=True, **COMMON)
    assert eager.llm_engine.core.runner.cpu_graph is None
    vocab = compiled.llm_engine.config.model_config.vocab_size
    batch, single = random_prompts(vocab, [5, 9, 17, 3], seed=1), random_prompts(vocab, [7], seed=2)
    compiled_before = _compiles()
    for prompts in (batch, single):  # decode batches of 4..1 (dynamic graph), then batch 1 (static)
        assert _tokens(compiled, prompts) == _tokens(eager, prompts)
    assert graph.steps >= 11 + 11, "decode steps ran eagerly"
    assert _compiles() == compiled_before, "a decode step recompiled after warm-up"


def test_compiled_steps_are_decode_only(llama_dir, monkeypatch):
    """Prefill chunks run eagerly; every pure decode step runs the graph."""
    monkeypatch.setenv("OCTAVO_CPU_GRAPH_MODE", "torch_compile")
    llm = LLM(llama_dir, **COMMON)
    graph = llm.llm_engine.core.runner.cpu_graph
    assert graph.accepts(3, 3, 1) and not graph.accepts(2, 7, 6) and not graph.accepts(1, 1, 2)
    before = graph.steps
    _tokens(llm, random_prompts(llm.llm_engine.config.model_config.vocab_size, [9]), max_tokens=5)
    assert graph.steps - before == 4  # the first token comes from the prefill step


def _graphs(llm: LLM) -> str:
    return llm.llm_engine.core.executor.worker_infos[0]["graphs"]


def test_enforce_eager_and_unsupported_options_run_eagerly_with_the_reason(llama_dir, monkeypatch):
    monkeypatch.setenv("OCTAVO_CPU_GRAPH_MODE", "torch_compile")
    eager = LLM(llama_dir, enforce_eager=True, **COMMON)
    assert eager.llm_engine.core.runner.cpu_graph is None
    assert _graphs(eager) == "none (--enforce-eager)"
    spec = LLM(llama_dir, speculative_config={"method": "ngram", "num_speculative_tokens": 2,
                                              "prompt_lookup_max": 3}, **COMMON)
    assert spec.llm_engine.core.runner.cpu_graph is None
    assert _graphs(spec) == "none (speculative decoding (ngram) runs eagerly)"


def test_moe_models_run_eagerly_with_the_reason(checkpoints, monkeypatch):
    monkeypatch.setenv("OCTAVO_CPU_GRAPH_MODE", "torch_compile")
    llm = LLM(checkpoints["mixtral"], **COMMON)
    assert llm.llm_engine.core.runner.cpu_graph is None
    assert _graphs(llm) == "none (mixture-of-experts layers (the expert routing's shapes depend on the data))"


def test_graph_mode_env_is_validated_and_reported(llama_dir, monkeypatch):
    from octavo.engine.arg_utils import EngineArgs
    from octavo.platforms.cpu import CpuPlatform

    monkeypatch.setenv("OCTAVO_CPU_GRAPH_MODE", "cuda_graph")
    with pytest.raises(ValueError, match="OCTAVO_CPU_GRAPH_MODE must be one of none, torch_compile"):
        CpuPlatform.get_graph_capture()
    monkeypatch.setenv("OCTAVO_CPU_GRAPH_MODE", "torch_compile")
    cfg = EngineArgs(model=llama_dir).create_engine_config()
    assert not cfg.enforce_eager
    assert str(CpuPlatform.get_graph_capture(cfg)) == "torch_compile (OCTAVO_CPU_GRAPH_MODE)"
    monkeypatch.setenv("OCTAVO_CPU_GRAPH_MODE", "none")
    assert CpuPlatform.get_graph_capture(cfg).value == "none"


def test_custom_ops_match_the_extension_calls():
    """The graph's custom ops compute what the eager path's direct kernel calls compute."""
    import numpy as np

    import octavo.attention.ops.cpu_custom_ops  # noqa: F401
    from octavo.attention.backend import CommonAttentionMetadata
    from octavo.attention.backends.cpu_paged import CpuPagedImpl, build_cpu_metadata

    torch.manual_seed(0)
    impl = CpuPagedImpl(4, 32, 32**-0.5, 2)
    cache = torch.zeros(4, 2, 2, 16 * 32)
    q, k, v = torch.randn(3, 4, 32), torch.randn(3, 2, 32), torch.randn(3, 2, 32)
    md = build_cpu_metadata(CommonAttentionMetadata(
        query_start_loc=torch.tensor([0, 1, 2, 3], dtype=torch.int32), seq_lens=torch.tensor([1, 1, 1], dtype=torch.int32),
        block_table=torch.tensor([[1], [2], [3]], dtype=torch.int32), slot_mapping=torch.tensor([16, 32, 48]),
        query_start_loc_cpu=np.array([0, 1, 2, 3]), seq_lens_cpu=np.array([1, 1, 1]), num_reqs=3,
        num_actual_tokens=3, max_query_len=1, max_seq_len=1, block_size=16,
    ))
    want = impl.forward(q, k, v, cache.clone(), md)
    got_cache = cache.clone()
    got = torch.ops.octavo.cpu_paged_attention(q, k, v, got_cache, md.slot_mapping, md.query_start_loc,
                                                md.seq_lens, md.block_table, impl.scale, 0, 0.0)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert got_cache[1:].abs().sum() > 0  # the K/V were written in place
