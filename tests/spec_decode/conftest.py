"""Fixtures of the speculative decoding tests."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def small_draft_dir(tmp_path_factory, tokenizer_dir) -> str:
    """A one-layer, narrower Llama with the fixtures' tokenizer (a draft cheaper than any target)."""
    import torch
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(tokenizer_dir)
    cfg = transformers.LlamaConfig(
        vocab_size=len(tok), bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, intermediate_size=64, max_position_embeddings=2048, rms_norm_eps=1e-6,
        initializer_range=0.2, tie_word_embeddings=True,
    )
    torch.manual_seed(5)
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    out = tmp_path_factory.mktemp("small_draft")
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    return str(out)
