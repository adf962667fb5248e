"""``fp8``: vLLM's ``Fp8Config`` checkpoints, and online FP8 quantization.

Checkpoint (``quant_method: fp8``): ``weight`` float8_e4m3fn [N, K] with ``weight_scale`` []/[1]
(per tensor) or, with ``weight_block_size: [128, 128]`` (DeepSeek/Qwen FP8), ``weight_scale_inv``
[ceil(N/128), ceil(K/128)] (despite the name, the multiplier: ``w = w_fp8 * scale_inv``);
``activation_scheme`` ``dynamic`` (per token; per token and 128 columns for block weights) or
``static`` with ``input_scale`` [].

Online (``--quantization fp8`` on an unquantized checkpoint): per-channel weight scales
(``amax / 448`` per output row), dynamic per-token activations.
"""

from __future__ import annotations

from typing import Any

import torch

from octavo.quantization.base import LinearMethod, QuantizationConfig, check_keys, matches_ignore
from octavo.quantization.canonical import Fp8Weight
from octavo.quantization.kernels.torch_ref import FP8_MAX


def quantize_fp8_per_channel(w: torch.Tensor) -> Fp8Weight:
    """Online: ``scale = amax(|w_row|) / 448``, ``w_fp8 = (w / scale).to(e4m3)``."""
    wf = w.to(torch.float32)
    scale = (wf.abs().amax(dim=1) / FP8_MAX).clamp(min=1e-12)
    q = (wf / scale[:, None]).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return Fp8Weight(q, scale)


class Fp8Online(LinearMethod):
    tensor_names = ("weight",)
    quantizes_on_device = True

    def to_canonical(self, t: dict[str, torch.Tensor]) -> Fp8Weight:
        return quantize_fp8_per_channel(t["weight"])

    def describe(self) -> str:
        return "online fp8 (per-channel weights, dynamic per-token activations)"


class Fp8Checkpoint(LinearMethod):
    def __init__(self, block: tuple[int, int] | None, static: bool) -> None:
        self.block, self.static = block, static
        scale = "weight_scale_inv" if block else "weight_scale"
        self.tensor_names = ("weight", scale) + (("input_scale",) if static else ())

    def to_canonical(self, t: dict[str, torch.Tensor]) -> Fp8Weight:
        w = t["weight"]
        if w.dtype != torch.float8_e4m3fn:
            raise ValueError(f"weight has dtype {w.dtype}, expected float8_e4m3fn")
        if self.block:
            n, k = w.shape
            s = t["weight_scale_inv"].to(torch.float32)
            want = (-(-n // self.block[0]), -(-k // self.block[1]))
            if tuple(s.shape) != want:
                raise ValueError(f"weight_scale_inv has shape {tuple(s.shape)}, expected {want} for blocks {self.block}")
        else:
            s = t["weight_scale"].to(torch.float32)
            s = s.reshape(()) if s.numel() == 1 else s.reshape(-1)
        ins = t["input_scale"].to(torch.float32).reshape(()) if self.static else None
        return Fp8Weight(w, s, ins, self.block)

    def describe(self) -> str:
        w = f"block {self.block[0]}x{self.block[1]}" if self.block else "per-tensor"
        return f"fp8 ({w} weights, {'static' if self.static else 'dynamic'} activations)"


class Fp8Config(QuantizationConfig):
    name = "fp8"
    kinds = ("fp8",)
    _KEYS = {"quant_method", "activation_scheme", "weight_block_size", "ignored_layers", "fmt",
             "modules_to_not_convert", "is_checkpoint_fp8_serialized"}

    def __init__(self, method: LinearMethod, ignored: list[str]) -> None:
        self.method, self.ignored = method, ignored

    @classmethod
    def from_config(cls, cfg: dict[str, Any] | None) -> Fp8Config:
        if cfg is None:
            return cls(Fp8Online(), [])
        check_keys(cfg, cls._KEYS, "fp8")
        if cfg.get("fmt", "e4m3") != "e4m3":
            raise ValueError(f"fp8: fmt {cfg['fmt']!r} is not supported (only e4m3)")
        scheme = cfg.get("activation_scheme", "dynamic")
        if scheme not in ("dynamic", "static"):
            raise ValueError(f"fp8: activation_scheme {scheme!r} is not supported (dynamic, static)")
        block = cfg.get("weight_block_size")
        if block is not None:
            if len(block) != 2:
                raise ValueError(f"fp8: weight_block_size {block!r} must be [rows, cols]")
            if scheme == "static":
                raise ValueError("fp8: block-wise weights with a static activation scheme are not supported")
            block = (int(block[0]), int(block[1]))
        ignored = list(cfg.get("ignored_layers") or []) + list(cfg.get("modules_to_not_convert") or [])
        return cls(Fp8Checkpoint(block, scheme == "static"), ignored)

    def linear_method(self, prefix: str) -> LinearMethod | None:
        return None if matches_ignore(prefix, self.ignored) else self.method

    def describe(self) -> str:
        return f"fp8 ({self.method.describe()})"
