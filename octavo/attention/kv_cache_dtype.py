"""``--kv-cache-dtype``: what the KV cache stores (vLLM's names).

``auto`` stores K/V in the model's dtype. ``fp8`` (= ``fp8_e4m3``) and ``fp8_e5m2`` store one
byte per value: a token costs half the memory of a 16-bit cache, so the pool holds twice the
tokens, and decode attention reads half the bytes. Values are stored as ``x / scale`` rounded to
the format (saturated at its largest finite value) and read back as ``q * scale``, with one
scale per layer for K and one for V: the checkpoint's (``k_scale`` / ``v_scale``,
``octavo.models.kv_scales``), else 1.0 (vLLM's default when a checkpoint carries none).
"""

from __future__ import annotations

import torch

FP8_DTYPES: dict[str, torch.dtype] = {
    "fp8": torch.float8_e4m3fn,
    "fp8_e4m3": torch.float8_e4m3fn,
    "fp8_e5m2": torch.float8_e5m2,
}
KV_CACHE_DTYPES = ("auto", *FP8_DTYPES)


def kv_cache_torch_dtype(kv_cache_dtype: str, model_dtype: torch.dtype) -> torch.dtype:
    """The element type of the KV cache tensors."""
    if kv_cache_dtype == "auto":
        return model_dtype
    if kv_cache_dtype not in FP8_DTYPES:
        raise ValueError(f"--kv-cache-dtype (kv_cache_dtype) {kv_cache_dtype!r} is not one of {list(KV_CACHE_DTYPES)}")
    return FP8_DTYPES[kv_cache_dtype]


def is_fp8(dtype: torch.dtype) -> bool:
    return dtype in (torch.float8_e4m3fn, torch.float8_e5m2)


def fp8_max(dtype: torch.dtype) -> float:
    """Largest finite value of an fp8 format (stores saturate there)."""
    return float(torch.finfo(dtype).max)
