#!/usr/bin/env python3
"""Cost of applying a grammar bitmask to a batch of logits, per kernel, in one run.

For each batch size, a bitmask shaped like JSON-constrained decoding (most 32-token words
all banned, a few all allowed, a few mixed) is applied to float32 logits by octavo's host
kernel (``apply_token_bitmask``, numpy, the sampler's choice on a host CPU) and by xgrammar's kernel
(``apply_token_bitmask_xgrammar``, the baseline); every row constrained, as in a decode
batch. Reports the median microseconds per call of ``--repeats`` and the ratio to xgrammar.

  python benchmarks/bitmask_apply_bench.py --batch-sizes 1 8 32 128 --vocab 4096
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time

import torch

from octavo.core.sampler import apply_token_bitmask, apply_token_bitmask_xgrammar


def json_like_bitmask(rows: int, vocab: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    words = (vocab + 31) // 32
    mask = torch.zeros(rows, words, dtype=torch.int32)
    r = torch.rand(rows, words, generator=g)
    mask[r < 0.05] = -1
    mixed = r > 0.95
    mask[mixed] = torch.randint(-(2**31), 2**31 - 1, (int(mixed.sum()),), dtype=torch.int32, generator=g)
    return mask


def time_kernel(kernel, logits: torch.Tensor, bitmask: torch.Tensor, repeats: int) -> float:
    rows = list(range(logits.shape[0]))
    times = []
    for _ in range(repeats):
        x = logits.clone()
        t0 = time.perf_counter()
        kernel(x, rows, bitmask)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 32, 128])
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--repeats", type=int, default=200)
    args = ap.parse_args()
    results = []
    for b in args.batch_sizes:
        logits = torch.randn(b, args.vocab, generator=torch.Generator().manual_seed(b))
        bitmask = json_like_bitmask(b, args.vocab)
        ours = time_kernel(apply_token_bitmask, logits, bitmask, args.repeats)
        base = time_kernel(apply_token_bitmask_xgrammar, logits, bitmask, args.repeats)
        results.append({"batch": b, "octavo_us": ours * 1e6, "xgrammar_us": base * 1e6, "ratio": ours / base})
        print(f"batch {b:4d}: octavo {ours * 1e6:8.1f} us   xgrammar {base * 1e6:8.1f} us   "
              f"ratio {ours / base:.2f}x", flush=True)
    print(json.dumps({"machine": platform.processor() or platform.machine(), "vocab": args.vocab,
                      "threads": torch.get_num_threads(), "results": results}))


if __name__ == "__main__":
    main()
