#!/usr/bin/env python3
"""Offline throughput with quantized weights and an fp8 KV cache against the unquantized
model, in one run.

Runs ``octavo bench throughput`` (dummy weights at a model *shape*, no download) once per
variant, ``METHOD[:KV_CACHE_DTYPE]`` (``none`` = unquantized weights, the KV cache ``auto``
unless given), and prints each one's output tokens per second and its ratio to the first.

    python benchmarks/bench_quant_throughput.py --shape llama8b --variants none,fp8,fp8:fp8   # CUDA
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_quant import bench_cmd, bench_model, common_parser  # noqa: E402


def output_tok_s(model: Path, variant: str, args, out_dir: Path) -> float:
    """Output tokens per second of one ``octavo bench throughput`` run."""
    out = out_dir / f"throughput_{variant.replace(':', '_')}.json"
    subprocess.run(bench_cmd("throughput", model, variant, args, out) + ["--num-prompts", str(args.num_prompts)],
                   check=True)
    return float(json.loads(out.read_text())["results"]["octavo"]["summary"]["output_tok_per_s"])


def main() -> int:
    ap = common_parser(__doc__, 512, 256)
    ap.add_argument("--variants", default="none,fp8,fp8:fp8")
    ap.add_argument("--num-prompts", type=int, default=128)
    args = ap.parse_args()
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    model = bench_model(args.shape)
    rows = [{"variant": v, "output_tok_s": output_tok_s(model, v, args, out_dir)} for v in args.variants.split(",")]
    for r in rows:
        r.update(output_tok_s=round(r["output_tok_s"], 1), ratio_vs_first=round(r["output_tok_s"] / rows[0]["output_tok_s"], 3))
        print("RESULT " + json.dumps(r), flush=True)
    (out_dir / "bench_quant_throughput.json").write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
