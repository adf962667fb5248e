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


def bench_cmd(kind: str, model: Path, variant: str, args: argparse.Namespace, out: Path) -> list[str]:
    """``octavo bench KIND`` on the dummy-weight ``model`` for ``variant`` = ``METHOD[:KV_CACHE_DTYPE]``
    (``none``: unquantized weights; the KV cache ``auto`` unless given)."""
    method, _, kv = variant.partition(":")
    cmd = [sys.executable, "-m", "octavo.entrypoints.cli", "bench", kind, "--model", str(model),
           "--load-format", "dummy", "--dtype", args.dtype, "--input-len", str(args.input_len),
           "--output-len", str(args.output_len), "--backend", "octavo",
           "--max-model-len", str(args.input_len + args.output_len + 16), "--output-json", str(out),
           "--kv-cache-dtype", kv or "auto"]
    return cmd + (["--quantization", method] if method != "none" else [])


def common_parser(doc: str, input_len: int, output_len: int) -> argparse.ArgumentParser:
    """The options both quantization benchmarks take."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="llama8b", choices=sorted(SHAPES))
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--input-len", type=int, default=input_len)
    ap.add_argument("--output-len", type=int, default=output_len)
    ap.add_argument("--out", default=os.environ.get("OUT", tempfile.gettempdir()))
    return ap


def bench_model(shape: str) -> Path:
    return write_model_dir(shape, Path(tempfile.gettempdir()) / "octavo_bench_models")


def run_one(model: Path, method: str, args: argparse.Namespace, out_dir: Path) -> dict:
    out = out_dir / f"latency_{method}.json"
    cmd = bench_cmd("latency", model, method, args, out) + [
        "--batch-size", str(args.batch_size), "--num-iters", str(args.num_iters), "--num-iters-warmup", "1",
        "--disable-tqdm"]
    subprocess.run(cmd, check=True)
    report = json.loads(out.read_text())
    s, env = report["results"]["octavo"]["summary"], report["environment"]
    return {"method": method, "median_tpot_ms": s["median_tpot_ms"], "median_e2e_s": s["median_e2e_s"],
            "kernels": env.get("quantization_kernels", ""), "weights_mib": env.get("model_weights_mib"),
            "device": env.get("device"), "platform": env.get("platform")}


def main() -> int:
    ap = common_parser(__doc__, 128, 128)
    ap.add_argument("--methods", default="none,fp8,int8")
    ap.add_argument("--batch-size", type=int, default=1)
    ap.add_argument("--num-iters", type=int, default=3)
    args = ap.parse_args()
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    model = bench_model(args.shape)
    rows = [run_one(model, m, args, out_dir) for m in args.methods.split(",")]
    base = next((r for r in rows if r["method"] == "none"), rows[0])
    for r in rows:
        r["tpot_ratio_vs_baseline"] = round(r["median_tpot_ms"] / base["median_tpot_ms"], 3)
        print("RESULT " + json.dumps(r), flush=True)
    (out_dir / "bench_quant.json").write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
