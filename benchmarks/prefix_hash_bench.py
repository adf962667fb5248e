#!/usr/bin/env python3
"""Cost of prefix-cache block hashing on long prompts, per algorithm, in one run.

For each prompt length, hashes every full block of a random prompt (what the scheduler does
once per new request) with each ``--prefix-caching-hash-algo`` choice and, as the same-run
baseline, Python's builtin tuple hash (octavo's former default, 64-bit and unsafe: a collision
hands one request another's KV). Reports microseconds per prompt, per 1k tokens, and the ratio
to the baseline; the median of ``--repeats`` timings.

  python benchmarks/prefix_hash_bench.py --lengths 2048 8192 32768 --block-size 16
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time

import numpy as np

from octavo.core.block_hash import extend_block_hashes, get_hash_function


def _builtin(parent, token_ids, extra):
    return hash((0 if parent is None else parent, tuple(token_ids), extra))


def time_hashing(fn, tokens: list[int], block_size: int, repeats: int) -> float:
    """Median seconds to hash every full block of ``tokens`` (salted, as a tenant's request)."""
    times = []
    for _ in range(repeats):
        hashes: list = []
        t0 = time.perf_counter()
        extend_block_hashes(hashes, tokens, block_size, "tenant-a", fn)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lengths", type=int, nargs="+", default=[2048, 8192, 32768])
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--json-out", default=None)
    args = ap.parse_args()
    algos = {"builtin (baseline)": _builtin}
    for name in ("sha256", "xxhash"):
        try:
            algos[name] = get_hash_function(name)
        except ValueError as e:
            print(f"skipping {name}: {e}")
    rng = np.random.default_rng(0)
    rows = []
    print(f"machine: {platform.processor() or platform.machine()}, python {platform.python_version()}")
    print(f"{'tokens':>7} {'algo':>20} {'us/prompt':>10} {'us/1k tok':>10} {'x baseline':>10}")
    for n in args.lengths:
        tokens = rng.integers(3, 150_000, size=n).tolist()
        base = None
        for name, fn in algos.items():
            t = time_hashing(fn, tokens, args.block_size, args.repeats)
            base = base or t
            rows.append({"tokens": n, "algo": name, "seconds": t, "ratio": t / base})
            print(f"{n:>7} {name:>20} {t * 1e6:>10.0f} {t * 1e6 / n * 1000:>10.1f} {t / base:>10.2f}")
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump({"block_size": args.block_size, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
