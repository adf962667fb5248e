"""What a draft model must share with its target: the vocabulary, token for token.

The draft proposes token ids that the target verifies, so both must read ids the same way:
the same ``vocab_size`` in ``config.json`` and, where both folders carry a tokenizer, the same
token -> id map and special tokens. Other differences (depth, width, heads, RoPE) are what
makes a draft cheap and are allowed. Each error names the mismatch.
"""

from __future__ import annotations

from typing import Any

FLAG = "--speculative-config"


def check_same_vocab(target_cfg: Any, draft_cfg: Any, target_name: str, draft_name: str) -> None:
    """``vocab_size`` of the two ``config.json``s."""
    tv, dv = getattr(target_cfg, "vocab_size", None), getattr(draft_cfg, "vocab_size", None)
    if tv != dv:
        raise ValueError(
            f"{FLAG}: the draft model {draft_name} has vocab_size {dv}, the target {target_name} has {tv}; "
            "a draft model must use the target's tokenizer and vocabulary"
        )


def check_same_tokenizer(target_tok: Any, draft_tok: Any, draft_name: str) -> None:
    """Token -> id maps and the special tokens of two loaded tokenizers."""
    t_vocab, d_vocab = target_tok.get_vocab(), draft_tok.get_vocab()
    if t_vocab != d_vocab:
        diff = sorted(set(t_vocab.items()) ^ set(d_vocab.items()), key=lambda kv: kv[1])[:3]
        raise ValueError(
            f"{FLAG}: the draft model {draft_name}'s tokenizer maps tokens to other ids than the "
            f"target's ({len(d_vocab)} vs {len(t_vocab)} tokens; first differences (token, id): {diff}); "
            "a draft model must use the target's tokenizer"
        )
    for attr in ("bos_token_id", "eos_token_id"):
        t, d = getattr(target_tok, attr, None), getattr(draft_tok, attr, None)
        if t != d:
            raise ValueError(
                f"{FLAG}: the draft model {draft_name}'s tokenizer has {attr} {d}, the target's {t}; "
                "a draft model must use the target's tokenizer"
            )
