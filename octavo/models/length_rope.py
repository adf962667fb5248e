"""RoPE whose rotation depends on the sequence length: ``longrope`` and ``dynamic`` (NTK).

transformers picks the rotation per forward call from ``seq_len = max(position_ids) + 1``:
``longrope`` uses the long factors when ``seq_len > original_max_position_embeddings``, else the
short ones; ``dynamic`` rescales the base for ``seq_len > max_position_embeddings``. In
``generate`` a prompt of ``P`` tokens is one forward (``seq_len = P``) and each later token its
own (``seq_len = p + 1``); K is cached as rotated then. So the rotation of the token at position
``p`` of a request with a ``P``-token prompt is fixed by ``S = max(P, p + 1)``, which octavo
computes per token: chunked prefill, batching and preemption (recompute) do not change it, and
greedy output is token-identical to transformers ``generate`` on each sequence.

(vLLM decides once per engine instead: long factors for every token when ``max_model_len``
exceeds the original context, and dynamic NTK at its largest scale for every position. That
differs from transformers for every sequence shorter than those lengths.)

Phi-3 (``Phi3ForCausalLM``) is different: its ``prepare_inputs_for_generation`` drops the KV
cache when a sequence first grows past ``original_max_position_embeddings``, so transformers
recomputes the whole sequence with the long factors. Its rule is per sequence (``mode =
"sequence"``): every token uses the long factors iff the sequence is longer than the threshold,
and the scheduler recomputes a request whose KV was computed short once it crosses
(``kv_key``; ``Scheduler`` restarts a request whose key changes).

Per token the model receives a *rope key* in place of its position (``keys``):
``p + stride * variant``, where ``stride`` is ``max_model_len`` and ``variant`` is 0/1
(short/long) for longrope and ``max(0, S - max_position_embeddings)`` for dynamic (the row of
the per-length frequency table). ``RotaryEmbedding`` decodes it.

The KV of a prompt longer than the threshold depends on the prompt's length, not only on its
tokens: ``kv_key`` gives the prefix cache an extra key for those prompts.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

LENGTH_DEPENDENT_TYPES = ("longrope", "dynamic")


# Architectures whose transformers ``generate`` recomputes the sequence at the longrope switch.
_SEQUENCE_SWITCH_MODEL_TYPES = ("phi3",)


@dataclass(frozen=True)
class LengthRope:
    kind: str  # "longrope" or "dynamic"
    threshold: int  # longrope: original_max_position_embeddings; dynamic: max_position_embeddings
    stride: int  # max_model_len: positions per variant
    mode: str = "token"  # "token": fixed per token; "sequence": one variant for the whole sequence

    def keys(self, positions: np.ndarray, prompt_lens: np.ndarray, seq_lens: np.ndarray) -> np.ndarray:
        """Rope key of each token, from its position, its request's prompt length and its
        request's known length (prompt, outputs and the token in flight), all [T]."""
        seen = seq_lens if self.mode == "sequence" else np.maximum(prompt_lens, positions + 1)
        if self.kind == "longrope":
            variant = (seen > self.threshold).astype(np.int64)
        else:
            variant = np.maximum(seen - self.threshold, 0)
        return positions + self.stride * variant

    def kv_key(self, num_prompt_tokens: int, num_tokens: int) -> int | None:
        """What besides its tokens determines a request's KV (None: positions alone), for a
        request of ``num_tokens`` known tokens (in flight included). Extra prefix-cache key;
        in "sequence" mode a change means the request's KV must be recomputed."""
        if self.mode == "sequence":
            return 1 if num_tokens > self.threshold else None
        if num_prompt_tokens <= self.threshold:
            return None
        return 1 if self.kind == "longrope" else num_prompt_tokens


def rope_parameters_of(hf_config, layer_type: str | None = None) -> dict:
    """RoPE parameters of a config (of one layer type, for configs that key them by type)."""
    params = getattr(hf_config, "rope_parameters", None)
    if params:
        if layer_type is not None and isinstance(params.get(layer_type), dict):
            return dict(params[layer_type])
        return dict(params)
    out = {"rope_type": "default", "rope_theta": getattr(hf_config, "rope_theta", 10000.0)}
    scaling = getattr(hf_config, "rope_scaling", None)
    if scaling:
        out.update(scaling)
        out["rope_type"] = scaling.get("rope_type", scaling.get("type", "default"))
    if out.get("rope_type") == "su":
        out["rope_type"] = "longrope"
    return out


def length_rope(hf_config, max_model_len: int) -> LengthRope | None:
    """The model's length-dependent RoPE, or None when rotations depend on position only."""
    params = rope_parameters_of(hf_config)
    per_type = [v for v in params.values() if isinstance(v, dict)]
    if any(p.get("rope_type") in LENGTH_DEPENDENT_TYPES for p in per_type):
        raise ValueError("longrope / dynamic RoPE set per layer type is not supported")
    kind = params.get("rope_type")
    if kind not in LENGTH_DEPENDENT_TYPES:
        return None
    if kind == "longrope":
        threshold = params.get("original_max_position_embeddings") or getattr(
            hf_config, "original_max_position_embeddings", None
        )
        if not threshold:
            raise ValueError("longrope RoPE needs original_max_position_embeddings in config.json")
    else:
        threshold = hf_config.max_position_embeddings
    mode = "sequence" if kind == "longrope" and hf_config.model_type in _SEQUENCE_SWITCH_MODEL_TYPES else "token"
    return LengthRope(kind, int(threshold), int(max_model_len), mode)


def context_limit_factor(hf_config) -> float:
    """How far past ``max_position_embeddings`` the model may be run: dynamic NTK extrapolates
    by its ``factor`` (vLLM's rule); 1 otherwise."""
    params = rope_parameters_of(hf_config)
    if params.get("rope_type") == "dynamic":
        return float(params.get("factor", 1.0))
    return 1.0
