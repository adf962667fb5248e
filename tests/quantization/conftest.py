"""A wider tiny Llama for quantization tests: every K divisible by 128 (group 128, FP8 blocks)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def wide_llama(tmp_path_factory, tokenizer_dir):
    import torch
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(tokenizer_dir)
    cfg = transformers.LlamaConfig(
        vocab_size=len(tok), bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id, rms_norm_eps=1e-6, initializer_range=0.1, hidden_size=256,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, intermediate_size=512,
        max_position_embeddings=1024, tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    out = tmp_path_factory.mktemp("wide_llama")
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    return str(out)
