"""Per-token rope keys and KV keys of length-dependent RoPE (longrope, dynamic NTK)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers

from octavo.models.length_rope import LengthRope, context_limit_factor, length_rope


def test_token_mode_keys_follow_the_forward_transformers_ran():
    """Prompt tokens take the prompt's length, later tokens their own position + 1."""
    lr = LengthRope("longrope", threshold=8, stride=100)
    pos = np.array([0, 5, 9, 10, 0, 3])
    prompt = np.array([6, 6, 6, 6, 12, 12])
    np.testing.assert_array_equal(lr.keys(pos, prompt, prompt), [0, 5, 109, 110, 100, 103])
    dyn = LengthRope("dynamic", threshold=8, stride=100)
    np.testing.assert_array_equal(dyn.keys(pos, prompt, prompt), [0, 5, 209, 310, 400, 403])


def test_sequence_mode_keys_follow_the_whole_sequence():
    lr = LengthRope("longrope", threshold=8, stride=100, mode="sequence")
    pos = np.array([0, 7, 0, 8])
    np.testing.assert_array_equal(lr.keys(pos, np.array([4, 4, 4, 4]), np.array([8, 8, 9, 9])), [0, 7, 100, 108])


@pytest.mark.parametrize(
    ("lr", "expected"),
    [
        (LengthRope("longrope", 8, 100), [None, None, 1, 1]),  # prompt length decides
        (LengthRope("dynamic", 8, 100), [None, None, 9, 12]),  # per prompt length
        (LengthRope("longrope", 8, 100, "sequence"), [None, 1, 1, 1]),  # current length decides
    ],
)
def test_kv_key(lr, expected):
    cases = [(4, 8), (4, 9), (9, 9), (12, 20)]  # (prompt tokens, known tokens)
    assert [lr.kv_key(p, n) for p, n in cases] == expected


def test_rules_read_from_configs():
    rope = {"rope_type": "longrope", "rope_theta": 1e4, "short_factor": [1.0] * 8, "long_factor": [2.0] * 8,
            "original_max_position_embeddings": 64}
    phi3 = transformers.Phi3Config(hidden_size=64, num_attention_heads=4, max_position_embeddings=512,
                                   original_max_position_embeddings=64,
                                   rope_parameters=dict(rope))
    llama = transformers.LlamaConfig(hidden_size=64, num_attention_heads=4, max_position_embeddings=512,
                                     rope_parameters=dict(rope))
    assert length_rope(phi3, 512) == LengthRope("longrope", 64, 512, "sequence")
    assert length_rope(llama, 512) == LengthRope("longrope", 64, 512, "token")
    dyn = transformers.LlamaConfig(max_position_embeddings=64,
                                   rope_parameters={"rope_type": "dynamic", "rope_theta": 1e4, "factor": 4.0})
    assert length_rope(dyn, 256) == LengthRope("dynamic", 64, 256, "token")
    assert context_limit_factor(dyn) == 4.0 and context_limit_factor(llama) == 1.0
    assert length_rope(transformers.LlamaConfig(), 4096) is None


@pytest.mark.parametrize("rope_type", ["default", "longrope", "dynamic"])
def test_rope_tables_follow_the_device_the_model_is_built_on(rope_type):
    """The runner builds models under a ``torch.device`` context (cuda on a GPU): the tables
    are computed on the CPU whatever the context, then land on that device."""
    from octavo.models.layers import _ROPE_TABLES, RotaryEmbedding

    rope = {"rope_type": rope_type, "rope_theta": 1e4}
    if rope_type == "longrope":
        rope.update(short_factor=[1.0] * 8, long_factor=[2.0] * 8, original_max_position_embeddings=64)
    if rope_type == "dynamic":
        rope.update(factor=2.0)
    cfg = transformers.LlamaConfig(hidden_size=64, num_attention_heads=4, max_position_embeddings=128,
                                   rope_parameters=rope)
    _ROPE_TABLES.clear()
    with torch.device("meta"):
        emb = RotaryEmbedding(cfg, 16, 128, torch.float32)
    assert emb.cos.device.type == emb.sin.device.type == "meta"
    if emb.inv_freq_by_len is not None:
        assert emb.inv_freq_by_len.device.type == "meta"
    _ROPE_TABLES.clear()
