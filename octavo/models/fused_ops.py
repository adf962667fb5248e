"""Fused GPU versions of the small per-layer ops: RMSNorm(+residual), SiLU·mul, RoPE; and the
decode GEMV that replaces cuBLAS on bf16/fp16 linears at batch <= 8 where it is faster.

Each is one Triton launch where eager torch takes several, and each rounds exactly where the
eager op in ``layers.py`` rounds (to the model dtype between the same steps), so bf16/fp16
results match eager torch up to float32 reduction order. ``layers.py`` calls these for
models the CUDA/ROCm platforms bound them to, when triton imports; CPU runs (and the fp32 HF-equivalence tests) keep the
plain torch path. Set ``ENABLED = False`` to compare against eager.

Linears: ``select_linear_kernels`` runs once at load (the platform's ``decode_gemv_policy``):
for each distinct weight shape and batch bucket 1/2/4/8 it times cuBLAS against a few split-K
GEMV tilings (``octavo.quantization.kernels.triton_gemv``) and keeps the GEMV only where it wins
("auto"; weights under 1 MiB keep cuBLAS untimed; choices are kept for the process), or takes
the table's tiling without timing ("table"). ``linear_usable`` then answers
per call from that choice; captured decode graphs record whichever kernel was chosen. Set
``GEMV_ENABLED = False`` to compare against cuBLAS (recapture the graphs after flipping it).

Qwen3's q/k norms and RoPE: ``qk_norm_rope``, one launch for the three ops.
"""

from __future__ import annotations

import logging

import torch
import triton
import triton.language as tl

ENABLED = True
GEMV_ENABLED = True
GEMV_MAX_ROWS = 8
QK_NORM_ROPE_ENABLED = True  # False: Qwen3's q/k norms and RoPE as three launches (comparisons)
# Qwen3: the q/k norm + RoPE launch also writes the token's K/V into the paged cache (attention
# backends with ``supports_kv_written``), so the separate KV-write launch disappears.
KV_WRITE_IN_ROPE = True
_GEMV_DTYPES = (torch.bfloat16, torch.float16)

logger = logging.getLogger(__name__)


def usable(x: torch.Tensor) -> bool:
    """The platform bound these kernels to a CUDA/ROCm model at load (``layers.bind_fused_ops``)."""
    return ENABLED


def _linear_types() -> tuple[type, ...]:
    from octavo.distributed.layers import (
        ColumnParallelLinear,
        RowParallelLinear,
        VocabParallelEmbedding,
    )

    return (ColumnParallelLinear, RowParallelLinear, VocabParallelEmbedding)  # + the LM head


# Weights smaller than this keep cuBLAS under "auto" without timing: a launch, not the bytes,
# is their cost, and timing them would only slow the start of small models.
AUTO_MIN_WEIGHT_BYTES = 1 << 20
# (N, K, dtype, device, policy) -> choice, kept for the process: engines started again (tests,
# benchmarks) on the same GPU reuse the timings.
_CHOICES: dict[tuple, dict] = {}


def _choose(weight: torch.Tensor, policy: str) -> dict:
    """Batch bucket -> GemvConfig (or None: cuBLAS) for one weight shape, and the timings."""
    from octavo.quantization.kernels import triton_gemv as g

    key = (*weight.shape, weight.dtype, str(weight.device), policy)
    if key in _CHOICES:
        return _CHOICES[key]
    sms = g.num_sms(weight.device)
    table, times = {}, {}
    small = weight.numel() * weight.element_size() < AUTO_MIN_WEIGHT_BYTES
    for m in g.BATCH_BUCKETS:
        if policy == "auto" and small:
            table[m] = None
        elif policy == "auto":
            table[m], times[m] = g.time_against_cublas(weight, m, sms)
        else:
            table[m] = g.default_config(*weight.shape, m, sms)
    _CHOICES[key] = {"table": table, "times": times}
    return _CHOICES[key]


def select_linear_kernels(model: torch.nn.Module, policy: str) -> dict:
    """Choose, once at load, cuBLAS or a GEMV tiling per linear weight shape and batch bucket.

    ``policy``: "auto" (time both on the device), "table" (the GEMV's default tiling) or
    "off". Returns ``{(N, K, dtype): {"table": {bucket: cfg | None}, "times": ...}}``; each
    linear module keeps its shape's table (``linear_usable`` reads it).
    """
    if policy not in ("auto", "table", "off"):
        raise ValueError(f"decode GEMV policy {policy!r}: expected auto, table or off")
    choices: dict = {}
    if policy == "off":
        return choices
    for module in model.modules():
        w = getattr(module, "weight", None)
        if not isinstance(module, _linear_types()) or w is None or w.dim() != 2 or w.dtype not in _GEMV_DTYPES:
            continue
        key = (*w.shape, w.dtype)
        if key not in choices:
            with torch.no_grad():
                choices[key] = _choose(w.detach(), policy)
            picked = {m: (c.describe() if c else "cublas") for m, c in choices[key]["table"].items()}
            logger.info("decode GEMV for [%d, %d] %s (%s): %s", *w.shape, w.dtype, policy, picked)
        module.__dict__["_octavo_gemv"] = choices[key]["table"]
    return choices


def _gemv_config(layer, x: torch.Tensor):
    table = layer.__dict__.get("_octavo_gemv")
    if table is None or not GEMV_ENABLED or x.dtype != layer.weight.dtype:
        return None
    rows = x.numel() // max(1, x.shape[-1])
    if rows > GEMV_MAX_ROWS or (x.requires_grad and torch.is_grad_enabled()):
        return None
    tp = getattr(layer, "tp", None)
    if tp is not None and tp.world_size > 1:  # row-parallel / vocab-parallel: torch path reduces
        return None
    from octavo.quantization.kernels.triton_gemv import bucket

    return table.get(bucket(rows))


def linear_usable(layer, x: torch.Tensor) -> bool:
    """True where the load-time choice put this layer's batch on the GEMV (else cuBLAS)."""
    return _gemv_config(layer, x) is not None


def linear(layer, x: torch.Tensor) -> torch.Tensor:
    """``F.linear(x, layer.weight, layer.bias)`` through the chosen split-K GEMV."""
    from octavo.quantization.kernels.triton_gemv import launch

    cfg = _gemv_config(layer, x)
    w = layer.weight
    n, k = w.shape
    x2 = x.reshape(-1, k)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    y = launch(x2, w, n, k, cfg, out_dtype=x.dtype, bias=getattr(layer, "bias", None), dot_dtype=x.dtype)
    return y.reshape(*x.shape[:-1], n)


@triton.jit
def _rms_norm_kernel(
    x_ptr, res_ptr, w_ptr, out_ptr, res_out_ptr,
    stride_x, stride_r, stride_o, stride_ro,
    n, eps,
    HAS_RESIDUAL: tl.constexpr, BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        r = tl.load(res_ptr + row * stride_r + offs, mask=mask, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(x.dtype)  # rounded like eager x + residual
        tl.store(res_out_ptr + row * stride_ro + offs, x, mask=mask)
    h = x.to(tl.float32)
    var = tl.sum(h * h, axis=0) / n
    h = (h * tl.rsqrt(var + eps)).to(x.dtype)
    w = tl.load(w_ptr + offs, mask=mask, other=0.0)
    y = (w.to(tl.float32) * h.to(tl.float32)).to(out_ptr.dtype.element_ty)
    tl.store(out_ptr + row * stride_o + offs, y, mask=mask)


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
):
    """``norm(x)`` or ``(norm(x + residual), x + residual)``, like ``layers.RMSNorm``."""
    shape = x.shape
    n = shape[-1]
    x2 = x.reshape(-1, n)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    rows = x2.shape[0]
    out_dtype = torch.promote_types(weight.dtype, x.dtype)
    out = torch.empty((rows, n), dtype=out_dtype, device=x.device)
    if residual is not None:
        r2 = residual.reshape(-1, n)
        res_out = torch.empty((rows, n), dtype=x.dtype, device=x.device)
    else:
        r2 = res_out = x2
    if rows:
        block = triton.next_power_of_2(n)
        _rms_norm_kernel[(rows,)](
            x2, r2, weight, out, res_out,
            x2.stride(0), r2.stride(0), out.stride(0), res_out.stride(0),
            n, eps,
            HAS_RESIDUAL=residual is not None, BLOCK=block,
            num_warps=min(16, max(1, block // 256)),
        )
    out = out.view(shape)
    return out if residual is None else (out, res_out.view(shape))


@triton.jit
def _silu_mul_kernel(x_ptr, out_ptr, stride_x, stride_o, n, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    g = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0)
    u = tl.load(x_ptr + row * stride_x + n + offs, mask=mask, other=0.0)
    gf = g.to(tl.float32)
    s = (gf / (1.0 + tl.exp(-gf))).to(g.dtype)  # F.silu, rounded
    y = (s.to(tl.float32) * u.to(tl.float32)).to(g.dtype)
    tl.store(out_ptr + row * stride_o + offs, y, mask=mask)


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    n = gate_up.shape[-1] // 2
    x2 = gate_up.reshape(-1, 2 * n)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    rows = x2.shape[0]
    out = torch.empty((rows, n), dtype=gate_up.dtype, device=gate_up.device)
    if rows:
        block = min(1024, triton.next_power_of_2(n))
        _silu_mul_kernel[(rows, triton.cdiv(n, block))](
            x2, out, x2.stride(0), out.stride(0), n, BLOCK=block, num_warps=4
        )
    return out.view(*gate_up.shape[:-1], n)


@triton.jit
def _cache_store(c_ptr, dst, x1, x2, inv_scale, HALF: tl.constexpr, mask, FP8_MAX: tl.constexpr):
    """Store a head's two halves into a KV cache as ``paged_attention.write_kv`` does (an fp8
    cache: ``x / scale`` saturated at the format's largest value)."""
    if FP8_MAX > 0.0:
        x1 = tl.clamp(x1.to(tl.float32) * inv_scale, -FP8_MAX, FP8_MAX)
        x2 = tl.clamp(x2.to(tl.float32) * inv_scale, -FP8_MAX, FP8_MAX)
    tl.store(c_ptr + dst, x1.to(c_ptr.dtype.element_ty), mask=mask)
    tl.store(c_ptr + dst + HALF, x2.to(c_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _rope_kernel(
    q_ptr, k_ptr, qw_ptr, kw_ptr, cos_ptr, sin_ptr, pos_ptr, qo_ptr, ko_ptr,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_qot, stride_kot, stride_cos, eps,
    v_ptr, kc_ptr, vc_ptr, slot_ptr, stride_vt, stride_vh, stride_cb, stride_cs, stride_ch,
    inv_k_scale, inv_v_scale,
    NUM_Q_HEADS: tl.constexpr, NUM_K_HEADS: tl.constexpr, HALF: tl.constexpr,
    HP: tl.constexpr, DP: tl.constexpr, NORM: tl.constexpr,
    WRITE_KV: tl.constexpr = False, BLOCK_SIZE: tl.constexpr = 16, FP8_MAX: tl.constexpr = 0.0,
):
    """Neox RoPE of one token's q and k heads; NORM: each head RMS-normed first (Qwen3's q/k
    norms, weights qw / kw, rounded as ``_rms_norm_kernel`` rounds). WRITE_KV: also store the
    rotated k and the token's v into the paged KV cache at its slot (none where slot < 0)."""
    t = tl.program_id(0).to(tl.int64)
    pos = tl.load(pos_ptr + t).to(tl.int64)
    offs_h = tl.arange(0, HP)
    offs_d = tl.arange(0, DP)
    d_ok = offs_d < HALF
    c1 = tl.load(cos_ptr + pos * stride_cos + offs_d, mask=d_ok, other=0.0).to(tl.float32)
    c2 = tl.load(cos_ptr + pos * stride_cos + HALF + offs_d, mask=d_ok, other=0.0).to(tl.float32)
    s1 = tl.load(sin_ptr + pos * stride_cos + offs_d, mask=d_ok, other=0.0).to(tl.float32)
    s2 = tl.load(sin_ptr + pos * stride_cos + HALF + offs_d, mask=d_ok, other=0.0).to(tl.float32)
    for which in tl.static_range(2):
        if which == 0:
            src, dst, w_ptr, st, sh, so, nh = q_ptr, qo_ptr, qw_ptr, stride_qt, stride_qh, stride_qot, NUM_Q_HEADS
        else:
            src, dst, w_ptr, st, sh, so, nh = k_ptr, ko_ptr, kw_ptr, stride_kt, stride_kh, stride_kot, NUM_K_HEADS
        mask = (offs_h[:, None] < nh) & d_ok[None, :]
        p1 = src + t * st + offs_h[:, None] * sh + offs_d[None, :]
        x1 = tl.load(p1, mask=mask, other=0.0)
        x2 = tl.load(p1 + HALF, mask=mask, other=0.0)
        dt = x1.dtype
        f1 = x1.to(tl.float32)
        f2 = x2.to(tl.float32)
        if NORM:  # RMSNorm of every head, rounded as the eager op: w * (x / rms(x)).to(dtype)
            r = tl.rsqrt((tl.sum(f1 * f1, axis=1) + tl.sum(f2 * f2, axis=1)) / (2 * HALF) + eps)[:, None]
            w1 = tl.load(w_ptr + offs_d, mask=d_ok, other=0.0).to(tl.float32)[None, :]
            w2 = tl.load(w_ptr + HALF + offs_d, mask=d_ok, other=0.0).to(tl.float32)[None, :]
            f1 = (w1 * (f1 * r).to(dt).to(tl.float32)).to(dt).to(tl.float32)
            f2 = (w2 * (f2 * r).to(dt).to(tl.float32)).to(dt).to(tl.float32)
        # Eager: x * cos + rotate_half(x) * sin, each product rounded to the model dtype.
        y1 = ((f1 * c1[None, :]).to(dt).to(tl.float32) + (-f2 * s1[None, :]).to(dt).to(tl.float32)).to(dt)
        y2 = ((f2 * c2[None, :]).to(dt).to(tl.float32) + (f1 * s2[None, :]).to(dt).to(tl.float32)).to(dt)
        q1 = dst + t * so + offs_h[:, None] * (HALF * 2) + offs_d[None, :]
        tl.store(q1, y1, mask=mask)
        tl.store(q1 + HALF, y2, mask=mask)
        if WRITE_KV and which == 1:
            slot = tl.load(slot_ptr + t)
            if slot >= 0:
                c_off = (slot // BLOCK_SIZE) * stride_cb + (slot % BLOCK_SIZE) * stride_cs
                c_dst = c_off + offs_h[:, None] * stride_ch + offs_d[None, :]
                _cache_store(kc_ptr, c_dst, y1, y2, inv_k_scale, HALF, mask, FP8_MAX)
                pv = v_ptr + t * stride_vt + offs_h[:, None] * stride_vh + offs_d[None, :]
                v1 = tl.load(pv, mask=mask, other=0.0)
                v2 = tl.load(pv + HALF, mask=mask, other=0.0)
                _cache_store(vc_ptr, c_dst, v1, v2, inv_v_scale, HALF, mask, FP8_MAX)


def rope(positions, q, k, cos, sin):
    """Neox RoPE of ``q`` [T, H, D] and ``k`` [T, Hk, D]; returns new contiguous tensors."""
    t, h, d = q.shape
    hk = k.shape[1]
    qo = torch.empty((t, h, d), dtype=q.dtype, device=q.device)
    ko = torch.empty((t, hk, d), dtype=k.dtype, device=k.device)
    if t:
        _launch_rope(positions, q, k, None, None, 0.0, cos, sin, qo, ko)
    return qo, ko


def _launch_rope(positions, q, k, q_weight, k_weight, eps, cos, sin, qo, ko, kv_write=None) -> None:
    """``_rope_kernel`` over every token (norm weights None: RoPE alone; ``kv_write``: see
    ``qk_norm_rope``)."""
    t, h, d = q.shape
    hk = k.shape[1]
    assert q.stride(-1) == 1 and k.stride(-1) == 1 and cos.stride(-1) == 1
    norm = q_weight is not None
    _rope_kernel[(t,)](
        q, k, q_weight if norm else q, k_weight if norm else k, cos, sin, positions, qo, ko,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), qo.stride(0), ko.stride(0),
        cos.stride(0), eps, *_kv_write_args(kv_write, k),
        NUM_Q_HEADS=h, NUM_K_HEADS=hk, HALF=d // 2,
        HP=triton.next_power_of_2(max(h, hk)), DP=triton.next_power_of_2(d // 2), NORM=norm,
        **_kv_write_meta(kv_write),
        num_warps=4,
    )


def _kv_write_args(kv_write, k: torch.Tensor) -> tuple:
    """The kernel's KV-write arguments (placeholders when there is no write)."""
    if kv_write is None:
        return (k, k, k, k, 0, 0, 0, 0, 0, 1.0, 1.0)
    v, kv_cache, slots, k_scale, v_scale = kv_write
    kc, vc = kv_cache[0], kv_cache[1]
    return (v, kc, vc, slots, v.stride(0), v.stride(1), kc.stride(0), kc.stride(1), kc.stride(2),
            1.0 / k_scale, 1.0 / v_scale)


def _kv_write_meta(kv_write) -> dict:
    from octavo.attention.kv_cache_dtype import fp8_max, is_fp8

    if kv_write is None:
        return {}
    kc = kv_write[1][0]
    return {"WRITE_KV": True, "BLOCK_SIZE": kc.shape[1],
            "FP8_MAX": fp8_max(kc.dtype) if is_fp8(kc.dtype) else 0.0}


def check_kv_write(kv_write, k: torch.Tensor) -> None:
    """A KV write target ``(v, kv_cache, slot_mapping, k_scale, v_scale)`` that matches ``k``
    [T, Hk, D]: ``kv_cache`` [2, blocks, block_size, Hk, D], one slot per token; else ValueError."""
    v, kv_cache, slots, _, _ = kv_write
    t, hk, d = k.shape
    if (v.shape != k.shape or kv_cache.dim() != 5 or kv_cache.shape[0] != 2
            or tuple(kv_cache.shape[3:]) != (hk, d) or slots.shape != (t,) or v.stride(-1) != 1
            or kv_cache[0].stride(-1) != 1):
        raise ValueError(f"KV write target does not fit k {tuple(k.shape)}: v {tuple(v.shape)}, "
                         f"cache {tuple(kv_cache.shape)}, slots {tuple(slots.shape)}")


def qk_norm_rope(positions, q, k, q_weight, k_weight, eps: float, cos, sin, kv_write=None):
    """Qwen3's per-head RMSNorm of ``q`` [T, H, D] and ``k`` [T, Hk, D] (weights [D], one
    ``eps``), then neox RoPE of the whole head, in one launch: ``rope(positions,
    rms_norm(q), rms_norm(k))`` with the same roundings. Returns new contiguous tensors.
    The weights must have the activations' dtype (the norm's output dtype is then theirs).
    ``kv_write = (v, kv_cache, slot_mapping, k_scale, v_scale)``: the same launch also does
    ``paged_attention.write_kv(rotated k, v, kv_cache, slot_mapping, k_scale, v_scale)``."""
    t, h, d = q.shape
    hk = k.shape[1]
    if q_weight.dtype != q.dtype or k_weight.dtype != k.dtype or d % 2:
        raise ValueError(f"qk_norm_rope: {q.dtype} heads of size {d} with {q_weight.dtype} norm weights")
    if kv_write is not None:
        check_kv_write(kv_write, k)
    qo = torch.empty((t, h, d), dtype=q.dtype, device=q.device)
    ko = torch.empty((t, hk, d), dtype=k.dtype, device=k.device)
    if t:
        _launch_rope(positions, q, k, q_weight, k_weight, eps, cos, sin, qo, ko, kv_write)
    return qo, ko
