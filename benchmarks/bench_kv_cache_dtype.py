#!/usr/bin/env python3
"""Triton paged attention and KV write per layer call with a 16-bit and an fp8 KV cache (GPU).

Shapes of a Llama-3.1-8B layer (32 query heads, 8 KV heads, head size 128, blocks of 16):
128 decodes over 768 cached tokens, 8 prefill chunks of 512, and one decode over 4096 tokens
(split-KV). Each call is timed over 20 launches after 3 warm-up ones (a device synchronize
around them); printed in microseconds per call.

    python benchmarks/bench_kv_cache_dtype.py
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.attention.paged_cases import make_batch  # noqa: E402

CASES = {"decode128x768": ([(768, 1)] * 128, 1), "prefill8x512": ([(0, 512)] * 8, 1), "decode1x4096": ([(4096, 1)], 8)}
FORMATS = {"auto": None, "fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}


def _time(fn, iters: int = 20) -> float:
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(iters):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / iters * 1e6


def bench(seqs, segments: int, kv_dtype) -> tuple[float, float]:
    from octavo.attention.ops.paged_attention import paged_attention, write_kv

    q, k, v, cache, md = make_batch(seqs, num_heads=32, num_kv_heads=8, head_size=128, block_size=16,
                                    dtype=torch.bfloat16, device="cuda")
    c = cache if kv_dtype is None else cache.to(kv_dtype)
    out = torch.empty_like(q)
    attn = _time(lambda: paged_attention(q, c, out, md.query_start_loc, md.seq_lens, md.block_table, md.num_reqs,
                                         md.max_query_len, 0.088, num_segments=segments))
    return attn, _time(lambda: write_kv(k, v, c, md.slot_mapping))


def main() -> int:
    for name, (seqs, segments) in CASES.items():
        for fmt, dtype in FORMATS.items():
            attn, write = bench(seqs, segments, dtype)
            print("RESULT " + json.dumps({"case": name, "kv_cache_dtype": fmt, "attention_us": round(attn, 1),
                                          "write_us": round(write, 1)}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
