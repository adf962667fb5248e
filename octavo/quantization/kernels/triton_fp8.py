"""FP8 (e4m3) weight linears on NVIDIA GPUs: a split-K Triton GEMV for decode batches (M <= 8)
and ``torch._scaled_mm`` above, both computing what W8A8 means in the quantization contract.

Contract (``prepack_fp8`` / ``fp8_linear``): ``weight`` float8_e4m3fn [N, K]; ``weight_scale``
float32 [] (per-tensor), [N] (per-channel) or [ceil(N/128), ceil(K/128)] (128x128 blocks).
Activations are quantized per token (scale = amax / 448 per row) unless a static
``input_scale`` [] is given; ``y = (x_q * x_scale) @ (W * w_scale).T (+ bias)`` in x's dtype.

Why a GEMV: at batch 1 a linear is a pass over its weight bytes, and ``_scaled_mm``'s GEMM
tiles waste most of that pass (slower than bf16 cuBLAS on the same layer); the GEMV streams
the fp8 bytes once with enough programs to fill the GPU, so it moves half of bf16's bytes.
Larger batches become compute-bound, where the tensor-core GEMM of ``_scaled_mm`` wins.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import triton
import triton.language as tl

from octavo.quantization.kernels import triton_gemv as g

FP8_MAX = 448.0
SMALL_BATCH = 8  # rows up to which the GEMV runs; above it the GEMM
_MIN_SCALE = 1.0 / (FP8_MAX * 512.0)  # all-zero rows get a finite scale


@dataclass
class Fp8Packed:
    """An FP8 weight ready for ``fp8_linear`` (made once at load by ``prepack_fp8``)."""

    weight: torch.Tensor  # float8_e4m3fn [N, K], contiguous
    scale: torch.Tensor  # float32: [] / [N] / [ceil(N/128), ceil(K/128)]
    scale_mode: int  # triton_gemv.SCALE_TENSOR / SCALE_CHANNEL / SCALE_BLOCK
    scale_row: torch.Tensor | None  # float32 [1, N] for _scaled_mm's row-wise scaling
    # batch bucket -> tiles, or None: ``torch._scaled_mm`` (``tune_fp8`` found it faster)
    configs: dict[int, g.GemvConfig | None] = field(default_factory=dict)
    counters: torch.Tensor | None = None  # int32 zeros: in-kernel K-split sums (``g.launch``)

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.weight.shape)  # type: ignore[return-value]


def _scale_mode(weight: torch.Tensor, scale: torch.Tensor) -> int:
    n, k = weight.shape
    if scale.numel() == 1 and scale.dim() <= 1:
        return g.SCALE_TENSOR
    if tuple(scale.shape) == (n,):
        return g.SCALE_CHANNEL
    if tuple(scale.shape) == (triton.cdiv(n, 128), triton.cdiv(k, 128)):
        return g.SCALE_BLOCK
    raise ValueError(
        f"fp8 weight_scale of shape {tuple(scale.shape)} fits neither per-tensor [], per-channel "
        f"[{n}] nor 128x128 blocks [{triton.cdiv(n, 128)}, {triton.cdiv(k, 128)}] for a [{n}, {k}] weight"
    )


def small_batch_config(n: int, k: int, m: int, scale_mode: int, sms: int) -> g.GemvConfig:
    """Tiles for an fp8 [N, K] weight at ``m`` rows (<= 8), from an H200 sweep of every
    Llama-3.1-8B linear (``benchmarks/bench_quant_gemv.py``): fp8 x fp8 tensor-core tiles (32
    columns, 256 of K; block scales cap K tiles at 128) at 2-8 rows, where the CUDA-core paths
    pay a conversion per code per row (4-15x slower), and at one row for weights of 32M codes
    and more; smaller weights at one row stream faster through the one-row FMA."""
    block = scale_mode == g.SCALE_BLOCK
    if m == 1 and n * k < (32 << 20):
        bn, bk = (32, 128) if block else (8, 1024)
        return g.GemvConfig(bn, bk, g.pick_split(n, k, bn, bk, sms), False, 4)
    bn, bk = (64, 128) if block else (32, 256)
    return g.GemvConfig(bn, bk, g.pick_split(n, k, bn, bk, sms), True, 4)


def prepack_fp8(weight: torch.Tensor, weight_scale: torch.Tensor) -> Fp8Packed:
    """Validate and lay out an FP8 weight once (contiguous, fp32 scales, tile choices)."""
    if weight.dtype != torch.float8_e4m3fn or weight.dim() != 2:
        raise ValueError(f"fp8 weight must be float8_e4m3fn [N, K], got {weight.dtype} {tuple(weight.shape)}")
    scale = weight_scale.to(torch.float32).contiguous()
    mode = _scale_mode(weight, scale)
    if mode == g.SCALE_TENSOR:
        scale = scale.reshape(())
    n, k = weight.shape
    row = None
    if mode != g.SCALE_BLOCK:
        row = scale.expand(n).reshape(1, n).contiguous()
    sms = g.num_sms(weight.device)
    configs = {m: small_batch_config(n, k, m, mode, sms) for m in (1, 2, 4, 8)}
    return Fp8Packed(weight.contiguous(), scale, mode, row, configs, g.new_counters(n, weight.device))


@triton.jit
def _quant_rows_kernel(
    x_ptr, xq_ptr, xs_ptr, in_scale_ptr, K, stride_x, stride_q,
    STATIC: tl.constexpr, BLOCK: tl.constexpr,
):
    """One row: scale = amax / 448 (or the static scale), x_q = clamp(x / scale) in e4m3."""
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    ok = offs < K
    x = tl.load(x_ptr + row * stride_x + offs, mask=ok, other=0.0).to(tl.float32)
    if STATIC:
        scale = tl.load(in_scale_ptr)
    else:
        scale = tl.maximum(tl.max(tl.abs(x), axis=0) / 448.0, 1.0 / (448.0 * 512.0))
    q = tl.clamp(x / scale, -448.0, 448.0)
    tl.store(xq_ptr + row * stride_q + offs, q.to(tl.float8e4nv), mask=ok)
    tl.store(xs_ptr + row, scale)


def quantize_rows(x: torch.Tensor, input_scale: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(x_q float8_e4m3fn [M, K], scales float32 [M])`` for a 2-D ``x``: dynamic per-token
    scales, or the static per-tensor ``input_scale``. One launch, no host synchronisation."""
    m, k = x.shape
    xq = torch.empty((m, k), dtype=torch.float8_e4m3fn, device=x.device)
    xs = torch.empty((m,), dtype=torch.float32, device=x.device)
    if m:
        s = input_scale.to(torch.float32).reshape(()) if input_scale is not None else xs
        block = triton.next_power_of_2(k)
        _quant_rows_kernel[(m,)](
            x, xq, xs, s, k, x.stride(0), xq.stride(0),
            STATIC=input_scale is not None, BLOCK=block, num_warps=min(16, max(4, block // 1024)),
        )
    return xq, xs


def _bucket(m: int) -> int:
    return 1 if m <= 1 else 2 if m <= 2 else 4 if m <= 4 else 8


def _gemv(xq, xs, packed: Fp8Packed, bias, out_dtype, cfg: g.GemvConfig) -> torch.Tensor:
    """The small-batch kernels on ``quantize_rows``' output. The dot path feeds the fp8 codes of
    both operands to the tensor cores in 16-row tiles (fp32 accumulation; Triton widens e4m3 to
    fp16 exactly, one instruction per two codes, where the CUDA-core FMA path needs three per
    code); larger tiles take bf16 copies (Hopper's fp8 warpgroup MMA accumulates with fewer
    bits)."""
    n, k = packed.shape
    return g.launch(
        xq, packed.weight, n, k, cfg, out_dtype=out_dtype,
        scale_mode=packed.scale_mode, w_scale=packed.scale, x_scale=xs, bias=bias,
        dot_dtype=torch.float8_e4m3fn if cfg.block_m(xq.shape[0]) <= 16 else torch.bfloat16,
        counters=packed.counters,
    )


def _gemm(xq, xs, packed: Fp8Packed, bias, out_dtype) -> torch.Tensor:
    """Larger batches: ``torch._scaled_mm`` with row-wise scales (bf16 out, per-tensor and
    per-channel weights); block scales and other dtypes take the Triton kernel in 64-row tiles."""
    n, k = packed.shape
    if packed.scale_row is not None and out_dtype == torch.bfloat16 and n % 16 == 0 and k % 16 == 0:
        y = torch._scaled_mm(
            xq, packed.weight.t(), scale_a=xs.reshape(-1, 1), scale_b=packed.scale_row,
            out_dtype=out_dtype,
        )
        return y if bias is None else y + bias
    cfg = g.GemvConfig(64, 128 if packed.scale_mode == g.SCALE_BLOCK else 64, 1, True, 4)
    return g.launch(xq, packed.weight, n, k, cfg, out_dtype=out_dtype,
                    scale_mode=packed.scale_mode, w_scale=packed.scale, x_scale=xs, bias=bias)


def fp8_linear(
    x: torch.Tensor, packed: Fp8Packed, bias: torch.Tensor | None = None,
    input_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """``y = quant(x) @ W.T (+ bias)`` in ``x``'s dtype, for ``x`` [..., K]."""
    n, k = packed.shape
    if x.shape[-1] != k:
        raise ValueError(f"fp8_linear: x has {x.shape[-1]} features, the weight {k}")
    x2 = x.reshape(-1, k)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    xq, xs = quantize_rows(x2, input_scale)
    m = x2.shape[0]
    cfg = packed.configs[_bucket(m)] if m <= SMALL_BATCH else None
    if cfg is not None:
        y = _gemv(xq, xs, packed, bias, x.dtype, cfg)
    else:
        y = _gemm(xq, xs, packed, bias, x.dtype)
    return y.reshape(*x.shape[:-1], n)


def fp8_candidates(n: int, k: int, m: int, scale_mode: int, sms: int) -> list[g.GemvConfig]:
    """Tilings worth timing for an fp8 [N, K] weight at ``m`` rows (the table choice first):
    the one-row FMA at batch 1, the rows FMA above; block scales keep ``block_k`` <= 128."""
    first = small_batch_config(n, k, m, scale_mode, sms)
    block = scale_mode == g.SCALE_BLOCK
    if m == 1:
        shapes = ((16, 128), (32, 128)) if block else ((4, 1024), (8, 512))
    else:
        shapes = ((8, 128), (16, 128)) if block else ((8, 256), (4, 512))
    out = [first]
    for bn, bk in shapes:
        out.append(g.GemvConfig(bn, bk, g.pick_split(n, k, bn, bk, sms), False, 4, rows=m > 1))
        out.append(g.GemvConfig(bn, bk, 1, False, 4, rows=m > 1))
    # fp8 x fp8 on the tensor cores, the rows padded to a 16-row tile
    for bn, bk in ((32, 128), (64, 128)) if block else ((32, 256), (64, 128), (16, 512)):
        out.append(g.GemvConfig(bn, bk, g.pick_split(n, k, bn, bk, sms), True, 4))
    return list(dict.fromkeys(out))


def tune_fp8(packed: Fp8Packed, timer=None, budget: int = g.ROTATE_BYTES) -> dict[int, dict[str, float]]:
    """Time, once at load, each batch bucket's GEMV tilings and (where it applies: row-wise
    scales) ``torch._scaled_mm`` on ``packed``, streaming rotating weight copies from a CUDA
    graph as decode does (``triton_gemv.time_against_cublas``'s method), and keep the fastest in
    ``packed.configs`` (None: ``_scaled_mm``). A tiling whose result strays from the table
    choice's, or that fails, is never kept. Returns every time in ms per bucket."""
    timer = timer or g.graph_time_ms
    n, k = packed.shape
    sms = g.num_sms(packed.weight.device)
    copies = g.rotation_copies(n * k, budget)
    packs = [packed] + [Fp8Packed(packed.weight.clone(), packed.scale, packed.scale_mode, packed.scale_row)
                        for _ in range(copies - 1)]
    mm_ok = packed.scale_row is not None and n % 16 == 0 and k % 16 == 0
    report = {}
    for m in (1, 2, 4, 8):
        packed.configs[m], report[m] = _tune_bucket(packed, packs, m, sms, mm_ok, timer)
    return report


def _tune_bucket(packed: Fp8Packed, packs: list, m: int, sms: int, mm_ok: bool, timer):
    """(the fastest method's config or None for ``_scaled_mm``, every time) at ``m`` rows."""
    n, k = packed.shape
    gen = torch.Generator(device=packed.weight.device).manual_seed(m)
    x = torch.randn((m, k), generator=gen, device=packed.weight.device).to(torch.bfloat16)
    xq, xs = quantize_rows(x)
    cands = fp8_candidates(n, k, m, packed.scale_mode, sms)
    ref = _gemv(xq, xs, packed, None, x.dtype, cands[0]).float()
    methods = {c.describe(): c for c in cands}
    if mm_ok:
        methods["scaled_mm"] = None
    times, best, best_t = {}, packed.configs[m], float("inf")
    for name, cfg in methods.items():
        def run(p, cfg=cfg):
            return _gemm(xq, xs, p, None, x.dtype) if cfg is None else _gemv(xq, xs, p, None, x.dtype, cfg)

        try:
            err = float((run(packed).float() - ref).norm() / ref.norm().clamp_min(1e-30))
            t = timer([lambda p=p: run(p) for p in packs]) if err < 2e-2 else float("nan")
        except Exception:  # a tiling this compiler/GPU rejects: never kept
            t = float("nan")
        times[name] = t
        if t < best_t:
            best, best_t = cfg, t
    return best, times
