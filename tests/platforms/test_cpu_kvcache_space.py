"""The CPU KV cache: sized from the workload unless ``OCTAVO_CPU_KVCACHE_SPACE`` says otherwise,
and allocated without a zero fill (no correctness may rely on fresh cache contents)."""

from __future__ import annotations

import pytest
import torch

from octavo import LLM, SamplingParams
from octavo.engine.arg_utils import EngineArgs
from octavo.platforms.cpu import CpuPlatform, GiB


def _config(monkeypatch, model_dir, **kwargs):
    monkeypatch.setenv("OCTAVO_PLATFORM", "cpu")
    return EngineArgs(model=model_dir, **kwargs).create_engine_config()


def _per_token_bytes(cfg) -> int:
    mc = cfg.model_config
    return 2 * mc.num_layers * mc.num_kv_heads * mc.head_size * torch.empty((), dtype=mc.dtype).element_size()


def test_default_space_is_what_the_workload_can_use(monkeypatch, llama_dir, cpu_platform):
    monkeypatch.delenv("OCTAVO_CPU_KVCACHE_SPACE", raising=False)
    cfg = _config(monkeypatch, llama_dir, max_model_len=200, max_num_seqs=3, block_size=16)
    blocks_per_seq = -(-200 // 16)
    want = (3 * blocks_per_seq + 1) * 16 * _per_token_bytes(cfg)  # + the null block
    assert cfg.cache_config.cpu_kvcache_space_bytes == want
    assert "auto" in CpuPlatform.describe()["kv cache space"]


def test_default_space_holds_max_num_seqs_full_length_sequences(monkeypatch, llama_dir, cpu_platform):
    """The null block does not count: one sequence of max_model_len = 256 tokens (16 blocks) fits."""
    monkeypatch.delenv("OCTAVO_CPU_KVCACHE_SPACE", raising=False)
    llm = LLM(model=llama_dir, max_model_len=256, max_num_seqs=1, block_size=16)
    try:
        core = llm.llm_engine.core
        assert core.scheduler.max_seq_len == 256  # no "fewer than max_model_len" cut
        out = llm.generate([{"prompt_token_ids": [5] * 128}],
                           SamplingParams(temperature=0.0, max_tokens=128, ignore_eos=True))
        assert len(out[0].outputs[0].token_ids) == 128
    finally:
        llm.llm_engine.core.shutdown()


def test_default_space_is_bounded_by_free_memory(monkeypatch, llama_dir, cpu_platform):
    monkeypatch.delenv("OCTAVO_CPU_KVCACHE_SPACE", raising=False)
    monkeypatch.setattr(CpuPlatform, "mem_get_info", classmethod(lambda cls, device_id=None: (10 << 20, 64 << 30)))
    cfg = _config(monkeypatch, llama_dir, max_model_len=128, max_num_seqs=4096, block_size=16)
    one_seq = (128 + 16) * _per_token_bytes(cfg)  # + the null block
    assert cfg.cache_config.cpu_kvcache_space_bytes == max(one_seq, 5 << 20)


def test_env_overrides_and_is_validated(monkeypatch, llama_dir, cpu_platform):
    monkeypatch.setenv("OCTAVO_CPU_KVCACHE_SPACE", "0.5")
    assert _config(monkeypatch, llama_dir).cache_config.cpu_kvcache_space_bytes == GiB // 2
    monkeypatch.setenv("OCTAVO_CPU_KVCACHE_SPACE", "0")
    with pytest.raises(ValueError, match="OCTAVO_CPU_KVCACHE_SPACE must be > 0"):
        _config(monkeypatch, llama_dir)


@pytest.mark.parametrize("arch", ["llama", "mistral_sw"])  # a 32-token sliding window: blocks freed
def test_garbage_in_a_fresh_cache_is_never_read(monkeypatch, checkpoints, cpu_platform, arch):
    """The cache is ``torch.empty``: poison it with NaN before serving; outputs must not change."""
    prompts = [[5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21] * 3, [30, 31, 32]]
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    outs = []
    for poison in (False, True):
        llm = LLM(model=checkpoints[arch], max_model_len=256, max_num_seqs=4, block_size=16)
        runner = llm.llm_engine.core.runner
        if poison:
            for cache in runner.kv_caches:
                cache.fill_(float("nan"))
        res = llm.generate([{"prompt_token_ids": p} for p in prompts], params)
        outs.append([r.outputs[0].token_ids for r in res])
        llm.llm_engine.core.shutdown()
    assert outs[0] == outs[1]
