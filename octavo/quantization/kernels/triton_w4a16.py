"""W4A16 linears on NVIDIA GPUs: 4-bit weights dequantized in registers by one Triton kernel,
a split-K GEMV on the CUDA cores for one row (and for float32 activations) and a tensor-core
tile for more rows.

Contract (``prepack_w4a16`` / ``w4a16_linear``): the canonical tensors every loader produces
(AWQ and GPTQ included, after their own unpacking): ``q`` uint8 [N, K] codes 0..15, ``scales``
float32 [N, K // group], ``zeros`` uint8 [N, K // group] (8 for symmetric formats);
``w[n, k] = (q[n, k] - zeros[n, k // group]) * scales[n, k // group]``; ``y = x @ w.T (+ bias)``
in x's dtype (bf16, fp16 or fp32). Groups: a multiple of 16 that divides 128 or is a multiple
of it, or one group per row (``group == K``, any K).

Repack, once at load, into *planes*: K is cut into blocks of 128 codes; block ``b`` of a row is
16 int32 words, and bits ``4i..4i+3`` of word ``j`` hold code ``k = 128 b + 16 i + j``. Plane
``i`` of a block (one nibble position over its 16 words) is then 16 consecutive codes, which
multiply 16 consecutive activations: the activation loads stay contiguous, and a 128-bit load
brings 32 codes. K is padded to a multiple of 128 with code 0 (the padded activations are
masked to 0).

Why this form (the kernel is bound by its instructions, not its bytes, unless each code costs
only a few): a code becomes a float without a conversion instruction. ``(word & (0xF << 4p)) |
0x4B000000`` read as a float32 is ``2**23 + c * 16**p`` exactly; subtracting ``2**23`` leaves
``c * 16**p``, and the activation it multiplies was scaled by ``16**-p`` (exact powers of two),
so each product is ``c * x`` rounded once. Per 8 codes: one shift, eight and-or (LOP3), eight
subtractions, eight FMAs. The zero point leaves the inner loop: ``sum (c - z) x = sum c x - z sum
x`` per group, the second term one product per row and group (the constant subtracted is the
same for every row, so nothing per row is rebroadcast into the weight tile's layout). The
tensor-core path extracts plane ``i``'s codes the same way (``p = 0`` after a shift), feeds them
to the dot in the activations' dtype (integers 0..15: exact), and multiplies each group's fp32
partial sums by its scales. Rounding: fp32 accumulation, as fp32 dequantization would give.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import triton
import triton.language as tl

from octavo.quantization.kernels import triton_gemv as g

SMALL_BATCH = 8
BLOCK_CODES = 128  # codes per block of a row: 8 planes of 16
WORDS = BLOCK_CODES // 8
MAGIC = 0x4B000000  # float32 2**23; a kernel argument so the and-or takes its mask as the immediate
_TWO23 = tl.constexpr(8388608.0)


@dataclass(frozen=True)
class W4Config:
    """One launch's tiling: ``block_n`` rows of W per program, ``split`` programs along K (each
    a run of whole 128-code blocks), the dot (``block_m`` rows, >= 16) or the FMA path (one row)."""

    block_n: int
    split: int = 1
    use_dot: bool = False
    num_warps: int = 4
    num_stages: int = 3
    asm: bool = False  # the dot's codes unpacked by ``_UNPACK_ASM`` (CUDA, 16-bit x, groups >= 128)

    def block_m(self, m: int) -> int:
        return min(64, max(16, triton.next_power_of_2(m))) if self.use_dot else 1

    def describe(self) -> str:
        kind = "asm" if self.asm else "dot" if self.use_dot else "fma"
        return f"{kind} n{self.block_n} split{self.split} w{self.num_warps}"


@dataclass
class W4A16Packed:
    """A 4-bit weight ready for ``w4a16_linear`` (made once at load by ``prepack_w4a16``)."""

    packed: torch.Tensor  # int32 [N, Kp // 8], planes (module docstring), Kp = K rounded up to 128
    scales: torch.Tensor  # float32 [N, K // group]
    zeros: torch.Tensor  # float32 [N, K // group]
    n: int
    k: int
    group: int  # as the kernel indexes scales: a per-row group is Kp
    configs: dict[int, W4Config] = field(default_factory=dict)  # batch bucket -> tiling
    counters: torch.Tensor | None = None  # int32 zeros: in-kernel K-split sums (``g.launch``)


def pack_planes(q: torch.Tensor) -> torch.Tensor:
    """uint8 codes [N, K] (0..15) -> int32 [N, Kp // 8] in plane order (K padded to 128 with 0s)."""
    n, k = q.shape
    kp = triton.cdiv(k, BLOCK_CODES) * BLOCK_CODES
    if kp != k:
        q = torch.nn.functional.pad(q, (0, kp - k))
    planes = q.reshape(n, kp // BLOCK_CODES, 8, WORDS).to(torch.int64)  # [n, block, plane i, word j]
    shifts = (torch.arange(8, dtype=torch.int64, device=q.device) * 4)[None, None, :, None]
    words = (planes << shifts).sum(2)
    words = torch.where(words >= 2**31, words - 2**32, words)
    return words.reshape(n, kp // 8).to(torch.int32).contiguous()


def group_supported(group: int, k: int) -> str | None:
    """None if the kernel takes ``group`` for a K-wide weight, else why not."""
    if group == k or (group % 16 == 0 and (BLOCK_CODES % group == 0 or group % BLOCK_CODES == 0)):
        return None
    return f"group size {group} (K={k}): the W4A16 kernel takes one group per row or multiples of 16 that divide 128 or are multiples of it"


def _config(n: int, k: int, m: int, sms: int, fp32: bool) -> W4Config:
    """The table (from H200 sweeps of ``candidates``): 128-row FMA tiles at one row (and for fp32
    activations, a program per row) split to fill the GPU four times over; the dot with the
    inline-asm unpacking above (the plane-by-plane dot where that cannot run), 128 columns,
    split to fill it twice; one split, eight warps past the decode batches."""
    if m == 1 or fp32:
        return W4Config(128, _split_for(n, k, 128, sms), False, 4)
    if m <= SMALL_BATCH:
        return W4Config(128, _split_for(n, k, 128, sms, waves=2), True, 4, asm=True)
    return W4Config(128, 1, True, 8, asm=True)


def _split_for(n: int, k: int, bn: int, sms: int, waves: int = 4) -> int:
    """Fewest K splits (powers of two) giving ``waves`` programs per SM, each split >= 2 blocks."""
    tiles_n, blocks = triton.cdiv(n, bn), triton.cdiv(k, BLOCK_CODES)
    split = 1
    while tiles_n * split < waves * sms and blocks // (2 * split) >= 2:
        split *= 2
    return split


def candidates(n: int, k: int, m: int, sms: int) -> list[W4Config]:
    """Tilings worth timing at ``m`` rows (the table's first): FMA tiles at one row, dot tiles
    with the inline-asm unpacking at any row count and the plane-by-plane dot above one row,
    each with the split that fills the GPU and half it."""
    out = [_config(n, k, m, sms, False)]
    shapes = [(bn, w, False, False) for bn in (128, 256) for w in (4, 8)] if m == 1 else []
    shapes += [(bn, w, True, True) for bn in (128, 256) for w in (4, 8)]  # the inline-asm unpacking
    shapes += [(bn, 4, True, False) for bn in (64, 128)] if m > 1 else []
    for bn, warps, dot, asm in shapes:
        split = _split_for(n, k, bn, sms)
        for sp in {split, max(1, split // 2)}:
            out.append(W4Config(bn, sp, dot, warps, asm=asm))
    return list(dict.fromkeys(out))


def prepack_w4a16(q: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, group: int) -> W4A16Packed:
    """Validate the canonical tensors and repack them for the kernel (once, at load)."""
    if q.dtype != torch.uint8 or q.dim() != 2:
        raise ValueError(f"w4a16 codes must be uint8 [N, K], got {q.dtype} {tuple(q.shape)}")
    n, k = q.shape
    if group <= 0 or k % group:
        raise ValueError(f"w4a16 group size {group} must divide K={k}")
    if why := group_supported(group, k):
        raise ValueError(why)
    want = (n, k // group)
    if tuple(scales.shape) != want or tuple(zeros.shape) != want:
        raise ValueError(
            f"w4a16 scales {tuple(scales.shape)} and zeros {tuple(zeros.shape)} must both be {list(want)}"
        )
    kp = triton.cdiv(k, BLOCK_CODES) * BLOCK_CODES
    sms = g.num_sms(q.device)
    configs = {m: _config(n, k, m, sms, False) for m in (1, 2, 4, 8)}
    return W4A16Packed(
        pack_planes(q), scales.to(torch.float32).contiguous(), zeros.to(torch.float32).contiguous(),
        n, k, kp if group == k else group, configs, g.new_counters(n, q.device),
    )


@triton.jit
def _plane_fma(words, magic, x_row, k0, K, i: tl.constexpr, EVEN_K: tl.constexpr):
    """Plane ``i`` of a block: its codes times their 16 activations, [BLOCK_N, 16] fp32 (the
    zero point is subtracted later, per group), and the activations (fp32 [16])."""
    P: tl.constexpr = i if i < 5 else i - 3  # nibble position after the shift (< 5: inside the mantissa)
    SH: tl.constexpr = 0 if i < 5 else 12
    offs = k0 + 16 * i + tl.arange(0, 16)
    x = tl.load(x_row + offs, mask=(offs < K) | EVEN_K, other=0.0).to(tl.float32)
    bits = ((words >> SH) & (15 << (4 * P))) | magic
    c = bits.to(tl.float32, bitcast=True) - _TWO23  # c * 16**P, exact
    return c * (x * (1.0 / (1 << (4 * P))))[None, :], x


@triton.jit
def _plane_dot(words, magic, x_rows, m_ok, k0, K, part, i: tl.constexpr, DOT_DTYPE: tl.constexpr,
               EVEN_K: tl.constexpr):
    """``part`` plus plane ``i``'s 16 codes dotted with their activations, and the activations."""
    offs = k0 + 16 * i + tl.arange(0, 16)
    x = tl.load(x_rows + offs[None, :], mask=m_ok[:, None] & ((offs < K) | EVEN_K)[None, :], other=0.0)
    c = (((words >> (4 * i)) & 15) | magic).to(tl.float32, bitcast=True) - _TWO23  # codes 0..15, exact
    return tl.dot(x.to(DOT_DTYPE), tl.trans(c.to(DOT_DTYPE)), part), x.to(tl.float32)


# Four bytes of a word (byte t: plane 2t in its low nibble, plane 2t + 1 in its high one) and
# the row's ``MAGIC + zero`` twice ($5) -> ``code - zero`` of the four low nibbles ($0, $1) and
# of the four high ones ($2, $3), as 16-bit floats: a byte permute puts each byte under the
# exponent byte of a 16-bit float whose mantissa step is one unit (bf16 0x43.. = 128 + m, fp16
# 0x64.. = 1024 + m), an and keeps one nibble of it, and the subtraction is exact. Per four
# bytes: one shift, four permutes, four ands, four subtractions (two codes each).
_UNPACK_ASM = """{
.reg .b32 a01, a23, b01, b23, s, mg;
mov.b32 mg, MAGIC4;
shr.u32 s, $4, 4;
prmt.b32 a01, $4, mg, 0x4140;
prmt.b32 a23, $4, mg, 0x4342;
prmt.b32 b01, s, mg, 0x4140;
prmt.b32 b23, s, mg, 0x4342;
and.b32 a01, a01, 0xFF0FFF0F;
and.b32 a23, a23, 0xFF0FFF0F;
and.b32 b01, b01, 0xFF0FFF0F;
and.b32 b23, b23, 0xFF0FFF0F;
sub.rn.TYPE $0, a01, $5;
sub.rn.TYPE $1, a23, $5;
sub.rn.TYPE $2, b01, $5;
sub.rn.TYPE $3, b23, $5;
}"""
_UNPACK_BF16 = tl.constexpr(_UNPACK_ASM.replace("MAGIC4", "0x43434343").replace("TYPE", "bf16x2"))
_UNPACK_F16 = tl.constexpr(_UNPACK_ASM.replace("MAGIC4", "0x64646464").replace("TYPE", "f16x2"))


@triton.jit
def _block_asm(w_base, n_ok, x_rows, ka, m_ok, srow, zrow, b, K, acc, GROUP: tl.constexpr,
               DOT_DTYPE: tl.constexpr, EVEN_K: tl.constexpr):
    """``acc`` plus one 128-code block (one scale group spans it: ``GROUP >= 128``) on the tensor
    cores, its ``code - zero`` unpacked two per instruction (``_UNPACK_ASM``; CUDA only). Byte
    ``c = 4 j + t`` of a block holds codes ``32 t + j`` (low nibble) and ``32 t + 16 + j``: ``ka``."""
    c = tl.arange(0, 64)
    w8 = tl.load(w_base + b * 64 + c[None, :], mask=n_ok[:, None], other=0)
    s = tl.load(srow + (b * 128) // GROUP, mask=n_ok, other=0.0)
    z = tl.load(zrow + (b * 128) // GROUP, mask=n_ok, other=0.0)
    if DOT_DTYPE == tl.bfloat16:
        zb = (z + 128.0).to(tl.bfloat16)[:, None] + tl.zeros(w8.shape, tl.bfloat16)
        lo, hi = tl.inline_asm_elementwise(_UNPACK_BF16, "=r,=r,=r,=r,r,r,r", [w8, zb],
                                           dtype=(tl.bfloat16, tl.bfloat16), is_pure=True, pack=4)
    else:
        zb = (z + 1024.0).to(tl.float16)[:, None] + tl.zeros(w8.shape, tl.float16)
        lo, hi = tl.inline_asm_elementwise(_UNPACK_F16, "=r,=r,=r,=r,r,r,r", [w8, zb],
                                           dtype=(tl.float16, tl.float16), is_pure=True, pack=4)
    k = b * 128 + ka
    xa = tl.load(x_rows + k[None, :], mask=m_ok[:, None] & ((k < K) | EVEN_K)[None, :], other=0.0)
    xb = tl.load(x_rows + 16 + k[None, :], mask=m_ok[:, None] & ((k + 16 < K) | EVEN_K)[None, :], other=0.0)
    part = tl.dot(xa, tl.trans(lo))
    part = tl.dot(xb, tl.trans(hi), part)
    return acc + part * s[None, :]


@triton.jit
def _block_planes(w_rows, n_ok, x_rows, x_row, m_ok, srow, zrow, magic, b, K, acc, corr, GROUP: tl.constexpr,
                  USE_DOT: tl.constexpr, DOT_DTYPE: tl.constexpr, EVEN_K: tl.constexpr):
    """One block plane by plane (FMA, or one dot per plane); a scale group spans ``PPG`` planes."""
    PPG: tl.constexpr = 8 if GROUP >= 128 else GROUP // 16
    words = tl.load(w_rows + b * 16, mask=n_ok[:, None], other=0)
    k0 = b * 128
    for gi in tl.static_range(8 // PPG):
        gidx = (k0 + gi * PPG * 16) // GROUP
        s = tl.load(srow + gidx, mask=n_ok, other=0.0)
        z = tl.load(zrow + gidx, mask=n_ok, other=0.0)
        if USE_DOT:
            part, xs = _plane_dot(words, magic, x_rows, m_ok, k0, K, tl.zeros_like(corr), gi * PPG, DOT_DTYPE, EVEN_K)
            for pi in tl.static_range(1, PPG):
                part, x = _plane_dot(words, magic, x_rows, m_ok, k0, K, part, gi * PPG + pi, DOT_DTYPE, EVEN_K)
                xs += x
            acc += part * s[None, :]
            corr += tl.sum(xs, axis=1)[:, None] * (s * z)[None, :]
        else:
            part, xs = _plane_fma(words, magic, x_row, k0, K, gi * PPG, EVEN_K)
            for pi in tl.static_range(1, PPG):
                p, x = _plane_fma(words, magic, x_row, k0, K, gi * PPG + pi, EVEN_K)
                part += p
                xs += x
            acc += part * s[:, None]
            corr += (tl.sum(xs, axis=0) * (s * z))[None, :]
    return acc, corr


@triton.jit
def _w4_kernel(
    x_ptr, w_ptr, s_ptr, z_ptr, bias_ptr, out_ptr, part_ptr, cnt_ptr,
    M, N, K, blocks_per_split, stride_xm, stride_wn, stride_sn, stride_om, magic,
    GROUP: tl.constexpr, HAS_BIAS: tl.constexpr, SPLIT: tl.constexpr, FUSED_REDUCE: tl.constexpr,
    USE_DOT: tl.constexpr, DOT_DTYPE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    EVEN_K: tl.constexpr, ASM: tl.constexpr,
):
    """Grid (N tiles, K splits, M tiles). Each program streams [BLOCK_N, blocks] of W once and
    accumulates ``sum c x`` per group times its scales (``acc``) and ``sum z x`` times the scales
    (``corr``), subtracted once at the end."""
    pid_k = tl.program_id(1)
    offs_m = tl.program_id(2) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    m_ok, n_ok = offs_m < M, offs_n < N
    b_start = pid_k * blocks_per_split
    b_end = tl.minimum(tl.cdiv(K, 128), b_start + blocks_per_split)
    w_base = w_ptr + offs_n.to(tl.int64)[:, None] * stride_wn  # ASM: bytes, else int32 words
    w_rows = w_base + tl.arange(0, 16)[None, :]
    x_rows = x_ptr + offs_m.to(tl.int64)[:, None] * stride_xm
    x_row = x_ptr + (tl.program_id(2) * BLOCK_M).to(tl.int64) * stride_xm  # the FMA path's one row
    srow = s_ptr + offs_n.to(tl.int64) * stride_sn
    zrow = z_ptr + offs_n.to(tl.int64) * stride_sn
    if USE_DOT:
        acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    else:
        acc = tl.zeros((BLOCK_N, 16), tl.float32)
    corr = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)  # sum over groups of s * z * (sum of x)
    ka = 32 * (tl.arange(0, 64) % 4) + tl.arange(0, 64) // 4  # ASM: the codes of a block's bytes
    for b in range(b_start, b_end):
        if ASM:
            acc = _block_asm(w_base, n_ok, x_rows, ka, m_ok, srow, zrow, b, K, acc, GROUP, DOT_DTYPE, EVEN_K)
        else:
            acc, corr = _block_planes(w_rows, n_ok, x_rows, x_row, m_ok, srow, zrow, magic, b, K, acc, corr,
                                      GROUP, USE_DOT, DOT_DTYPE, EVEN_K)
    if not USE_DOT:
        acc = tl.sum(acc, axis=1)[None, :]
    acc -= corr
    g._epilogue(acc, s_ptr, s_ptr, bias_ptr, out_ptr, part_ptr, cnt_ptr, offs_m, offs_n, m_ok, n_ok, pid_k,
                M, N, stride_om, 0, False, HAS_BIAS, SPLIT, FUSED_REDUCE)


def asm_applies(dtype: torch.dtype, group: int) -> bool:
    """Whether the inline-assembly unpacking can run: compiled CUDA (not the interpreter),
    bf16/fp16 activations, and one scale group per 128-code block or more."""
    return not g.INTERPRETED and dtype in (torch.bfloat16, torch.float16) and group % BLOCK_CODES == 0


def _bucket(m: int) -> int:
    return 1 if m <= 1 else 2 if m <= 2 else 4 if m <= 4 else 8


def launch(x: torch.Tensor, p: W4A16Packed, cfg: W4Config, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``y[M, N]`` for a 2-D ``x`` [M, K] (unit stride along K) at tiling ``cfg``: allocates
    ``y`` and, with a K split and no counters, the fp32 partials; capturable in a CUDA graph."""
    m, n = x.shape[0], p.n
    out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if m == 0:
        return out
    blocks = triton.cdiv(p.k, BLOCK_CODES)
    per = triton.cdiv(blocks, cfg.split)
    split = triton.cdiv(blocks, per)
    bm = cfg.block_m(m)
    tiles = triton.cdiv(n, cfg.block_n) * triton.cdiv(m, bm)
    fused = split > 1 and p.counters is not None and p.counters.numel() >= tiles
    part = out if split == 1 else torch.empty((split, m, n), dtype=torch.float32, device=x.device)
    dot_dtype = tl.float32 if g.INTERPRETED or x.dtype == torch.float32 else g._DOT_DTYPES[x.dtype]
    asm = cfg.asm and cfg.use_dot and asm_applies(x.dtype, p.group)
    w = p.packed.view(torch.uint8) if asm else p.packed
    _w4_kernel[(triton.cdiv(n, cfg.block_n), split, triton.cdiv(m, bm))](
        x, w, p.scales, p.zeros, bias if bias is not None else out, out, part,
        p.counters if fused else out, m, n, p.k, per, x.stride(0), w.stride(0), p.scales.stride(0),
        out.stride(0), MAGIC, GROUP=p.group, HAS_BIAS=bias is not None, SPLIT=split, FUSED_REDUCE=fused,
        USE_DOT=cfg.use_dot, DOT_DTYPE=dot_dtype, BLOCK_M=bm, BLOCK_N=cfg.block_n,
        EVEN_K=p.k % BLOCK_CODES == 0, ASM=asm, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    if split > 1 and not fused:
        g.reduce_splits(part, bias, out)
    return out


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
        cfg = _config(n, k, m, g.DEFAULT_SMS, fp32)
    return launch(x2, packed, cfg, bias).reshape(*x.shape[:-1], n)
