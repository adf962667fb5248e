#!/usr/bin/env python3
"""Structured-output overhead per output token on one engine, before/after the host bitmask
kernel, interleaved in one process.

Each iteration runs the same random prompts three ways back to back through ``octavo bench
latency``'s own iteration (``--batch-size`` requests, greedy, exactly ``--output-len``
tokens): unconstrained (the baseline), under the benchmark JSON Schema with xgrammar's bitmask
kernel applying the mask (``xgrammar``, the former CPU path) and with octavo's host kernel
(``host``, the CPU path now); the order of the two constrained runs alternates. Reports, per
kernel, constrained / unconstrained time per output token (TPOT) and this process's CPU time
per output token (robust to other load on the machine), the median over iterations.

  python benchmarks/structured_overhead_bench.py --batch-size 32 --output-len 64 --num-iters 10
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="default: the shipped model")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--input-len", type=int, default=32)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--num-iters", type=int, default=10)
    args = ap.parse_args()

    from octavo import LLM
    from octavo.benchmarks.datasets import random_requests, special_ids
    from octavo.benchmarks.latency import octavo_iteration
    from octavo.core.sampler import apply_token_bitmask, apply_token_bitmask_xgrammar

    llm = LLM(model=args.model) if args.model else LLM()
    engine = llm.llm_engine
    sampler = engine.core.runner.sampler
    kernels = {"xgrammar": apply_token_bitmask_xgrammar, "host": apply_token_bitmask}
    ratios: dict[str, dict[str, list[float]]] = {k: {"tpot": [], "cpu": []} for k in kernels}
    tok = engine.tokenizer
    vocab, special = len(tok), special_ids(tok)
    for it in range(args.num_iters + 1):  # iteration 0 warms up
        reqs = random_requests(args.batch_size, args.input_len, args.output_len, vocab, seed=1 + it,
                               exclude_ids=special)
        base = octavo_iteration(engine, reqs, args.output_len)
        for name in (("xgrammar", "host") if it % 2 else ("host", "xgrammar")):
            sampler.apply_bitmask = kernels[name]
            run = octavo_iteration(engine, reqs, args.output_len, structured=True)
            if it:
                ratios[name]["tpot"].append(run["mean_tpot_s"] / base["mean_tpot_s"])
                ratios[name]["cpu"].append(run["cpu_s_per_token"] / base["cpu_s_per_token"])
    summary = {name: {k: statistics.median(v) for k, v in r.items()} for name, r in ratios.items()}
    for name, s in summary.items():
        print(f"batch {args.batch_size}, {name} kernel: constrained / unconstrained TPOT {s['tpot']:.3f}x, "
              f"CPU time per token {s['cpu']:.3f}x")
    print(json.dumps({"machine": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
                      "load_avg": os.getloadavg(), "args": vars(args), "median": summary, "per_iter": ratios}))


if __name__ == "__main__":
    main()
