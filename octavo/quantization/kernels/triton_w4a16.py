"""W4A16 linears on NVIDIA GPUs: 4-bit weights dequantized in registers by a Triton kernel that
is a split-K GEMV for decode batches (M <= 8) and a tiled GEMM above.

Contract (``prepack_w4a16`` / ``w4a16_linear``): the canonical tensors every loader produces
(AWQ and GPTQ included, after their own unpacking): ``q`` uint8 [N, K] codes 0..15, ``scales``
float32 [N, K // group], ``zeros`` uint8 [N, K // group] (8 for symmetric formats);
``w[n, k] = (q[n, k] - zeros[n, k // group]) * scales[n, k // group]``; ``y = x @ w.T (+ bias)``
in x's dtype (bf16, fp16 or fp32).

Repack, once at load: eight codes per int32 along K (code ``k = 8j + i`` in bits ``4i..4i+3``
of word ``j``), so a 128-bit load brings 32 weights; zeros become float32 beside the scales.
The kernel feeds ``q - zero`` (exact small integers) to the dot and multiplies each K tile's
fp32 partial sums by its group's scales: no bf16 rounding of the dequantized weight.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from octavo.quantization.kernels import triton_gemv as g

SMALL_BATCH = 8


@dataclass
class W4A16Packed:
    """A 4-bit weight ready for ``w4a16_linear`` (made once at load by ``prepack_w4a16``)."""

    packed: torch.Tensor  # int32 [N, K // 8]
    scales: torch.Tensor  # float32 [N, K // group]
    zeros: torch.Tensor  # float32 [N, K // group]
    n: int
    k: int
    group: int
    configs: dict[int, g.GemvConfig] = field(default_factory=dict)  # batch bucket -> tiles
    counters: torch.Tensor | None = None  # int32 zeros: in-kernel K-split sums (``g.launch``)


def pack_int4(q: torch.Tensor) -> torch.Tensor:
    """uint8 codes [N, K] (0..15, K % 8 == 0) -> int32 [N, K // 8], eight codes per word."""
    n, k = q.shape
    shifts = torch.arange(0, 32, 4, dtype=torch.int64, device=q.device)
    words = (q.reshape(n, k // 8, 8).to(torch.int64) << shifts).sum(-1)
    words = torch.where(words >= 2**31, words - 2**32, words)
    return words.to(torch.int32).contiguous()


def tile_k(group: int, k: int, want: int) -> int:
    """The largest power of two <= ``want`` (and >= 8) that a group boundary never splits."""
    if group == k:
        return want
    bk = want
    while bk > 8 and group % bk:
        bk //= 2
    return bk


def _config(n: int, k: int, group: int, m: int, sms: int, fp32: bool) -> g.GemvConfig:
    if m == 1 or fp32:  # FMA tiles may span groups (a scale per 8-code word)
        bn, bk, dot = 16, 1024, False
    elif m <= SMALL_BATCH:  # one group per dot tile: small groups take more rows per tile
        bk = tile_k(group, k, 256)
        bn, dot = min(128, max(16, 4096 // bk)), True  # 512 words: 16 bytes per thread
    else:
        return g.GemvConfig(64, tile_k(group, k, 64), 1, True, 4)
    return g.GemvConfig(bn, bk, g.pick_split(n, k, bn, bk, sms), dot, 4)


def prepack_w4a16(q: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, group: int) -> W4A16Packed:
    """Validate the canonical tensors and repack them for the kernel (once, at load)."""
    if q.dtype != torch.uint8 or q.dim() != 2:
        raise ValueError(f"w4a16 codes must be uint8 [N, K], got {q.dtype} {tuple(q.shape)}")
    n, k = q.shape
    if k % 8:
        raise ValueError(f"w4a16 needs K divisible by 8, got K={k}")
    if group <= 0 or k % group or (group % 8 and group != k):
        raise ValueError(f"w4a16 group size {group} must divide K={k} and be a multiple of 8")
    want = (n, k // group)
    if tuple(scales.shape) != want or tuple(zeros.shape) != want:
        raise ValueError(
            f"w4a16 scales {tuple(scales.shape)} and zeros {tuple(zeros.shape)} must both be {list(want)}"
        )
    sms = g.num_sms(q.device)
    configs = {m: _config(n, k, group, m, sms, False) for m in (1, 2, 4, 8)}
    return W4A16Packed(
        pack_int4(q), scales.to(torch.float32).contiguous(), zeros.to(torch.float32).contiguous(),
        n, k, group, configs, g.new_counters(n, q.device),
    )


def _bucket(m: int) -> int:
    return 1 if m <= 1 else 2 if m <= 2 else 4 if m <= 4 else 8


def w4a16_linear(x: torch.Tensor, packed: W4A16Packed, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``y = x @ dequant(W).T (+ bias)`` in ``x``'s dtype, for ``x`` [..., K]."""
    n, k = packed.n, packed.k
    if x.shape[-1] != k:
        raise ValueError(f"w4a16_linear: x has {x.shape[-1]} features, the weight {k}")
    x2 = x.reshape(-1, k)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    m = x2.shape[0]
    fp32 = x.dtype == torch.float32  # fp32 stays off the tensor cores (no TF32 rounding)
    if m <= SMALL_BATCH and not fp32:
        cfg = packed.configs[_bucket(m)]
    else:
        cfg = _config(n, k, packed.group, m, g.DEFAULT_SMS, fp32)
    y = g.launch(
        x2, packed.packed, n, k, cfg, out_dtype=x.dtype, wfmt=g.WFMT_INT4,
        scale_mode=g.SCALE_GROUP, w_scale=packed.scales, w_zs=packed.zeros, group=packed.group,
        bias=bias, dot_dtype=x.dtype, counters=packed.counters,
    )
    return y.reshape(*x.shape[:-1], n)
