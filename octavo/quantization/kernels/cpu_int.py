"""Weight-only INT8 / INT4 linear layers on the CPU, through octavo's C++ kernels.

``prepack_int`` runs once at load: it turns the canonical weight (codes ``q`` uint8 [N, K],
``scales`` float32 [N, G], ``zeros`` uint8 [N, G], ``w = (q - zero) * scale`` per group of
``K // G`` columns) into the layout the kernels stream (``csrc/cpu/quant_api.h``): tiles of 32
output channels, each tile's codes one contiguous run of 32-byte rows (a row per k for 8-bit,
per pair of k for 4-bit, two codes a byte), scales and zero points per tile and group.

``int_linear`` then computes ``x @ w.T (+ bias)`` for x of any float dtype, accumulating in
float32 and rounding once to x's dtype: for up to ``GEMM_MAX_ROWS`` rows in the C++ GEMV/GEMM
(weights decoded in registers, reused by a block of rows), beyond that by dequantizing a block
of tiles at a time into a cache-sized buffer in x's dtype (C++) and multiplying each block with
torch's BLAS (prefill batches are compute-bound, and the BLAS has the better micro-kernel); the
weight is still read from memory as codes only. bf16 batches whose weight dequantized to bf16
stays in cache (``WHOLE_DEQUANT_MAX_BYTES``), and larger weights from ``WHOLE_DEQUANT_MIN_ROWS``
rows, dequantize the whole weight once for one GEMM instead (``_dequant_gemm``).
bf16 batches take one of two C++ kernels that multiply bf16 (q - z) tiles, the scales applied
per group in fp32 (exact weight-only semantics: q - z is exact in bf16, every product exact in
fp32): where the CPU has AMX (``PackedInt.amx``), batches of 5 rows and more -- each thread
dequantizes its weight tiles once into a cache-resident bf16 buffer and multiplies on the AMX
tiles (``csrc/cpu/quant_amx.h``) -- up to ``DEQUANT_GEMM_MIN_ROWS`` rows; larger (prefill)
batches dequantize the whole weight into bf16 (C++) for torch's GEMM, whose AMX kernel is
faster there (bf16 weights, as the BLAS path). Elsewhere, in the avx512_bf16 build
(``PackedInt.dpbf16``: AVX512-BF16 without AMX, e.g. AMD Zen 4 / 5), batches of
``DPBF16_MIN_ROWS`` rows and more, any number: each thread dequantizes one tile at a time into
bf16 pairs beside the previous tile's product and multiplies them with VDPBF16PS
(``csrc/cpu/quant_dpbf16.h``), faster than both the fp32-FMA GEMM and the dequantization +
oneDNN GEMM at every size measured. Other builds keep the paths above.
With ``act_int8`` (``PackedInt.a8``) every batch instead quantizes x per token to int8 and
multiplies in integers (AVX512-VNNI, ``csrc/cpu/quant_a8.h``; ``torch_ref.int_a8_linear`` is its
math): W8A8 / W4A8 numerics, for checkpoints whose activations are int8 and for the
``OCTAVO_CPU_INT8_ACTIVATIONS`` opt-in (``a8_unsupported`` says where it cannot run). bf16
batches of more than ``A8_AMX_MIN_ROWS`` rows on an AMX CPU feed the int8 codes (exact in bf16)
to the AMX kernel, the per-token scale applied in its fp32 epilogue (sums in fp32, not int32).
The ISA variant is the one ``octavo.cpu_isa`` selects (``OCTAVO_CPU_ISA`` forces one), fixed
per packed weight at prepack time.

Importing this module raises ``ImportError`` when the C++ extension is not available, so the
kernel selection can fall back to the torch reference with the reason.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType

import torch

from octavo import cpu_isa

TILE = 32  # output channels per tile (kQuantTile in quant_api.h)
# Rows above which the weight is dequantized block by block and multiplied by torch's BLAS.
GEMM_MAX_ROWS = 40
# Kernel build avx512_bf16 where the AMX path does not take the weight (PackedInt.dpbf16): bf16
# batches of at least DPBF16_MIN_ROWS[bits] rows, any number of them, run in C++ -- each thread
# dequantizes its weight tiles once into bf16 (q - z) pairs and multiplies them by VDPBF16PS
# (csrc/cpu/quant_dpbf16.h). Every decoder linear of SmolLM2-135M, 2-core Zen 5, against the
# fp32-FMA GEMM below GEMM_MAX_ROWS and the whole-weight dequantization + oneDNN GEMM above:
# INT8 3 rows 1.04x the time, 4 rows 0.94x, 8 rows 0.62x, 32 rows ~0.5x, 48-256 rows 0.47-0.80x,
# 1024 rows 0.93x, 2048 rows 0.93x; INT4 g32 / g128 4 rows 1.10x / 1.07x, 5 rows 0.86x / 0.95x.
DPBF16_MIN_ROWS = {8: 4, 4: 5}
BLAS_BLOCK_BYTES = 1 << 20  # one dequantized block of tiles (stays in L2)
AMX_K = 32  # the AMX path needs groups of a multiple of this (or one group per row)
A8_MAX_GROUP = 65536  # int8 activations: int32 sums of 255 * 128 * group stay exact
# int8 activations, bf16 batches above this many rows where the CPU has AMX: the codes through
# the AMX kernel in C++ (VPDPBUSD's 64 MACs per instruction lose to AMX's tiles at prefill sizes)
A8_AMX_MIN_ROWS = 8
# bf16 batches of at least this many rows on an AMX CPU (weight-only): the weight is dequantized
# whole into bf16 and multiplied by torch's GEMM (oneDNN's AMX kernel), which beats the C++ AMX
# kernel from about these sizes (SmolLM2-135M shapes, 2 threads: 2048 rows INT8 7.9 -> 6.4 ms
# per layer, 1024 rows INT4 g32 7.2 -> 4.6 ms; at 64-128 rows the C++ kernel is 2-3x faster)
DEQUANT_GEMM_MIN_ROWS = {8: 1536, 4: 256}
# Without AMX, past GEMM_MAX_ROWS: the whole weight dequantized for one GEMM where its bf16 copy
# stays in cache (every decoder linear of a small model), else only from WHOLE_DEQUANT_MIN_ROWS
# rows (below that, a 57 MB bf16 lm_head written and read back through memory costs more than it
# saves: INT8 49152 x 576, 2-core Zen 5, blocks vs whole: 48 rows 11.2 vs 38.8 ms, 256 rows 43 vs
# 59 ms, 512 rows 146 vs 114 ms).
WHOLE_DEQUANT_MAX_BYTES = 16 << 20
WHOLE_DEQUANT_MIN_ROWS = 512

cpu_isa.load_extension()  # ImportError (with the reason) when no kernel variant runs here


@dataclass(frozen=True)
class PackedInt:
    """An INT8 / INT4 weight in the kernels' layout (see the module docstring).

    weight uint8 [ceil(N/32), K or ceil(K/2), 32]; scales, zeros float32 [ceil(N/32), G, 32];
    padded channels have code 0, zero 0 and scale 0. ``zero_point`` >= 0: every (unpadded) zero
    is that code, so the batch-1 and int8-activation kernels take it from a register instead of
    streaming ``zeros`` (symmetric weights; a padded channel's scale 0 makes its zero moot).
    """

    weight: torch.Tensor
    scales: torch.Tensor
    zeros: torch.Tensor
    n: int
    k: int
    group: int
    bits: int
    ext: ModuleType
    amx: bool = False  # bf16 batches of >= 5 rows run on AMX (any M; no BLAS path)
    a8: bool = False  # every batch: int8 activations, integer dot products (int_linear_a8)
    dpbf16: bool = False  # bf16 batches of DPBF16_MIN_ROWS[bits] rows and more: the VDPBF16PS kernel
    input_scale: float = 0.0  # a8 with a static activation scale (> 0); 0: per token
    # >= 0: every zero point is this code (symmetric weights): batch 1 does not stream zeros
    zero_point: float = -1.0

    @property
    def dp_min_rows(self) -> int:
        """The kernels' threshold for the VDPBF16PS path (0: never): ``DPBF16_MIN_ROWS[bits]`` or 0."""
        return DPBF16_MIN_ROWS[self.bits] if self.dpbf16 else 0

    @property
    def nbytes(self) -> int:
        """Bytes the kernel reads per call (codes, scales and zero points)."""
        return sum(t.numel() * t.element_size() for t in (self.weight, self.scales, self.zeros))

    def _kw(self) -> dict:
        return dict(weight=self.weight, scales=self.scales, zeros=self.zeros, n=self.n, k=self.k,
                    group=self.group, bits=self.bits)


def _check(q: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, bits: int) -> int:
    """The group size, after checking the canonical tensors; ValueError naming what is wrong."""
    if bits not in (4, 8):
        raise ValueError(f"prepack_int: bits must be 4 or 8, got {bits}")
    if q.dtype != torch.uint8 or q.dim() != 2:
        raise ValueError(f"prepack_int: q must be uint8 [N, K], got {q.dtype} {tuple(q.shape)}")
    n, k = q.shape
    if scales.dim() != 2 or scales.shape[0] != n or scales.shape[1] == 0 or k % scales.shape[1]:
        raise ValueError(f"prepack_int: scales {tuple(scales.shape)} must be [N, G] with K % G == 0 for q {(n, k)}")
    if zeros.dtype != torch.uint8 or zeros.shape != scales.shape:
        raise ValueError(f"prepack_int: zeros must be uint8 {tuple(scales.shape)}, got {zeros.dtype} {tuple(zeros.shape)}")
    group = k // scales.shape[1]
    if bits == 4 and group % 2 and group != k:
        raise ValueError(f"prepack_int: 4-bit weights need an even group size (or one group per row), got {group}")
    limit = 1 << bits
    if int(q.max()) >= limit or int(zeros.max()) >= limit:
        raise ValueError(f"prepack_int: {bits}-bit codes and zero points must be < {limit}")
    return group


def _tiles(t: torch.Tensor, n_pad: int) -> torch.Tensor:
    """[N, C] -> [ceil(N/32), C, 32] (channel-minor), zero-padded channels."""
    n, c = t.shape
    padded = torch.zeros(n_pad, c, dtype=t.dtype)
    padded[:n] = t
    return padded.view(n_pad // TILE, TILE, c).transpose(1, 2).contiguous()


def a8_unsupported(k: int, group: int, ext: ModuleType) -> str | None:
    """Why int8 activations cannot run for this shape with this kernel build, or None."""
    if not ext.int_a8():
        return f"int8 activations need AVX512-VNNI and AVX512-VBMI (kernel build {ext.ISA} on this CPU has not)"
    if k % 4 or (group != k and group % 4) or group > A8_MAX_GROUP:
        return f"int8 activations need K and the group multiples of 4, group <= {A8_MAX_GROUP} (K={k}, group={group})"
    return None


def prepack_int(q: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, bits: int,
                *, variant: str | None = None, amx: bool = True, act_int8: bool = False,
                input_scale: float | None = None, dpbf16: bool = True) -> PackedInt:
    """Repack a canonical INT8 / INT4 weight for ``int_linear`` (once, at load).

    ``variant`` names a kernel build (``avx512_bf16``, ``avx2``, ...) instead of the selected one
    (tests and benchmarks compare them); the caller makes sure this CPU runs it. ``amx=False``
    keeps bf16 batches off the AMX path even where the CPU has it (comparisons), ``dpbf16=False``
    off the VDPBF16PS one. ``act_int8``:
    every call quantizes x to int8 (per token, or by the static ``input_scale``); LookupError
    where that cannot run here (``a8_unsupported``).
    """
    group = _check(q, scales, zeros, bits)
    n, k = q.shape
    if input_scale is not None and not (act_int8 and input_scale > 0):
        raise ValueError(f"prepack_int: input_scale {input_scale} needs act_int8 and a positive scale")
    q = q.cpu()
    if bits == 4:
        if k % 2:
            q = torch.cat([q, torch.zeros(n, 1, dtype=torch.uint8)], dim=1)
        q = q[:, 0::2] | (q[:, 1::2] << 4)
    n_pad = -(-n // TILE) * TILE
    ext = cpu_isa.load_extension() if variant is None else cpu_isa.load_variant(variant)
    if act_int8 and (why := a8_unsupported(k, group, ext)):
        raise LookupError(why)
    z = zeros.cpu()
    z0 = z.reshape(-1)[0]
    amx = amx and ext.int_amx() and (group == k or group % AMX_K == 0)
    return PackedInt(
        weight=_tiles(q, n_pad),
        scales=_tiles(scales.cpu().to(torch.float32), n_pad),
        zeros=_tiles(z.to(torch.float32), n_pad),
        n=n, k=k, group=group, bits=bits, ext=ext,
        amx=amx, a8=act_int8, input_scale=float(input_scale or 0.0),
        dpbf16=dpbf16 and not amx and ext.int_dpbf16() and (group == k or group % 2 == 0),
        zero_point=float(z0) if bool((z == z0).all()) else -1.0,
    )


def dequantize(packed: PackedInt, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The weight [N, K] the packed codes stand for, in ``dtype`` (a transposed view)."""
    out = torch.empty(packed.k, packed.n, dtype=dtype)
    packed.ext.int_dequant(out=out, **packed._kw())
    return out.T


def _blas_linear(x2: torch.Tensor, packed: PackedInt) -> torch.Tensor:
    """x2 [M, K] @ w.T for many rows: blocks of tiles are dequantized (transposed, into a buffer
    that stays in cache) and each block's product is the BLAS's; returns [M, N] (a view)."""
    m, k, n = x2.shape[0], packed.k, packed.n
    tiles = packed.weight.shape[0]
    per = max(1, min(tiles, BLAS_BLOCK_BYTES // (k * x2.element_size() * TILE)))
    buf = torch.empty(k, per * TILE, dtype=x2.dtype)
    out_t = torch.empty(n, m, dtype=x2.dtype)
    x_t = x2.T
    for t0 in range(0, tiles, per):
        t1 = min(tiles, t0 + per)
        n0, n1 = t0 * TILE, min(n, t1 * TILE)
        w_t = buf[:, : n1 - n0]
        packed.ext.int_dequant(weight=packed.weight[t0:t1], scales=packed.scales[t0:t1],
                               zeros=packed.zeros[t0:t1], out=w_t, n=n1 - n0, k=k, group=packed.group,
                               bits=packed.bits)
        torch.mm(w_t.T, x_t, out=out_t[n0:n1])
    return out_t.T


def _dequant_gemm(packed: PackedInt, rows: int, dtype: torch.dtype) -> bool:
    """Whether ``int_linear`` dequantizes the whole weight for torch's GEMM: weight-only bf16
    batches of ``DEQUANT_GEMM_MIN_ROWS`` rows on an AMX CPU; elsewhere past ``GEMM_MAX_ROWS``
    where the bf16 copy fits ``WHOLE_DEQUANT_MAX_BYTES``, and from ``WHOLE_DEQUANT_MIN_ROWS``
    for larger weights. The weight is the same bf16 dequantization ``_blas_linear`` makes block
    by block, but one GEMM over it beats a GEMM per block plus the transposed copy of the result
    (the decoder linears of the SmolLM2-135M shape, INT8, 2-core Zen 5: 2048 rows 37.7 -> 19.7
    ms, as fast as the bf16 weights; 48-512 rows 0.63-0.82x the time). Never for weights of the
    VDPBF16PS kernel (``PackedInt.dpbf16``), which beats it at every size measured (up to 2048
    rows: ``DPBF16_MIN_ROWS``)."""
    if packed.a8 or dtype != torch.bfloat16 or packed.dpbf16:
        return False
    if packed.amx:
        return rows >= DEQUANT_GEMM_MIN_ROWS[packed.bits]
    small = packed.n * packed.k * 2 <= WHOLE_DEQUANT_MAX_BYTES
    return rows > GEMM_MAX_ROWS and (small or rows >= WHOLE_DEQUANT_MIN_ROWS)


def runs_in_kernel(packed: PackedInt, rows: int, dtype: torch.dtype) -> bool:
    """Whether ``int_linear`` computes ``rows`` rows of ``dtype`` in one C++ kernel call
    (``int_linear`` / ``int_linear_a8``), rather than through torch's BLAS."""
    if _dequant_gemm(packed, rows, dtype):
        return False
    return packed.a8 or rows <= GEMM_MAX_ROWS or ((packed.amx or packed.dpbf16) and dtype == torch.bfloat16)


def kernel_bias(bias: torch.Tensor | None) -> torch.Tensor | None:
    """``bias`` as the C++ kernels add it: contiguous float32 (the same values)."""
    if bias is not None and (bias.dtype != torch.float32 or not bias.is_contiguous()):
        bias = bias.to(torch.float32).contiguous()
    return bias


def int_linear(x: torch.Tensor, packed: PackedInt, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ w.T (+ bias)`` for x [..., K] (float32 / bfloat16 / float16); the result has x's dtype.

    Called once per quantized linear per step: the common case (x 2-D with unit inner stride)
    takes no reshape, and the extension gets positional arguments (its keyword matching alone
    cost about as much as a small layer's kernel)."""
    k = packed.k
    if x.shape[-1] != k:
        raise ValueError(f"int_linear: x {tuple(x.shape)} must have K={k} features")
    x2 = x if x.dim() == 2 and x.stride(1) == 1 else x.reshape(-1, k).contiguous()
    m = x2.shape[0]
    w = packed
    if _dequant_gemm(w, m, x2.dtype):
        wt = torch.empty(k, w.n, dtype=x2.dtype)
        w.ext.int_dequant(out=wt, **w._kw())
        y = torch.nn.functional.linear(x2, wt.T, None if bias is None else bias.to(x2.dtype))
        return y if x2 is x else y.view(*x.shape[:-1], w.n)
    if not runs_in_kernel(w, m, x2.dtype):
        y = _blas_linear(x2, w).contiguous()
        if bias is not None:
            y += bias.to(x.dtype)
        return y if x2 is x else y.view(*x.shape[:-1], w.n)
    bias = kernel_bias(bias)
    out = torch.empty(m, w.n, dtype=x.dtype)
    if w.a8:
        w.ext.int_linear_a8(x2, w.weight, w.scales, w.zeros, out, w.n, k, w.group, w.bits, bias,
                            w.input_scale, 0, w.amx, w.zero_point)
    else:
        w.ext.int_linear(x2, w.weight, w.scales, w.zeros, out, w.n, k, w.group, w.bits, bias, 0, w.amx,
                         w.zero_point, w.dp_min_rows)
    return out if x2 is x else out.view(*x.shape[:-1], w.n)
