"""The EAGLE-3 head (``method: eagle3``; ``Eagle3LlamaForCausalLM``, the layout vLLM loads).

The target keeps, per token, its residual stream entering three of its layers (``aux`` layer
ids: the head's ``eagle_config.eagle_aux_hidden_state_layer_ids``, else vLLM's default
``(2, L // 2, L - 3)`` of a target with ``L`` layers), side by side: ``[T, 3 * hidden]``. For
position ``i`` the head computes

    h = fc(aux[i])                                   # fc: [hidden, 3 * hidden], no bias
    x = cat(input_layernorm(embed(t[i + 1])), hidden_norm(h))     # [2 * hidden]
    a = o_proj(attention(qkv_proj(x)))               # qkv_proj reads 2 * hidden
    r = h + a;  g = r + mlp(post_attention_layernorm(r))

``g`` is fed back in place of ``h`` for later drafts (then without ``fc``), and the draft is
``argmax(lm_head(norm(g)))`` over the head's own vocabulary of ``draft_vocab_size`` tokens,
mapped to target ids by ``d2t`` (``target_id = draft_id + d2t[draft_id]``).

Checkpoint tensors: ``fc.weight``, ``midlayer.*`` (or ``layers.0.*``), ``norm.weight``,
``lm_head.weight``, ``d2t``; ``t2d`` (derivable from ``d2t``) is not read; an
``embed_tokens.weight`` must equal the target's (the head embeds with the target's; a different
one is refused). One decoder layer only.
"""

from __future__ import annotations

import torch
from torch import nn

from octavo.distributed.layers import QKVParallelLinear
from octavo.models.layers import RMSNorm
from octavo.models.llama import LlamaDecoderLayer, LlamaForCausalLM, stacked_param_name
from octavo.spec_decode.shared_tensors import split_shared_copy

NOT_READ = ("t2d",)  # the reverse of d2t, derivable


class _VocabMap(nn.Module):
    """``d2t``: the offset from each draft-vocabulary id to its target id."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.d2t = nn.Parameter(torch.zeros(n, dtype=torch.int64), requires_grad=False)


class Eagle3Head(nn.Module):
    stacked_params = LlamaForCausalLM.stacked_params

    def __init__(self, cfg, target: nn.Module, backend, dtype: torch.dtype, max_position: int) -> None:
        super().__init__()
        if cfg.num_hidden_layers != 1:
            raise ValueError(f"an EAGLE-3 head with {cfg.num_hidden_layers} layers; octavo runs one-layer heads")
        self.config = cfg
        self._target = (target,)
        h = cfg.hidden_size
        draft_vocab = getattr(cfg, "draft_vocab_size", None) or cfg.vocab_size
        self.fc = nn.Linear(3 * h, h, bias=False)
        layer = LlamaDecoderLayer(cfg, backend, dtype, max_position)
        attn = layer.self_attn
        attn.qkv_proj = QKVParallelLinear(2 * h, attn.head_dim, cfg.num_attention_heads,
                                          getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads,
                                          bool(getattr(cfg, "attention_bias", False)))
        layer.hidden_norm = RMSNorm(h, cfg.rms_norm_eps)
        self.layers = nn.ModuleList([layer])
        self.norm = RMSNorm(h, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(h, draft_vocab, bias=False)
        self.vocab_map = _VocabMap(draft_vocab)

    @property
    def target(self) -> nn.Module:
        return self._target[0]

    def split_checkpoint_tensor(self, name: str, tensor: torch.Tensor):
        return split_shared_copy(self.target, ("embed_tokens.weight",), name, tensor)

    def attention_layers(self) -> list:
        return [self.layers[0].self_attn.attn]

    def combine(self, features: torch.Tensor) -> torch.Tensor:
        """The target's three auxiliary hidden states -> the head's hidden input."""
        return self.fc(features.to(self.fc.weight.dtype))

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, hidden_states: torch.Tensor,
                attn_metadata) -> torch.Tensor:
        layer = self.layers[0]
        embeds = layer.input_layernorm(self.target.model.embed_tokens(input_ids))
        residual = hidden_states
        x = torch.cat((embeds, layer.hidden_norm(hidden_states)), dim=-1)
        a = layer.self_attn(positions, x, attn_metadata)
        a, residual = layer.post_attention_layernorm(a, residual)
        return layer.mlp(a) + residual

    def greedy(self, g: torch.Tensor) -> torch.Tensor:
        draft = self.lm_head(self.norm(g)).argmax(dim=-1)
        return (draft + self.vocab_map.d2t[draft]).to(torch.int64)

    def init_dummy(self, seed: int) -> None:
        from octavo.models.loader import init_dummy_weights

        for name, child in self.named_children():
            if name != "vocab_map":
                init_dummy_weights(child, seed=seed)

    # -- checkpoint names (read by octavo.models.loader.load_weights) ---------------------
    def expected_checkpoint_targets(self) -> set[tuple[str, str | None]]:
        return LlamaForCausalLM.expected_checkpoint_targets(self)

    def map_checkpoint_name(self, name: str) -> tuple[str, str | None] | None:
        if name.startswith("model."):
            name = name[len("model."):]
        if name in NOT_READ or "rotary_emb.inv_freq" in name:
            return None
        if name == "d2t":
            return "vocab_map.d2t", None
        if name.startswith("midlayer."):
            name = "layers.0." + name[len("midlayer."):]
        return stacked_param_name(name, self.stacked_params)
