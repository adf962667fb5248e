"""Recovering Llama-3 RoPE scaling from a GGUF's ``rope_freqs`` factors."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from octavo.models.gguf_rope import infer_llama3_parameters, rope_parameters_from_factors
from tests.fixtures.gguf_writer import llama3_rope_freqs

LLAMA_31 = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
LLAMA_32 = {**LLAMA_31, "factor": 32.0}


@pytest.mark.parametrize("params", [LLAMA_31, LLAMA_32], ids=["llama-3.1", "llama-3.2"])
def test_llama3_parameters_recovered_from_real_shapes(params):
    factors = llama3_rope_freqs(params, 128)
    assert infer_llama3_parameters(factors, params["rope_theta"], 128) == params


def test_recovered_parameters_give_transformers_frequencies():
    import transformers
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    cfg = transformers.LlamaConfig(hidden_size=4096, num_attention_heads=32, rope_parameters=dict(LLAMA_31))
    ref, _ = ROPE_INIT_FUNCTIONS["llama3"](cfg, "cpu")
    got = rope_parameters_from_factors(llama3_rope_freqs(LLAMA_31, 128), 500000.0, 128)
    cfg2 = transformers.LlamaConfig(hidden_size=4096, num_attention_heads=32, rope_parameters=got)
    assert torch.equal(ROPE_INIT_FUNCTIONS["llama3"](cfg2, "cpu")[0], ref)


def test_factors_no_llama3_config_makes_are_applied_directly():
    factors = np.linspace(1.0, 3.0, 64, dtype=np.float32) ** 2  # smooth everywhere: not llama3
    params = rope_parameters_from_factors(factors, 10000.0, 128)
    assert params["rope_type"] == "default" and params["gguf_freq_factors"] == factors.tolist()


@pytest.mark.parametrize("bad", [np.zeros(64), np.full(64, np.nan)])
def test_non_positive_factors_are_refused(bad):
    with pytest.raises(ValueError, match="non-positive or non-finite"):
        rope_parameters_from_factors(bad.astype(np.float32), 10000.0, 128)
