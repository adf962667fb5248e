"""Per-layer KV cache scales from a checkpoint: ``self_attn.k_scale`` / ``self_attn.v_scale``
(llm-compressor's and vLLM's names; older checkpoints: ``k_proj.output_scale`` /
``v_proj.output_scale``), one float per layer, what an fp8 KV cache divides K and V by
(``octavo.attention.kv_cache_dtype``).

The loader hands each such tensor to ``accept_kv_scale``, which keeps it on the layer's
``Attention`` module; ``apply_kv_scales`` then gives them to the attention kernels when the
cache is fp8. With ``--kv-cache-dtype auto`` the cache keeps the model's dtype and the scales
are not needed: the startup log says so (never dropped without a word). A checkpoint whose
``quantization_config`` declares a KV cache scheme must carry both scales for every layer.
"""

from __future__ import annotations

import logging
import math

import torch
from torch import nn

logger = logging.getLogger(__name__)

SUFFIXES = {".k_scale": "k_scale", ".v_scale": "v_scale",
            ".k_proj.output_scale": "k_scale", ".v_proj.output_scale": "v_scale"}


def accept_kv_scale(model: nn.Module, name: str, tensor: torch.Tensor) -> bool:
    """Keep ``tensor`` when ``name`` is a KV cache scale of one of the model's attention
    layers (False otherwise: not one)."""
    for suffix, attr in SUFFIXES.items():
        if not name.endswith(suffix):
            continue
        try:
            attn = model.get_submodule(name[: -len(suffix)] + ".attn")
        except AttributeError:
            return False
        if tensor.numel() != 1:
            raise ValueError(f"a KV cache scale is one value per layer; got shape {tuple(tensor.shape)}")
        value = float(tensor.float().reshape(()))
        if not (math.isfinite(value) and value > 0):
            raise ValueError(f"a KV cache scale must be positive and finite; got {value}")
        attn.kv_scales = {**getattr(attn, "kv_scales", {}), attr: value}
        return True
    return False


def apply_kv_scales(model: nn.Module, kv_cache_dtype: str, quantization_config: dict | None) -> None:
    """Give the loaded scales to every attention layer's kernel (fp8 caches). A checkpoint
    whose ``quantization_config`` declares a ``kv_cache_scheme`` must have both for every layer."""
    required = bool((quantization_config or {}).get("kv_cache_scheme"))
    layers = model.attention_layers()
    scales = [getattr(a, "kv_scales", {}) for a in layers]
    incomplete = [i for i, s in enumerate(scales) if (s or required) and set(s) != {"k_scale", "v_scale"}]
    if incomplete:
        raise ValueError(f"the checkpoint's KV cache scales (k_scale and v_scale) are missing for the attention "
                         f"layers {incomplete[:8]}{' ...' if len(incomplete) > 8 else ''}")
    if not any(scales):
        return
    if kv_cache_dtype == "auto":
        logger.info("the checkpoint's KV cache scales (%d layers) are not used: --kv-cache-dtype auto keeps the "
                    "model's dtype in the cache; --kv-cache-dtype fp8 stores it in fp8 with them", len(layers))
        return
    for attn, s in zip(layers, scales, strict=True):
        if not hasattr(attn.impl, "k_scale"):
            raise ValueError(f"the attention backend {type(attn.impl).__name__} takes no KV cache scales")
        attn.impl.k_scale, attn.impl.v_scale = s["k_scale"], s["v_scale"]
    logger.info("fp8 KV cache with the checkpoint's per-layer scales (K %.3g..%.3g, V %.3g..%.3g)",
                min(s["k_scale"] for s in scales), max(s["k_scale"] for s in scales),
                min(s["v_scale"] for s in scales), max(s["v_scale"] for s in scales))
