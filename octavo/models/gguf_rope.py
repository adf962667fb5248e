"""Llama-3 RoPE scaling carried by a GGUF file as the ``rope_freqs`` tensor.

llama.cpp's converter writes no scaling metadata for ``rope_type: llama3``; it writes one
float32 factor per rotated frequency instead (``rope_freqs.weight``, llama.cpp divides each
frequency by its factor). The HF parameters are recovered from those factors:

- ``factor`` is the largest factor (the low-frequency band is divided by it);
- in the band between, llama.cpp's factor is ``1 / ((1 - s) / factor + s)`` with
  ``s = (old_ctx / wavelen - low) / (high - low)``, linear in ``1 / wavelen``. Two or more
  frequencies in that band fix the line; ``(old_ctx, low, high)`` scaled together give the same
  factors, so the recovered parameters take ``low_freq_factor = 1`` (what every Llama 3.x
  checkpoint uses).

The recovered parameters are accepted only when llama.cpp's formula reproduces every stored
factor from them; then octavo computes RoPE exactly as transformers does for the original
checkpoint. When they cannot be recovered (fewer than two frequencies in the band, or factors
no Llama-3 configuration produces), the stored factors are used directly: each frequency of the
default RoPE divided by its factor, which is what llama.cpp computes.
"""

from __future__ import annotations

import math

import numpy as np
import torch


def default_frequencies(base: float, dim: int) -> torch.Tensor:
    """The unscaled inverse frequencies, in float32 as transformers and llama.cpp compute them."""
    return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))


def llama3_factors(params: dict, dim: int) -> np.ndarray:
    """The ``rope_freqs`` llama.cpp's converter writes for llama3 ``params`` (float32)."""
    factor, low, high = params["factor"], params["low_freq_factor"], params["high_freq_factor"]
    old = params["original_max_position_embeddings"]
    low_wavelen, high_wavelen = old / low, old / high
    out = []
    for freq in default_frequencies(params["rope_theta"], dim).tolist():
        wavelen = 2 * math.pi / freq
        if wavelen < high_wavelen:
            out.append(1.0)
        elif wavelen > low_wavelen:
            out.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.asarray(out, dtype=np.float32)


def infer_llama3_parameters(factors: np.ndarray, base: float, dim: int) -> dict | None:
    """The llama3 ``rope_parameters`` whose llama.cpp factors are ``factors``, or None."""
    factors = np.asarray(factors, dtype=np.float64)
    factor = float(factors.max())
    if factor <= 1.0:
        return None
    inv_wavelen = default_frequencies(base, dim).double().numpy() / (2 * math.pi)
    band = (factors > 1.0 + 1e-6) & (factors < factor * (1 - 1e-6))
    if band.sum() < 2:
        return None
    smooth = (1 / factors[band] - 1 / factor) / (1 - 1 / factor)
    slope, intercept = np.polyfit(inv_wavelen[band], smooth, 1)
    if intercept >= 0 or slope <= 0:
        return None
    high = 1 - 1 / intercept  # low_freq_factor = 1: intercept = -1 / (high - 1)
    params = {
        "rope_type": "llama3", "rope_theta": float(base), "factor": float(round(factor, 6)),
        "low_freq_factor": 1.0, "high_freq_factor": float(round(high, 4)),
        "original_max_position_embeddings": int(round(slope * (high - 1))),
    }
    if np.allclose(llama3_factors(params, dim), factors, rtol=1e-5, atol=0):
        return params
    return None


def rope_parameters_from_factors(factors: np.ndarray, base: float, dim: int) -> dict:
    """HF ``rope_parameters`` for a GGUF's ``rope_freqs``: llama3 when recoverable, else the
    default RoPE with the factors applied directly (``gguf_freq_factors``, read by
    ``octavo.models.layers.compute_inv_freq``)."""
    factors = np.asarray(factors, dtype=np.float32).reshape(-1)
    if factors.shape[0] != dim // 2:
        raise ValueError(
            f"GGUF rope_freqs.weight has {factors.shape[0]} factors; the model rotates {dim} dimensions "
            f"and needs {dim // 2}"
        )
    if not np.isfinite(factors).all() or (factors <= 0).any():
        raise ValueError("GGUF rope_freqs.weight holds non-positive or non-finite factors")
    params = infer_llama3_parameters(factors, base, dim)
    if params is not None:
        return params
    return {"rope_type": "default", "rope_theta": float(base), "gguf_freq_factors": factors.tolist()}
