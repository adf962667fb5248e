"""Teacher-forced comparison of octavo against a transformers reference.

The reference generates a greedy continuation of each prompt; octavo scores the same token
sequence (``prompt_logprobs``); at every continuation position we compare octavo's log
probability of the reference token with the reference's, and whether that token is also
octavo's top-1 choice.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from octavo import LLM, SamplingParams
from tests.hf_reference import random_prompts


@dataclass
class Agreement:
    mean_abs_dlogprob: float
    top1: float
    positions: int

    def __str__(self) -> str:
        return f"mean |dlogprob| {self.mean_abs_dlogprob:.2e}, top-1 {self.top1:.1%} over {self.positions} positions"


def reference_sequences(ref, vocab: int, n_prompts: int = 6, new_tokens: int = 24) -> list[tuple[list[int], list[int]]]:
    """(prompt, reference greedy continuation) pairs; ``ref`` is a transformers model.
    Prompts share one length so the reference decodes them as one batch."""
    prompts = random_prompts(vocab, [10] * n_prompts, seed=7)
    ids = torch.tensor(prompts)
    with torch.no_grad():
        gen = ref.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                           min_new_tokens=new_tokens, do_sample=False, pad_token_id=0)
    return [(p, gen[i, len(p):].tolist()) for i, p in enumerate(prompts)]


def compare(llm: LLM, ref, seqs: list[tuple[list[int], list[int]]]) -> Agreement:
    params = SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=1)
    full = [p + g for p, g in seqs]
    outs = llm.generate([{"prompt_token_ids": s} for s in full], params, use_tqdm=False)
    deltas, hits = [], 0
    for (p, _g), seq, out in zip(seqs, full, outs, strict=True):
        with torch.no_grad():
            ref_lp = ref(torch.tensor([seq])).logits[0].float().log_softmax(-1)
        for i in range(len(p), len(seq)):
            tok = seq[i]
            got = out.prompt_logprobs[i][tok]
            deltas.append(abs(got.logprob - float(ref_lp[i - 1, tok])))
            hits += got.rank == 1
    return Agreement(sum(deltas) / len(deltas), hits / len(deltas), len(deltas))
