"""Vectorised sampling over the whole batch, on whatever device the logits are on.

One fixed pipeline for every row: fp32 logits -> temperature -> top-k / top-p -> sample.
Greedy rows take the argmax. Random rows divide probabilities by i.i.d. Exponential(1) noise
and take the argmax (equivalent to sampling from them, without ``torch.multinomial``'s host
sync); seeded rows draw their noise from their own generator, so their output does not depend
on what else is in the batch.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn


@dataclass
class SamplingMetadata:
    temperature: torch.Tensor  # [S] float32; 0 marks a greedy row
    all_greedy: bool
    all_random: bool
    top_k: torch.Tensor | None = None  # [S] int64; <= 0 means disabled
    top_p: torch.Tensor | None = None  # [S] float32; 1.0 means disabled
    generators: dict[int, torch.Generator] = field(default_factory=dict)


@dataclass
class SamplerOutput:
    sampled_token_ids: torch.Tensor  # [S] int64


def apply_top_k_top_p(
    logits: torch.Tensor, top_k: torch.Tensor | None, top_p: torch.Tensor | None
) -> torch.Tensor:
    """Mask (to -inf) tokens outside each row's top-k and top-p nucleus."""
    if top_k is None and top_p is None:
        return logits
    sorted_logits, sorted_idx = logits.sort(dim=-1, descending=True)
    vocab = logits.shape[-1]
    if top_k is not None:
        k = torch.where(top_k <= 0, torch.full_like(top_k, vocab), top_k.clamp(max=vocab))
        positions = torch.arange(vocab, device=logits.device)[None, :]
        sorted_logits = sorted_logits.masked_fill(positions >= k[:, None], float("-inf"))
    if top_p is not None:
        probs = sorted_logits.softmax(dim=-1)
        cum = probs.cumsum(dim=-1)
        # Drop a token when the mass *before* it already reaches top_p; always keep the first.
        drop = (cum - probs) >= top_p[:, None]
        drop[:, 0] = False
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    return torch.empty_like(logits).scatter_(-1, sorted_idx, sorted_logits)


def random_sample(probs: torch.Tensor, generators: dict[int, torch.Generator]) -> torch.Tensor:
    q = torch.empty_like(probs)
    if len(generators) != probs.shape[0]:
        q.exponential_()
    for row, gen in generators.items():
        q[row].exponential_(generator=gen)
    return probs.div_(q).argmax(dim=-1)


class Sampler(nn.Module):
    def forward(self, logits: torch.Tensor, md: SamplingMetadata) -> SamplerOutput:
        logits = logits.float()
        greedy = logits.argmax(dim=-1) if not md.all_random else None
        if md.all_greedy:
            return SamplerOutput(greedy)
        temp = torch.where(md.temperature > 0, md.temperature, torch.ones_like(md.temperature))
        scaled = logits / temp[:, None]
        scaled = apply_top_k_top_p(scaled, md.top_k, md.top_p)
        probs = scaled.softmax(dim=-1)
        sampled = random_sample(probs, md.generators)
        if greedy is not None:
            sampled = torch.where(md.temperature > 0, sampled, greedy)
        return SamplerOutput(sampled)
