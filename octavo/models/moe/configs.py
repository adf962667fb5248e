"""Tile configurations of the Triton grouped GEMM: a small tuned table and a heuristic.

The table is keyed by (device name, dtype, E, I, H) and maps an upper bound on the number of
token-expert pairs (``M``) to tile sizes; the first bucket ``>= M`` is used. Shapes not in the
table use ``default_config``, which sizes ``BLOCK_M`` to the expected tokens per expert (a
decode step routes ~M/E pairs to each active expert, so a large BLOCK_M mostly multiplies
zero padding) and widens tiles for large batches where the GEMMs become compute-bound.

``benchmarks/bench_moe.py --tune`` measures candidates on a device and prints table entries.
"""

from __future__ import annotations

import functools

import torch

Config = dict[str, int]

# (device-name substring, dtype, E, I, H) -> [(max pairs M, config), ...] ascending in M.
# Starting entries for the Qwen3-30B-A3B expert shape (128 experts, I=768, H=2048) in bf16 on
# Hopper, reasoned from the shape (not yet measured); replace them with what the sweep prints.
TUNED: dict[tuple[str, torch.dtype, int, int, int], list[tuple[int, Config]]] = {
    ("H200", torch.bfloat16, 128, 768, 2048): [
        # Decode: ~M/E pairs per expert; narrow N tiles put more SMs on the weight stream.
        (64, dict(BLOCK_M=16, BLOCK_N=32, BLOCK_K=128, GROUP_M=1, num_warps=4, num_stages=4)),
        (512, dict(BLOCK_M=16, BLOCK_N=128, BLOCK_K=128, GROUP_M=1, num_warps=4, num_stages=3)),
        (4096, dict(BLOCK_M=64, BLOCK_N=128, BLOCK_K=64, GROUP_M=8, num_warps=4, num_stages=3)),
        (1 << 62, dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, GROUP_M=8, num_warps=8, num_stages=3)),
    ],
}


def default_config(num_experts: int, num_pairs: int, dtype: torch.dtype) -> Config:
    """Heuristic tiles for any shape: BLOCK_M follows the pairs each expert expects."""
    per_expert = max(1, num_pairs // max(1, num_experts))
    if per_expert <= 16:
        cfg = dict(BLOCK_M=16, BLOCK_N=64, BLOCK_K=128, GROUP_M=1, num_warps=4, num_stages=3)
    elif per_expert <= 64:
        cfg = dict(BLOCK_M=32, BLOCK_N=64, BLOCK_K=64, GROUP_M=8, num_warps=4, num_stages=3)
    elif per_expert <= 256:
        cfg = dict(BLOCK_M=64, BLOCK_N=128, BLOCK_K=64, GROUP_M=8, num_warps=4, num_stages=3)
    else:
        cfg = dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, GROUP_M=8, num_warps=8, num_stages=3)
    if dtype == torch.float32:  # twice the bytes per element: halve K to keep shared memory
        cfg["BLOCK_K"] = min(cfg["BLOCK_K"], 32)
        cfg["num_stages"] = 2
    return cfg


@functools.lru_cache(maxsize=64)
def _device_name(device_index: int) -> str:
    from octavo.platforms import current_platform

    return current_platform.get_device_name(device_index)


def get_config(
    num_experts: int, inter: int, hidden: int, num_pairs: int, dtype: torch.dtype, top_k: int,
    device_index: int = 0,
) -> Config:
    """Tiles for one grouped GEMM call; a tuned entry when the table has this shape."""
    name = _device_name(device_index) if TUNED else ""
    for (dev, dt, e, i, h), buckets in TUNED.items():
        if dev in name and (dt, e, i, h) == (dtype, num_experts, inter, hidden):
            for bound, cfg in buckets:
                if num_pairs <= bound:
                    return cfg
    return default_config(num_experts, num_pairs, dtype)
