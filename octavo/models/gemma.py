"""Gemma 2 and Gemma 3 (text) decoders, numerically matched to transformers.

What differs from the Llama family (``llama.py``, whose attention forward and checkpoint
mapping are reused):
- embeddings scaled by ``sqrt(hidden_size)`` (in the weight dtype);
- RMSNorm computes ``norm(x) * (1 + w)`` in float32, then casts (weights stored as offsets);
- four norms per layer: input, post-attention, pre-feed-forward, post-feed-forward, with the
  residual added after the post norms;
- GeGLU MLP (``gelu`` with the tanh approximation);
- attention scale ``query_pre_attn_scalar ** -0.5``; Gemma 2 soft-caps attention logits
  (``attn_logit_softcapping``) and final logits (``final_logit_softcapping``);
- local (sliding-window) and global layers from ``layer_types``; Gemma 3 gives each its own
  RoPE parameters (``rope_parameters[layer_type]``) and normalises q and k per head.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from octavo.attention.backend import AttentionBackend
from octavo.distributed.layers import (
    MergedColumnParallelLinear,
    QKVParallelLinear,
    RowParallelLinear,
    VocabParallelEmbedding,
)
from octavo.models.layers import RotaryEmbedding, linear
from octavo.models.llama import Attention, LlamaAttention, LlamaForCausalLM
from octavo.models.sliding_window import layer_sliding_windows

_GELU_TANH = ("gelu_pytorch_tanh", "gelu_tanh")


class GemmaRMSNorm(nn.Module):
    """``x / rms(x) * (1 + w)`` in float32, cast back to the input dtype (as transformers)."""

    def __init__(self, hidden_size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(hidden_size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return (h * (1.0 + self.weight.float())).type_as(x)


class GemmaAttention(LlamaAttention):
    """Llama's attention forward with Gemma's scale, soft cap, q/k norms and per-type RoPE."""

    def __init__(self, cfg, backend: type[AttentionBackend], dtype: torch.dtype, max_position: int, layer_idx: int):
        nn.Module.__init__(self)
        total_heads, total_kv = cfg.num_attention_heads, cfg.num_key_value_heads
        self.head_dim = cfg.head_dim
        bias = bool(getattr(cfg, "attention_bias", False))
        self.qkv_proj = QKVParallelLinear(cfg.hidden_size, self.head_dim, total_heads, total_kv, bias)
        self.num_heads, self.num_kv_heads = self.qkv_proj.num_heads, self.qkv_proj.num_kv_heads
        self.q_size, self.kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        self.o_proj = RowParallelLinear(total_heads * self.head_dim, cfg.hidden_size, bias=bias)
        self.qk_norm = cfg.model_type == "gemma3_text"
        if self.qk_norm:
            self.q_norm = GemmaRMSNorm(self.head_dim, cfg.rms_norm_eps)
            self.k_norm = GemmaRMSNorm(self.head_dim, cfg.rms_norm_eps)
        layer_type = cfg.layer_types[layer_idx]
        self.rotary_emb = RotaryEmbedding(cfg, self.head_dim, max_position, dtype, layer_type)
        impl = backend.get_impl_cls()(
            self.num_heads, self.head_dim, cfg.query_pre_attn_scalar**-0.5, self.num_kv_heads,
            sliding_window=layer_sliding_windows(cfg)[layer_idx],
            logits_soft_cap=getattr(cfg, "attn_logit_softcapping", None),
        )
        self.attn = Attention(impl)


class GemmaMLP(nn.Module):
    def __init__(self, cfg) -> None:
        super().__init__()
        act = getattr(cfg, "hidden_activation", None) or getattr(cfg, "hidden_act", None)
        if act not in _GELU_TANH:
            raise ValueError(f"hidden_activation {act!r} is not supported (only {', '.join(_GELU_TANH)})")
        inter = cfg.intermediate_size
        self.gate_up_proj = MergedColumnParallelLinear(cfg.hidden_size, {"gate": inter, "up": inter}, False)
        self.down_proj = RowParallelLinear(inter, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = linear(self.gate_up_proj, x).chunk(2, dim=-1)
        return linear(self.down_proj, F.gelu(gate, approximate="tanh") * up)


class GemmaDecoderLayer(nn.Module):
    def __init__(self, cfg, backend, dtype, max_position, layer_idx: int) -> None:
        super().__init__()
        self.self_attn = GemmaAttention(cfg, backend, dtype, max_position, layer_idx)
        self.mlp = GemmaMLP(cfg)
        eps = cfg.rms_norm_eps
        self.input_layernorm = GemmaRMSNorm(cfg.hidden_size, eps)
        self.post_attention_layernorm = GemmaRMSNorm(cfg.hidden_size, eps)
        self.pre_feedforward_layernorm = GemmaRMSNorm(cfg.hidden_size, eps)
        self.post_feedforward_layernorm = GemmaRMSNorm(cfg.hidden_size, eps)

    def forward(self, positions, hidden, attn_metadata):
        residual = hidden
        hidden = self.self_attn(positions, self.input_layernorm(hidden), attn_metadata)
        hidden = residual + self.post_attention_layernorm(hidden)
        residual = hidden
        hidden = self.mlp(self.pre_feedforward_layernorm(hidden))
        return residual + self.post_feedforward_layernorm(hidden)


class GemmaModel(nn.Module):
    def __init__(self, cfg, backend, dtype: torch.dtype, max_position: int) -> None:
        super().__init__()
        self.embed_tokens = VocabParallelEmbedding(cfg.vocab_size, cfg.hidden_size)
        # sqrt(hidden) as a float32 tensor cast to the model dtype, as transformers rounds it.
        scale = torch.tensor(cfg.hidden_size**0.5, dtype=torch.float32).to(dtype)
        self.register_buffer("embed_scale", scale, persistent=False)
        self.layers = nn.ModuleList(
            GemmaDecoderLayer(cfg, backend, dtype, max_position, i) for i in range(cfg.num_hidden_layers)
        )
        self.norm = GemmaRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, input_ids, positions, attn_metadata):
        hidden = self.embed_tokens(input_ids)
        hidden = hidden * self.embed_scale
        for layer in self.layers:
            hidden = layer(positions, hidden, attn_metadata)
        return self.norm(hidden)


class Gemma2ForCausalLM(LlamaForCausalLM):
    """Gemma 2; also Gemma 3 text (``Gemma3ForCausalLM``), which the config's fields select."""

    def __init__(self, cfg, backend: type[AttentionBackend], dtype: torch.dtype, max_position: int):
        nn.Module.__init__(self)
        if getattr(cfg, "layer_types", None) is None:
            raise ValueError("Gemma config.json without layer_types is not supported")
        self.config = cfg
        self.dtype = dtype
        self.model = GemmaModel(cfg, backend, dtype, max_position)
        self.tie_word_embeddings = bool(getattr(cfg, "tie_word_embeddings", True))
        if not self.tie_word_embeddings:
            from octavo.distributed.layers import ParallelLMHead

            self.lm_head = ParallelLMHead(cfg.vocab_size, cfg.hidden_size)
        self.final_logit_softcapping = getattr(cfg, "final_logit_softcapping", None)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor | None:
        logits = super().compute_logits(hidden)
        if logits is not None and self.final_logit_softcapping:
            cap = self.final_logit_softcapping
            logits = torch.tanh(logits / cap) * cap
        return logits


Gemma3ForCausalLM = Gemma2ForCausalLM
