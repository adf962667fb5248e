"""Quantized linear layers: the model's tensor-parallel linears, with their weight replaced.

``quantize_model`` asks the ``QuantizationConfig`` about every linear layer; each quantized one
loses its ``weight`` parameter and gains a ``QuantState``. The loader hands the state every
checkpoint tensor of that layer (``accept``); once all shards are in, the state builds the
canonical weight per shard, keeps this rank's slice, fuses the shards, moves the result to the
layer's device and prepacks it for the kernel chosen once per model (``finalize``).
``models.layers.linear`` then calls ``apply``. Biases stay ordinary parameters.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from octavo.quantization.base import LinearMethod, QuantizationConfig
from octavo.quantization.canonical import CanonicalWeight, cat_shards
from octavo.quantization.kernels.select import QuantKernel, select_kernel

logger = logging.getLogger(__name__)


@dataclass
class KernelChoice:
    """The kernel per canonical weight kind, chosen at the first layer of that kind."""

    priority: dict[str, tuple[str, ...]]
    chosen: dict[str, QuantKernel] = field(default_factory=dict)
    skipped: dict[str, dict[str, str]] = field(default_factory=dict)
    weights: dict[str, str] = field(default_factory=dict)

    def kernel_for(self, w: CanonicalWeight) -> QuantKernel:
        key = w.kind
        if key not in self.chosen:
            kernel, skipped = select_kernel(w, self.priority.get(key, ()))
            self.chosen[key], self.skipped[key], self.weights[key] = kernel, skipped, w.describe()
            why = "; ".join(f"not {k}: {v}" for k, v in skipped.items())
            logger.info("quantized %s layers run kernel %s%s", w.describe(), kernel.name, f" ({why})" if why else "")
        return self.chosen[key]

    def summary(self) -> str:
        return "; ".join(f"{self.weights[k]} -> {v.name}" for k, v in self.chosen.items())


class QuantState:
    """One quantized layer: pending checkpoint tensors, then the packed weight."""

    def __init__(self, layer: nn.Module, method: LinearMethod, choice: KernelChoice, device: torch.device) -> None:
        self.method = method
        self.choice = choice
        self.device = device
        shards = getattr(layer, "shard_offsets", None) or {None: None}
        self.shards: list[str | None] = list(shards)
        self.pending: dict[str | None, dict[str, torch.Tensor]] = {s: {} for s in self.shards}
        self.kernel: QuantKernel | None = None
        self.packed: Any = None
        self.perm: torch.Tensor | None = None
        self.nbytes = 0
        self.canonical: CanonicalWeight | None = None
        self.weight_shape: tuple[int, int] = (0, 0)

    @property
    def names(self) -> tuple[str, ...]:
        return self.method.tensor_names + self.method.optional_names

    def accept(self, layer: nn.Module, name: str, tensor: torch.Tensor, shard: str | None) -> None:
        if shard not in self.pending:
            raise ValueError(f"shard {shard!r} is not one of {self.shards}")
        self.pending[shard][name] = tensor
        # Layers with optional tensors (GPTQ's g_idx) wait for the end of the checkpoint.
        if not self.method.optional_names and self.complete():
            self.finalize(layer)

    def complete(self) -> bool:
        return all(set(self.method.tensor_names) <= set(p) for p in self.pending.values())

    def finalize(self, layer: nn.Module) -> None:
        """Canonical weight per shard -> this rank's slice -> fused -> device -> prepacked."""
        parts = []
        for shard in self.shards:
            tensors = self.pending[shard]
            if self.method.quantizes_on_device:  # online: quantize where the model lives
                tensors = {k: v.to(self.device) for k, v in tensors.items()}
            w = self.method.to_canonical(tensors)
            parts.append(_rank_slice(layer, w, shard))
        self.pending = {s: {} for s in self.shards}
        self.install(cat_shards(parts))

    def install(self, w: CanonicalWeight) -> None:
        """Move this rank's fused canonical weight to the device and prepack it."""
        w = w.to(self.device)
        self.kernel = self.choice.kernel_for(w)
        self.perm = getattr(w, "perm", None)
        self.nbytes = _nbytes(w)
        self.packed = self.kernel.prepack(w)
        self.canonical = w if self.kernel.keeps_canonical else None

    def apply(self, layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
        if self.perm is not None:
            x = x.index_select(-1, self.perm)
        d = layer.__dict__  # the attributes without nn.Module.__getattr__ per call
        params = d["_parameters"]
        bias = params["bias"] if "bias" in params else getattr(layer, "bias", None)
        tp = d["tp"] if "tp" in d else getattr(layer, "tp", None)  # row-parallel: bias added once
        if tp is not None and tp.world_size > 1:
            out = tp.all_reduce(self.kernel.apply(x, self.packed, None))
            return out if bias is None else out + bias
        return self.kernel.apply(x, self.packed, bias)


def _rank_slice(layer: nn.Module, w: CanonicalWeight, shard: str | None) -> CanonicalWeight:
    if hasattr(layer, "shard_offsets"):  # column-parallel: rows of this shard
        _, rows = layer.shard_offsets[shard]
        src = layer.shard_sources[shard]
        return w if (src, rows) == (0, w.shape[0]) else w.rows(src, rows)
    start, length = layer.in_start, layer.local_in  # row-parallel: input columns
    return w if (start, length) == (0, w.shape[1]) else w.cols(start, length)


def _nbytes(w: CanonicalWeight) -> int:
    return sum(t.numel() * t.element_size() for t in vars(w).values() if isinstance(t, torch.Tensor))


def quant_state(layer: nn.Module) -> QuantState | None:
    return layer.__dict__.get("quant_state")


def quantize_model(model: nn.Module, qconfig: QuantizationConfig, priority: dict[str, tuple[str, ...]]) -> KernelChoice:
    """Replace the weight of every linear layer the config quantizes with a ``QuantState``."""
    from octavo.distributed.layers import ColumnParallelLinear, RowParallelLinear

    choice = KernelChoice(priority)
    for prefix, module in model.named_modules():
        if not isinstance(module, (ColumnParallelLinear, RowParallelLinear)):
            continue
        method = qconfig.linear_method(checkpoint_prefix(model, prefix))
        if method is None:
            continue
        st = QuantState(module, method, choice, module.weight.device)
        st.weight_shape = tuple(module.weight.shape)  # this rank's [out, in]
        del module._parameters["weight"]
        module.weight = None
        module.__dict__["quant_state"] = st
    model.__dict__["quant_kernels"] = choice
    return choice


def checkpoint_prefix(model: nn.Module, prefix: str) -> str:
    """The checkpoint name of a (possibly fused) layer: its first shard's (``qkv_proj`` -> ``q_proj``)."""
    stacked = getattr(model, "stacked_params", {})
    parts = prefix.split(".")
    for ckpt, (fused, _) in stacked.items():
        if parts and parts[-1] == fused:
            return ".".join([*parts[:-1], ckpt])
    return prefix


def quantized_targets(model: nn.Module) -> set[tuple[str, str | None]]:
    """Every (``layer.tensor``, shard) the checkpoint must provide for quantized layers."""
    out: set[tuple[str, str | None]] = set()
    for prefix, module in model.named_modules():
        st = quant_state(module)
        if st is not None:
            out |= {(f"{prefix}.{n}", s) for n in st.method.tensor_names for s in st.shards}
    return out


def accept_tensor(model: nn.Module, pname: str, tensor: torch.Tensor, shard: str | None) -> bool:
    """Hand a checkpoint tensor to the quantized layer that owns it; False if none does."""
    path, _, attr = pname.rpartition(".")
    try:
        module = model.get_submodule(path)
    except AttributeError:
        return False
    st = quant_state(module)
    if st is None or attr not in st.names:
        return False
    st.accept(module, attr, tensor, shard)
    return True


def finalize_all(model: nn.Module) -> None:
    """After the last checkpoint tensor: build every layer still waiting (all its tensors
    are there: the loader checked none is missing)."""
    for module in model.modules():
        st = quant_state(module)
        if st is not None and st.packed is None and st.complete():
            st.finalize(module)


@torch.no_grad()
def init_dummy_quantized(model: nn.Module, seed: int = 0) -> None:
    """``load_format="dummy"``: small random weights, quantized by online methods. Checkpoint
    formats have no quantizer here and are refused."""
    gen = torch.Generator().manual_seed(seed)
    for module in model.modules():
        st = quant_state(module)
        if st is None:
            continue
        if st.method.tensor_names != ("weight",):
            raise ValueError(
                f"load_format 'dummy' cannot make {st.method.describe()} weights; use a real checkpoint "
                "or an online method (--quantization int8 / fp8)"
            )
        w = torch.empty(st.weight_shape).uniform_(-0.05, 0.05, generator=gen)
        st.install(st.method.to_canonical({"weight": w}))


def quantized_bytes(model: nn.Module) -> int:
    return sum(st.nbytes for m in model.modules() if (st := quant_state(m)) is not None)
