"""``gptq`` checkpoints (AutoGPTQ / GPTQModel), 4- and 8-bit, with and without ``desc_act``.

Per layer: ``qweight`` int32 [K * bits / 32, N] (codes packed along K, sequential),
``qzeros`` int32 [groups, N * bits / 32] (packed along N, sequential), ``scales`` [groups, N],
``g_idx`` int32 [K] (the group of each input channel). ``checkpoint_format`` ``gptq`` (v1)
stores each zero point minus one; ``gptq_v2`` stores it as is.
``w[k, n] = (q[k, n] - z[g_idx[k], n]) * s[g_idx[k], n]``.

With ``desc_act`` the groups are not contiguous in K: the canonical weight permutes K so they
are (``perm = argsort(g_idx)``) and the layer feeds ``x[:, perm]``.
"""

from __future__ import annotations

from typing import Any

import torch

from octavo.quantization.base import LinearMethod, QuantizationConfig, check_keys
from octavo.quantization.canonical import IntWeight, int_weight_from_g_idx
from octavo.quantization.packing import unpack_int32


class GptqLinear(LinearMethod):
    tensor_names = ("qweight", "qzeros", "scales")
    optional_names = ("g_idx",)

    def __init__(self, bits: int, group: int, zero_offset: int) -> None:
        self.bits, self.group, self.zero_offset = bits, group, zero_offset

    def to_canonical(self, t: dict[str, torch.Tensor]) -> IntWeight:
        scales = t["scales"].to(torch.float32)  # [groups, N]
        n = scales.shape[1]
        k = t["qweight"].shape[0] * 32 // self.bits
        q = unpack_int32(t["qweight"], self.bits, 0, k)  # [K, N]
        z = unpack_int32(t["qzeros"], self.bits, 1, n).to(torch.int16) + self.zero_offset
        if int(z.max()) >= (1 << self.bits):
            raise ValueError(f"zero points overflow {self.bits} bits (checkpoint_format mismatch?)")
        group = k if self.group == -1 else self.group
        if scales.shape[0] * group != k:
            raise ValueError(f"scales have {scales.shape[0]} groups, expected {k // group} for group size {group}")
        g_idx = t.get("g_idx")
        if g_idx is not None and g_idx.numel() != k:
            raise ValueError(f"g_idx has {g_idx.numel()} entries, expected {k}")
        return int_weight_from_g_idx(
            q.T.contiguous(), scales.T.contiguous(), z.to(torch.uint8).T.contiguous(), g_idx, self.bits, group
        )

    def describe(self) -> str:
        return f"gptq int{self.bits} group {self.group}"


class GptqConfig(QuantizationConfig):
    name = "gptq"
    kinds = ("int",)
    _KEYS = {"quant_method", "bits", "group_size", "desc_act", "sym", "static_groups", "damp_percent",
             "true_sequential", "model_name_or_path", "model_file_base_name", "checkpoint_format",
             "lm_head", "meta", "pack_dtype", "damp_auto_increment", "mse", "quantizer", "v2",
             "format", "hyb_act", "act_group_aware", "fail_safe", "modules_in_block_to_quantize"}

    def __init__(self, bits: int, group: int, desc_act: bool, zero_offset: int) -> None:
        self.bits, self.group, self.desc_act, self.zero_offset = bits, group, desc_act, zero_offset

    @classmethod
    def from_config(cls, cfg: dict[str, Any] | None) -> GptqConfig:
        if cfg is None:
            raise ValueError("--quantization gptq needs a checkpoint quantized with GPTQ (octavo does not run GPTQ calibration)")
        check_keys(cfg, cls._KEYS, "gptq")
        bits = int(cfg.get("bits", 4))
        if bits not in (4, 8):
            raise ValueError(f"gptq: bits={bits} is not supported (4 or 8)")
        if cfg.get("lm_head"):
            raise ValueError("gptq: a quantized lm_head is not supported")
        if cfg.get("modules_in_block_to_quantize"):
            raise ValueError("gptq: modules_in_block_to_quantize (partially quantized blocks) is not supported")
        fmt = str(cfg.get("checkpoint_format") or cfg.get("format") or "gptq").lower()
        if fmt not in ("gptq", "gptq_v2"):
            raise ValueError(f"gptq: checkpoint_format {fmt!r} is not supported (gptq, gptq_v2)")
        return cls(bits, int(cfg.get("group_size", 128)), bool(cfg.get("desc_act", False)), 1 if fmt == "gptq" else 0)

    def linear_method(self, prefix: str) -> LinearMethod | None:
        return GptqLinear(self.bits, self.group, self.zero_offset)

    def describe(self) -> str:
        act = ", desc_act" if self.desc_act else ""
        return f"gptq (int{self.bits} group {self.group}{act})"
