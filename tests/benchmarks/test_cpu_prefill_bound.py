"""``benchmarks/cpu_prefill_bound.py``: its FLOP count against the linears of a real
transformers model, and its shapes against that model's weights."""

from __future__ import annotations

import torch

from tests.benchmarks.script_loader import load_script

CFG = {"hidden_size": 48, "intermediate_size": 80, "num_hidden_layers": 3, "num_attention_heads": 6,
       "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 300}


def _decoder_linears():
    from transformers import LlamaConfig, LlamaForCausalLM

    model = LlamaForCausalLM(LlamaConfig(**CFG))
    return [m for name, m in model.named_modules() if isinstance(m, torch.nn.Linear) and "lm_head" not in name]


def test_linear_flops_count_every_decoder_weight_once_per_token():
    bound = load_script("benchmarks/cpu_prefill_bound.py")
    params = sum(m.weight.numel() for m in _decoder_linears())
    flops = bound.prefill_flops(CFG, 7)
    assert flops["linears"] == 2 * params * 7
    assert flops["lm_head"] == 2 * CFG["hidden_size"] * CFG["vocab_size"]
    # causal: token i attends to i + 1 keys, QK^T and PV each 2 * head_dim FLOPs per (head, key)
    keys = sum(i + 1 for i in range(7))
    assert flops["attention"] == 2 * 2 * 6 * 16 * keys * 3


def test_linear_shapes_cover_the_same_weights_fused():
    bound = load_script("benchmarks/cpu_prefill_bound.py")
    fused = sum(o * i * n for o, i, n in bound.linear_shapes(CFG))
    assert fused == sum(m.weight.numel() for m in _decoder_linears())
