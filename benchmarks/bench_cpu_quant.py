#!/usr/bin/env python3
"""Per-step time of every linear of a decoder on the CPU: bf16 ``F.linear`` vs octavo's INT8/INT4.

Default shape: SmolLM2-135M (hidden 576, intermediate 1536, 30 layers, 9 query / 3 KV heads of
64, vocab 49152, tied lm_head), with the linears as octavo runs them: fused qkv (576 -> 960),
o (576 -> 576), fused gate_up (576 -> 3072), down (1536 -> 576) per layer, then the lm_head.
Every layer has its own weights (nothing stays cache-resident that would not in a real model).
One step = every linear once at batch M. The kinds (bf16 = ``F.linear``, oneDNN; bf16-gemv = octavo's
own bf16 GEMV, what the decode step runs unquantized up to its row limit (``cpu_fused_ops``);
int8 per-channel; int4 with groups; ``-a8``: int8 activations, W8A8 / W4A8; ``-nodp``: without
the VDPBF16PS kernel, the fp32-FMA GEMM) are timed in interleaved rounds in one process, so machine
load hits all of them alike; the report gives medians, the ratio to bf16, the weight bytes
streamed per step and the resulting GB/s, the load average and the kernel variant. On a shared
machine the process CPU time (all threads, spin-waits included) is reported beside the wall
time: it is far less sensitive to other processes taking the cores.

Example:
  python benchmarks/bench_cpu_quant.py --threads 2 --batch 1,32 --rounds 15 --json-out q.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from octavo import cpu_isa  # noqa: E402
from octavo.models import cpu_fused_ops  # noqa: E402
from octavo.quantization.kernels import cpu_int  # noqa: E402


def layer_shapes(hidden: int, inter: int, heads: int, kv_heads: int, head_dim: int) -> list[tuple[int, int]]:
    """(N, K) of one decoder layer's linears as octavo fuses them."""
    return [(heads * head_dim + 2 * kv_heads * head_dim, hidden), (hidden, heads * head_dim),
            (2 * inter, hidden), (hidden, inter)]


def make_kind(kind: str, shapes: list[tuple[int, int]], variant: str | None, seed: int):
    """(list of per-linear callables' state, bytes of weights read per step)."""
    g = torch.Generator().manual_seed(seed)
    weights, nbytes = [], 0
    for n, k in shapes:
        if kind in ("bf16", "bf16-gemv"):
            w = (torch.randn(n, k, generator=g) * 0.02).to(torch.bfloat16)
            weights.append(w if kind == "bf16" else cpu_fused_ops.pack_gemv_weight(w))
            nbytes += w.numel() * 2
            continue
        base, _, opt = kind.partition("-")
        bits, group = (8, k) if base == "int8" else (4, int(base.split("g")[1]))
        q = torch.randint(0, 1 << bits, (n, k), generator=g, dtype=torch.uint8)
        scales = torch.rand(n, k // group, generator=g) * 0.01
        zeros = torch.full((n, k // group), 1 << (bits - 1), dtype=torch.uint8)
        p = cpu_int.prepack_int(q, scales, zeros, bits, variant=variant, amx=opt != "noamx", act_int8=opt == "a8",
                                 dpbf16=opt != "nodp")
        weights.append(p)
        nbytes += p.nbytes
    return weights, nbytes


def step(kind: str, weights, xs: dict[int, torch.Tensor]) -> None:
    for w in weights:
        if kind == "bf16":
            F.linear(xs[w.shape[1]], w)
        elif kind == "bf16-gemv":
            cpu_fused_ops.gemv(xs[w.shape[1] * 2], w)  # packed [N/16, K/2, 16, 2]
        else:
            cpu_int.int_linear(xs[w.k], w)


def run(args) -> dict:
    torch.set_num_threads(args.threads)
    shapes = layer_shapes(args.hidden, args.intermediate, args.heads, args.kv_heads, args.head_dim) * args.layers
    shapes.append((args.vocab, args.hidden))
    kinds = args.kinds.split(",")
    made = {k: make_kind(k, shapes, args.variant, seed=i) for i, k in enumerate(kinds)}
    result = {"machine": platform.machine(), "cpu": cpu_isa.cpu_name(), "threads": args.threads,
              "variant": args.variant or cpu_isa.describe(), "linears_per_step": len(shapes),
              "bytes_per_step": {k: made[k][1] for k in kinds}, "load_before": os.getloadavg(), "batches": {}}
    for m in [int(b) for b in args.batch.split(",")]:
        xs = {k: torch.randn(m, k).to(torch.bfloat16) for k in {k for _, k in shapes}}
        for kind in kinds:  # warm-up
            step(kind, made[kind][0], xs)
        times: dict[str, list[float]] = {k: [] for k in kinds}
        cpu: dict[str, list[float]] = {k: [] for k in kinds}
        for r in range(args.rounds):
            order = kinds if r % 2 == 0 else kinds[::-1]
            for kind in order:
                t0, c0 = time.perf_counter(), time.process_time()
                step(kind, made[kind][0], xs)
                times[kind].append(time.perf_counter() - t0)
                cpu[kind].append(time.process_time() - c0)
        med = {k: statistics.median(v) for k, v in times.items()}
        result["batches"][m] = {
            k: {"median_ms": med[k] * 1e3, "min_ms": min(times[k]) * 1e3, "max_ms": max(times[k]) * 1e3,
                "ratio_vs_bf16": med[k] / med["bf16"] if "bf16" in med else None,
                "cpu_ms": statistics.median(cpu[k]) * 1e3,
                "cpu_ratio_vs_bf16": statistics.median(cpu[k]) / statistics.median(cpu["bf16"]) if "bf16" in med else None,
                "GB_per_s": made[k][1] / med[k] / 1e9}
            for k in kinds
        }
    result["load_after"] = os.getloadavg()
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--batch", default="1", help="comma-separated batch sizes (rows per step)")
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--kinds", default="bf16,int8,int4g128,int4g32",
                   help="bf16, bf16-gemv, int8 (per-channel), int4g<group>; an int kind with the suffix -noamx keeps "
                        "bf16 batches off the AMX path (where the CPU has AMX), with -a8 quantizes the "
                        "activations to int8 per token (AVX512-VNNI), with -nodp keeps bf16 batches off the "
                        "VDPBF16PS kernel (avx512_bf16 without AMX)")
    p.add_argument("--variant", default=None, help="kernel build to use (default: the selected one)")
    p.add_argument("--hidden", type=int, default=576)
    p.add_argument("--intermediate", type=int, default=1536)
    p.add_argument("--layers", type=int, default=30)
    p.add_argument("--heads", type=int, default=9)
    p.add_argument("--kv-heads", type=int, default=3)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--vocab", type=int, default=49152)
    p.add_argument("--json-out", default=None)
    args = p.parse_args()
    res = run(args)
    print(f"{res['cpu']} ({res['machine']}), {res['threads']} threads, kernels {res['variant']}; "
          f"load average before {res['load_before'][0]:.2f}, after {res['load_after'][0]:.2f}")
    for m, per in res["batches"].items():
        for kind, r in per.items():
            ratio = f"{r['ratio_vs_bf16']:.3f}x bf16" if r["ratio_vs_bf16"] is not None else ""
            cratio = f"{r['cpu_ratio_vs_bf16']:.3f}x" if r["cpu_ratio_vs_bf16"] is not None else ""
            print(f"batch {m:>3} {kind:>9}: {r['median_ms']:8.2f} ms/step (min {r['min_ms']:.2f}, "
                  f"max {r['max_ms']:.2f})  {ratio:>14}  {r['GB_per_s']:6.1f} GB/s of weights  "
                  f"| CPU time {r['cpu_ms']:8.2f} ms {cratio}")
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(res, f, indent=2)


if __name__ == "__main__":
    main()
