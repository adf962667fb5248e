"""What an EAGLE head checkpoint must be for octavo to run it beside its target.

``eagle``: an EAGLE-1 head in the layout vLLM loads (``EagleLlamaForCausalLM``, or a head whose
``config.json`` names the target family's ``LlamaForCausalLM`` / ``Qwen2ForCausalLM`` /
``Qwen3ForCausalLM``): one (or a few) decoder layers of the target's width. It shares the
target's embedding and ``lm_head``, so the hidden size and vocabulary must match.
``eagle3``: an ``Eagle3LlamaForCausalLM`` head (one layer, the target's width, its own
``lm_head`` over ``draft_vocab_size`` tokens) reading three of the target's layers. Each
refusal names the mismatch or the feature.
"""

from __future__ import annotations

import json
import os
from typing import Any

FLAG = "--speculative-config"
# config.json ``architectures`` of EAGLE-1 heads octavo runs, and the model types of their layers.
HEAD_ARCHITECTURES = ("EagleLlamaForCausalLM", "LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM")
HEAD_MODEL_TYPES = ("llama", "qwen2", "qwen3")
# Targets whose EAGLE heads are Llama-style (the head embeds tokens with the target's plain
# embedding; Gemma scales its embedding, Phi-3 has no such heads).
TARGET_ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM",
                        "MixtralForCausalLM", "Qwen2MoeForCausalLM", "Qwen3MoeForCausalLM")


def load_eagle_config(head_dir: str, method: str = "eagle") -> tuple[Any, str]:
    """(transformers config, architecture name) of the head's folder."""
    from transformers import AutoConfig

    path = os.path.join(head_dir, "config.json")
    if not os.path.exists(path):
        raise ValueError(f"{FLAG}: the EAGLE head {head_dir} has no config.json")
    with open(path) as f:
        raw = json.load(f)
    archs = raw.get("architectures") or ["EagleLlamaForCausalLM"]
    is3 = any("eagle3" in a.lower() for a in archs)
    if is3 != (method == "eagle3"):
        what = "an EAGLE-3" if is3 else "not an EAGLE-3"
        raise ValueError(f"{FLAG}: the checkpoint {head_dir} is {what} head ({archs}); use method "
                         f"{'eagle3' if is3 else 'eagle'}")
    if is3:
        if raw.get("model_type") != "llama":
            raise ValueError(f"{FLAG}: the EAGLE-3 head {head_dir} has model_type {raw.get('model_type')!r}; "
                             "octavo runs Llama-style EAGLE-3 heads")
        return AutoConfig.from_pretrained(head_dir), archs[0]
    arch = next((a for a in archs if a in HEAD_ARCHITECTURES), None)
    if arch is None:
        raise ValueError(f"{FLAG}: the EAGLE head {head_dir} has architectures {archs}; octavo runs EAGLE-1 "
                         f"heads of {list(HEAD_ARCHITECTURES)}")
    if raw.get("model_type") not in HEAD_MODEL_TYPES:
        raise ValueError(f"{FLAG}: the EAGLE head {head_dir} has model_type {raw.get('model_type')!r}; octavo "
                         f"runs heads with decoder layers of {list(HEAD_MODEL_TYPES)}")
    return AutoConfig.from_pretrained(head_dir), arch


def check_eagle_head(target_cfg: Any, head_cfg: Any, head_dir: str, target_name: str,
                     tensor_parallel_size: int, method: str = "eagle") -> None:
    """The head fits the target (errors name the problem)."""
    arch = (getattr(target_cfg, "architectures", None) or ["?"])[0]
    if arch not in TARGET_ARCHITECTURES:
        raise ValueError(f"{FLAG}: method 'eagle' is not supported for a {arch} target; octavo runs EAGLE heads "
                         f"of {list(TARGET_ARCHITECTURES)}")
    th, hh = target_cfg.hidden_size, head_cfg.hidden_size
    if th != hh:
        raise ValueError(f"{FLAG}: the EAGLE head {head_dir} has hidden_size {hh}, the target {target_name} has "
                         f"{th}; a head reads the target's hidden states and shares its embedding and lm_head")
    if head_cfg.vocab_size != target_cfg.vocab_size:
        raise ValueError(f"{FLAG}: the EAGLE head {head_dir} has vocab_size {head_cfg.vocab_size}, the target "
                         f"{target_name} has {target_cfg.vocab_size}; a head drafts in its target's vocabulary")
    if getattr(head_cfg, "add_para_norm", False):
        raise ValueError(f"{FLAG}: the EAGLE head {head_dir} sets add_para_norm (HASS input norms), which octavo "
                         "does not run")
    if getattr(head_cfg, "quantization_config", None) is not None:
        raise ValueError(f"{FLAG}: the EAGLE head {head_dir} is quantized; octavo runs unquantized heads only")
    if tensor_parallel_size > 1:
        raise ValueError(f"{FLAG}: method {method!r} is not supported with --tensor-parallel-size "
                         f"{tensor_parallel_size} (octavo runs EAGLE heads on one rank)")
    if method == "eagle3":
        _check_eagle3(target_cfg, head_cfg, head_dir)


def aux_layer_ids(head_cfg: Any, num_target_layers: int) -> tuple[int, ...]:
    """The target layers whose input residual stream an EAGLE-3 head reads, ascending (the
    head's ``eagle_config.eagle_aux_hidden_state_layer_ids``, else vLLM's default)."""
    eagle_cfg = getattr(head_cfg, "eagle_config", None) or {}
    ids = eagle_cfg.get("eagle_aux_hidden_state_layer_ids")
    if ids is None:
        ids = (2, num_target_layers // 2, num_target_layers - 3)
    return tuple(sorted(int(i) for i in ids))


def _check_eagle3(target_cfg: Any, head_cfg: Any, head_dir: str) -> None:
    n = target_cfg.num_hidden_layers
    ids = aux_layer_ids(head_cfg, n)
    if len(ids) != 3 or len(set(ids)) != 3 or ids[0] < 0 or ids[-1] >= n:
        raise ValueError(f"{FLAG}: the EAGLE-3 head {head_dir} reads target layers {list(ids)}; a target of {n} "
                         "layers needs 3 distinct ids in [0, num_hidden_layers) (set "
                         "eagle_config.eagle_aux_hidden_state_layer_ids in its config.json)")
    th = getattr(head_cfg, "target_hidden_size", None)
    if th is not None and th != target_cfg.hidden_size:
        raise ValueError(f"{FLAG}: the EAGLE-3 head {head_dir} has target_hidden_size {th}, the target has "
                         f"{target_cfg.hidden_size}")
    dv = getattr(head_cfg, "draft_vocab_size", None) or head_cfg.vocab_size
    if dv > head_cfg.vocab_size:
        raise ValueError(f"{FLAG}: the EAGLE-3 head {head_dir} has draft_vocab_size {dv} > vocab_size "
                         f"{head_cfg.vocab_size}")
    if head_cfg.num_hidden_layers != 1:
        raise ValueError(f"{FLAG}: the EAGLE-3 head {head_dir} has {head_cfg.num_hidden_layers} layers; octavo "
                         "runs one-layer EAGLE-3 heads")
    if getattr(head_cfg, "norm_before_residual", False):
        raise ValueError(f"{FLAG}: the EAGLE-3 head {head_dir} sets norm_before_residual, which octavo does not run")
