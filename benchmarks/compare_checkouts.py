#!/usr/bin/env python3
"""``octavo bench throughput`` on several checkouts of octavo, interleaved, in one run.

Each round runs the benchmark once per checkout (a fresh process each, ``PYTHONPATH`` set to
the checkout), in the order given; rounds repeat. A busy or shared machine then slows every
checkout alike within a round, and the report gives, per checkout, the median output tok/s,
the median process CPU seconds per output token (less sensitive to other load than wall time)
and the median per-round ratio of each to the first checkout (the baseline)::

    git worktree add /tmp/base <commit>   # and copy the built octavo/_C_*.so into it
    python benchmarks/compare_checkouts.py --rounds 4 /tmp/base . -- \\
        --num-prompts 256 --input-len 128 --output-len 128 --threads 2

Everything after ``--`` goes to ``octavo bench throughput`` (run from a scratch directory: give
absolute paths).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time


def run_once(checkout: str, bench_args: list[str]) -> dict:
    """One benchmark process on ``checkout``: its output tok/s, CPU s and load at start."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "r.json")
        env = dict(os.environ, PYTHONPATH=os.path.abspath(checkout))
        cmd = [sys.executable, "-m", "octavo.entrypoints.cli", "bench", "throughput", *bench_args,
               "--disable-tqdm", "--output-json", out]
        load = os.getloadavg()[0]
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        # cwd: not a checkout (python -m puts the working directory first on sys.path)
        subprocess.run(cmd, env=env, cwd=tmp, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wall = time.perf_counter() - t0
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        with open(out) as f:
            report = json.load(f)
    summary = report["results"]["octavo"]["summary"]
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {
        "output_tok_per_s": summary["output_tok_per_s"],
        "cpu_s": cpu,  # the whole process: load, warm-up and the timed run
        "cpu_ms_per_output_token": 1e3 * cpu / summary["total_output_tokens"],
        "process_wall_s": wall,
        "load": load,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("checkouts", nargs="+", help="repository roots; the first is the baseline")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--output-json", default=None)
    argv = sys.argv[1:]
    split = argv.index("--") if "--" in argv else len(argv)
    args = p.parse_args(argv[:split])
    bench_args = argv[split + 1:]
    runs: dict[str, list[dict]] = {c: [] for c in args.checkouts}
    for r in range(args.rounds):
        for c in args.checkouts:
            res = run_once(c, bench_args)
            runs[c].append(res)
            print(f"round {r + 1} {c}: {res['output_tok_per_s']:.1f} output tok/s, "
                  f"{res['cpu_ms_per_output_token']:.3f} CPU ms/output token, load {res['load']:.2f}", flush=True)
    base = args.checkouts[0]
    print(f"\nmedians over {args.rounds} rounds (ratios: per round, vs {base})")
    print(f"{'checkout':40s} {'out tok/s':>10s} {'ratio':>7s} {'CPU ms/tok':>11s} {'ratio':>7s}")
    summary = {}
    for c in args.checkouts:
        tps = [x["output_tok_per_s"] for x in runs[c]]
        cpu = [x["cpu_ms_per_output_token"] for x in runs[c]]
        tps_ratio = [a["output_tok_per_s"] / b["output_tok_per_s"] for a, b in zip(runs[c], runs[base], strict=True)]
        cpu_ratio = [a["cpu_ms_per_output_token"] / b["cpu_ms_per_output_token"]
                     for a, b in zip(runs[c], runs[base], strict=True)]
        summary[c] = {
            "median_output_tok_per_s": statistics.median(tps),
            "median_tok_per_s_ratio": statistics.median(tps_ratio),
            "median_cpu_ms_per_output_token": statistics.median(cpu),
            "median_cpu_ratio": statistics.median(cpu_ratio),
        }
        s = summary[c]
        print(f"{c:40s} {s['median_output_tok_per_s']:10.1f} {s['median_tok_per_s_ratio']:7.3f} "
              f"{s['median_cpu_ms_per_output_token']:11.3f} {s['median_cpu_ratio']:7.3f}")
    if args.output_json:
        with open(args.output_json, "w") as f:
            json.dump({"bench_args": bench_args, "runs": runs, "summary": summary}, f, indent=1)


if __name__ == "__main__":
    main()
