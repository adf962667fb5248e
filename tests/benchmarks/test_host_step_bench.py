"""``benchmarks/host_step_bench.py`` drives the engine's own scheduler and output processor to
completion without the model: every request finishes with its output length, every KV block
comes back, and each step's time is split into its three parts."""

from __future__ import annotations

import argparse
import random

from tests.benchmarks.script_loader import load_script


def test_a_pass_finishes_every_request_and_frees_every_block():
    from octavo import LLM

    bench = load_script("benchmarks/host_step_bench.py")
    llm = LLM(seed=0, max_model_len=64)
    engine = llm.llm_engine
    pool = engine.core.scheduler.kv_cache_manager.block_pool
    free_before = pool.get_num_free_blocks()
    args = argparse.Namespace(num_requests=5, input_len=20, output_len=7)
    per_step = bench.one_pass(llm, "t", args, random.Random(0))
    assert set(per_step) == {"schedule", "update", "outputs", "total"}
    assert all(v > 0 for v in per_step.values())
    assert abs(per_step["total"] - sum(v for k, v in per_step.items() if k != "total")) < 1e-9
    assert not engine.core.scheduler.has_unfinished_requests()
    assert not engine.output_processor.has_unfinished()
    assert pool.get_num_free_blocks() == free_before
