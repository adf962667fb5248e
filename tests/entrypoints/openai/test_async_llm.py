"""``AsyncLLM`` directly, engine core on a thread (``inproc``): streaming deltas, ``n > 1``,
stop strings, aborts freeing blocks, a prompt the KV cache can never hold, metrics hooks."""

from __future__ import annotations

import asyncio

import pytest

from octavo.engine.arg_utils import EngineArgs
from octavo.engine.async_llm import AsyncLLM
from octavo.metrics import ServerMetrics
from octavo.sampling_params import SamplingParams


def test_async_llm_inproc(llama_dir):
    async def main():
        metrics = ServerMetrics("tiny")
        args = EngineArgs(model=llama_dir, dtype="float32", num_gpu_blocks_override=9, block_size=16)
        engine = await AsyncLLM.from_engine_args(args, inproc=True, stat_logger=metrics)
        try:
            # deltas add up to the full text; n=2 gives two samples
            params = SamplingParams(max_tokens=6, ignore_eos=True, n=2, temperature=0.0)
            texts = {0: "", 1: ""}
            stream = await engine.add_request("a", "hello world", params)
            async for out in stream:
                for c in out.outputs:
                    texts[c.index] += c.text
            assert out.finished and texts[0] == texts[1] and texts[0]
            # the same through generate()
            final = None
            greedy = SamplingParams(max_tokens=6, ignore_eos=True, temperature=0.0)
            async for out in engine.generate("hello world", greedy, "b"):
                final = out
            assert final.finished and len(final.outputs[0].token_ids) == 1  # DELTA: the last one
            # a prompt the cache can never hold (8 usable blocks x 16 tokens) is refused up front
            with pytest.raises(ValueError, match="KV cache"):
                await engine.add_request("c", {"prompt_token_ids": [5] * 130}, SamplingParams(max_tokens=1))
            assert "c" not in engine.requests
            # leaving a stream early aborts the request and frees its blocks
            stream = await engine.add_request("d", {"prompt_token_ids": [5] * 40},
                                              SamplingParams(max_tokens=60, ignore_eos=True))
            async for _ in stream:
                break
            await asyncio.sleep(0)
            for _ in range(200):
                stats = engine.last_stats
                if stats is not None and stats.num_running_reqs == 0 and stats.kv_cache_usage == 0.0:
                    break
                await asyncio.sleep(0.02)
            assert engine.last_stats.kv_cache_usage == 0.0
            assert not engine.requests and not engine.output_processor.states
        finally:
            await engine.shutdown()
        text = metrics.render().decode()
        assert 'octavo:request_success_total{finished_reason="length",model_name="tiny"} 2.0' in text

    asyncio.run(main())
