"""The EAGLE-1 head: a small decoder fed the target's hidden states (the checkpoint format
vLLM loads for ``method: eagle``, e.g. an ``EagleLlamaForCausalLM`` head of a Llama target).

For position ``i`` the head reads the target's output hidden state ``h[i]`` (after the
target's final norm: what the target's forward returns, as vLLM feeds it) and the token
``t[i + 1]``; it computes

    x = fc(cat(embed(t[i + 1]), h[i]))          # fc: [hidden, 2 * hidden], maybe a bias
    g = decoder layers over x (the first without an input norm), + the residual

and ``g[i]``, through the target's ``lm_head`` (no norm in between), predicts ``t[i + 2]``.
Drafting further, ``g`` takes the place of ``h`` at the next position. The token embedding
and the ``lm_head`` are the target's (shared; a copy in the head's checkpoint is not read).

Checkpoint tensors: ``fc.weight`` (``fc.bias``), ``layers.N.*`` in the target family's names
(optionally under ``model.``); the first layer has no ``input_layernorm``. Anything else is an
error naming it. Copies of the shared ``embed_tokens.weight`` / ``lm_head.weight`` (EAGLE's
checkpoints carry the embedding) must equal the target's: the head drafts with the target's.
"""

from __future__ import annotations

import logging

import torch
from torch import nn

from octavo.models.llama import LlamaDecoderLayer, LlamaForCausalLM, stacked_param_name
from octavo.spec_decode.shared_tensors import split_shared_copy

logger = logging.getLogger(__name__)

# Tensors of an EAGLE checkpoint that the head takes from the target instead.
SHARED_TENSORS = ("embed_tokens.weight", "lm_head.weight")


class EagleHead(nn.Module):
    """The head's own parameters: ``fc`` and ``layers``; ``target`` lends embedding and lm_head.

    ``target`` is held outside the module tree (it is not the head's parameter)."""

    stacked_params = LlamaForCausalLM.stacked_params

    def __init__(self, cfg, target: nn.Module, backend, dtype: torch.dtype, max_position: int) -> None:
        super().__init__()
        self.config = cfg
        self._target = (target,)
        h = cfg.hidden_size
        # vLLM's heads have no fc bias, EAGLE's original training code has one: a checkpoint's
        # ``fc.bias`` is loaded when present, else the bias stays zero.
        self.fc = nn.Linear(2 * h, h, bias=True)
        with torch.no_grad():
            self.fc.bias.zero_()
        self.layers = nn.ModuleList(
            LlamaDecoderLayer(cfg, backend, dtype, max_position) for _ in range(cfg.num_hidden_layers)
        )
        self.layers[0].input_layernorm = nn.Identity()

    @property
    def target(self) -> nn.Module:
        return self._target[0]

    def split_checkpoint_tensor(self, name: str, tensor: torch.Tensor):
        return split_shared_copy(self.target, SHARED_TENSORS, name, tensor)

    def attention_layers(self) -> list:
        return [layer.self_attn.attn for layer in self.layers]

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, hidden_states: torch.Tensor,
                attn_metadata) -> torch.Tensor:
        """``g`` for each flattened token: ``input_ids[i]`` is the token after the position
        whose hidden state (the target's, or the head's own ``g``) is ``hidden_states[i]``."""
        embeds = self.target.model.embed_tokens(input_ids)
        x = self.fc(torch.cat((embeds, hidden_states.to(embeds.dtype)), dim=-1))
        residual = None
        for layer in self.layers:
            x, residual = layer(positions, x, residual, attn_metadata)
        return x + residual

    def compute_logits(self, g: torch.Tensor) -> torch.Tensor | None:
        return self.target.compute_logits(g)

    def init_dummy(self, seed: int) -> None:
        """Small random weights (``load_format="dummy"``)."""
        from octavo.models.loader import init_dummy_weights

        init_dummy_weights(self, seed=seed)

    def combine(self, features: torch.Tensor) -> torch.Tensor:
        """What the head reads of the target per token (EAGLE-1: its output hidden state)."""
        return features

    def greedy(self, g: torch.Tensor) -> torch.Tensor:
        """The draft token (target vocabulary ids) after each output ``g``."""
        return self.compute_logits(g).argmax(dim=-1).to(torch.int64)

    # -- checkpoint names (read by octavo.models.loader.load_weights) ---------------------
    def expected_checkpoint_targets(self) -> set[tuple[str, str | None]]:
        return LlamaForCausalLM.expected_checkpoint_targets(self) - {("fc.bias", None)}

    def map_checkpoint_name(self, name: str) -> tuple[str, str | None] | None:
        if name.startswith("model."):
            name = name[len("model."):]
        if "rotary_emb.inv_freq" in name:
            return None
        if name.startswith("layers.0.input_layernorm."):
            raise ValueError(f"tensor {name!r}: an EAGLE head's first layer has no input_layernorm "
                             "(is this a whole model rather than an EAGLE head?)")
        return stacked_param_name(name, self.stacked_params)


def build_eagle_head(mc, target: nn.Module, attn_backend, device: torch.device, platform,
                     max_model_len: int) -> EagleHead:
    """The head of ``mc`` (its ``ModelConfig``) on ``device`` with its weights loaded (or dummy)."""
    from octavo.models.layers import bind_fused_ops
    from octavo.models.loader import load_weights

    cls = EagleHead
    if "eagle3" in mc.architecture.lower():
        from octavo.spec_decode.eagle3_head import Eagle3Head as cls
    old = torch.get_default_dtype()
    torch.set_default_dtype(mc.dtype)
    try:
        with torch.device(device):
            head = cls(mc.hf_config, target, attn_backend, mc.dtype, max_model_len)
    finally:
        torch.set_default_dtype(old)
    if mc.load_format == "dummy":
        head.init_dummy(mc.seed)
    else:
        load_weights(head, mc.model, mc.load_format)
    bind_fused_ops(head, platform.fused_op_kernels, platform.decode_gemv_policy())
    return head.eval()
