#!/usr/bin/env python3
"""Batch-1 decode latency of quantized linears against the unquantized model, in one run.

Runs ``octavo bench latency`` (dummy weights at a model *shape*, no download) once per
``--quantization`` value and prints each one's median time per output token and its ratio to
the unquantized baseline measured in the same run. Online methods only (``int8``, ``fp8``):
the dummy weights are quantized at load like a real checkpoint's would be.

    python benchmarks/bench_quant.py --shape llama8b --methods none,fp8,int8        # CUDA
    python benchmarks/bench_quant.py --shape tiny --methods none,int8 --dtype bfloat16   # CPU

The report names the kernel each quantized run chose (``quantization_kernels``).
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


def run_one(model: Path, method: str, args: argparse.Namespace, out_dir: Path) -> dict:
    out = out_dir / f"latency_{method}.json"
    cmd = [sys.executable, "-m", "octavo.entrypoints.cli", "bench", "latency", "--model", str(model),
           "--load-format", "dummy", "--dtype", args.dtype, "--batch-size", str(args.batch_size),
           "--input-len", str(args.input_len), "--output-len", str(args.output_len),
           "--num-iters", str(args.num_iters), "--num-iters-warmup", "1", "--backend", "octavo",
           "--max-model-len", str(args.input_len + args.output_len + 16), "--disable-tqdm",
           "--output-json", str(out)]
    if method != "none":
        cmd += ["--quantization", method]
    subprocess.run(cmd, check=True)
    report = json.loads(out.read_text())
    s, env = report["results"]["octavo"]["summary"], report["environment"]
    return {"method": method, "median_tpot_ms": s["median_tpot_ms"], "median_e2e_s": s["median_e2e_s"],
            "kernels": env.get("quantization_kernels", ""), "weights_mib": env.get("model_weights_mib"),
            "device": env.get("device"), "platform": env.get("platform")}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="llama8b", choices=sorted(SHAPES))
    ap.add_argument("--methods", default="none,fp8,int8")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--batch-size", type=int, default=1)
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--num-iters", type=int, default=3)
    ap.add_argument("--out", default=os.environ.get("OUT", tempfile.gettempdir()))
    args = ap.parse_args()
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    model = write_model_dir(args.shape, Path(tempfile.gettempdir()) / "octavo_bench_models")
    rows = [run_one(model, m, args, out_dir) for m in args.methods.split(",")]
    base = next((r for r in rows if r["method"] == "none"), rows[0])
    for r in rows:
        r["tpot_ratio_vs_baseline"] = round(r["median_tpot_ms"] / base["median_tpot_ms"], 3)
        print("RESULT " + json.dumps(r), flush=True)
    (out_dir / "bench_quant.json").write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
