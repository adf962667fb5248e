"""``awq`` checkpoints (AutoAWQ, GEMM packing), 4-bit with zero points.

Per layer: ``qweight`` int32 [K, N / 8], ``qzeros`` int32 [K / group, N / 8], ``scales``
[K / group, N] (float16). Each int32 packs 8 output columns in AWQ's order: nibble ``i`` holds
column ``[0, 2, 4, 6, 1, 3, 5, 7][i]`` of its group of 8. Zero points are stored as they are
(no offset): ``w[k, n] = (q[k, n] - z[k // group, n]) * s[k // group, n]``.
"""

from __future__ import annotations

from typing import Any

import torch

from octavo.quantization.base import LinearMethod, QuantizationConfig, check_keys
from octavo.quantization.canonical import IntWeight
from octavo.quantization.packing import AWQ_NIBBLE, unpack_int32


class AwqLinear(LinearMethod):
    tensor_names = ("qweight", "qzeros", "scales")

    def __init__(self, group: int) -> None:
        self.group = group

    def to_canonical(self, t: dict[str, torch.Tensor]) -> IntWeight:
        scales = t["scales"].to(torch.float32)  # [K / group, N]
        n = scales.shape[1]
        q = unpack_int32(t["qweight"], 4, 1, n, AWQ_NIBBLE)  # [K, N]
        z = unpack_int32(t["qzeros"], 4, 1, n, AWQ_NIBBLE)  # [K / group, N]
        k = q.shape[0]
        group = k if self.group == -1 else self.group
        if scales.shape[0] * group != k or z.shape != scales.shape:
            raise ValueError(f"qweight {tuple(q.shape)}, qzeros {tuple(z.shape)} and scales {tuple(scales.shape)} disagree for group {group}")
        return IntWeight(q.T.contiguous(), scales.T.contiguous(), z.T.contiguous(), 4, group)

    def describe(self) -> str:
        return f"awq int4 group {self.group}"


class AwqConfig(QuantizationConfig):
    name = "awq"
    kinds = ("int",)
    _KEYS = {"quant_method", "bits", "w_bit", "group_size", "q_group_size", "zero_point", "version",
             "modules_to_not_convert"}

    def __init__(self, group: int, skip: list[str]) -> None:
        self.group, self.skip = group, skip

    @classmethod
    def from_config(cls, cfg: dict[str, Any] | None) -> AwqConfig:
        if cfg is None:
            raise ValueError("--quantization awq needs a checkpoint quantized with AWQ (octavo does not run AWQ calibration)")
        check_keys(cfg, cls._KEYS, "awq")
        bits = int(cfg.get("bits", cfg.get("w_bit", 4)))
        version = str(cfg.get("version", "gemm")).lower()
        if bits != 4 or version != "gemm" or not cfg.get("zero_point", True):
            raise ValueError(
                f"awq: bits={bits}, version={version!r}, zero_point={cfg.get('zero_point', True)} is not "
                "supported (octavo runs 4-bit GEMM-packed AWQ with zero points)"
            )
        group = int(cfg.get("group_size", cfg.get("q_group_size", 128)))
        return cls(group, list(cfg.get("modules_to_not_convert") or []))

    def linear_method(self, prefix: str) -> LinearMethod | None:
        if any(part in prefix for part in self.skip):
            return None
        return AwqLinear(self.group)

    def describe(self) -> str:
        return f"awq (int4 group {self.group}, GEMM packing)"
