#!/usr/bin/env python3
"""The fastest a CPU can process a prompt in bf16: a lower bound on time to first token.

A prompt of N tokens costs (per decoder layer) the q/k/v/o and MLP linears for all N tokens,
causal attention, and the LM head for the last token only. This script counts those FLOPs for a
model's ``config.json`` and divides them by this machine's bf16 matmul rate measured in the same
run, two ways:

- ``square``: torch's bf16 GEMM on one large square product (the best case the BLAS reaches);
- ``shapes``: every linear of the model at N rows timed alone, summed (what a perfect engine that
  only ran the linears, back to back with nothing between them, would take).

With ``--llamacpp-json`` (a ``bench_llamacpp.py`` report) it also prints, per round, llama.cpp's
prompt time and the smallest TTFT ratio to it that those bounds allow: where that ratio is above a
target, no engine using this machine's bf16 matmul can reach the target.

    python benchmarks/cpu_prefill_bound.py --model <smol-135m> --threads 2 --prompt-len 128 \\
        --llamacpp-json l.json --json-out bound.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path


def _dims(cfg: dict) -> tuple[int, int, int, int, int, int]:
    """(hidden, intermediate, layers, query heads, KV heads, head size) of a ``config.json``."""
    h, heads = cfg["hidden_size"], cfg["num_attention_heads"]
    return (h, cfg["intermediate_size"], cfg["num_hidden_layers"], heads,
            cfg.get("num_key_value_heads", heads), cfg.get("head_dim") or h // heads)


def linear_shapes(cfg: dict) -> list[tuple[int, int, int]]:
    """(out_features, in_features, count per model) of the decoder's linears, fused as octavo runs them."""
    h, inter, layers, heads, kv, d = _dims(cfg)
    return [((heads + 2 * kv) * d, h, layers), (h, heads * d, layers), (2 * inter, h, layers), (h, inter, layers)]


def prefill_flops(cfg: dict, n: int) -> dict[str, float]:
    """FLOPs of a prompt of ``n`` tokens: linears (all tokens), causal attention, LM head (1 token)."""
    h, _, layers, heads, _, d = _dims(cfg)
    linears = 2.0 * n * sum(o * i * count for o, i, count in linear_shapes(cfg))
    attention = 2.0 * 2 * heads * d * (n * (n + 1) / 2) * layers  # QK^T and PV over the causal half
    lm_head = 2.0 * h * cfg["vocab_size"]
    return {"linears": linears, "attention": attention, "lm_head": lm_head,
            "total": linears + attention + lm_head}


def best_seconds(fn, reps: int) -> float:
    fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def measure(cfg: dict, n: int, reps: int) -> dict[str, float]:
    """bf16 GEMM rates of this machine: one large square product, and the model's linears at n rows."""
    import torch

    g = torch.Generator().manual_seed(0)
    a = torch.randn(2048, 2048, generator=g).bfloat16()
    square = 2.0 * 2048**3 / best_seconds(lambda: torch.mm(a, a), reps)
    shapes_s = 0.0
    for out_f, in_f, count in linear_shapes(cfg):
        x = torch.randn(n, in_f, generator=g).bfloat16()
        w = torch.randn(out_f, in_f, generator=g).bfloat16()
        shapes_s += count * best_seconds(lambda x=x, w=w: torch.nn.functional.linear(x, w), reps)
    return {"square_gflops": square / 1e9, "linears_alone_ms": shapes_s * 1e3}


def llamacpp_pp_ms(path: Path) -> list[float]:
    """llama.cpp's bf16 prompt-processing times, one per round, from a bench_llamacpp.py report."""
    report = json.loads(path.read_text())
    return [r["types"]["bf16"]["llamacpp"]["pp_ms"] for r in report["rounds"] if "bf16" in r["types"]]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="a directory with config.json")
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--llamacpp-json", type=Path)
    ap.add_argument("--json-out", type=Path)
    args = ap.parse_args()

    import torch

    from octavo.cpu_isa import cpu_name

    torch.set_num_threads(args.threads)
    cfg = json.loads((Path(args.model) / "config.json").read_text())
    flops = prefill_flops(cfg, args.prompt_len)
    rates = measure(cfg, args.prompt_len, args.reps)
    bound_square_ms = flops["total"] / (rates["square_gflops"] * 1e9) * 1e3
    report = {"cpu": cpu_name(), "threads": args.threads, "prompt_len": args.prompt_len,
              "gflop": {k: round(v / 1e9, 3) for k, v in flops.items()},
              "square_gemm_gflops": round(rates["square_gflops"], 1),
              "bound_ms_at_square_rate": round(bound_square_ms, 2),
              "linears_alone_ms": round(rates["linears_alone_ms"], 2)}
    if args.llamacpp_json:
        pp = llamacpp_pp_ms(args.llamacpp_json)
        report["llamacpp_pp_ms"] = pp
        report["min_ttft_ratio_at_square_rate"] = [round(bound_square_ms / p, 3) for p in pp]
        report["min_ttft_ratio_linears_alone"] = [round(rates["linears_alone_ms"] / p, 3) for p in pp]
        report["median_llamacpp_pp_ms"] = statistics.median(pp)
    print(json.dumps(report, indent=1))
    if args.json_out:
        args.json_out.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
