#!/usr/bin/env python3
"""Offline throughput with quantized weights and an fp8 KV cache against the unquantized
model, in one run.

Runs ``octavo bench throughput`` (dummy weights at a model *shape*, no download) once per
variant, ``METHOD[:KV_CACHE_DTYPE]`` (``none`` = unquantized weights, the KV cache ``auto``
unless given), and prints each one's output tokens per second and its ratio to the first.

    python benchmarks/bench_quant_throughput.py --shape llama8b --variants none,fp8,fp8:fp8   # CUDA
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_cuda import SHAPES, write_model_dir  # noqa: E402


def run_one(model: Path, variant: str, args: argparse.Namespace, out_dir: Path) -> dict:
    method, _, kv = variant.partition(":")
    out = out_dir / f"throughput_{variant.replace(':', '_')}.json"
    cmd = [sys.executable, "-m", "octavo.entrypoints.cli", "bench", "throughput", "--model", str(model),
           "--load-format", "dummy", "--dtype", args.dtype, "--num-prompts", str(args.num_prompts),
           "--input-len", str(args.input_len), "--output-len", str(args.output_len), "--backend", "octavo",
           "--max-model-len", str(args.input_len + args.output_len + 16), "--output-json", str(out),
           "--kv-cache-dtype", kv or "auto"]
    if method != "none":
        cmd += ["--quantization", method]
    subprocess.run(cmd, check=True)
    report = json.loads(out.read_text())
    return {"variant": variant, "report": report}


def output_tok_s(report: dict) -> float:
    """Output tokens per second from a ``bench throughput`` report."""
    return float(report["results"]["octavo"]["summary"]["output_tok_per_s"])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="llama8b", choices=sorted(SHAPES))
    ap.add_argument("--variants", default="none,fp8,fp8:fp8")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--num-prompts", type=int, default=128)
    ap.add_argument("--input-len", type=int, default=512)
    ap.add_argument("--output-len", type=int, default=256)
    ap.add_argument("--out", default=os.environ.get("OUT", tempfile.gettempdir()))
    args = ap.parse_args()
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    model = write_model_dir(args.shape, Path(tempfile.gettempdir()) / "octavo_bench_models")
    rows = [run_one(model, v, args, out_dir) for v in args.variants.split(",")]
    base = output_tok_s(rows[0]["report"])
    for r in rows:
        tok_s = output_tok_s(r.pop("report"))
        r.update(output_tok_s=round(tok_s, 1), ratio_vs_first=round(tok_s / base, 3))
        print("RESULT " + json.dumps(r), flush=True)
    (out_dir / "bench_quant_throughput.json").write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
