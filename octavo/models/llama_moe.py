"""Mixture-of-experts decoders of the Llama family: Mixtral, Qwen2-MoE, Qwen3-MoE.

They share ``llama.py``'s attention, norms and decoder loop; only the MLP of the sparse layers
differs: a router (``gate``, replicated on every rank) picks each token's top-k experts and a
``FusedMoE`` runs them. Qwen2-MoE adds a shared expert (a dense MLP every token passes
through) scaled by ``sigmoid(shared_expert_gate(x))``. Which layers are sparse follows
transformers: every ``decoder_sparse_step``-th layer not listed in ``mlp_only_layers``.

Checkpoints store each expert's projections separately (``experts.<e>.gate_proj.weight`` or
Mixtral's ``w1``/``w3``/``w2``); ``map_checkpoint_name`` routes them into the stacked
``w13_weight`` / ``w2_weight`` parameters with the shard id ``"<e>.<gate|up|down>"``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from octavo.models.layers import fused_ops_of, linear, silu_and_mul
from octavo.models.llama import LlamaForCausalLM, LlamaMLP
from octavo.models.moe.layer import FusedMoE

# checkpoint projection name -> which part of an expert it is
_EXPERT_PROJ = {"gate_proj": "gate", "up_proj": "up", "down_proj": "down", "w1": "gate", "w3": "up", "w2": "down"}


@dataclass(frozen=True)
class MoESpec:
    """The MoE shape of a config, read the way transformers reads it."""

    num_experts: int
    top_k: int
    intermediate_size: int
    renormalize: bool
    shared_intermediate_size: int = 0
    sparse_step: int = 1
    mlp_only_layers: tuple[int, ...] = ()

    def is_sparse(self, layer_index: int) -> bool:
        return (
            layer_index not in self.mlp_only_layers
            and self.num_experts > 0
            and (layer_index + 1) % self.sparse_step == 0
        )


def moe_spec(cfg) -> MoESpec:
    """``MoESpec`` of a Mixtral / Qwen2-MoE / Qwen3-MoE config."""
    num_experts = getattr(cfg, "num_experts", None) or getattr(cfg, "num_local_experts", 0)
    if cfg.model_type == "mixtral":
        return MoESpec(num_experts, cfg.num_experts_per_tok, cfg.intermediate_size, renormalize=True)
    return MoESpec(
        num_experts,
        cfg.num_experts_per_tok,
        cfg.moe_intermediate_size,
        renormalize=bool(getattr(cfg, "norm_topk_prob", False)),
        shared_intermediate_size=int(getattr(cfg, "shared_expert_intermediate_size", 0) or 0),
        sparse_step=int(getattr(cfg, "decoder_sparse_step", 1) or 1),
        mlp_only_layers=tuple(getattr(cfg, "mlp_only_layers", None) or ()),
    )


class SparseMoeBlock(nn.Module):
    """Router + experts (+ the gated shared expert of Qwen2-MoE)."""

    def __init__(self, cfg, spec: MoESpec, dtype: torch.dtype) -> None:
        super().__init__()
        self.gate = nn.Linear(cfg.hidden_size, spec.num_experts, bias=False)
        self.experts = FusedMoE(
            spec.num_experts, spec.top_k, cfg.hidden_size, spec.intermediate_size, spec.renormalize, dtype
        )
        self.shared_expert = None
        if spec.shared_intermediate_size:
            self.shared_expert = LlamaMLP(cfg, spec.shared_intermediate_size)
            self.shared_expert_gate = nn.Linear(cfg.hidden_size, 1, bias=False)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        # The router's logits decide the top-k: plain torch computes them as transformers does,
        # or, at few tokens, the expert kernel's fused router GEMV (same float32 products and
        # rounding; only the summation order differs).
        se = self.shared_expert
        if se is None:
            return self.experts.forward_from_router(hidden, self.gate.weight)
        logits = F.linear(hidden, self.gate.weight)
        gate = torch.sigmoid(F.linear(hidden, self.shared_expert_gate.weight))
        tp = self.experts.tp
        if tp.world_size == 1 or se.down_proj.bias is not None:
            return self.experts(hidden, logits) + gate * se(hidden)
        # Tensor parallel: one all-reduce for both. Every rank adds its experts' partial sum to
        # its rows of the shared expert (gate is per token, so it distributes over the sum).
        shared = F.linear(silu_and_mul(linear(se.gate_up_proj, hidden), fused_ops_of(se)), se.down_proj.weight)
        return tp.all_reduce(self.experts(hidden, logits, reduce=False) + gate * shared)


class MoeForCausalLM(LlamaForCausalLM):
    """A Llama-family decoder whose sparse layers are ``SparseMoeBlock``s."""

    def __init__(self, cfg, backend, dtype: torch.dtype, max_position: int):
        qc = getattr(cfg, "quantization_config", None)
        if qc:
            method = qc.get("quant_method") if isinstance(qc, dict) else getattr(qc, "quant_method", qc)
            raise ValueError(
                f"{type(self).__name__}: quantized mixture-of-experts checkpoints are not supported "
                f"(quantization_config method {method!r}); octavo runs experts in bfloat16, float16 "
                "or float32 only. Use an unquantized checkpoint."
            )
        self.spec = moe_spec(cfg)
        super().__init__(cfg, backend, dtype, max_position)

    def make_mlp(self, cfg, layer_index: int) -> nn.Module | None:
        if not self.spec.is_sparse(layer_index):
            return None
        return SparseMoeBlock(cfg, self.spec, self.dtype)

    def moe_layers(self) -> list[FusedMoE]:
        return [m for m in self.modules() if isinstance(m, FusedMoE)]

    def map_checkpoint_name(self, name: str) -> tuple[str, str | None] | None:
        parts = name.split(".")
        if "block_sparse_moe" in parts:  # Mixtral's name for the MoE block
            parts[parts.index("block_sparse_moe")] = "mlp"
        if "experts" in parts:
            i = parts.index("experts")
            rest = parts[i + 1:]
            if len(rest) == 3 and rest[0].isdigit() and rest[1] in _EXPERT_PROJ and rest[2] == "weight":
                which = _EXPERT_PROJ[rest[1]]
                param = "w2_weight" if which == "down" else "w13_weight"
                return ".".join([*parts[: i + 1], param]), f"{rest[0]}.{which}"
        return super().map_checkpoint_name(".".join(parts))

    def expected_checkpoint_targets(self) -> set[tuple[str, str | None]]:
        targets = super().expected_checkpoint_targets()
        for prefix, module in self.named_modules():
            if isinstance(module, FusedMoE):
                targets -= {(f"{prefix}.w13_weight", None), (f"{prefix}.w2_weight", None)}
                targets |= module.checkpoint_targets(prefix)
        return targets


class MixtralForCausalLM(MoeForCausalLM):
    pass


class Qwen2MoeForCausalLM(MoeForCausalLM):
    pass


class Qwen3MoeForCausalLM(MoeForCausalLM):
    pass
