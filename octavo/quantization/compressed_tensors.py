"""``compressed-tensors`` checkpoints (llm-compressor's format), the schemes octavo runs:

- W4A16 / W8A16, ``pack-quantized``: ``weight_packed`` int32 [N, ceil(K * bits / 32)] (codes
  sequential, stored as ``q + 2**(bits-1)``), ``weight_scale`` [N, K // group] (or [N, 1] per
  channel), ``weight_shape`` [2], and for asymmetric schemes ``weight_zero_point`` packed
  the same way along N ([ceil(N * bits / 32), K // group]);
  ``int-quantized`` (unpacked): ``weight`` int8 and an unpacked int8 ``weight_zero_point``;
- FP8 W8A8, ``float-quantized``: ``weight`` float8_e4m3fn, ``weight_scale`` [1] / [N, 1] /
  block, activations dynamic per token or static ``input_scale`` [1];
- INT8 W8A8, ``int-quantized``: ``weight`` int8, ``weight_scale`` [N, 1], symmetric activations
  dynamic per token or static ``input_scale``.
``actorder: group`` (GPTQ act-order) adds ``weight_g_idx`` [K]. A ``kv_cache_scheme`` of static
per-tensor fp8 scales brings ``k_scale`` / ``v_scale`` per layer (``octavo.models.kv_scales``).
Anything else (asymmetric activations, sparsity, transforms, other KV cache schemes, other bit
widths) is refused with the setting named.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import torch

from octavo.quantization.base import LinearMethod, QuantizationConfig, check_keys, matches_ignore
from octavo.quantization.canonical import Fp8Weight, Int8Weight, IntWeight, int_weight_from_g_idx
from octavo.quantization.packing import unpack_int32

WHAT = "compressed-tensors"
_META_KEYS = {"quant_method", "format", "config_groups", "ignore", "quantization_status",
              "global_compression_ratio", "version", "provider", "kv_cache_scheme", "sparsity_config",
              "transform_config"}
_ARG_KEYS = {"num_bits", "type", "symmetric", "strategy", "group_size", "block_structure", "dynamic",
             "actorder", "observer", "observer_kwargs", "zp_dtype", "scale_dtype"}
INT_FORMATS = ("pack-quantized", "int-quantized", "naive-quantized")


def check_kv_cache_scheme(scheme: dict[str, Any]) -> None:
    """The one KV cache scheme octavo runs: static per-tensor fp8 scales (``k_scale`` /
    ``v_scale`` per layer, ``octavo.models.kv_scales``), used with ``--kv-cache-dtype fp8``."""
    a = Args.parse(scheme, "kv_cache_scheme")
    if (a.num_bits, a.type, a.strategy, a.dynamic, a.symmetric) != (8, "float", "tensor", False, True):
        raise ValueError(f"{WHAT}: kv_cache_scheme {scheme!r} is not supported (octavo runs static per-tensor "
                         "fp8 scales: num_bits 8, type float, strategy tensor, dynamic false, symmetric)")


@dataclass(frozen=True)
class Args:
    """One ``weights`` / ``input_activations`` entry."""

    num_bits: int
    type: str
    symmetric: bool
    strategy: str
    group_size: int | None
    block: tuple[int, int] | None
    dynamic: bool
    actorder: str | None = None

    @staticmethod
    def parse(d: dict[str, Any], where: str) -> Args:
        check_keys(d, _ARG_KEYS, f"{WHAT} {where}")
        actorder = d.get("actorder") or None
        if actorder not in (None, "group", "weight", "static"):
            raise ValueError(f"{WHAT} {where}: actorder {actorder!r} is not supported")
        block = d.get("block_structure")
        return Args(
            int(d.get("num_bits", 8)), str(d.get("type", "int")), bool(d.get("symmetric", True)),
            str(d.get("strategy", "tensor")), d.get("group_size"), tuple(block) if block else None,
            bool(d.get("dynamic", False)), actorder,
        )


def _scheme_error(where: str, w: Args, a: Args | None, fmt: str) -> ValueError:
    act = "none" if a is None else f"{a.type}{a.num_bits} {a.strategy} {'dynamic' if a.dynamic else 'static'}"
    return ValueError(
        f"{WHAT} {where}: scheme weights {w.type}{w.num_bits} {w.strategy} "
        f"{'symmetric' if w.symmetric else 'asymmetric'}, activations {act}, format {fmt!r} is not "
        "supported (octavo runs W4A16/W8A16 pack-quantized, FP8 W8A8 and INT8 W8A8)"
    )


def method_for(w: Args, a: Args | None, fmt: str, where: str) -> LinearMethod:
    """The LinearMethod of one config group, or ValueError naming the scheme."""
    if w.actorder is not None and not (a is None and w.type == "int" and w.strategy == "group"):
        raise ValueError(f"{WHAT} {where}: actorder {w.actorder!r} is not supported for this scheme")
    if a is None and w.type == "int" and w.num_bits in (4, 8) and fmt in INT_FORMATS:
        if w.strategy in ("group", "channel") and (w.strategy != "group" or w.group_size):
            return WeightOnlyInt(w, packed=fmt == "pack-quantized")
    if a is not None and w.type == a.type == "float" and w.num_bits == a.num_bits == 8 and fmt == "float-quantized":
        if w.symmetric and a.symmetric and w.strategy in ("tensor", "channel", "block"):
            static = a.strategy == "tensor" and not a.dynamic
            dynamic = a.dynamic and a.strategy in ("token", "group")
            if static or (dynamic and (w.strategy == "block") == (a.strategy == "group")):
                return Fp8W8A8(w, static)
    if a is not None and w.type == a.type == "int" and w.num_bits == a.num_bits == 8 and fmt in INT_FORMATS[1:]:
        if w.symmetric and a.symmetric and w.strategy in ("tensor", "channel"):
            if (a.strategy == "token" and a.dynamic) or (a.strategy == "tensor" and not a.dynamic):
                return Int8W8A8(w, static=not a.dynamic)
    raise _scheme_error(where, w, a, fmt)


class WeightOnlyInt(LinearMethod):
    def __init__(self, w: Args, packed: bool) -> None:
        self.args, self.packed = w, packed
        weight = ("weight_packed", "weight_shape") if packed else ("weight",)
        self.tensor_names = (*weight, "weight_scale") + (() if w.symmetric else ("weight_zero_point",))
        # actorder "group": input channel k belongs to group weight_g_idx[k] (not k // group);
        # "weight" / "static" only changed the order GPTQ quantized in: groups stay contiguous.
        if w.actorder == "group":
            self.tensor_names += ("weight_g_idx",)

    def to_canonical(self, t: dict[str, torch.Tensor]) -> IntWeight:
        bits, off = self.args.num_bits, 1 << (self.args.num_bits - 1)
        if self.packed:
            n, k = (int(v) for v in t["weight_shape"].tolist())
            q = unpack_int32(t["weight_packed"], bits, 1, k)
        else:
            q = (t["weight"].to(torch.int16) + off).to(torch.uint8)
        n, k = q.shape
        scales = t["weight_scale"].to(torch.float32).reshape(n, -1)
        group = k // scales.shape[1]
        if self.args.symmetric:
            zeros = torch.full_like(scales, off, dtype=torch.uint8)
        elif self.packed:
            zeros = unpack_int32(t["weight_zero_point"], bits, 0, n)
        else:
            zeros = (t["weight_zero_point"].to(torch.int16).reshape(n, -1) + off).to(torch.uint8)
        return int_weight_from_g_idx(q, scales, zeros.reshape(scales.shape), t.get("weight_g_idx"), bits, group)

    def describe(self) -> str:
        a = self.args
        g = f"group {a.group_size}" if a.strategy == "group" else "per-channel"
        return f"W{a.num_bits}A16 {g} {'sym' if a.symmetric else 'asym'}"


class Fp8W8A8(LinearMethod):
    def __init__(self, w: Args, static: bool) -> None:
        self.args, self.static = w, static
        self.tensor_names = ("weight", "weight_scale") + (("input_scale",) if static else ())

    def to_canonical(self, t: dict[str, torch.Tensor]) -> Fp8Weight:
        w = t["weight"]
        if w.dtype != torch.float8_e4m3fn:
            raise ValueError(f"weight has dtype {w.dtype}, expected float8_e4m3fn")
        s = t["weight_scale"].to(torch.float32)
        if self.args.strategy == "tensor":
            s = s.reshape(())
        elif self.args.strategy == "channel":
            s = s.reshape(-1)
        ins = t["input_scale"].to(torch.float32).reshape(()) if self.static else None
        return Fp8Weight(w, s, ins, self.args.block)


class Int8W8A8(LinearMethod):
    def __init__(self, w: Args, static: bool) -> None:
        self.args, self.static = w, static
        self.tensor_names = ("weight", "weight_scale") + (("input_scale",) if static else ())

    def to_canonical(self, t: dict[str, torch.Tensor]) -> Int8Weight:
        q = t["weight"]
        if q.dtype != torch.int8:
            raise ValueError(f"weight has dtype {q.dtype}, expected int8")
        s = t["weight_scale"].to(torch.float32).reshape(-1).expand(q.shape[0]).contiguous()
        ins = t["input_scale"].to(torch.float32).reshape(()) if self.static else None
        return Int8Weight(q, s, ins)


class CompressedTensorsConfig(QuantizationConfig):
    name = "compressed-tensors"
    kinds = ("int", "fp8", "int8_w8a8")

    def __init__(self, groups: list[tuple[list[str], LinearMethod]], ignore: list[str], fmt: str) -> None:
        self.groups, self.ignore, self.format = groups, ignore, fmt

    @classmethod
    def from_config(cls, cfg: dict[str, Any] | None) -> CompressedTensorsConfig:
        if cfg is None:
            raise ValueError("--quantization compressed-tensors needs a checkpoint with a compressed-tensors quantization_config")
        check_keys(cfg, _META_KEYS, WHAT)
        for key in ("sparsity_config", "transform_config"):
            if cfg.get(key):
                raise ValueError(f"{WHAT}: {key} is not supported (octavo cannot honour {cfg[key]!r})")
        if cfg.get("kv_cache_scheme"):
            check_kv_cache_scheme(cfg["kv_cache_scheme"])
        fmt = cfg.get("format", "dense")
        groups = []
        for gname, g in (cfg.get("config_groups") or {}).items():
            check_keys(g, {"targets", "weights", "input_activations", "output_activations", "format"}, f"{WHAT} {gname}")
            if g.get("output_activations"):
                raise ValueError(f"{WHAT} {gname}: output_activations quantization is not supported")
            if not g.get("weights"):
                raise ValueError(f"{WHAT} {gname}: groups without weight quantization are not supported")
            w = Args.parse(g["weights"], f"{gname}.weights")
            a = Args.parse(g["input_activations"], f"{gname}.input_activations") if g.get("input_activations") else None
            groups.append((list(g.get("targets") or []), method_for(w, a, g.get("format") or fmt, gname)))
        if not groups and not cfg.get("kv_cache_scheme"):  # a KV-cache-only checkpoint has none
            raise ValueError(f"{WHAT}: quantization_config has no config_groups")
        return cls(groups, list(cfg.get("ignore") or []), fmt)

    def linear_method(self, prefix: str) -> LinearMethod | None:
        if matches_ignore(prefix, self.ignore):
            return None
        for targets, method in self.groups:
            for t in targets:
                if t == "Linear" or (t.startswith("re:") and re.match(t[3:], prefix)) or prefix.endswith(t):
                    return method
        return None

    def describe(self) -> str:
        return f"{self.name} ({', '.join(m.describe() for _, m in self.groups)})"
