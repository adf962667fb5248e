"""Fused CPU versions of the small per-layer ops: RMSNorm(+residual), SiLU·mul, RoPE.

One C++ call each (octavo's CPU extension, the ISA variant ``octavo.cpu_isa`` picked) where
eager torch dispatches 3 to 14 ops; at decode batch sizes that per-op overhead, not the
arithmetic, is what these ops cost. Each rounds to the model dtype exactly where the eager op in
``layers.py`` rounds, so bf16/fp16 results match eager torch up to fp32 reduction order and the
last bit of ``exp``. ``layers.py`` calls these for models the CPU platform bound them to (when the extension is
built);
set ``ENABLED = False`` to compare against eager.
Same API as ``octavo.models.fused_ops`` (the GPU versions).
"""

from __future__ import annotations

import sys

import torch

from octavo.core.sampler import first_max_index as _torch_first_max
from octavo.cpu_isa import load_extension

_ext = load_extension()  # ImportError when the extension is not built: layers.py falls back
_rms_norm = _ext.rms_norm
_silu_and_mul = _ext.silu_and_mul
_rope = _ext.rope

ENABLED = True
_HALF = (torch.bfloat16, torch.float16)


def usable(x: torch.Tensor) -> bool:
    """bf16/fp16 CPU tensors outside autograd. float32 keeps the eager torch path: it is the
    reference mode (token-identical to HF transformers), not a speed mode."""
    return (
        ENABLED
        and x.dtype in _HALF
        and not (x.requires_grad and torch.is_grad_enabled())
        and not torch.compiler.is_compiling()  # graph mode: inductor fuses the torch ops itself
    )


def _rows(x: torch.Tensor, n: int) -> torch.Tensor:
    if x.dim() == 2 and x.stride(1) == 1:
        return x
    x2 = x.reshape(-1, n)
    return x2 if x2.stride(-1) == 1 else x2.contiguous()


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None):
    """``norm(x)`` or ``(norm(x + residual), x + residual)``, like ``layers.RMSNorm``."""
    shape = x.shape
    n = shape[-1]
    x2 = _rows(x, n)
    rows = x2.shape[0]
    out = torch.empty((rows, n), dtype=x.dtype)
    w = weight if weight.is_contiguous() else weight.contiguous()
    if residual is None:
        _rms_norm(x=x2, weight=w, out=out, eps=float(eps))
        return out.view(shape)
    res_out = torch.empty((rows, n), dtype=x.dtype)
    _rms_norm(x=x2, weight=w, out=out, eps=float(eps), residual=_rows(residual, n), residual_out=res_out)
    return out.view(shape), res_out.view(shape)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """``silu(x[..., :n]) * x[..., n:]``."""
    shape = x.shape
    n = shape[-1] // 2
    x2 = _rows(x, 2 * n)
    out = torch.empty((x2.shape[0], n), dtype=x.dtype)
    _silu_and_mul(x=x2, out=out)
    return out.view(*shape[:-1], n)


def rope(positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
    """Neox RoPE of ``q`` [T, H, D] and ``k`` [T, Hk, D] (strided views allowed) -> new tensors."""
    T, H, D = q.shape
    if q.stride(-1) != 1:
        q = q.contiguous()
    if k.stride(-1) != 1:
        k = k.contiguous()
    if positions.dtype != torch.int64 or not positions.is_contiguous():
        positions = positions.to(torch.int64).contiguous()
    q_out = torch.empty((T, H, D), dtype=q.dtype)
    k_out = torch.empty((T, k.shape[1], D), dtype=q.dtype)
    _rope(positions=positions, q=q, k=k, cos=cos.contiguous(), sin=sin.contiguous(), q_out=q_out, k_out=k_out)
    return q_out, k_out


_row_argmax = getattr(_ext, "row_argmax", None)
_ARGMAX_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def first_max_index(x: torch.Tensor) -> torch.Tensor:
    """``x.argmax(dim=-1)`` (``octavo.core.sampler.first_max_index``: the first maximum, a NaN
    counting as the maximum) for 2-D rows with a unit inner stride, in one pass over them on
    the kernels' threads; torch's ``max(dim=-1)`` ran single-threaded over a [48, 49152]
    logits tensor at ~1.5 ms. Anything else goes to ``first_max_index``."""
    if (
        _row_argmax is None
        or x.dim() != 2
        or x.dtype not in _ARGMAX_DTYPES
        or x.stride(-1) != 1
        or x.stride(0) < x.shape[1]
        or x.shape[-1] == 0
        or torch.compiler.is_compiling()
    ):
        return _torch_first_max(x)
    out = torch.empty(x.shape[0], dtype=torch.int64)
    _row_argmax(x=x, out=out)
    return out


# -- linear layers: oneDNN with the weight prepacked once ------------------------------------
# torch's F.linear on bf16 CPU tensors already calls oneDNN, but with the plain weight, which
# oneDNN reorders on every call; prepacking once (what torch.compile's CPU freezing does) gives
# bit-identical results and is ~2x faster at batch 1 and 10-40% at decode batch sizes. The
# packed copy is cached on the module and rebuilt if the weight is modified in place or
# replaced (version counter / data pointer). Costs one extra copy of the linear weights.

PREPACK = hasattr(torch.ops.mkldnn, "_reorder_linear_weight") and torch.backends.mkldnn.is_available()
_PACK_HINT = 128  # oneDNN's layout hint (a typical M); results do not depend on it
_linear_pointwise = torch.ops.mkldnn._linear_pointwise if PREPACK else None


def linear_usable(layer, x: torch.Tensor) -> bool:
    """bf16 ``x``, a layer on a single rank whose weight oneDNN could pack. Per call only the
    dtype is checked: the layer's rank count is fixed at construction and read once."""
    if not (PREPACK and ENABLED) or x.dtype != torch.bfloat16:
        return False
    d = layer.__dict__
    if d.get("_octavo_no_prepack"):
        return False
    single = d.get("_octavo_single_rank")
    if single is None:
        tp = getattr(layer, "tp", None)
        single = d["_octavo_single_rank"] = tp is None or tp.world_size == 1
    return single


def _packed(owner, weight: torch.Tensor):
    cache = owner.__dict__.get("_octavo_packed")
    if cache is not None and cache[2] is weight and cache[0] == (weight._version, weight.data_ptr()):
        return cache[1]
    key = (weight._version, weight.data_ptr())
    if cache is None or cache[0] != key or cache[2] is not weight:
        try:
            packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), _PACK_HINT)
        except RuntimeError:
            owner.__dict__["_octavo_no_prepack"] = True
            return None
        cache = (key, packed, weight)
        owner.__dict__["_octavo_packed"] = cache
    return cache[1]


# -- decode batch sizes: octavo's bf16 GEMV (csrc/cpu/gemv.cpp) -------------------------------
# At a few rows the linear layers are pure weight streaming. The GEMV reads a copy of the
# weight packed once as [N/16, K/2, 16, 2] (one 64-byte vector per k pair of 16 output rows)
# exactly once per call, sequentially, with VDPBF16PS where the CPU has it. Above
# ``GEMV_MAX_ROWS`` rows (prefill) oneDNN's blocked GEMM (AMX where present) is faster.

_gemv = getattr(_ext, "gemv", None)
GEMV = _gemv is not None
GEMV_MAX_ROWS = 4
# Where the CPU has AMX the same call runs 2+ rows on AMX tiles straight from the packed weight
# (csrc/cpu/gemv_amx.h; K a multiple of 32): up to this many rows that streams the weight faster
# than oneDNN's blocked GEMM (SmolLM2-135M's linears, 2-core Xeon: 1.4x at 32 rows, 1.2x at 64).
GEMV_AMX = GEMV and bool(getattr(_ext, "gemv_amx", lambda: False)())
GEMV_AMX_MAX_ROWS = 64
# Without AMX but with VDPBF16PS (AVX512-BF16: AMD Zen 4 and later) the same call runs up to
# GEMV_AMX_MAX_ROWS rows in 6-row register tiles over each thread's run of weight blocks, which
# stay in L2 while every row passes (csrc/cpu/gemv.cpp): ~85-90 % of the FMA peak where oneDNN's
# blocked GEMM reaches 70-85 % at these sizes (SmolLM2-135M's four linears of a layer, 2-core
# Zen 4, weights in cache: 0.77-0.83x oneDNN's time at 8 rows, 0.90-0.96x at 48, 1.02-1.07x at
# 64, where weights from DRAM and the one-call decoder stack still favour it; oneDNN is ahead
# from ~96 rows and stays the prefill path).
GEMV_DOT = GEMV and not GEMV_AMX and bool(getattr(_ext, "BF16_DOT", False))


def gemv_rows(rows: int, k: int) -> bool:
    """Whether ``linear`` runs ``rows`` rows of ``k`` features on the GEMV (else oneDNN)."""
    if rows <= GEMV_MAX_ROWS:
        return True
    return rows <= GEMV_AMX_MAX_ROWS and ((GEMV_AMX and k % 32 == 0) or GEMV_DOT)


def select_linear_kernels(model, policy: str) -> None:
    """Mark the linears the GEMV serves at decode sizes (``bind_fused_ops`` calls this unless
    the platform's decode-GEMV policy is "off"). On the CPU "auto" and "table" are the same:
    every bf16 weight with rows a multiple of 16 and an even row length; nothing is timed."""
    for m in model.modules():
        w = m.__dict__.get("_parameters", {}).get("weight")
        if w is not None and w.dim() == 2 and w.shape[0] % 16 == 0 and w.shape[1] % 2 == 0:
            m.__dict__["_octavo_use_gemv"] = True


def attach_layer_paths(model) -> None:
    """Llama-family decoder layers run their step without the module tree in between
    (``cpu_decode_layer``: the same kernels in the same order, the same output), and their
    models the whole layer loop in one call where every layer can (``cpu_decode_stack``). The
    output projection gets its INT8 copy where ``OCTAVO_CPU_INT8_LM_HEAD`` asks for one
    (``quantization.lm_head``)."""
    from octavo.models import cpu_decode_layer, cpu_decode_stack
    from octavo.quantization import lm_head

    cpu_decode_layer.attach(model, sys.modules[__name__])
    cpu_decode_stack.attach(model)
    output_head = getattr(model, "output_head", None)
    if output_head is not None:
        lm_head.attach(model, output_head())


def pack_gemv_weight(weight: torch.Tensor) -> torch.Tensor:
    """[N, K] -> the GEMV layout [N/16, K/2, 16, 2] (N % 16 == 0, K % 2 == 0)."""
    n, k = weight.shape
    return weight.detach().reshape(n // 16, 16, k // 2, 2).transpose(1, 2).contiguous()


def _gemv_weight(owner, weight: torch.Tensor) -> torch.Tensor | None:
    """The packed copy of ``weight`` cached on ``owner`` (rebuilt when the weight changes)."""
    cache = owner.__dict__.get("_octavo_gemv")
    if cache is not None and cache[2] is weight and cache[0] == (weight._version, weight.data_ptr()):
        return cache[1]
    key = (weight._version, weight.data_ptr())
    if cache is None or cache[0] != key or cache[2] is not weight:
        n, k = weight.shape if weight.dim() == 2 else (0, 1)
        if weight.dtype != torch.bfloat16 or n % 16 or k % 2 or n == 0:
            owner.__dict__["_octavo_no_gemv"] = True
            return None
        cache = (key, pack_gemv_weight(weight), weight)
        owner.__dict__["_octavo_gemv"] = cache
    return cache[1]


def gemv_packed(layer, w: torch.Tensor, dtype: torch.dtype) -> torch.Tensor | None:
    """The GEMV's packed copy of ``layer``'s weight ``w`` for activations of ``dtype``, or None
    where the GEMV does not serve this layer (not selected, not packable, another dtype)."""
    d = layer.__dict__
    if not (GEMV and d.get("_octavo_use_gemv")) or d.get("_octavo_no_gemv") or w.dtype != dtype:
        return None
    return _gemv_weight(layer, w)


def gemv(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ W.T (+ bias)`` for bf16 ``x`` [..., K] and ``W`` packed by ``pack_gemv_weight``."""
    k = x.shape[-1]
    x2 = _rows(x, k)
    out = torch.empty((x2.shape[0], packed.shape[0] * 16), dtype=x.dtype)
    if bias is not None and not bias.is_contiguous():
        bias = bias.contiguous()
    _gemv(x=x2, weight=packed, out=out, bias=bias)
    return out if x2 is x else out.view(*x.shape[:-1], out.shape[-1])


def linear(layer, x: torch.Tensor, weight: torch.Tensor | None = None, bias: torch.Tensor | None = None):
    """``F.linear(x, weight, bias)`` with ``layer``'s weight (or ``weight``) prepacked once:
    octavo's GEMV at decode batch sizes, oneDNN's blocked GEMM above."""
    d = layer.__dict__
    if weight is None:  # the module's own parameters, without nn.Module.__getattr__ per call
        params = d.get("_parameters") or {}
        w = params["weight"] if "weight" in params else layer.weight
        b = params["bias"] if "bias" in params else getattr(layer, "bias", None)
    else:
        w, b = weight, bias
    if torch.compiler.is_compiling():
        return _compiled_linear(d, x, w, b)
    k = x.shape[-1]
    if gemv_rows(x.numel() // k, k):
        packed = gemv_packed(layer, w, x.dtype)
        if packed is not None and (b is None or b.dtype == x.dtype):
            return gemv(x, packed, b)
    packed = _packed(layer, w) if w.dtype == x.dtype else None
    if packed is None:
        return torch.nn.functional.linear(x, w, b)
    return _linear_pointwise(x, packed, b, "none", [], "")


def prepack(model) -> None:
    """Pack every linear weight the decode kernels read (GEMV and oneDNN copies) now, so a
    compiled graph finds them cached on the modules (``_compiled_linear`` never packs)."""
    for m in model.modules():
        d = m.__dict__
        w = d.get("_parameters", {}).get("weight")
        if w is None or w.dim() != 2 or w.dtype != torch.bfloat16 or not PREPACK:
            continue
        if GEMV and d.get("_octavo_use_gemv"):
            _gemv_weight(m, w)
        _packed(m, w)


def _compiled_linear(d: dict, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    """``linear`` while dynamo traces: the weights packed by ``prepack`` (read from the module's
    cache, no version checks in the graph), GEMV as the ``octavo::cpu_gemv`` custom op."""
    gemv_cache = d.get("_octavo_gemv")
    if GEMV and gemv_cache is not None and x.shape[0] <= GEMV_MAX_ROWS and x.dim() == 2:
        if b is None or b.dtype == x.dtype:
            return torch.ops.octavo.cpu_gemv(x, gemv_cache[1], b)
    packed = d.get("_octavo_packed")
    if packed is None:
        return torch.nn.functional.linear(x, w, b)
    return torch.ops.octavo.cpu_packed_linear(x, packed[1], b)


if PREPACK:

    @torch.library.custom_op("octavo::cpu_packed_linear", mutates_args=())
    def cpu_packed_linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """oneDNN's linear over a weight prepacked by ``_packed`` (inductor lowers
        ``mkldnn._linear_pointwise`` only for weights it froze itself, so the graph mode calls it
        through this op)."""
        return _linear_pointwise(x, packed, bias, "none", [], "")

    @cpu_packed_linear.register_fake
    def _(x, packed, bias):
        return x.new_empty((*x.shape[:-1], packed.shape[0]))


if GEMV:

    @torch.library.custom_op("octavo::cpu_gemv", mutates_args=())
    def cpu_gemv(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """``x [M, K] @ W.T (+ bias)`` for bf16 ``x`` and ``W`` packed by ``pack_gemv_weight``
        (the CPU graph mode's GEMV: a custom op keeps it inside the compiled graph)."""
        x = x if x.is_contiguous() else x.contiguous()
        out = torch.empty((x.shape[0], packed.shape[0] * 16), dtype=x.dtype)
        _gemv(x=x, weight=packed, out=out, bias=None if bias is None else bias.contiguous())
        return out

    @cpu_gemv.register_fake
    def _(x, packed, bias):
        return x.new_empty((x.shape[0], packed.shape[0] * 16))
