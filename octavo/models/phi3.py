"""Phi-3 / Phi-4 (``Phi3ForCausalLM``): the Llama decoder with fused checkpoint tensors.

Checkpoints store ``qkv_proj`` (q, k, v rows stacked) and ``gate_up_proj`` (gate rows, then
up rows) as single tensors; they are split into the q/k/v and gate/up shards octavo's
tensor-parallel layers load, so every rank still takes only its slice. RoPE: default,
``longrope``/``su`` to the full context, switching for the whole sequence as transformers'
Phi-3 ``generate`` does (``models/length_rope.py``) and a partial rotary factor (Phi-4-mini). ``sliding_window`` applies to every layer.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from octavo.models.llama import LlamaForCausalLM


class Phi3ForCausalLM(LlamaForCausalLM):
    def split_checkpoint_tensor(self, name: str, tensor: torch.Tensor) -> Iterator[tuple[str, torch.Tensor]]:
        """``...qkv_proj.weight`` -> q/k/v_proj, ``...gate_up_proj.weight`` -> gate/up_proj."""
        cfg = self.config
        if ".qkv_proj." in name:
            head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
            q = cfg.num_attention_heads * head_dim
            kv = (cfg.num_key_value_heads or cfg.num_attention_heads) * head_dim
            if tensor.shape[0] != q + 2 * kv:
                raise ValueError(f"tensor {name!r} has {tensor.shape[0]} rows, expected {q + 2 * kv} (q + k + v)")
            for part, t in zip(("q_proj", "k_proj", "v_proj"), tensor.split([q, kv, kv]), strict=True):
                yield name.replace("qkv_proj", part), t
        elif ".gate_up_proj." in name:
            inter = cfg.intermediate_size
            if tensor.shape[0] != 2 * inter:
                raise ValueError(f"tensor {name!r} has {tensor.shape[0]} rows, expected {2 * inter} (gate + up)")
            gate, up = tensor.split([inter, inter])
            yield name.replace("gate_up_proj", "gate_proj"), gate
            yield name.replace("gate_up_proj", "up_proj"), up
        else:
            yield name, tensor
