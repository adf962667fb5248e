"""Pick the kernel that applies each kind of canonical weight: once per model, at load.

The platform lists candidates in priority order (``Platform.quant_kernel_priority``); each is
asked whether it can run here (its module imports: the C++ extension is built, Triton is
installed) and whether it runs this weight (bits, block scales); the first that can is used and
every earlier one is logged with its reason. ``torch_ref`` runs everything, everywhere.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from octavo import envs
from octavo.quantization.canonical import CanonicalWeight, Fp8Weight, Int8Weight, IntWeight
from octavo.quantization.kernels import torch_ref

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class QuantKernel:
    """``prepack(weight) -> packed`` once at load; ``apply(x, packed, bias) -> y`` per call."""

    name: str
    prepack: Callable[[CanonicalWeight], Any]
    apply: Callable[[torch.Tensor, Any, torch.Tensor | None], torch.Tensor]
    # The canonical weight is kept only while the kernel still reads it (torch_ref).
    keeps_canonical: bool = False
    # apply(x, p, b) is cpu_int.int_linear(x, p, b) wherever p is a cpu_int.PackedInt (the CPU's
    # fused decoder-layer step calls the same C++ kernel itself: models/cpu_decode_layer.py).
    cpu_int_linear: bool = False


def _ref(w: CanonicalWeight) -> QuantKernel:
    fn = {"int": torch_ref.int_linear, "fp8": torch_ref.fp8_linear, "int8_w8a8": torch_ref.int8_w8a8_linear}[w.kind]
    return QuantKernel("torch_ref", lambda w: w, fn, keeps_canonical=True)


def _cpu_int(w: CanonicalWeight) -> QuantKernel:
    if not isinstance(w, IntWeight):
        raise LookupError(f"runs integer weight-only layers, not {w.describe()}")
    mod = importlib.import_module("octavo.quantization.kernels.cpu_int")
    return QuantKernel(
        "cpu_int",
        lambda w: mod.prepack_int(w.q, w.scales, w.zeros, w.bits),
        lambda x, p, b: mod.int_linear(x, p, b),
        cpu_int_linear=True,
    )


def _cpu_int_a8(w: CanonicalWeight) -> QuantKernel:
    """Weight-only INT8 / INT4 weights with int8 activations: only by the explicit opt-in
    ``OCTAVO_CPU_INT8_ACTIVATIONS`` (a weight-only checkpoint promises 16-bit activations)."""
    if not isinstance(w, IntWeight):
        raise LookupError(f"runs integer weight-only layers, not {w.describe()}")
    if not envs.OCTAVO_CPU_INT8_ACTIVATIONS:
        raise LookupError("weight-only checkpoint: activations stay 16-bit (OCTAVO_CPU_INT8_ACTIVATIONS=1 "
                          "quantizes them to int8 per token, faster but not the checkpoint's numerics)")
    mod = importlib.import_module("octavo.quantization.kernels.cpu_int")
    try:
        ext = mod.cpu_isa.load_extension()
    except ImportError as e:
        raise ValueError(f"OCTAVO_CPU_INT8_ACTIVATIONS=1 needs octavo's C++ CPU kernels: {e}") from None
    if not ext.int_a8():  # the opt-in cannot be honoured on this machine: say so, don't run 16-bit
        raise ValueError(f"OCTAVO_CPU_INT8_ACTIVATIONS=1: int8 activations need AVX512-VNNI and AVX512-VBMI, "
                         f"which this CPU (kernel build {ext.ISA}) has not; unset it to run the checkpoint's "
                         "16-bit activations")
    if why := mod.a8_unsupported(w.q.shape[1], w.group, ext):
        logger.warning("%s layers keep 16-bit activations despite OCTAVO_CPU_INT8_ACTIVATIONS=1: %s", w.describe(), why)
        raise LookupError(why)

    def prepack(w: IntWeight):
        if why := mod.a8_unsupported(w.q.shape[1], w.group, mod.cpu_isa.load_extension()):
            logger.warning("a %s layer %s keeps 16-bit activations: %s", w.describe(), tuple(w.q.shape), why)
        return mod.prepack_int(w.q, w.scales, w.zeros, w.bits, act_int8=why is None)

    return QuantKernel("cpu_int_a8", prepack, lambda x, p, b: mod.int_linear(x, p, b), cpu_int_linear=True)


def _cpu_w8a8(w: CanonicalWeight) -> QuantKernel:
    """INT8 W8A8 checkpoints (int8 activations are what the checkpoint means): the VNNI kernel
    on codes ``q + 128`` with zero point 128 (exactly ``xq . q``); a layer of a shape it cannot
    run keeps the reference."""
    if not isinstance(w, Int8Weight):
        raise LookupError(f"runs int8 W8A8 layers, not {w.describe()}")
    mod = importlib.import_module("octavo.quantization.kernels.cpu_int")
    n, k = w.q.shape
    if why := mod.a8_unsupported(k, k, mod.cpu_isa.load_extension()):
        raise LookupError(why)

    def prepack(w: Int8Weight):
        n, k = w.q.shape
        if why := mod.a8_unsupported(k, k, mod.cpu_isa.load_extension()):
            logger.warning("a %s layer %s runs the torch reference: %s", w.describe(), (n, k), why)
            return w
        codes = (w.q.to(torch.int16) + 128).to(torch.uint8)
        ins = None if w.input_scale is None else float(w.input_scale)
        return mod.prepack_int(codes, w.scale.reshape(n, 1).to(torch.float32),
                               torch.full((n, 1), 128, dtype=torch.uint8), 8, act_int8=True, input_scale=ins)

    def apply(x: torch.Tensor, p, b: torch.Tensor | None) -> torch.Tensor:
        return torch_ref.int8_w8a8_linear(x, p, b) if isinstance(p, Int8Weight) else mod.int_linear(x, p, b)

    return QuantKernel("cpu_w8a8", prepack, apply, cpu_int_linear=True)


def _triton_w4a16(w: CanonicalWeight) -> QuantKernel:
    if not isinstance(w, IntWeight) or w.bits != 4:
        raise LookupError(f"runs 4-bit weight-only layers, not {w.describe()}")
    mod = importlib.import_module("octavo.quantization.kernels.triton_w4a16")
    if why := mod.group_supported(w.group, w.q.shape[1]):
        raise LookupError(why)
    return QuantKernel(
        "triton_w4a16",
        lambda w: mod.prepack_w4a16(w.q, w.scales, w.zeros, w.group),
        lambda x, p, b: mod.w4a16_linear(x, p, b),
    )


def _triton_fp8(w: CanonicalWeight) -> QuantKernel:
    if not isinstance(w, Fp8Weight):
        raise LookupError(f"runs fp8 layers, not {w.describe()}")
    mod = importlib.import_module("octavo.quantization.kernels.triton_fp8")
    if w.block is not None and w.input_scale is None and not getattr(mod, "ACT_GROUP_QUANT", False):
        # Block-scaled checkpoints (DeepSeek / Qwen FP8, compressed-tensors FP8_BLOCK) quantize
        # activations per token and block-width group; per-token scales would change results.
        raise LookupError("quantizes activations per token; block-scaled fp8 needs per-token-group scales")
    return QuantKernel(
        "triton_fp8",
        lambda w: (mod.prepack_fp8(w.weight, w.weight_scale), w.input_scale),
        lambda x, p, b: mod.fp8_linear(x, p[0], b, input_scale=p[1]),
    )


KERNELS: dict[str, Callable[[CanonicalWeight], QuantKernel]] = {
    "torch_ref": _ref, "cpu_int": _cpu_int, "cpu_int_a8": _cpu_int_a8, "cpu_w8a8": _cpu_w8a8, "triton_w4a16": _triton_w4a16, "triton_fp8": _triton_fp8,
}


def select_kernel(weight: CanonicalWeight, priority: tuple[str, ...]) -> tuple[QuantKernel, dict[str, str]]:
    """(the first candidate that runs ``weight``, {skipped candidate: why}); torch_ref last."""
    skipped: dict[str, str] = {}
    for name in (*priority, "torch_ref"):
        if name in skipped or name not in KERNELS:
            skipped.setdefault(name, "unknown kernel")
            continue
        try:
            return KERNELS[name](weight), skipped
        except ImportError as e:
            skipped[name] = f"not available here ({e})"
        except LookupError as e:
            skipped[name] = str(e.args[0])
    raise AssertionError("torch_ref runs every canonical weight")


def _probe_weight(kind: str, bits: int = 4) -> CanonicalWeight:
    """A small weight of ``kind``: enough for a kernel to say whether it could run it."""
    if kind == "int":
        codes = torch.zeros(8, 128, dtype=torch.uint8)
        return IntWeight(codes, torch.ones(8, 1), torch.zeros(8, 1, dtype=torch.uint8), bits, 128)
    if kind == "fp8":
        return Fp8Weight(torch.zeros(8, 128, dtype=torch.float8_e4m3fn), torch.ones(8))
    return Int8Weight(torch.zeros(8, 128, dtype=torch.int8), torch.ones(8))


def probe_kernels(kinds: tuple[str, ...], priority: dict[str, tuple[str, ...]]) -> dict[str, tuple[str, dict[str, str]]]:
    """kind -> (kernel that would run it, {skipped: why}), without loading a model (``octavo info``)."""
    out = {}
    for kind in kinds:
        kernel, skipped = select_kernel(_probe_weight(kind), priority.get(kind, ()))
        out[kind] = (kernel.name, skipped)
    return out


__all__ = ["QuantKernel", "select_kernel", "Fp8Weight", "Int8Weight", "IntWeight"]
