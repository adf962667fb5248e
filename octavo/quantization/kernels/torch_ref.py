"""Reference kernels for every canonical quantized weight (the yardstick for faster kernels).

Readable torch, no device code: weights are dequantized to float32 and multiplied in float32;
the result is cast to the input's dtype. Activation quantization is emulated faithfully:

- FP8 (e4m3): ``scale = amax(|x|) / 448`` per token (or per token and 128-wide group of K for
  block-scaled weights), or the static ``input_scale``; ``x_q = clamp(x / scale).to(e4m3)``.
- INT8: ``scale = amax(|x|) / 127.5`` per token (compressed-tensors' symmetric convention:
  half the int8 range 255), or the static scale; ``x_q = clamp(round(x / scale), -128, 127)``;
  the integer products are accumulated exactly (float64 holds them without rounding).

Canonical weights (what every format's loader produces) are documented in
``octavo.quantization.canonical``.
"""

from __future__ import annotations

import torch

from octavo.quantization.canonical import Fp8Weight, Int8Weight, IntWeight

FP8_MAX = 448.0  # largest finite float8_e4m3fn
INT8_HALF_RANGE = 127.5  # (127 - (-128)) / 2
_MIN_SCALE = 1e-12


def dequantize_int(w: IntWeight) -> torch.Tensor:
    """``(q - zero) * scale`` in float32, [N, K] (K in the canonical, possibly permuted, order)."""
    scales = w.scales.repeat_interleave(w.group, dim=1)
    zeros = w.zeros.repeat_interleave(w.group, dim=1).to(torch.float32)
    return (w.q.to(torch.float32) - zeros) * scales


def int_linear(x: torch.Tensor, w: IntWeight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """Weight-only INT4/INT8: dequantize, then ``x @ w.T (+ bias)`` in float32."""
    y = x.to(torch.float32) @ dequantize_int(w).T
    if bias is not None:
        y = y + bias.to(torch.float32)
    return y.to(x.dtype)


def _block_scales(scale: torch.Tensor, n: int, k: int, block: tuple[int, int]) -> torch.Tensor:
    bn, bk = block
    return scale.repeat_interleave(bn, dim=0)[:n].repeat_interleave(bk, dim=1)[:, :k]


def dequantize_fp8(w: Fp8Weight) -> torch.Tensor:
    """The float32 weight [N, K] an FP8 weight stands for."""
    wf = w.weight.to(torch.float32)
    s = w.weight_scale.to(torch.float32)
    if w.block is not None:
        return wf * _block_scales(s, wf.shape[0], wf.shape[1], w.block)
    return wf * (s if s.dim() == 0 else s.view(-1, 1))


def quantize_fp8_activation(x: torch.Tensor, input_scale: torch.Tensor | None, group: int | None) -> torch.Tensor:
    """Round ``x`` [M, K] through float8_e4m3fn and back to float32 (per token, per token
    and ``group`` columns, or with the static ``input_scale``)."""
    xf = x.to(torch.float32)
    if input_scale is not None:
        s = input_scale.to(torch.float32).reshape(())
        return (xf / s).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn).to(torch.float32) * s
    m, k = xf.shape
    g = group or k
    xg = xf.view(m, k // g, g)
    s = (xg.abs().amax(dim=-1, keepdim=True) / FP8_MAX).clamp(min=_MIN_SCALE)
    xq = (xg / s).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn).to(torch.float32)
    return (xq * s).view(m, k)


def fp8_linear(
    x: torch.Tensor, w: Fp8Weight, bias: torch.Tensor | None = None, input_scale: torch.Tensor | None = None
) -> torch.Tensor:
    """FP8 W8A8: activations rounded to e4m3 (dynamic or static scale), float32 GEMM."""
    scale = input_scale if input_scale is not None else w.input_scale
    group = w.block[1] if w.block is not None and scale is None else None
    xq = quantize_fp8_activation(x.reshape(-1, x.shape[-1]), scale, group)
    y = xq @ dequantize_fp8(w).T
    if bias is not None:
        y = y + bias.to(torch.float32)
    return y.to(x.dtype).view(*x.shape[:-1], -1)


def quantize_int8_activation(x: torch.Tensor, input_scale: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(int8 codes as float64 [M, K], scale [M, 1] or []): symmetric, round half to even."""
    xf = x.to(torch.float32)
    if input_scale is not None:
        s = input_scale.to(torch.float32).reshape(())
    else:
        s = (xf.abs().amax(dim=-1, keepdim=True) / INT8_HALF_RANGE).clamp(min=_MIN_SCALE)
    return torch.round(xf / s).clamp(-128, 127).to(torch.float64), s


def int_a8_linear(
    x: torch.Tensor, w: IntWeight, bias: torch.Tensor | None = None, input_scale: torch.Tensor | None = None
) -> torch.Tensor:
    """A weight-only INT8 / INT4 weight with int8 activations (W8A8 / W4A8 numerics, what the
    C++ ``int_linear_a8`` computes): x quantized per token as in ``quantize_int8_activation``;
    per group g the exact integer ``d_g = xq . (q - zero_g)``; ``y = s_x * sum_g d_g * scale_g``
    in float32 (only this epilogue rounds)."""
    x2 = x.reshape(-1, x.shape[-1])
    xq, s = quantize_int8_activation(x2, input_scale)
    m, k = xq.shape
    n, groups = w.scales.shape
    wq = w.q.to(torch.float64) - w.zeros.to(torch.float64).repeat_interleave(w.group, dim=1)
    d = torch.einsum("mgk,ngk->mng", xq.view(m, groups, w.group), wq.view(n, groups, w.group))
    y = (d.to(torch.float32) * w.scales.to(torch.float32)).sum(-1) * s.to(torch.float32)
    if bias is not None:
        y = y + bias.to(torch.float32)
    return y.to(x.dtype).view(*x.shape[:-1], -1)


def int8_w8a8_linear(x: torch.Tensor, w: Int8Weight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """INT8 W8A8: per-token (or static) int8 activations, exact integer accumulation."""
    x2 = x.reshape(-1, x.shape[-1])
    xq, s = quantize_int8_activation(x2, w.input_scale)
    acc = (xq @ w.q.to(torch.float64).T).to(torch.float32)
    y = acc * s * w.scale.to(torch.float32).view(1, -1)
    if bias is not None:
        y = y + bias.to(torch.float32)
    return y.to(x.dtype).view(*x.shape[:-1], -1)
