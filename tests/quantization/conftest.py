"""A wider tiny Llama for quantization tests: every K divisible by 128 (group 128, FP8 blocks)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def wide_llama(tmp_path_factory, tokenizer_dir):
    from tests.fixtures.checkpoints import build_llama

    out = build_llama(tmp_path_factory.mktemp("wide_llama"), tokenizer_dir, seed=0, initializer_range=0.1,
                      hidden_size=256, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      intermediate_size=512, max_position_embeddings=1024, tie_word_embeddings=False)
    return str(out)
