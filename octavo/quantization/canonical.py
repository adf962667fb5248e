"""Canonical quantized weights: what every format's loader produces, whatever its on-disk layout.

Kernels are written against these (and repack once at load into their own layout):

- ``IntWeight`` (weight-only INT4/INT8: W4A16, W8A16, AWQ, GPTQ, online int8):
  ``q`` uint8 [N, K] unsigned codes (0..15 or 0..255); ``scales`` float32 [N, K // group];
  ``zeros`` uint8 [N, K // group] (symmetric formats: 8 or 128);
  ``w[n, k] = (q[n, k] - zeros[n, k // group]) * scales[n, k // group]``. ``perm`` (GPTQ
  ``desc_act``): K was permuted so groups are contiguous; the layer feeds ``x[:, perm]``.
- ``Fp8Weight``: ``weight`` float8_e4m3fn [N, K]; ``weight_scale`` float32 [] (per tensor),
  [N] (per channel) or [ceil(N / bn), ceil(K / bk)] with ``block = (bn, bk)``; activations
  quantized per token (per token and ``bk`` columns for block scales) unless ``input_scale`` [].
- ``Int8Weight`` (INT8 W8A8): ``q`` int8 [N, K]; ``scale`` float32 [N]; activations int8 per
  token unless a static ``input_scale`` [].

Every class concatenates along N (fused q/k/v, gate/up) and slices along N or K
(tensor parallelism), so format loaders deal with one checkpoint shard at a time.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch


def _cat_or_none(parts: list[torch.Tensor | None]) -> torch.Tensor | None:
    return None if parts[0] is None else torch.cat(parts, dim=0)


@dataclass
class IntWeight:
    q: torch.Tensor
    scales: torch.Tensor
    zeros: torch.Tensor
    bits: int
    group: int
    perm: torch.Tensor | None = None
    kind = "int"

    def __post_init__(self) -> None:
        n, k = self.q.shape
        if self.q.dtype != torch.uint8 or self.zeros.dtype != torch.uint8:
            raise ValueError(f"integer codes must be uint8, got q {self.q.dtype}, zeros {self.zeros.dtype}")
        if k % self.group or self.scales.shape != (n, k // self.group) or self.zeros.shape != self.scales.shape:
            raise ValueError(
                f"q {tuple(self.q.shape)} with group {self.group} needs scales/zeros "
                f"{(n, k // self.group)}, got {tuple(self.scales.shape)} / {tuple(self.zeros.shape)}"
            )

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.q.shape)

    def describe(self) -> str:
        g = "per-channel" if self.group == self.q.shape[1] else f"group {self.group}"
        return f"int{self.bits} weight-only, {g}" + (", act-order" if self.perm is not None else "")

    @staticmethod
    def cat(parts: list[IntWeight]) -> IntWeight:
        first = parts[0]
        if any(p.group != first.group or p.bits != first.bits for p in parts):
            raise ValueError("fused shards differ in bits or group size")
        if any(p.perm is not None for p in parts) and len(parts) > 1:
            perms = [p.perm for p in parts]
            if any(q is None or not torch.equal(q, perms[0]) for q in perms):
                raise ValueError("fused shards with act-order (g_idx) must share one input permutation")
        return replace(
            first, q=torch.cat([p.q for p in parts]), scales=torch.cat([p.scales for p in parts]),
            zeros=torch.cat([p.zeros for p in parts]),
        )

    def rows(self, start: int, length: int) -> IntWeight:
        return replace(
            self, q=self.q.narrow(0, start, length), scales=self.scales.narrow(0, start, length),
            zeros=self.zeros.narrow(0, start, length),
        )

    def cols(self, start: int, length: int) -> IntWeight:
        if self.perm is not None:
            raise ValueError("act-order (desc_act / g_idx) weights cannot be split along their input dimension")
        if self.scales.shape[1] == 1:  # per channel: the row's scale holds for any columns
            return replace(self, q=self.q.narrow(1, start, length), group=length)
        if start % self.group or length % self.group:
            raise ValueError(f"input slice [{start}, {start + length}) does not align to group size {self.group}")
        g0, gl = start // self.group, length // self.group
        return replace(
            self, q=self.q.narrow(1, start, length), scales=self.scales.narrow(1, g0, gl),
            zeros=self.zeros.narrow(1, g0, gl),
        )

    def to(self, device: torch.device) -> IntWeight:
        perm = None if self.perm is None else self.perm.to(device)
        return replace(
            self, q=self.q.to(device).contiguous(), scales=self.scales.to(device, torch.float32).contiguous(),
            zeros=self.zeros.to(device).contiguous(), perm=perm,
        )


@dataclass
class Fp8Weight:
    weight: torch.Tensor
    weight_scale: torch.Tensor
    input_scale: torch.Tensor | None = None
    block: tuple[int, int] | None = None
    kind = "fp8"

    def __post_init__(self) -> None:
        if self.weight.dtype != torch.float8_e4m3fn:
            raise ValueError(f"fp8 weights must be float8_e4m3fn, got {self.weight.dtype}")
        if self.block is not None and self.input_scale is None and self.weight.shape[1] % self.block[1]:
            raise ValueError(
                f"block-scaled fp8 weight with K={self.weight.shape[1]} not divisible by the block "
                f"width {self.block[1]}: per-token-group activation scales need whole groups"
            )

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.weight.shape)

    def describe(self) -> str:
        if self.block is not None:
            w = f"block {self.block[0]}x{self.block[1]}"
        else:
            w = "per-tensor" if self.weight_scale.dim() == 0 else "per-channel"
        if self.input_scale is not None:
            a = "static"
        else:
            a = "dynamic per-token" + (f"-group ({self.block[1]})" if self.block is not None else "")
        return f"fp8 e4m3 W8A8 ({w} weight scales, {a} activations)"

    def per_channel(self) -> Fp8Weight:
        """A per-tensor scale expanded to one per output row (exact: same values)."""
        if self.weight_scale.dim() == 0:
            return replace(self, weight_scale=self.weight_scale.expand(self.weight.shape[0]).clone())
        return self

    @staticmethod
    def cat(parts: list[Fp8Weight]) -> Fp8Weight:
        first = parts[0]
        if len(parts) == 1:
            return first
        if any(p.block != first.block for p in parts):
            raise ValueError("fused shards differ in block size")
        if first.block is not None:
            bad = [p.shape[0] for p in parts[:-1] if p.shape[0] % first.block[0]]
            if bad:
                raise ValueError(f"block-scaled fused shards need row counts divisible by {first.block[0]}, got {bad}")
        else:
            parts = [p.per_channel() for p in parts]
        ins = [p.input_scale for p in parts]
        if any((s is None) != (ins[0] is None) for s in ins):
            raise ValueError("fused shards mix static and dynamic activation scales")
        # One activation scale for the fused GEMM: the largest (as vLLM does); exact when equal.
        input_scale = None if ins[0] is None else torch.stack([s.reshape(()) for s in ins]).max()
        return Fp8Weight(
            torch.cat([p.weight for p in parts]), torch.cat([p.weight_scale for p in parts]),
            input_scale, first.block,
        )

    def rows(self, start: int, length: int) -> Fp8Weight:
        s = self.weight_scale
        if self.block is not None:
            bn = self.block[0]
            if start % bn or (length % bn and start + length != self.shape[0]):
                raise ValueError(f"output slice [{start}, {start + length}) does not align to blocks of {bn}")
            s = s.narrow(0, start // bn, -(-length // bn))
        elif s.dim() == 1:
            s = s.narrow(0, start, length)
        return replace(self, weight=self.weight.narrow(0, start, length), weight_scale=s)

    def cols(self, start: int, length: int) -> Fp8Weight:
        s = self.weight_scale
        if self.block is not None:
            bk = self.block[1]
            if start % bk or length % bk:
                raise ValueError(f"input slice [{start}, {start + length}) does not align to blocks of {bk}")
            s = s.narrow(1, start // bk, length // bk)
        return replace(self, weight=self.weight.narrow(1, start, length), weight_scale=s)

    def to(self, device: torch.device) -> Fp8Weight:
        ins = None if self.input_scale is None else self.input_scale.to(device, torch.float32).reshape(())
        return replace(
            self, weight=self.weight.to(device).contiguous(),
            weight_scale=self.weight_scale.to(device, torch.float32).contiguous(), input_scale=ins,
        )


@dataclass
class Int8Weight:
    q: torch.Tensor
    scale: torch.Tensor
    input_scale: torch.Tensor | None = None
    kind = "int8_w8a8"

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.q.shape)

    def describe(self) -> str:
        a = "static" if self.input_scale is not None else "dynamic per-token"
        return f"int8 W8A8 (per-channel weight scales, {a} activations)"

    @staticmethod
    def cat(parts: list[Int8Weight]) -> Int8Weight:
        ins = [p.input_scale for p in parts]
        if any((s is None) != (ins[0] is None) for s in ins):
            raise ValueError("fused shards mix static and dynamic activation scales")
        input_scale = None if ins[0] is None else torch.stack([s.reshape(()) for s in ins]).max()
        return Int8Weight(torch.cat([p.q for p in parts]), torch.cat([p.scale for p in parts]), input_scale)

    def rows(self, start: int, length: int) -> Int8Weight:
        return replace(self, q=self.q.narrow(0, start, length), scale=self.scale.narrow(0, start, length))

    def cols(self, start: int, length: int) -> Int8Weight:
        return replace(self, q=self.q.narrow(1, start, length))

    def to(self, device: torch.device) -> Int8Weight:
        ins = None if self.input_scale is None else self.input_scale.to(device, torch.float32).reshape(())
        return replace(
            self, q=self.q.to(device).contiguous(), scale=self.scale.to(device, torch.float32).contiguous(),
            input_scale=ins,
        )


CanonicalWeight = IntWeight | Fp8Weight | Int8Weight


def int_weight_from_g_idx(
    q: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, g_idx: torch.Tensor | None, bits: int, group: int
) -> IntWeight:
    """An ``IntWeight`` from codes [N, K] whose input channel ``k`` belongs to group
    ``g_idx[k]`` (GPTQ / compressed-tensors act-order): K is permuted so each group is
    contiguous (``perm = argsort(g_idx)``, stable); the layer then feeds ``x[:, perm]``."""
    n, k = q.shape
    if g_idx is None:
        return IntWeight(q, scales, zeros, bits, group)
    g_idx = g_idx.to(torch.int64)
    perm = torch.argsort(g_idx, stable=True)
    if not torch.equal(g_idx[perm], torch.arange(k) // group):
        raise ValueError(f"g_idx does not assign {group} input channels to each of {k // group} groups")
    if torch.equal(perm, torch.arange(k)):
        return IntWeight(q, scales, zeros, bits, group)
    return IntWeight(q[:, perm].contiguous(), scales, zeros, bits, group, perm)


def cat_shards(parts: list[CanonicalWeight]) -> CanonicalWeight:
    """Fuse per-checkpoint-shard weights (q/k/v, gate/up) along N."""
    kinds = {type(p) for p in parts}
    if len(kinds) != 1:
        raise ValueError(f"fused shards are quantized differently: {sorted(k.__name__ for k in kinds)}")
    return type(parts[0]).cat(parts)
