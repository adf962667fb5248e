"""One decoder for the Llama family: Llama, Mistral, Qwen2 (q/k/v bias), Qwen3 (q/k RMSNorm).

The model works on a flattened batch: ``input_ids`` and ``positions`` are [T] over every
scheduled token of every request; attention reads and writes the paged KV cache through the
per-step metadata. q/k/v and gate/up are fused into one GEMM each at load time. Every linear
layer is tensor-parallel (``octavo.distributed.layers``); with one rank they compute exactly
what plain ``nn.Linear`` / ``nn.Embedding`` do.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import nn

from octavo.attention.backend import AttentionBackend, KVGroupMetadata
from octavo.distributed.layers import (
    MergedColumnParallelLinear,
    ParallelLMHead,
    QKVParallelLinear,
    RowParallelLinear,
    VocabParallelEmbedding,
)
from octavo.models.layers import RMSNorm, RotaryEmbedding, fused_ops_of, linear, silu_and_mul
from octavo.models.sliding_window import layer_sliding_windows


class Attention(nn.Module):
    """Binds one layer's attention kernel to its slice of the KV cache.

    ``kv_group``: the layer's KV cache group; with several groups the step's metadata is a
    ``KVGroupMetadata`` and the layer reads its group's block table and slot mapping.
    """

    def __init__(self, impl) -> None:
        super().__init__()
        self.impl = impl
        self.kv_cache: torch.Tensor | None = None
        self.kv_group = 0

    def forward(self, q, k, v, attn_metadata, kv_written: bool = False):
        """Attention of ``q`` over the cache; ``kv_written``: this step's K/V are already in the
        cache at the slot mapping (written from ``kv_write_target`` in the RoPE launch)."""
        if attn_metadata.__class__ is KVGroupMetadata:
            attn_metadata = attn_metadata.groups[self.kv_group]
        if kv_written:
            return self.impl.forward(q, k, v, self.kv_cache, attn_metadata, kv_written=True)
        return self.impl.forward(q, k, v, self.kv_cache, attn_metadata)

    def kv_write_target(self, v: torch.Tensor, attn_metadata) -> tuple | None:
        """``(v, kv cache, slot mapping, k scale, v scale)``: where another launch may write this
        step's K/V before ``forward(kv_written=True)``; None where the backend writes them itself
        (its impl lacks ``supports_kv_written``) or there is no cache yet (memory profiling)."""
        if not self.impl.supports_kv_written or self.kv_cache is None:
            return None
        if attn_metadata.__class__ is KVGroupMetadata:
            attn_metadata = attn_metadata.groups[self.kv_group]
        return v, self.kv_cache, attn_metadata.slot_mapping, self.impl.k_scale, self.impl.v_scale


class LlamaAttention(nn.Module):
    lean_cpu_step: ClassVar[bool] = True  # models/cpu_decode_layer.py reproduces forward

    def __init__(
        self, cfg, backend: type[AttentionBackend], dtype: torch.dtype, max_position: int,
        sliding_window: int | None = None,
    ):
        super().__init__()
        total_heads = cfg.num_attention_heads
        total_kv_heads = getattr(cfg, "num_key_value_heads", None) or total_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // total_heads
        bias = bool(getattr(cfg, "attention_bias", False)) or cfg.model_type == "qwen2"
        bias = bias or (cfg.model_type == "qwen2_moe" and bool(getattr(cfg, "qkv_bias", True)))
        self.qkv_proj = QKVParallelLinear(cfg.hidden_size, self.head_dim, total_heads, total_kv_heads, bias)
        # Heads held by this tensor-parallel rank.
        self.num_heads = self.qkv_proj.num_heads
        self.num_kv_heads = self.qkv_proj.num_kv_heads
        self.q_size = self.num_heads * self.head_dim
        self.kv_size = self.num_kv_heads * self.head_dim
        self.o_proj = RowParallelLinear(
            total_heads * self.head_dim, cfg.hidden_size, bias=bool(getattr(cfg, "attention_bias", False))
        )
        self.qk_norm = cfg.model_type in ("qwen3", "qwen3_moe")
        if self.qk_norm:
            self.q_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps)
            self.k_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps)
        self.rotary_emb = RotaryEmbedding(cfg, self.head_dim, max_position, dtype)
        scale = self.head_dim**-0.5
        self.attn = Attention(
            backend.get_impl_cls()(self.num_heads, self.head_dim, scale, self.num_kv_heads, sliding_window=sliding_window)
        )

    def forward(self, positions, hidden, attn_metadata):
        qkv = linear(self.qkv_proj, hidden)
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.view(-1, self.num_heads, self.head_dim)
        k = k.view(-1, self.num_kv_heads, self.head_dim)
        v = v.view(-1, self.num_kv_heads, self.head_dim)
        kv_write = None
        if self.qk_norm:
            if self.rotary_emb.writes_kv(q, self.q_norm, self.k_norm):
                kv_write = self.attn.kv_write_target(v, attn_metadata)  # K/V written in the RoPE launch
            q, k = self.rotary_emb.forward_qk_normed(positions, q, k, self.q_norm, self.k_norm, kv_write)
        else:
            q, k = self.rotary_emb(positions, q, k)
        out = self.attn(q, k, v, attn_metadata, kv_written=kv_write is not None)
        return linear(self.o_proj, out.reshape(-1, self.q_size))


class LlamaMLP(nn.Module):
    lean_cpu_step: ClassVar[bool] = True  # models/cpu_decode_layer.py reproduces forward

    def __init__(self, cfg, intermediate_size: int | None = None):
        super().__init__()
        act = getattr(cfg, "hidden_act", "silu")
        if act != "silu":
            raise ValueError(f"hidden_act {act!r} is not supported (only 'silu')")
        bias = bool(getattr(cfg, "mlp_bias", False))
        inter = intermediate_size or cfg.intermediate_size
        self.gate_up_proj = MergedColumnParallelLinear(cfg.hidden_size, {"gate": inter, "up": inter}, bias)
        self.down_proj = RowParallelLinear(inter, cfg.hidden_size, bias=bias)

    def forward(self, x):
        return linear(self.down_proj, silu_and_mul(linear(self.gate_up_proj, x), fused_ops_of(self)))


class LlamaDecoderLayer(nn.Module):
    lean_cpu_step: ClassVar[bool] = True  # models/cpu_decode_layer.py reproduces forward

    def __init__(
        self, cfg, backend, dtype, max_position, mlp: nn.Module | None = None, sliding_window: int | None = None
    ):
        super().__init__()
        self.self_attn = LlamaAttention(cfg, backend, dtype, max_position, sliding_window)
        self.mlp = mlp if mlp is not None else LlamaMLP(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, positions, hidden, residual, attn_metadata):
        lean = self.__dict__.get("lean_forward")  # the CPU's (models/cpu_decode_layer.py)
        if lean is not None and (out := lean(positions, hidden, residual, attn_metadata)) is not None:
            return out
        if residual is None:
            residual = hidden
            hidden = self.input_layernorm(hidden)
        else:
            hidden, residual = self.input_layernorm(hidden, residual)
        hidden = self.self_attn(positions, hidden, attn_metadata)
        hidden, residual = self.post_attention_layernorm(hidden, residual)
        return self.mlp(hidden), residual


class LlamaModel(nn.Module):
    lean_cpu_stack: ClassVar[bool] = True  # models/cpu_decode_stack.py reproduces the layer loop

    def __init__(self, cfg, backend, dtype, max_position, make_mlp=None):
        """``make_mlp(cfg, layer_index)`` may supply a layer's MLP (None: the dense one)."""
        super().__init__()
        self.embed_tokens = VocabParallelEmbedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(
            LlamaDecoderLayer(cfg, backend, dtype, max_position, make_mlp(cfg, i) if make_mlp else None, window)
            for i, window in enumerate(layer_sliding_windows(cfg))
        )
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        # EAGLE-3 heads read the residual stream entering these layers: ``aux_out[:T]`` holds
        # them side by side after each forward (a persistent buffer, so captured graphs write it).
        self.aux_layers: tuple[int, ...] = ()
        self.aux_out: torch.Tensor | None = None

    def forward(self, input_ids, positions, attn_metadata):
        hidden = self.embed_tokens(input_ids)
        stack = self.__dict__.get("lean_stack")  # the CPU's whole loop in one call, where it applies
        if stack is not None and not self.aux_layers and (out := stack(positions, hidden, attn_metadata)):
            hidden, _ = self.norm(*out)
            return hidden
        residual = None
        for i, layer in enumerate(self.layers):
            if self.aux_layers and i in self.aux_layers:
                self._keep_aux(i, hidden, residual)
            hidden, residual = layer(positions, hidden, residual, attn_metadata)
        hidden, _ = self.norm(hidden, residual)
        return hidden

    def _keep_aux(self, layer: int, hidden: torch.Tensor, residual: torch.Tensor | None) -> None:
        stream = hidden if residual is None else hidden + residual
        h, t = stream.shape[-1], stream.shape[0]
        for slot, want in enumerate(self.aux_layers):
            if want == layer:
                self.aux_out[:t, slot * h : (slot + 1) * h].copy_(stream)


def stacked_param_name(name: str, stacked: dict[str, tuple[str, str]]) -> tuple[str, str | None]:
    """Checkpoint tensor name -> (parameter name, shard id): a name whose part is a key of
    ``stacked`` (``q_proj``, ``gate_proj``, ...) loads into that fused parameter's shard."""
    parts = name.split(".")
    for ckpt, (fused, shard) in stacked.items():
        if ckpt in parts:
            parts[parts.index(ckpt)] = fused
            return ".".join(parts), shard
    return name, None


class LlamaForCausalLM(nn.Module):
    """Checkpoint tensor names map onto this module's parameters (see ``load_weights``)."""

    # Features ``octavo info --models`` lists (read by ``registry.describe_models``).
    supports_sliding_window: ClassVar[bool] = True  # per layer, from the config
    supports_tensor_parallel: ClassVar[bool] = True  # every linear layer is tensor-parallel

    # checkpoint suffix -> (fused parameter suffix, shard id)
    stacked_params = {
        "q_proj": ("qkv_proj", "q"),
        "k_proj": ("qkv_proj", "k"),
        "v_proj": ("qkv_proj", "v"),
        "gate_proj": ("gate_up_proj", "gate"),
        "up_proj": ("gate_up_proj", "up"),
    }

    def __init__(self, cfg, backend: type[AttentionBackend], dtype: torch.dtype, max_position: int):
        super().__init__()
        self.config = cfg
        self.dtype = dtype
        self.model = LlamaModel(cfg, backend, dtype, max_position, self.make_mlp)
        self.tie_word_embeddings = bool(getattr(cfg, "tie_word_embeddings", False))
        if not self.tie_word_embeddings:
            self.lm_head = ParallelLMHead(cfg.vocab_size, cfg.hidden_size)

    def make_mlp(self, cfg, layer_index: int) -> nn.Module | None:
        """The MLP of layer ``layer_index``; None builds the dense ``LlamaMLP``."""
        return None

    def attention_layers(self) -> list[Attention]:
        return [layer.self_attn.attn for layer in self.model.layers]

    def forward(self, input_ids, positions, attn_metadata: Any) -> torch.Tensor:
        return self.model(input_ids, positions, attn_metadata)

    def output_head(self) -> nn.Module:
        """The module whose weight projects hidden states to logits (the embedding when tied)."""
        return self.model.embed_tokens if self.tie_word_embeddings else self.lm_head

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor | None:
        """Full-vocabulary logits on tensor-parallel rank 0, ``None`` on the other ranks."""
        head = self.output_head()
        int8 = self.__dict__.get("int8_lm_head")  # OCTAVO_CPU_INT8_LM_HEAD (quantization/lm_head.py)
        if int8 is not None and (logits := int8.logits(hidden)) is not None:
            return logits
        ops = fused_ops_of(self)  # prepacked oneDNN weights on the CPU (single rank, bf16)
        if ops is not None and ops.linear_usable(head, hidden):
            return ops.linear(head, hidden)
        if self.tie_word_embeddings:
            return ParallelLMHead.compute_logits(head, hidden)  # same vocab partition
        return self.lm_head.compute_logits(hidden)

    def expected_checkpoint_targets(self) -> set[tuple[str, str | None]]:
        """Every (parameter, shard) a checkpoint must provide."""
        targets: set[tuple[str, str | None]] = set()
        for name, module in self.named_modules():
            for pname, _ in module.named_parameters(recurse=False):
                full = f"{name}.{pname}" if name else pname
                shards = getattr(module, "shard_offsets", None)
                if shards and None not in shards:
                    for shard in shards:
                        targets.add((full, shard))
                else:
                    targets.add((full, None))
        return targets

    def map_checkpoint_name(self, name: str) -> tuple[str, str | None] | None:
        """Checkpoint tensor name -> (parameter name, shard id), or None to skip it."""
        if "rotary_emb.inv_freq" in name:
            return None
        if name == "lm_head.weight" and self.tie_word_embeddings:
            return None
        return stacked_param_name(name, self.stacked_params)
