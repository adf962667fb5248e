"""Split-K Triton GEMV / skinny GEMM for decode batches: ``y = x @ dequant(W).T (+ bias)``.

One kernel serves two weight formats, each compiled to its own code by the weight's dtype
(4-bit weights have their own kernel, ``triton_w4a16``):

- bf16/fp16 weights [N, K] (the unquantized decode linears);
- float8_e4m3fn weights [N, K] with per-tensor, per-channel or 128x128-block
  scales; activations arrive already quantized (fp8 rows with one fp32 scale each).

Work split: the grid is (N blocks, K splits, M blocks). Each program streams a
[BLOCK_N, k_per_split] slab of W once (contiguous along K, so the loads vectorise to 128 bits),
and accumulates in fp32. With one K split the program writes ``y`` itself (bias added, cast to
the output dtype); with several it writes fp32 partials to a workspace [SPLIT, M, N] and a
second small kernel sums them: no atomics, deterministic, and both launches are plain kernels
on preallocated-by-the-caching-allocator tensors, so the pair is CUDA-graph capturable.

Two inner products: ``USE_DOT`` pads the rows to a tensor-core tile (BLOCK_M >= 16) and is the
choice for M >= 2; without it, BLOCK_M == 1 and each program keeps a [BLOCK_N, BLOCK_K] fp32
accumulator of elementwise products that it reduces once at the end (the classic GEMV: no
shuffles inside the loop). FP8 weights enter the dot as exact values (their codes) and their
scales multiply the fp32 partial sums, so the only rounding is the fp32 accumulation; the fp32
reference dequantizes first and agrees to accumulation order.
A third path (``GemvConfig.rows``, plain and fp8 weights) serves 2-8 rows without tensor
cores: each W tile is loaded once (128-bit per thread) and multiplies every row held in
registers, so a small batch costs one pass over the weight bytes, as M = 1 does.

Invariants the launchers keep: ``k_per_split`` is a multiple of ``BLOCK_K``, so every K tile
starts at a multiple of ``BLOCK_K``; for FP8 block scales ``BLOCK_K`` divides 128.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from octavo.utils.gc import no_garbage_collection

logger = logging.getLogger(__name__)

# How weight scales apply: none, per-tensor [], per-channel [N], per-iteration [ceil(N / 128),
# ceil(K / 128)] (fp8 128x128 blocks).
SCALE_NONE, SCALE_TENSOR, SCALE_CHANNEL, SCALE_BLOCK = 0, 1, 2, 3
# The same values as the kernels see them (a jitted function reads only constexpr globals).
_S_TENSOR, _S_CHANNEL, _S_BLOCK = tl.constexpr(SCALE_TENSOR), tl.constexpr(SCALE_CHANNEL), tl.constexpr(SCALE_BLOCK)


@dataclass(frozen=True)
class GemvConfig:
    """Tile shape of one launch. ``split_k``: programs along K (1 = no second pass)."""

    block_n: int
    block_k: int
    split_k: int = 1
    use_dot: bool = False
    num_warps: int = 4
    num_stages: int = 3
    rows: bool = False  # the FMA path over up to 8 rows at once (plain / fp8 weights, no dot)

    def block_m(self, m: int) -> int:
        if self.rows:
            return min(8, triton.next_power_of_2(max(1, m)))
        return min(64, max(16, triton.next_power_of_2(m))) if self.use_dot else 1

    def describe(self) -> str:
        kind = "rows" if self.rows else "dot" if self.use_dot else "fma"
        return f"{kind} n{self.block_n} k{self.block_k} split{self.split_k} w{self.num_warps}"


@triton.jit
def _load_w_tile(
    w_ptr, ws_ptr, offs_n, k0, k_end, n_ok, stride_wn, stride_sn,
    SCALE_MODE: tl.constexpr, BLOCK_K: tl.constexpr, OUT_DTYPE: tl.constexpr, EVEN_K: tl.constexpr,
):
    """W[offs_n, offs_k] as OUT_DTYPE (exact values) and its per-iteration scale vector [BLOCK_N]
    (ones when the scale applies after the loop)."""
    rows = offs_n.to(tl.int64)[:, None] * stride_wn
    offs_k = k0 + tl.arange(0, BLOCK_K)
    k_ok = (offs_k < k_end) | EVEN_K  # EVEN_K: every tile is whole
    w = tl.load(w_ptr + rows + offs_k[None, :], mask=n_ok[:, None] & k_ok[None, :], other=0.0)
    if SCALE_MODE == _S_BLOCK:
        s = tl.load(ws_ptr + (offs_n // 128).to(tl.int64) * stride_sn + k0 // 128, mask=n_ok, other=0.0)
    else:
        s = tl.full(offs_n.shape, 1.0, tl.float32)
    return w.to(OUT_DTYPE), s


@triton.jit
def _program_tile(M, N, K, k_per_split, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """This program's rows, output columns (with their bounds masks), K split and K range;
    the grid is (N blocks, K splits, M blocks)."""
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    pid_m = tl.program_id(2)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    k_start = pid_k * k_per_split
    return offs_m, offs_n, offs_m < M, offs_n < N, pid_k, k_start, tl.minimum(K, k_start + k_per_split)


@triton.jit
def _gemv_kernel(
    x_ptr, xs_ptr, w_ptr, ws_ptr, bias_ptr, out_ptr, part_ptr, cnt_ptr,
    M, N, K, k_per_split, stride_xm, stride_wn, stride_sn, stride_om,
    SCALE_MODE: tl.constexpr, X_SCALED: tl.constexpr,
    HAS_BIAS: tl.constexpr, SPLIT: tl.constexpr, FUSED_REDUCE: tl.constexpr,
    USE_DOT: tl.constexpr, DOT_DTYPE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr,
):
    offs_m, offs_n, m_ok, n_ok, pid_k, k_start, k_end = _program_tile(M, N, K, k_per_split, BLOCK_M, BLOCK_N)
    x_rows = x_ptr + offs_m.to(tl.int64)[:, None] * stride_xm
    if USE_DOT:
        acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    else:
        acc2 = tl.zeros((BLOCK_N, BLOCK_K), tl.float32)
    for it in range(0, tl.cdiv(k_end - k_start, BLOCK_K)):
        k0 = k_start + it * BLOCK_K
        offs_k = k0 + tl.arange(0, BLOCK_K)
        k_ok = (offs_k < k_end) | EVEN_K
        x = tl.load(x_rows + offs_k[None, :], mask=m_ok[:, None] & k_ok[None, :], other=0.0)
        w, s = _load_w_tile(
            w_ptr, ws_ptr, offs_n, k0, k_end, n_ok, stride_wn, stride_sn,
            SCALE_MODE, BLOCK_K, DOT_DTYPE if USE_DOT else tl.float32, EVEN_K,
        )
        if USE_DOT:
            part = tl.dot(x.to(DOT_DTYPE), tl.trans(w))
            if SCALE_MODE >= _S_BLOCK:
                part = part * s[None, :]
            acc += part
        else:
            prod = w * x.to(tl.float32)  # [BLOCK_N, BLOCK_K] * [1, BLOCK_K]
            if SCALE_MODE >= _S_BLOCK:
                prod = prod * s[:, None]
            acc2 += prod
    if not USE_DOT:
        acc = tl.sum(acc2, axis=1)[None, :]
    _epilogue(acc, xs_ptr, ws_ptr, bias_ptr, out_ptr, part_ptr, cnt_ptr, offs_m, offs_n, m_ok, n_ok, pid_k,
              M, N, stride_om, SCALE_MODE, X_SCALED, HAS_BIAS, SPLIT, FUSED_REDUCE)


@triton.jit
def _gemv_rows_kernel(
    x_ptr, xs_ptr, w_ptr, ws_ptr, bias_ptr, out_ptr, part_ptr, cnt_ptr,
    M, N, K, k_per_split, stride_xm, stride_wn, stride_sn, stride_om,
    SCALE_MODE: tl.constexpr, X_SCALED: tl.constexpr, HAS_BIAS: tl.constexpr,
    SPLIT: tl.constexpr, FUSED_REDUCE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr, VEC: tl.constexpr, EVEN_K: tl.constexpr,
):
    """Plain or fp8 weights at 2-8 rows without tensor cores: each [BLOCK_N, BLOCK_K] W tile is
    read once, as [BLOCK_N, BLOCK_K // VEC, VEC] (VEC elements = one 128-bit load per thread),
    and multiplies all BLOCK_M rows of x; each thread sums its VEC products in-thread into a
    [BLOCK_M, BLOCK_N, BLOCK_K // VEC] fp32 accumulator, reduced once after the loop."""
    offs_m, offs_n, m_ok, n_ok, pid_k, k_start, k_end = _program_tile(M, N, K, k_per_split, BLOCK_M, BLOCK_N)
    kv = tl.arange(0, BLOCK_K // VEC)[:, None] * VEC + tl.arange(0, VEC)[None, :]  # [KV, VEC]
    w_rows = w_ptr + offs_n.to(tl.int64)[:, None, None] * stride_wn
    x_rows = x_ptr + offs_m.to(tl.int64)[:, None, None] * stride_xm
    acc3 = tl.zeros((BLOCK_M, BLOCK_N, BLOCK_K // VEC), tl.float32)
    for it in range(0, tl.cdiv(k_end - k_start, BLOCK_K)):
        k0 = k_start + it * BLOCK_K
        offs_k = k0 + kv
        k_ok = (offs_k < k_end) | EVEN_K
        w = tl.load(w_rows + offs_k[None], mask=n_ok[:, None, None] & k_ok[None], other=0.0)
        x = tl.load(x_rows + offs_k[None], mask=m_ok[:, None, None] & k_ok[None], other=0.0)
        prod = tl.sum(w.to(tl.float32)[None] * x.to(tl.float32)[:, None], axis=3)
        if SCALE_MODE == _S_BLOCK:
            sb = tl.load(ws_ptr + (offs_n // 128).to(tl.int64) * stride_sn + k0 // 128, mask=n_ok, other=0.0)
            prod = prod * sb[None, :, None]
        acc3 += prod
    acc = tl.sum(acc3, axis=2)
    _epilogue(acc, xs_ptr, ws_ptr, bias_ptr, out_ptr, part_ptr, cnt_ptr, offs_m, offs_n, m_ok, n_ok, pid_k,
              M, N, stride_om, SCALE_MODE, X_SCALED, HAS_BIAS, SPLIT, FUSED_REDUCE)


@triton.jit
def _epilogue(
    acc, xs_ptr, ws_ptr, bias_ptr, out_ptr, part_ptr, cnt_ptr, offs_m, offs_n, m_ok, n_ok, pid_k,
    M, N, stride_om, SCALE_MODE: tl.constexpr, X_SCALED: tl.constexpr, HAS_BIAS: tl.constexpr,
    SPLIT: tl.constexpr, FUSED_REDUCE: tl.constexpr,
):
    """Scales that apply after the loop, then ``y`` (one K split) or the fp32 partials.

    ``FUSED_REDUCE`` (several splits): each program stores its partials, then takes a ticket
    from this output tile's counter; the program that draws the last ticket sums the SPLIT
    partials in split order (deterministic, as the separate reduce kernel would) and writes
    ``y``, then resets the counter to 0 for the next call (so a CUDA graph replays it): one
    launch instead of two. Partials are read past L1 (``.cg``), which is not coherent across
    programs on other SMs."""
    if SCALE_MODE == _S_TENSOR:
        acc = acc * tl.load(ws_ptr)
    if SCALE_MODE == _S_CHANNEL:
        acc = acc * tl.load(ws_ptr + offs_n, mask=n_ok, other=0.0)[None, :]
    if X_SCALED:
        acc = acc * tl.load(xs_ptr + offs_m, mask=m_ok, other=0.0)[:, None]
    mask = m_ok[:, None] & n_ok[None, :]
    o = out_ptr + offs_m.to(tl.int64)[:, None] * stride_om + offs_n[None, :]
    if SPLIT == 1:  # this program owns y[offs_m, offs_n]
        if HAS_BIAS:
            acc += tl.load(bias_ptr + offs_n, mask=n_ok, other=0.0).to(tl.float32)[None, :]
        tl.store(o, acc.to(out_ptr.dtype.element_ty), mask=mask)
    else:
        rows = (pid_k * M + offs_m.to(tl.int64))[:, None] * N + offs_n[None, :]
        tl.store(part_ptr + rows, acc, mask=mask)
        if FUSED_REDUCE:
            tile = tl.program_id(2) * tl.num_programs(0) + tl.program_id(0)
            tl.debug_barrier()  # every thread's partials are written before the ticket
            ticket = tl.atomic_add(cnt_ptr + tile, 1, sem="acq_rel")
            if ticket == SPLIT - 1:
                total = tl.zeros_like(acc)
                for s in tl.static_range(SPLIT):
                    srows = (s * M + offs_m.to(tl.int64))[:, None] * N + offs_n[None, :]
                    total += tl.load(part_ptr + srows, mask=mask, other=0.0, cache_modifier=".cg")
                if HAS_BIAS:
                    total += tl.load(bias_ptr + offs_n, mask=n_ok, other=0.0).to(tl.float32)[None, :]
                tl.store(o, total.to(out_ptr.dtype.element_ty), mask=mask)
                tl.atomic_xchg(cnt_ptr + tile, 0)


@triton.jit
def _splitk_reduce_kernel(
    part_ptr, bias_ptr, out_ptr, M, N, stride_om,
    SPLIT: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK: tl.constexpr,
):
    m = tl.program_id(1).to(tl.int64)
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < N
    acc = tl.zeros((BLOCK,), tl.float32)
    for s in tl.static_range(SPLIT):
        acc += tl.load(part_ptr + (s * M + m) * N + offs, mask=ok, other=0.0)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + offs, mask=ok, other=0.0).to(tl.float32)
    tl.store(out_ptr + m * stride_om + offs, acc.to(out_ptr.dtype.element_ty), mask=ok)


_DOT_DTYPES = {torch.bfloat16: tl.bfloat16, torch.float16: tl.float16, torch.float32: tl.float32,
               torch.float8_e4m3fn: tl.float8e4nv}
# Triton's CPU interpreter multiplies bf16 dot operands as raw bits; the values entering the dot
# are exact in fp32 too, so interpreted runs (the CPU tests) take an fp32 dot instead.
INTERPRETED = os.environ.get("TRITON_INTERPRET", "0") == "1"


def split_extent(k: int, cfg: GemvConfig) -> int:
    """K elements per split: a multiple of ``block_k``; the splits cover K."""
    return triton.cdiv(triton.cdiv(k, cfg.split_k), cfg.block_k) * cfg.block_k


def launch(
    x: torch.Tensor, w: torch.Tensor, n: int, k: int, cfg: GemvConfig, *,
    out_dtype: torch.dtype, scale_mode: int = SCALE_NONE,
    w_scale: torch.Tensor | None = None,
    x_scale: torch.Tensor | None = None, bias: torch.Tensor | None = None,
    dot_dtype: torch.dtype = torch.bfloat16, out: torch.Tensor | None = None,
    counters: torch.Tensor | None = None,
) -> torch.Tensor:
    """``y[M, N]`` for a 2-D ``x`` [M, K] (unit stride along K). Allocates only ``y`` and, with
    a K split, the fp32 partials: no host synchronisation, capturable in a CUDA graph.

    ``counters``: int32 zeros, at least one per output tile (``tiles(n, m, cfg)``), owned by
    this weight and never used by two launches at once (they run in stream order): with them a
    K split is summed by its last program instead of a second kernel."""
    m = x.shape[0]
    if out is None:
        out = torch.empty((m, n), dtype=out_dtype, device=x.device)
    if m == 0:
        return out
    per = split_extent(k, cfg)
    split = triton.cdiv(k, per)
    bm = cfg.block_m(m)
    grid = (triton.cdiv(n, cfg.block_n), split, triton.cdiv(m, bm))
    fused = split > 1 and counters is not None and counters.numel() >= tiles(n, m, cfg)
    part = out if split == 1 else torch.empty((split, m, n), dtype=torch.float32, device=x.device)
    common = dict(out=out, part=part, cnt=counters if fused else out, split=split, fused=fused, bm=bm,
                  grid=grid, per=per, bias=bias, x_scale=x_scale, w_scale=w_scale)
    if cfg.rows:
        _launch_rows(x, w, n, k, cfg, scale_mode, **common)
    else:
        _launch_main(x, w, n, k, cfg, scale_mode, dot_dtype, **common)
    if split > 1 and not fused:
        reduce_splits(part, bias, out)
    return out


def tiles(n: int, m: int, cfg: GemvConfig) -> int:
    """Output tiles of a launch: the counters ``launch`` needs for an in-kernel split sum."""
    return triton.cdiv(n, cfg.block_n) * triton.cdiv(m, cfg.block_m(m))


def new_counters(n: int, device: torch.device) -> torch.Tensor:
    """Counters for every decode-batch launch on an [N, K] weight (tiles of >= 4 columns, one
    row block): a weight's own, made once at load."""
    return torch.zeros(triton.cdiv(n, 4), dtype=torch.int32, device=device)


def reduce_splits(part: torch.Tensor, bias: torch.Tensor | None, out: torch.Tensor) -> None:
    """``out[M, N] = sum over splits of part[SPLIT, M, N] (+ bias)`` in out's dtype."""
    split, m, n = part.shape
    block = min(1024, triton.next_power_of_2(n))
    _splitk_reduce_kernel[(triton.cdiv(n, block), m)](
        part, bias if bias is not None else out, out, m, n, out.stride(0),
        SPLIT=split, HAS_BIAS=bias is not None, BLOCK=block, num_warps=4,
    )


def _scale_stride(w_scale: torch.Tensor | None) -> int:
    return w_scale.stride(0) if w_scale is not None and w_scale.dim() == 2 else 0


def _launch_rows(x, w, n, k, cfg, scale_mode, *, out, part, cnt, split, fused, bm, grid, per, bias,
                 x_scale, w_scale) -> None:
    """``_gemv_rows_kernel`` (plain / fp8 weights, 2-8 rows on the CUDA cores)."""
    _gemv_rows_kernel[grid](
        x, x_scale if x_scale is not None else out, w, w_scale if w_scale is not None else out,
        bias if bias is not None else out, out, part, cnt,
        x.shape[0], n, k, per, x.stride(0), w.stride(0), _scale_stride(w_scale), out.stride(0),
        SCALE_MODE=scale_mode, X_SCALED=x_scale is not None, HAS_BIAS=bias is not None,
        SPLIT=split, FUSED_REDUCE=fused, BLOCK_M=bm, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
        VEC=min(cfg.block_k, 16 // w.element_size()), EVEN_K=k % cfg.block_k == 0,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )


def _launch_main(x, w, n, k, cfg, scale_mode, dot_dtype, *, out, part, cnt,
                 split, fused, bm, grid, per, bias, x_scale, w_scale) -> None:
    """The one-kernel launch of ``_gemv_kernel`` (all formats; FMA over one row, or the dot)."""
    _gemv_kernel[grid](
        x, x_scale if x_scale is not None else out, w, w_scale if w_scale is not None else out,
        bias if bias is not None else out, out, part, cnt,
        x.shape[0], n, k, per, x.stride(0), w.stride(0), _scale_stride(w_scale), out.stride(0),
        SCALE_MODE=scale_mode, X_SCALED=x_scale is not None, HAS_BIAS=bias is not None,
        SPLIT=split, FUSED_REDUCE=fused, USE_DOT=cfg.use_dot,
        DOT_DTYPE=tl.float32 if INTERPRETED else _DOT_DTYPES[dot_dtype], BLOCK_M=bm, BLOCK_N=cfg.block_n,
        BLOCK_K=cfg.block_k, EVEN_K=k % cfg.block_k == 0, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )


# -- choosing a configuration ----------------------------------------------------------------
DEFAULT_SMS = 132  # an H100/H200; ``num_sms`` asks the driver when it can


def num_sms(device: torch.device) -> int:
    """Streaming multiprocessors of ``device`` (from Triton's driver; a default off-GPU)."""
    try:
        props = triton.runtime.driver.active.utils.get_device_properties(device.index or 0)
        return int(props["multiprocessor_count"])
    except Exception:  # the interpreter, or a driver without the query
        return DEFAULT_SMS


def pick_split(n: int, k: int, block_n: int, block_k: int, sms: int, waves: int = 4) -> int:
    """Fewest K splits giving ``waves`` programs per SM, each split keeping >= 4 K tiles."""
    tiles_n = triton.cdiv(n, block_n)
    split = 1
    while tiles_n * split < waves * sms and k // (2 * split) >= 4 * block_k:
        split *= 2
    return split


def candidates(n: int, k: int, m: int, sms: int) -> list[GemvConfig]:
    """A short list of tile shapes worth timing for a bf16/fp16 [N, K] weight at batch ``m``:
    without a K split where the rows alone give enough programs (no second launch), and with
    the split that fills the GPU."""
    out = []
    if m == 1:
        for bn, bk in ((8, 512), (4, 512), (4, 1024)):
            out.append(GemvConfig(bn, bk, 1, False, 4))
        for bn, bk in ((8, 512), (16, 256)):
            out.append(GemvConfig(bn, bk, pick_split(n, k, bn, bk, sms), False, 4))
    else:
        for bn, bk, warps in ((16, 256, 4), (32, 128, 4), (16, 512, 8)):
            out.append(GemvConfig(bn, bk, pick_split(n, k, bn, bk, sms), True, warps))
        out.append(GemvConfig(16, 256, 1, True, 4))
        out.append(GemvConfig(4, 256, pick_split(n, k, 4, 256, sms), False, 4, rows=True))
    return list(dict.fromkeys(out))


def default_config(n: int, k: int, m: int, sms: int) -> GemvConfig:
    """The table choice when nothing was timed: the split that fills the GPU."""
    bn, bk, dot = (8, 512, False) if m == 1 else (16, 256, True)
    return GemvConfig(bn, bk, pick_split(n, k, bn, bk, sms), dot, 4)


BATCH_BUCKETS = (1, 2, 4, 8)


def bucket(m: int) -> int:
    """The batch bucket (1, 2, 4, 8) whose choice serves ``m`` rows (``m <= 8``)."""
    return 1 if m <= 1 else 2 if m <= 2 else 4 if m <= 4 else 8


# Decode streams every layer's weights from HBM (a model is far larger than L2), so a timing
# that re-reads one weight from L2 favours the wrong tiling. The timing instead rotates over
# enough copies of the weight that together exceed L2 several times (H100/H200: 50 MB), each
# call reading a copy evicted since its last use, and replays the calls back to back from a
# CUDA graph as the decode step does (no host launch gaps, no cache-flush kernel in between).
ROTATE_BYTES = 128 << 20
MAX_COPIES = 64


def rotation_copies(weight_bytes: int, budget: int = ROTATE_BYTES, cap: int = MAX_COPIES) -> int:
    """How many copies of a ``weight_bytes`` weight the timing cycles through: enough to span
    ``budget`` bytes (so none is still in L2 when its turn comes again), at least 1, at most
    ``cap`` (the extra memory is ``(copies - 1) * weight_bytes <= budget``)."""
    return max(1, min(cap, -(-budget // max(1, weight_bytes))))


def graph_time_ms(calls: list, reps: int = 7, min_ms: float = 0.5) -> float:
    """Median ms per call of ``calls`` run back to back from one captured CUDA graph: each call
    is run once first (compiles, and proves it runs), then the graph is replayed in ``reps``
    measurements of at least ``min_ms`` each. A call that cannot be captured raises. The graph
    and the timing events come from the current platform (its graph-capture primitives)."""
    from octavo.platforms import current_platform

    for c in calls:
        c()
    current_platform.synchronize()
    graph = current_platform.new_graph()
    with no_garbage_collection(), current_platform.graph_capture_context(graph):
        for c in calls:
            c()
    events = [current_platform.new_event(timing=True) for _ in range(2)]

    def measure(times: int) -> float:
        events[0].record()
        for _ in range(times):
            graph.replay()
        events[1].record()
        events[1].synchronize()
        return events[0].elapsed_time(events[1]) / times

    est = measure(1)
    inner = max(1, int(min_ms / max(est, 1e-3)))
    samples = sorted(measure(inner) for _ in range(reps))
    return samples[len(samples) // 2] / len(calls)


def time_against_cublas(
    weight: torch.Tensor, m: int, sms: int, margin: float = 0.97, timer=None,
    budget: int = ROTATE_BYTES,
) -> tuple[GemvConfig | None, dict[str, float]]:
    """Time cuBLAS (``F.linear``) and each candidate on ``weight`` [N, K] at ``m`` rows; return
    the fastest candidate if it beats cuBLAS by ``margin`` (else None: keep cuBLAS) and every
    time in ms. A candidate whose result disagrees with cuBLAS, or that fails, is never chosen.

    ``timer(calls) -> ms per call`` (default ``graph_time_ms``) gets one call per weight copy
    (``rotation_copies``; the copies are freed on return), so every method is timed streaming
    its weight from memory as in decode."""
    timer = timer or graph_time_ms
    n, k = weight.shape
    gen = torch.Generator(device=weight.device).manual_seed(m)
    x = torch.randn((m, k), generator=gen, device=weight.device, dtype=torch.float32).to(weight.dtype)
    ref = torch.nn.functional.linear(x, weight).float()
    copies = rotation_copies(weight.numel() * weight.element_size(), budget)
    ws = [weight] + [weight.clone() for _ in range(copies - 1)]
    times = {"cublas": timer([lambda w=w: torch.nn.functional.linear(x, w) for w in ws])}
    best, best_t = None, times["cublas"] * margin
    for cfg in candidates(n, k, m, sms):
        def run(w, cfg=cfg):
            return launch(x, w, n, k, cfg, out_dtype=weight.dtype, dot_dtype=weight.dtype)

        try:
            err = float((run(weight).float() - ref).norm() / ref.norm().clamp_min(1e-30))
            t = timer([lambda w=w: run(w) for w in ws]) if err < 2e-2 else float("nan")
        except Exception as e:  # a tiling this compiler/GPU rejects: never chosen
            logger.warning("decode GEMV %s for [%d, %d] at M=%d failed: %r", cfg.describe(), n, k, m, e)
            t = float("nan")
        times[cfg.describe()] = t
        if t < best_t:
            best, best_t = cfg, t
    return best, times
