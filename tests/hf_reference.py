"""HuggingFace transformers as the reference for correctness tests."""

from __future__ import annotations

import functools


@functools.lru_cache(maxsize=8)
def hf_model(path: str, dtype_name: str = "float32"):
    import torch
    import transformers

    # eager: the one attention every transformers version runs with Gemma 2's logit soft-capping
    # (older releases' sdpa path ignored the cap and answered differently).
    return transformers.AutoModelForCausalLM.from_pretrained(
        path, dtype=getattr(torch, dtype_name), attn_implementation="eager").eval()


def hf_greedy(path: str, prompt_ids: list[int], max_new_tokens: int) -> list[int]:
    """Greedy continuation of one prompt with HF ``generate`` (stops at EOS like octavo)."""
    import torch

    model = hf_model(path)
    with torch.no_grad():
        ids = torch.tensor([prompt_ids])
        out = model.generate(
            ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
            do_sample=False, pad_token_id=model.config.pad_token_id,
        )
    return out[0, len(prompt_ids):].tolist()


def random_prompts(vocab_size: int, lengths: list[int], seed: int = 0, first_id: int = 3) -> list[list[int]]:
    import random

    rng = random.Random(seed)
    return [[rng.randrange(first_id, vocab_size) for _ in range(n)] for n in lengths]
