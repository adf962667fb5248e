#!/usr/bin/env python3
"""Batch throughput of quantized weights against bf16 on the CPU, same model, same run.

Per round and variant (rounds interleaved, so machine load hits all alike): ``octavo bench
throughput`` (``--batch`` requests of ``--input-len`` + ``--output-len`` tokens, all at once:
output and total tokens per second) and ``octavo bench latency --batch-size B`` (the batch's
prefill time, TTFT, and its time per decode step, TPOT). Variants: ``bf16`` (the checkpoint),
``int8`` (``--quantization int8``: online weight-only, per channel), ``int4`` (``--int4-model``,
e.g. the W4A16 g32 copy ``bench_llamacpp.py`` writes); a ``+a8`` suffix sets
``OCTAVO_CPU_INT8_ACTIVATIONS=1``, ``+lm8`` ``OCTAVO_CPU_INT8_LM_HEAD=1``. The report has
medians and each variant's ratio to bf16 per round and its median.

    python benchmarks/bench_cpu_batch.py --model <smol-135m> --int4-model <smol-135m-w4a16-g32> \\
        --variants bf16,int8,int4 --batch 32 --threads 2 --rounds 3 --json-out b.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
METRICS = ("output_tok_per_s", "total_tok_per_s", "ttft_ms", "tpot_ms")


def run_variant(args, variant: str, out: Path) -> dict[str, float]:
    """One round of ``variant``: throughput and latency figures."""
    base, *opts = variant.split("+")
    model = args.int4_model if base == "int4" else args.model
    flags = ["--dtype", "bfloat16", *(["--quantization", "int8"] if base == "int8" else [])]
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           "OCTAVO_CPU_INT8_ACTIVATIONS": "1" if "a8" in opts else "0",
           "OCTAVO_CPU_INT8_LM_HEAD": "1" if "lm8" in opts else "0"}
    common = ["--model", model, "--input-len", str(args.input_len), "--output-len", str(args.output_len),
              "--threads", str(args.threads), "--max-model-len", str(args.input_len + args.output_len),
              "--max-num-seqs", str(args.batch), "--disable-tqdm", *flags]
    cli = [sys.executable, "-m", "octavo.entrypoints.cli", "bench"]
    subprocess.run([*cli, "throughput", "--num-prompts", str(args.batch), "--output-json", out / "t.json", *common],
                   env=env, check=True, stdout=subprocess.DEVNULL)
    subprocess.run([*cli, "latency", "--batch-size", str(args.batch), "--num-iters-warmup", "1",
                    "--num-iters", str(args.iters), "--output-json", out / "l.json", *common],
                   env=env, check=True, stdout=subprocess.DEVNULL)
    t = json.loads((out / "t.json").read_text())["results"]["octavo"]["summary"]
    lat = json.loads((out / "l.json").read_text())["results"]["octavo"]["summary"]
    return {"output_tok_per_s": t["output_tok_per_s"], "total_tok_per_s": t["total_tok_per_s"],
            "ttft_ms": lat["median_ttft_ms"], "tpot_ms": lat["median_tpot_ms"], "load_avg_1m": os.getloadavg()[0]}


def summarise(rounds: list[dict], variants: list[str]) -> dict:
    """Medians per variant, and per-round ratios to bf16 with their medians."""
    out = {}
    for v in variants:
        s = {m: statistics.median(r[v][m] for r in rounds) for m in METRICS}
        if "bf16" in variants:
            for m in METRICS:
                s[f"median_ratio_{m}"] = statistics.median(r[v][m] / r["bf16"][m] for r in rounds)
        out[v] = s
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="bf16 HF checkpoint")
    p.add_argument("--int4-model", default=None, help="its W4A16 copy (variant int4)")
    p.add_argument("--variants", default="bf16,int8")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--iters", type=int, default=2, help="`bench latency` --num-iters")
    p.add_argument("--json-out", default=None)
    args = p.parse_args()
    variants = args.variants.split(",")
    if any(v.startswith("int4") for v in variants) and not args.int4_model:
        p.error("variant int4 needs --int4-model")
    rounds = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.rounds):
            order = variants if i % 2 == 0 else variants[::-1]
            rounds.append({v: run_variant(args, v, Path(tmp)) for v in order})
            print(f"round {i}: " + "; ".join(f"{v} {r['output_tok_per_s']:.0f} out tok/s, TTFT {r['ttft_ms']:.0f} ms, "
                                               f"TPOT {r['tpot_ms']:.1f} ms" for v, r in rounds[-1].items()), flush=True)
    report = {"batch": args.batch, "input_len": args.input_len, "output_len": args.output_len,
              "threads": args.threads, "rounds": rounds, "summary": summarise(rounds, variants)}
    for v, s in report["summary"].items():
        ratio = f" ({s['median_ratio_output_tok_per_s']:.2f}x bf16 output tok/s, TTFT {s['median_ratio_ttft_ms']:.2f}x, " \
                f"TPOT {s['median_ratio_tpot_ms']:.2f}x)" if "median_ratio_ttft_ms" in s else ""
        print(f"{v:>10}: {s['output_tok_per_s']:.0f} output tok/s, {s['total_tok_per_s']:.0f} total tok/s, "
              f"TTFT {s['ttft_ms']:.0f} ms, TPOT {s['tpot_ms']:.2f} ms{ratio}")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
