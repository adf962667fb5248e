"""What a mixture-of-experts model costs, from its config alone (``octavo info``, profiling).

Counts parameters the way octavo lays them out: attention, norms and the router on every
rank (attention sharded by heads), experts split over the tensor-parallel ranks (sharded or,
with expert parallelism, whole experts per rank: the same bytes either way), embeddings split
by vocabulary. "Active" weights are what one decode token reads: attention, router, its top-k
experts and the shared expert of every sparse layer, dense MLPs elsewhere, and the LM head.
"""

from __future__ import annotations

from dataclasses import dataclass

from octavo.models.llama_moe import moe_spec
from octavo.models.moe.layer import grouped_activation_bytes


@dataclass(frozen=True)
class MoECost:
    total_params: int
    expert_params: int
    active_params: int  # read per decode token
    params_per_rank: int
    sparse_layers: int


def moe_cost(cfg, tensor_parallel_size: int = 1) -> MoECost:
    spec = moe_spec(cfg)
    h, tp = cfg.hidden_size, tensor_parallel_size
    heads = cfg.num_attention_heads
    kv = getattr(cfg, "num_key_value_heads", None) or heads
    hd = getattr(cfg, "head_dim", None) or h // heads
    attn = h * hd * (2 * heads + 2 * kv)  # q/k/v/o matrices: sharded by heads
    attn_bias = bool(getattr(cfg, "attention_bias", False))
    if attn_bias or (cfg.model_type == "qwen2_moe" and getattr(cfg, "qkv_bias", True)):
        attn += hd * (heads + 2 * kv)  # q/k/v biases: sharded with their heads
    # Replicated on every rank: the o_proj bias, Qwen3's q/k RMSNorms, the layer norms.
    replicated = (h if attn_bias else 0) + (2 * hd if cfg.model_type == "qwen3_moe" else 0) + 2 * h
    dense_mlp = 3 * h * cfg.intermediate_size
    expert = 3 * h * spec.intermediate_size
    shared = 3 * h * spec.shared_intermediate_size
    router = spec.num_experts * h + (h if shared else 0)  # router (+ shared-expert gate): replicated
    sparse = [i for i in range(cfg.num_hidden_layers) if spec.is_sparse(i)]
    n_dense = cfg.num_hidden_layers - len(sparse)
    embed = cfg.vocab_size * h * (1 if getattr(cfg, "tie_word_embeddings", False) else 2)
    experts = len(sparse) * spec.num_experts * expert
    layers = cfg.num_hidden_layers * (attn + replicated) + n_dense * dense_mlp + len(sparse) * (router + shared)
    total = layers + experts + embed + h
    active = layers + len(sparse) * spec.top_k * expert + cfg.vocab_size * h + h
    per_rank = (
        cfg.num_hidden_layers * (attn // tp + replicated)
        + n_dense * dense_mlp // tp
        + len(sparse) * (router + shared // tp)
        + experts // tp
        + embed // tp
        + h
    )
    return MoECost(total, experts, active, per_rank, len(sparse))


def _size(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def moe_summary(
    cfg, dtype_bytes: int, tensor_parallel_size: int, expert_parallel: bool, max_num_batched_tokens: int
) -> dict[str, str]:
    """Labelled lines for ``octavo info``."""
    spec = moe_spec(cfg)
    cost = moe_cost(cfg, tensor_parallel_size)
    tp = tensor_parallel_size
    shared = f", shared expert I={spec.shared_intermediate_size}" if spec.shared_intermediate_size else ""
    out = {
        "experts": (
            f"{cost.sparse_layers} of {cfg.num_hidden_layers} layers route to top-{spec.top_k} of "
            f"{spec.num_experts} experts (I={spec.intermediate_size}, "
            f"{'renormalised' if spec.renormalize else 'softmax'} weights{shared})"
        ),
    }
    if expert_parallel and tp > 1:
        out["expert placement"] = f"expert parallel: {spec.num_experts // tp} whole experts per rank over {tp} ranks"
    elif tp > 1:
        out["expert placement"] = (
            f"tensor-sharded: all {spec.num_experts} experts on every rank, {spec.intermediate_size // tp} "
            f"rows each (--enable-expert-parallel: {spec.num_experts // tp} whole experts per rank)"
        )
    else:
        out["expert placement"] = "one rank holds every expert (--tensor-parallel-size N shards them)"
    b = dtype_bytes
    out["weights"] = (
        f"{_size(cost.total_params * b)} total ({_size(cost.expert_params * b)} experts), "
        f"{_size(cost.params_per_rank * b)} per rank at tp={tp}; "
        f"{_size(cost.active_params * b)} active per decode token"
    )
    local_experts = spec.num_experts // tp if expert_parallel else spec.num_experts
    local_inter = spec.intermediate_size if expert_parallel else spec.intermediate_size // tp
    peak = grouped_activation_bytes(
        max_num_batched_tokens, spec.top_k, local_experts, spec.num_experts, local_inter, cfg.hidden_size, dtype_bytes
    )
    out["moe activation peak"] = (
        f"{_size(peak)} per MoE layer at {max_num_batched_tokens} batched tokens "
        f"({max_num_batched_tokens * spec.top_k} token-expert pairs)"
    )
    return out
