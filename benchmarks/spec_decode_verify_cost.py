#!/usr/bin/env python3
"""Cost of a speculative verify step vs a plain decode step, batch 1, same engine, same run.

The model is a *shape* with random weights (``benchmarks/bench_cuda.py`` writes the config;
``load_format="dummy"``). One request decodes; the engine's proposer is replaced by one that
drafts ``k`` random tokens (so nearly all are rejected: this measures cost, not acceptance) or
none, alternating in blocks of steps, and each ``EngineCore.step`` is timed with a device
synchronize. Reported: median step time with 0 drafts and with ``k`` drafts, their ratio, and
the speedup the engine would deliver at acceptance rates 50% and 80% from these two numbers
(expected tokens per verify step ``sum(a^i, i=0..k)`` over the cost ratio).

  python benchmarks/spec_decode_verify_cost.py --shape llama8b --k 4        # H200
  python benchmarks/spec_decode_verify_cost.py --shape tiny --k 4           # CPU dry run
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


class _FixedDrafts:
    def __init__(self, k: int, vocab: int) -> None:
        import numpy as np

        self.k, self.rng, self.vocab = k, np.random.default_rng(0), vocab

    def propose(self, token_ids, max_tokens=None) -> list[int]:
        k = self.k if max_tokens is None else min(self.k, max_tokens)
        return self.rng.integers(3, self.vocab, size=k).tolist()


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--shape", default="tiny")
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--steps", type=int, default=40, help="timed steps per mode per block")
    p.add_argument("--blocks", type=int, default=3)
    args = p.parse_args()
    from bench_cuda import SHAPES, write_model_dir

    from octavo import LLM, SamplingParams
    from octavo.platforms import current_platform

    root = Path(tempfile.mkdtemp())
    model = write_model_dir(args.shape, root)
    spec = {"method": "ngram", "num_speculative_tokens": args.k}
    llm = LLM(str(model), load_format="dummy", speculative_config=spec, max_model_len=4096,
              dtype="float32" if args.shape == "tiny" else "bfloat16")
    core, engine = llm.llm_engine.core, llm.llm_engine
    vocab = SHAPES[args.shape]["vocab_size"]
    drafting, plain = _FixedDrafts(args.k, vocab), _FixedDrafts(0, vocab)
    total = 2 * args.blocks * args.steps + 16
    engine.add_request("r", {"prompt_token_ids": [3 + i % (vocab - 3) for i in range(512)]},
                       SamplingParams(temperature=0, max_tokens=total * (args.k + 1), ignore_eos=True))
    times: dict[str, list[float]] = {"plain": [], "verify": []}
    core.proposer = plain
    for _ in range(8):  # prefill and warm-up
        engine.step()
    for _ in range(args.blocks):
        for mode, proposer in (("plain", plain), ("verify", drafting)):
            core.proposer = proposer
            engine.step()  # the first step of a block verifies the previous block's drafts
            for _ in range(args.steps):
                current_platform.synchronize()
                t0 = time.perf_counter()
                engine.step()
                current_platform.synchronize()
                times[mode].append(time.perf_counter() - t0)
    plain_s, verify_s = statistics.median(times["plain"]), statistics.median(times["verify"])
    ratio = verify_s / plain_s
    speedup = {f"acceptance_{int(a * 100)}": sum(a**i for i in range(args.k + 1)) / ratio for a in (0.5, 0.8)}
    print("RESULT " + json.dumps({
        "shape": args.shape, "k": args.k, "device": current_platform.name,
        "median_plain_step_ms": 1e3 * plain_s, "median_verify_step_ms": 1e3 * verify_s,
        "verify_over_plain": ratio, "speedup_at": speedup, "stats": str(engine.get_stats()),
    }))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
