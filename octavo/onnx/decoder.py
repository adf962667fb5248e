"""octavo's own decoder, with its loaded weights, wrapped for ``torch.onnx.export``.

What is exported is what octavo runs: the model class of octavo's registry, built from the
checkpoint's ``config.json`` and filled by octavo's loader, with every layer (embeddings,
norms, RoPE tables, MLPs, the LM head and its soft cap) unchanged; only the paged attention
kernel is replaced by ``ExportAttentionImpl`` over explicit past/present tensors, and the fused
CPU/GPU kernels are left unbound (plain torch ops export to plain ONNX ops); mixture-of-experts
layers run every expert densely (``export_experts``).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from octavo.onnx.export_attention import ExportAttentionBackend, ExportStep
from octavo.onnx.export_experts import use_dense_experts


class ExportDecoder(nn.Module):
    """``(input_ids, attention_mask, position_ids, *past) -> (logits, *present)``.

    ``past`` alternates key, value per layer: [B, num_kv_heads, P, head_size] each.
    """

    def __init__(self, model: nn.Module, num_layers: int) -> None:
        super().__init__()
        self.model = model
        self.num_layers = num_layers

    def forward(self, input_ids, attention_mask, position_ids, *past):
        batch, seq = input_ids.shape
        pairs = [(past[2 * i], past[2 * i + 1]) for i in range(self.num_layers)]
        step = ExportStep(attention_mask, position_ids, pairs)
        hidden = self.model(input_ids.reshape(-1), position_ids.reshape(-1), step)
        logits = self.model.compute_logits(hidden).float()
        out = [logits.reshape(batch, seq, -1)]
        for k, v in step.presents:
            out += [k, v]
        return tuple(out)


def load_octavo_model(model_dir: str, hf_config: Any, architecture: str, dtype: torch.dtype,
                      max_position: int) -> nn.Module:
    """octavo's model for ``architecture``, weights loaded from ``model_dir``, attention exportable."""
    from octavo.models.layers import bind_fused_ops
    from octavo.models.loader import load_weights
    from octavo.models.registry import resolve_architecture

    _, model_cls = resolve_architecture([architecture])
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        model = model_cls(hf_config, ExportAttentionBackend, dtype, max_position)
    finally:
        torch.set_default_dtype(old)
    load_weights(model, model_dir, "auto")
    bind_fused_ops(model, "none")
    use_dense_experts(model, dtype)
    return model.eval()


def sample_inputs(batch: int, seq: int, past: int, num_layers: int, num_kv_heads: int, head_size: int,
                  dtype: torch.dtype, vocab_size: int) -> tuple[torch.Tensor, ...]:
    """Inputs to trace with (sizes > 1 everywhere, so no dimension is specialised)."""
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab_size, (batch, seq), generator=g)
    mask = torch.ones(batch, past + seq, dtype=torch.int64)
    pos = torch.arange(past, past + seq, dtype=torch.int64).expand(batch, seq).contiguous()
    kv = [torch.randn(batch, num_kv_heads, past, head_size, generator=g).to(dtype) for _ in range(2 * num_layers)]
    return (ids, mask, pos, *kv)
