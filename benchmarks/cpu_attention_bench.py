#!/usr/bin/env python3
"""Microbenchmark of octavo's CPU paged-attention kernels against ``torch_ref``, same run.

Default case: decode attention for 32 sequences x 1024 tokens of
context with the Llama-3-8B head configuration (32 query heads, 8 KV heads, head size 128),
bf16, block size 16. Everything is timed in this process on the same batch; the JSON carries
the times (median, min, max over repeats) and the ratios ``torch_ref / cpu_paged``.

``--query-len N`` gives every sequence N query tokens after its context (``--context 0
--query-len 200``: prompts' prefill, causal); the report adds GFLOP/s of Q.K^T and P.V.

Extra sweeps, all on the same batch:
  --variants   every ISA variant this CPU runs (avx512_bf16, avx512, avx2, scalar, ...)
  --block-sizes 16,32,64,128

Example:
  python benchmarks/cpu_attention_bench.py --threads 2 --variants \\
      --block-sizes 16,32,64,128 --json-out attn.json
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

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from octavo.attention.backend import CommonAttentionMetadata  # noqa: E402

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def make_decode_batch(num_seqs, context, heads, kv_heads, head_size, block_size, dtype, seed=0, query_len=1):
    """Every sequence has ``context`` cached tokens and ``query_len`` new query tokens (1: a
    decode batch; ``context`` 0: prompts' prefill)."""
    import numpy as np

    g = torch.Generator().manual_seed(seed)
    rng = np.random.default_rng(seed)
    seq_len = context + query_len
    blocks_per = -(-seq_len // block_size)
    num_blocks = 1 + num_seqs * blocks_per
    perm = rng.permutation(np.arange(1, num_blocks)).astype(np.int32)
    block_table = perm.reshape(num_seqs, blocks_per)
    pos = (context + np.arange(query_len))[None, :].repeat(num_seqs, 0)
    rows = np.arange(num_seqs)[:, None]
    slots = (block_table[rows, pos // block_size].astype(np.int64) * block_size + pos % block_size).reshape(-1)
    qsl = np.arange(num_seqs + 1, dtype=np.int64) * query_len
    seq_lens = np.full(num_seqs, seq_len, dtype=np.int64)
    n = num_seqs * query_len

    def rand(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float32).to(dtype)

    md = CommonAttentionMetadata(
        query_start_loc=torch.from_numpy(qsl.astype(np.int32)),
        seq_lens=torch.from_numpy(seq_lens.astype(np.int32)),
        block_table=torch.from_numpy(block_table),
        slot_mapping=torch.from_numpy(slots),
        query_start_loc_cpu=qsl,
        seq_lens_cpu=seq_lens,
        num_reqs=num_seqs,
        num_actual_tokens=n,
        max_query_len=query_len,
        max_seq_len=seq_len,
        block_size=block_size,
    )
    q = rand(n, heads, head_size)
    k = rand(n, kv_heads, head_size)
    v = rand(n, kv_heads, head_size)
    ref_cache = rand(2, num_blocks, block_size, kv_heads, head_size)
    return q, k, v, ref_cache, md


def timeit(fn, repeats, min_time=0.2):
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        n, t0 = 0, time.perf_counter()
        while True:
            fn()
            n += 1
            el = time.perf_counter() - t0
            if el >= min_time:
                break
        times.append(el / n)
    return {"median_ms": statistics.median(times) * 1e3, "min_ms": min(times) * 1e3,
            "max_ms": max(times) * 1e3, "repeats": repeats}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--num-seqs", type=int, default=32)
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--query-len", type=int, default=1, help="query tokens per sequence (> 1: prefill)")
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--head-size", type=int, default=128)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--dtype", choices=list(DTYPES), default="bf16")
    ap.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--variants", action="store_true", help="time every ISA variant this CPU runs")
    ap.add_argument("--block-sizes", default=None, help="comma list, e.g. 16,32,64,128")
    ap.add_argument("--no-ref", action="store_true", help="skip torch_ref (slow)")
    ap.add_argument("--json-out", default=None)
    args = ap.parse_args()

    if args.threads:
        torch.set_num_threads(args.threads)
    from octavo import cpu_isa
    from octavo.attention.backends.cpu_paged import build_cpu_metadata, cache_from_reference
    from octavo.attention.backends.torch_ref import paged_attention_ref, write_kv

    dtype = DTYPES[args.dtype]
    H, Hk, D = args.heads, args.kv_heads, args.head_size
    scale = D**-0.5
    default_variant, why = cpu_isa.select_variant()
    variants = [default_variant]
    if args.variants:
        for isa in cpu_isa.ARCH_ISAS.get(cpu_isa.machine(), ("scalar",)):
            for v in cpu_isa.ISA_VARIANTS[isa]:
                if v not in variants and cpu_isa.variant_runs_here(v) and cpu_isa._variant_built(v):
                    variants.append(v)
    block_sizes = [int(b) for b in args.block_sizes.split(",")] if args.block_sizes else [args.block_size]

    result = {
        "benchmark": "cpu_paged_attention_decode" if args.query_len == 1 else "cpu_paged_attention_prefill",
        "case": {"num_seqs": args.num_seqs, "context": args.context, "query_len": args.query_len, "heads": H, "kv_heads": Hk,
                 "head_size": D, "dtype": args.dtype},
        "threads": torch.get_num_threads(),
        "machine": {"cpu": cpu_isa.cpu_features(), "arch": platform.machine(), "nproc": os.cpu_count()},
        "default_variant": default_variant,
        "runs": [],
    }
    print(f"[attn] {args.num_seqs} seqs x {args.context} ctx, H={H} Hk={Hk} D={D} {args.dtype}, "
          f"threads={torch.get_num_threads()}, default variant {default_variant}", flush=True)
    ql, ctx = args.query_len, args.context
    kv_bytes = args.num_seqs * (ctx + ql) * Hk * D * 2 * torch.empty((), dtype=dtype).element_size()
    # Q.K^T and P.V over the keys each query token sees (causal within its chunk)
    flops = 4 * args.num_seqs * H * D * (ql * ctx + ql * (ql + 1) / 2)

    for bs in block_sizes:
        q, k, v, ref_cache, md = make_decode_batch(args.num_seqs, args.context, H, Hk, D, bs, dtype,
                                                   query_len=args.query_len)
        ref = None
        if not args.no_ref:
            cache_r = ref_cache.clone()

            def run_ref(cache_r=cache_r, md=md, q=q, k=k, v=v):
                write_kv(k, v, cache_r, md.slot_mapping)
                return paged_attention_ref(q, cache_r, md, scale)

            ref_out = run_ref()
            ref = timeit(run_ref, max(2, args.repeats // 2), min_time=0.0)
            print(f"[attn] bs={bs} torch_ref: {ref['median_ms']:.2f} ms", flush=True)
            result["runs"].append({"impl": "torch_ref", "block_size": bs, **ref})
        mdc = build_cpu_metadata(md)
        cache = cache_from_reference(ref_cache)
        for variant in variants:
            ext = cpu_isa.load_variant(variant)
            out = torch.empty_like(q)

            def run(ext=ext, cache=cache, out=out, mdc=mdc, q=q, k=k, v=v):
                ext.write_kv(key=k, value=v, kv_cache=cache, slot_mapping=mdc.slot_mapping)
                ext.paged_attention(query=q, out=out, kv_cache=cache, query_start_loc=mdc.query_start_loc,
                                    seq_lens=mdc.seq_lens, block_table=mdc.block_table, scale=scale)

            t = timeit(run, args.repeats)
            entry = {"impl": "cpu_paged", "variant": variant, "block_size": bs, **t,
                     "kv_read_GBps": kv_bytes / (t["median_ms"] * 1e-3) / 1e9,
                     "GFLOPs": flops / (t["median_ms"] * 1e-3) / 1e9}
            if ref is not None:
                err = float((out.double() - ref_out.double()).norm() / ref_out.double().norm())
                entry.update(speedup_vs_torch_ref=ref["median_ms"] / t["median_ms"], rel_err=err)
            result["runs"].append(entry)
            sp = f", {entry['speedup_vs_torch_ref']:.0f}x torch_ref, err {entry['rel_err']:.1e}" if ref else ""
            print(f"[attn] bs={bs} {variant:>12}: {t['median_ms']:.3f} ms "
                  f"[{t['min_ms']:.3f}-{t['max_ms']:.3f}], {entry['kv_read_GBps']:.1f} GB/s, "
                  f"{entry['GFLOPs']:.0f} GFLOP/s{sp}", flush=True)
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(result, f, indent=2)
    print("[attn] RESULT " + json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
