"""Tile configurations of the Triton grouped GEMM: a small tuned table and a heuristic.

The table is keyed by (device name, dtype, E, I, H) and maps an upper bound on the number of
token-expert pairs (``M``) to tile sizes; the first bucket ``>= M`` is used. Shapes not in the
table use ``default_config``, which sizes ``BLOCK_M`` to the expected tokens per expert (a
decode step routes ~M/E pairs to each active expert, so a large BLOCK_M mostly multiplies
zero padding) and widens tiles for large batches where the GEMMs become compute-bound.

``benchmarks/bench_moe.py --tune`` measures candidates on a device and prints table entries.

Few pairs skip the grouped GEMM for ``triton_gemv`` (one GEMV per pair): ``use_gemv`` decides
from the static shape (the number of tokens is fixed per captured graph), ``gemv_config`` gives
its tiles.
"""

from __future__ import annotations

import functools

import torch

Config = dict[str, int]

# (device-name substring, dtype, E, I, H) -> [(max pairs M, config), ...] ascending in M.
# Entries for the Qwen3-30B-A3B expert shape (128 experts, I=768, H=2048) in bf16 on Hopper,
# reasoned from the shape and laid out like vLLM's tuned table for this shape on the H200
# (not yet measured here; ``bench_moe.py kernel --tune`` prints replacements):
# - BLOCK_M stays 16 while experts average <= 8 pairs (<= 1024 pairs = 128 tokens of top-8): a
#   bigger M tile reads the same weights and only multiplies padding; 32 from ~16 pairs per
#   expert, 64 and 128 once the GEMMs approach compute-bound;
# - the gate/up program holds two weight tiles (gate and up), so its BLOCK_N covers twice the
#   weight columns of an unfused kernel's: 128 here is vLLM's 256;
# - up to 64 pairs the per-pair GEMV path runs instead (``use_gemv``); the first entry serves
#   only when that path is turned off;
# - every entry compiles for sm_90 without register spills (BLOCK_M 32 with two 32x128 fp32
#   accumulators needs 8 warps; with 4 it spills).
TUNED: dict[tuple[str, torch.dtype, int, int, int], list[tuple[int, Config]]] = {
    ("H200", torch.bfloat16, 128, 768, 2048): [
        (64, dict(BLOCK_M=16, BLOCK_N=32, BLOCK_K=128, GROUP_M=1, num_warps=4, num_stages=4)),
        (256, dict(BLOCK_M=16, BLOCK_N=64, BLOCK_K=128, GROUP_M=1, num_warps=4, num_stages=3)),
        (1024, dict(BLOCK_M=16, BLOCK_N=128, BLOCK_K=128, GROUP_M=1, num_warps=4, num_stages=2)),
        (2048, dict(BLOCK_M=32, BLOCK_N=128, BLOCK_K=128, GROUP_M=8, num_warps=8, num_stages=2)),
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


# -- the small-batch GEMV path ------------------------------------------------------------
# Timed on an H200 at the Qwen3-30B-A3B shape (bf16, CUDA graphs, cold L2): the best of six
# candidates at 1 and 8 tokens, 18% and 15% faster than 8-row gate/up and 4-row down tiles
# (``benchmarks/bench_moe.py gemv --tune``).
GEMV_CONFIG: Config = dict(
    GATE_UP_BLOCK_N=4, GATE_UP_BLOCK_K=512, GATE_UP_WARPS=4,
    DOWN_BLOCK_N=2, DOWN_BLOCK_K=256, DOWN_WARPS=4,
)


def gemv_config(dtype: torch.dtype) -> Config:
    """Tiles of ``triton_gemv``. Each program streams ``BLOCK_N`` weight rows in ``BLOCK_K``
    chunks; narrow rows make the grid (pairs x rows / BLOCK_N) large enough that every SM has
    several programs' loads in flight, which is what a weight stream needs. float32 halves
    ``BLOCK_K`` so a chunk keeps the same bytes and registers."""
    cfg = dict(GEMV_CONFIG)
    if dtype == torch.float32:
        cfg["GATE_UP_BLOCK_K"] //= 2
        cfg["DOWN_BLOCK_K"] //= 2
    return cfg


def gemv_max_pairs(num_experts: int, top_k: int) -> int:
    """Largest number of token-expert pairs that takes the GEMV path.

    The GEMV path requests an expert's weights once per pair; the grouped GEMM once per expert
    (plus its padding and the align pass). With P pairs routed at random over E experts the
    expected number of distinct experts is ``E * (1 - (1 - 1/E) ** P)``; at ``P = E / 2``
    that is ``0.39 E``: 1.27 requests per distinct expert. The GEMV kernels order programs so
    that repeats mostly hit L2, but that is not guaranteed, and the repeats grow quickly past
    this point, so the bound is ``E / 2`` pairs (64 for 128 experts: 8 tokens of top-8), never
    below ``top_k`` (one token's k experts are distinct: batch 1 reads each exactly once).
    Measured on an H200 (128 experts, top-8): the GEMV path is 1.27x the grouped GEMM's speed
    at 1 token, 1.07x at 8 (64 pairs, these tiles) and 0.77x at 16 (wider tiles).
    ``OCTAVO_MOE_GEMV_MAX_PAIRS`` overrides the bound (0 turns the path off).
    """
    from octavo import envs

    forced = envs.OCTAVO_MOE_GEMV_MAX_PAIRS
    if forced is not None:
        return forced
    return max(num_experts // 2, top_k)


def use_gemv(num_pairs: int, num_experts: int, top_k: int) -> bool:
    """Whether ``num_pairs`` token-expert pairs run on the GEMV path (see ``gemv_max_pairs``)."""
    return 0 < num_pairs <= gemv_max_pairs(num_experts, top_k)
