"""``OCTAVO_CPU_INT8_LM_HEAD``: the output projection in INT8 on the CPU, by explicit opt-in.

The lm_head (or, with tied embeddings, the embedding matrix it shares) is the largest single
weight of a small model: SmolLM2-135M's 49152 x 576 bf16 matrix is 57 MB, as many bytes as all
its layers in INT4, and at batch 1 every token streams it once. llama.cpp's q8_0 / q4_0 files
quantize it too (q8_0, q6_K). octavo keeps it as the checkpoint has it unless this opt-in is
set; then ``attach`` quantizes a copy the way ``--quantization int8`` quantizes the layers
(symmetric, per output channel: ``quantize_int8_per_channel``) and ``LlamaForCausalLM.compute_logits``
multiplies bf16 hidden states with it through ``cpu_int.int_linear``. Logits change slightly
(the copy's rounding); the embedding lookup keeps the checkpoint's weight. The copy is remade
when the weight is replaced or modified in place (``logits``).
"""

from __future__ import annotations

import logging

import torch
from torch import nn

from octavo import envs

logger = logging.getLogger(__name__)


class Int8LmHead:
    """An INT8 copy of ``module``'s weight [vocab, hidden] for the CPU kernels. Invariant:
    ``packed`` quantizes ``weight`` as it was at ``version``."""

    def __init__(self, module: nn.Module) -> None:
        self.module = module
        self.weight: torch.Tensor | None = None
        self.version = -1
        self.packed = None

    def _refresh(self) -> None:
        from octavo.quantization.int8 import quantize_int8_per_channel
        from octavo.quantization.kernels import cpu_int

        w = self.module._parameters["weight"]
        iw = quantize_int8_per_channel(w.detach())
        self.packed = cpu_int.prepack_int(iw.q, iw.scales, iw.zeros, 8)
        self.weight, self.version = w, w._version

    def logits(self, hidden: torch.Tensor) -> torch.Tensor | None:
        """hidden [T, H] (bf16) @ the INT8 copy.T, or None where it does not apply (another dtype)."""
        if hidden.dtype is not torch.bfloat16 or (hidden.requires_grad and torch.is_grad_enabled()):
            return None
        w = self.module._parameters["weight"]
        if w is not self.weight or w._version != self.version:
            self._refresh()
        from octavo.quantization.kernels import cpu_int

        return cpu_int.int_linear(hidden, self.packed)


def attach(model: nn.Module, head: nn.Module | None) -> bool:
    """Give ``model`` an ``int8_lm_head`` over ``head`` (its output projection, a single-rank
    bf16 [vocab, hidden] weight) where ``OCTAVO_CPU_INT8_LM_HEAD`` asks for it; True if it did.
    Refused with a warning (and the checkpoint's head kept) where the C++ kernels cannot run it."""
    if not envs.OCTAVO_CPU_INT8_LM_HEAD or head is None:
        return False
    w = head._parameters.get("weight")
    tp = getattr(head, "tp", None)
    if w is None or w.dim() != 2 or w.dtype != torch.bfloat16 or (tp is not None and tp.world_size > 1):
        logger.warning("OCTAVO_CPU_INT8_LM_HEAD: the output projection stays as the checkpoint has it "
                       "(needs a single-rank bfloat16 weight)")
        return False
    lm = Int8LmHead(head)
    lm._refresh()
    model.__dict__["int8_lm_head"] = lm
    logger.info("OCTAVO_CPU_INT8_LM_HEAD: the output projection %s runs an INT8 per-channel copy "
                "(%.1f MB instead of %.1f MB)", tuple(w.shape), lm.packed.nbytes / 1e6, w.numel() * 2 / 1e6)
    return True
