"""Decode-batch quantized linears on one NVIDIA GPU, a tile sweep: FP8 (per-channel weight
scales, dynamic per-token activations, the activation quantization included) over every
``fp8_candidates`` tiling (CUDA-core FMA, rows, and fp8 x fp8 tensor-core tiles) and
``torch._scaled_mm`` (and the table's tiling with its K split summed by a second kernel instead
of its last program: ``no-counters``), W4A16 (group 128, asymmetric) over every ``candidates``
tiling, next to cuBLAS bf16; every Llama-3.1-8B linear at M = 1, 2, 4, 8, each
timed like ``bench_gemv.py linears`` (one CUDA graph over 32 distinct weights, so the weights
stream from memory as in decode).

Reported per linear and M: the table choice (what octavo runs today), the fastest tiling, and
per-token totals (32 layers + the LM head) for both against the bf16 roofline (bf16 weight
bytes / the copy bandwidth measured in the same run). Targets (issue: quantization): FP8 <= 0.6x
and INT4 <= 0.4x that roofline at batch 1.

    python benchmarks/bench_quant_gemv.py [--only qkv,o] [--batches 1,2] [--json-out F]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from bench_gemv import DEVICE, LAYERS, LINEARS, copy_bandwidth, graph_seconds, log  # noqa: E402

GROUP = 128


def _time(calls, count: int) -> float:
    calls = calls * (max(count, 4) // len(calls))
    return graph_seconds(calls)


def sweep_w4(n: int, k: int, count: int, batches, sms: int, gen) -> dict:
    """{M: {"table": (name, s), "best": (name, s), "all": {name: s}}} for W4A16 at [N, K]: the
    table's tiling (what octavo runs) and every ``candidates`` tiling."""
    import torch

    from octavo.quantization.kernels import triton_w4a16 as w4

    packs = []
    for _ in range(count):
        q = torch.randint(0, 16, (n, k), device=DEVICE, dtype=torch.uint8, generator=gen)
        sc = torch.rand(n, k // GROUP, device=DEVICE, generator=gen) * 0.01
        z = torch.randint(0, 16, (n, k // GROUP), device=DEVICE, dtype=torch.uint8, generator=gen)
        packs.append(w4.prepack_w4a16(q, sc, z, GROUP))
        del q
    out = {}
    for m in batches:
        x = torch.randn(m, k, device=DEVICE, generator=gen).bfloat16()
        table = packs[0].configs[w4._bucket(m)]
        ref = w4.launch(x, packs[0], table).float()
        times = {}
        for cfg in w4.candidates(n, k, m, sms):
            try:
                err = float((w4.launch(x, packs[0], cfg).float() - ref).norm() / ref.norm())
                calls = [lambda p=p, x=x, cfg=cfg: w4.launch(x, p, cfg) for p in packs]
                times[cfg.describe()] = _time(calls, count) if err < 1e-2 else float("nan")
            except Exception as e:
                log(f"w4 [{n},{k}] M={m} {cfg.describe()}: {e!r}"[:300])
                times[cfg.describe()] = float("nan")
        out[m] = _summary(table.describe(), times)
    return out


def sweep_fp8(n: int, k: int, count: int, batches, sms: int, gen) -> dict:
    """The same for FP8 per-channel weights: every candidate tiling and ``_scaled_mm``."""
    import torch

    from octavo.quantization.kernels import triton_fp8 as f8

    packs = []
    for _ in range(count):
        w = torch.randn(n, k, device=DEVICE, generator=gen)
        s = (w.abs().amax(1) / f8.FP8_MAX).clamp_min(1e-12)
        packs.append(f8.prepack_fp8((w / s[:, None]).to(torch.float8_e4m3fn), s))
        del w
    out = {}
    for m in batches:
        x = torch.randn(m, k, device=DEVICE, generator=gen).bfloat16()
        table = packs[0].configs[f8._bucket(m)]
        cands = {c.describe(): c for c in [table] + f8.fp8_candidates(n, k, m, packs[0].scale_mode, sms)}
        cands["scaled_mm"] = None
        ref = f8.fp8_linear(x, packs[0]).float()
        bare = [f8.Fp8Packed(p.weight, p.scale, p.scale_mode, p.scale_row, p.configs, None) for p in packs]
        times = {f"{table.describe()} no-counters": _time([lambda p=p, x=x: f8.fp8_linear(x, p) for p in bare], count)}
        for name, cfg in cands.items():
            def run(p, cfg=cfg, x=x):
                xq, xs = f8.quantize_rows(x)
                return f8._gemm(xq, xs, p, None, x.dtype) if cfg is None else f8._gemv(xq, xs, p, None, x.dtype, cfg)

            try:
                err = float((run(packs[0]).float() - ref).norm() / ref.norm())
                times[name] = _time([lambda p=p: run(p) for p in packs], count) if err < 2e-2 else float("nan")
            except Exception as e:
                log(f"fp8 [{n},{k}] M={m} {name}: {e!r}"[:300])
                times[name] = float("nan")
        out[m] = _summary(table.describe(), times)
    return out


def cublas(n: int, k: int, count: int, batches, gen) -> dict:
    import torch

    ws = [torch.randn(n, k, device=DEVICE, generator=gen, dtype=torch.bfloat16) for _ in range(count)]
    res = {}
    for m in batches:
        x = torch.randn(m, k, device=DEVICE, generator=gen).bfloat16()
        res[m] = _time([lambda w=w, x=x: torch.nn.functional.linear(x, w) for w in ws], count)
    return res


def _summary(table: str, times: dict) -> dict:
    ok = {k: v for k, v in times.items() if v == v}
    best = min(ok, key=ok.get) if ok else None
    return {"table": [table, times.get(table)], "best": [best, ok.get(best)], "all": times}


def per_token(res: dict, bw: float, batches) -> dict:
    """Totals over one decode token (32 layers of each linear + the LM head) vs the bf16 roofline."""
    bf16_bytes = sum(2 * n * k * (LAYERS if c > 1 else 1) for n, k, c in LINEARS.values())
    roof = bf16_bytes / bw
    out = {"bf16_roofline_ms": roof * 1e3}
    for m in batches:
        for key in ("cublas", "w4_table", "w4_best", "fp8_table", "fp8_best"):
            total = 0.0
            for name, (_, _, c) in LINEARS.items():
                r = res.get(name)
                if r is None or (key != "cublas" and key.split("_")[0] not in r):
                    total = float("nan")
                    break
                kind, pick = key.split("_") if "_" in key else (key, None)
                t = r["cublas"][m] if pick is None else r[kind][m][pick][1]
                total += (t if t is not None else float("nan")) * (LAYERS if c > 1 else 1)
            out[f"{key}_M{m}"] = {"ms": total * 1e3, "vs_bf16_roofline": total / roof}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", default="", help="comma-separated linears (default all)")
    ap.add_argument("--batches", default="1,2,4,8")
    ap.add_argument("--formats", default="w4,fp8", help="comma-separated: w4, fp8 (cuBLAS bf16 always runs)")
    ap.add_argument("--json-out", default=None)
    args = ap.parse_args()
    import torch

    from octavo.quantization.kernels import triton_gemv as g

    batches = [int(b) for b in args.batches.split(",")]
    only = [x for x in args.only.split(",") if x]
    bw = copy_bandwidth()
    sms = g.num_sms(torch.device(DEVICE))
    report = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "bandwidth_Bps": bw,
              "group": GROUP, "linears": {}}
    gen = torch.Generator(device=DEVICE).manual_seed(0)
    for name, (n, k, count) in LINEARS.items():
        if only and name not in only:
            continue
        r = report["linears"][name] = {"N": n, "K": k, "cublas": cublas(n, k, count, batches, gen)}
        torch.cuda.empty_cache()
        for fmt, sweep in (("w4", sweep_w4), ("fp8", sweep_fp8)):
            if fmt in args.formats.split(","):
                r[fmt] = sweep(n, k, count, batches, sms, gen)
                torch.cuda.empty_cache()
        for m in batches:
            line = f"{name} M={m}: cublas {r['cublas'][m] * 1e6:.1f}us"
            for fmt in ("w4", "fp8"):
                if fmt in r:
                    line += f" | {fmt} table {_us(r[fmt][m]['table'])} best {_us(r[fmt][m]['best'])}"
            log(line)
        if args.json_out:  # after every linear: a timeout still leaves the finished ones
            Path(args.json_out).write_text(json.dumps(report, indent=1))
    report["per_token"] = per_token(report["linears"], bw, batches)
    for key, v in report["per_token"].items():
        if isinstance(v, dict):
            print(f"per token {key}: {v['ms']:.3f} ms = {v['vs_bf16_roofline']:.3f}x bf16 roofline")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(report, indent=1))
    return 0


def _us(pair) -> str:
    name, t = pair
    return f"{name} {t * 1e6:.1f}us" if t is not None and t == t else f"{name} -"


if __name__ == "__main__":
    raise SystemExit(main())
