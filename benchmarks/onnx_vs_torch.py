#!/usr/bin/env python3
"""ONNX Runtime runner vs octavo's torch path on the same checkpoint, one run, interleaved.

    python benchmarks/onnx_vs_torch.py --model DIR [--onnx EXPORT_DIR ...] [--torch-graph] [--rounds 3]

``DIR`` is an HF folder octavo loads; each ``--onnx`` folder is ``octavo export onnx DIR`` of it
(fp32, int4, ...). Without ``--onnx`` a float32 export is written to a temporary folder first.
Every engine is an ``LLM`` in this process (``--model-impl onnxruntime`` for the exports), all
greedy with ``ignore_eos`` on random token prompts (fresh per round, so no prefix-cache hits):

  batch 1    128 prompt tokens: TTFT (a 1-token generate) and time per output token
             TPOT = (e2e of a 128-token generate - TTFT) / 127
  batch 32   32 x (128 in + 128 out): output tokens / s

Rounds interleave the engines (round r runs every engine's batch-1 then batch-32 workload),
so drift on a shared machine hits all of them; the report gives per-engine medians and, per
round, each engine's ratio against the first torch dtype (``--torch-dtypes``), plus the load
average before and after every round.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _prompts(n: int, length: int, seed: int, vocab: int) -> list[list[int]]:
    import numpy as np

    return np.random.default_rng(seed).integers(3, vocab, size=(n, length)).tolist()


def _generate(llm, prompts: list[list[int]], n: int) -> float:
    from octavo import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=n, min_tokens=n, ignore_eos=True)
    t0 = time.perf_counter()
    llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    return time.perf_counter() - t0


def _engines(args) -> dict:
    from octavo import LLM

    engines = {}
    common = dict(max_model_len=args.max_model_len, seed=0, max_num_seqs=max(args.batch, 1))
    for dtype in args.torch_dtypes.split(","):
        t0 = time.perf_counter()
        engines[f"torch-{dtype}"] = (LLM(args.model, dtype=dtype, **common), time.perf_counter() - t0)
        if args.torch_graph:  # the same engine with the CPU graph mode (compile time counted)
            os.environ["OCTAVO_CPU_GRAPH_MODE"] = "torch_compile"
            try:
                t0 = time.perf_counter()
                llm = LLM(args.model, dtype=dtype, **common)
                engines[f"torch-{dtype}-compiled"] = (llm, time.perf_counter() - t0)
            finally:
                del os.environ["OCTAVO_CPU_GRAPH_MODE"]
    for folder in args.onnx:
        t0 = time.perf_counter()
        name = f"onnxruntime-{os.path.basename(os.path.normpath(folder))}"
        engines[name] = (LLM(folder, model_impl="onnxruntime", **common), time.perf_counter() - t0)
    return engines


def _round(engines: dict, args, r: int) -> dict:
    out = {"load_before": os.getloadavg()}
    for name, (llm, _) in engines.items():
        ttft = _generate(llm, _prompts(1, args.input_len, 7000 + r, args.vocab), 1)
        e2e = _generate(llm, _prompts(1, args.input_len, 8000 + r, args.vocab), args.output_len)
        wall = _generate(llm, _prompts(args.batch, args.input_len, 9000 + r, args.vocab), args.output_len)
        out[name] = {"ttft_s": ttft, "tpot_s": (e2e - ttft) / (args.output_len - 1),
                     "batch_tok_s": args.batch * args.output_len / wall}
        print(f"[round {r}] {name}: TTFT {ttft * 1e3:.1f} ms, TPOT {out[name]['tpot_s'] * 1e3:.2f} ms, "
              f"batch {args.batch}: {out[name]['batch_tok_s']:.1f} tok/s", flush=True)
    out["load_after"] = os.getloadavg()
    return out


def _summary(rounds: list[dict], names: list[str]) -> dict:
    base = names[0]
    summary = {}
    for name in names:
        med = {k: statistics.median(r[name][k] for r in rounds) for k in ("ttft_s", "tpot_s", "batch_tok_s")}
        # > 1 means this engine is faster than the baseline (time ratios inverted).
        speedup = {
            "tpot": [r[base]["tpot_s"] / r[name]["tpot_s"] for r in rounds],
            "ttft": [r[base]["ttft_s"] / r[name]["ttft_s"] for r in rounds],
            "batch_throughput": [r[name]["batch_tok_s"] / r[base]["batch_tok_s"] for r in rounds],
        }
        summary[name] = {"median": med, f"speedup_vs_{base}_per_round": speedup}
    return summary


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True)
    p.add_argument("--onnx", action="append", default=[], help="an exported folder (repeatable)")
    p.add_argument("--torch-dtypes", default="float32", help="comma-separated; the first is the baseline")
    p.add_argument("--torch-graph", action="store_true",
                   help="also each torch dtype with the CPU graph mode (OCTAVO_CPU_GRAPH_MODE=torch_compile)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--max-model-len", type=int, default=1024)
    p.add_argument("--vocab", type=int, default=4000, help="prompt ids are drawn from [3, vocab)")
    p.add_argument("--json-out", default=None)
    args = p.parse_args()
    sys.path.insert(0, ROOT)
    with tempfile.TemporaryDirectory() as tmp:
        if not args.onnx:
            from octavo.entrypoints.cli import main as octavo_main

            args.onnx = [os.path.join(tmp, "fp32")]
            octavo_main(["export", "onnx", args.model, "--output", args.onnx[0], "--max-model-len", str(args.max_model_len)])
        engines = _engines(args)
        for llm, _ in engines.values():  # warm-up
            _generate(llm, _prompts(2, 16, 1, args.vocab), 4)
        rounds = [_round(engines, args, r) for r in range(args.rounds)]
    import torch

    from octavo import cpu_isa

    report = {
        "machine": {"cpu": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
                    "torch_threads": torch.get_num_threads(), "octavo_cpu_kernels": cpu_isa.describe()},
        "workload": {k: getattr(args, k) for k in ("batch", "input_len", "output_len", "rounds")},
        "startup_s": {name: s for name, (_, s) in engines.items()},
        "rounds": rounds,
        "summary": _summary(rounds, list(engines)),
    }
    print(json.dumps(report["summary"], indent=1))
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
