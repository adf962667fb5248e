"""Vectorised sampling over the whole batch, on whatever device the logits are on.

One fixed pipeline for every row (rows with different parameters share each pass; a step
whose rows never use a feature skips it entirely):

1. logits -> float32
2. ``allowed_token_ids``: every other token -> -inf (if steps 3-4 then mask every allowed
   token of a row, that row keeps its allowed tokens: nothing outside them is ever sampled);
   structured outputs: tokens the row's grammar bitmask does not allow -> -inf
3. ``bad_words``: the last token of a bad word whose prefix ends the output so far -> -inf
4. ``min_tokens``: while fewer outputs than ``min_tokens``, EOS and ``stop_token_ids`` -> -inf;
   ``logit_bias`` is added
5. penalties, vLLM semantics: ``repetition_penalty`` divides positive / multiplies negative
   logits of tokens seen in the prompt *or* the output; ``frequency_penalty`` subtracts
   ``penalty * count`` and ``presence_penalty`` subtracts ``penalty`` for tokens seen in the
   output
6. greedy rows take the argmax here (if every row is greedy nothing below runs)
7. temperature, then ``min_p`` (tokens with probability below ``min_p * max_prob`` -> -inf),
   then ``top_k`` / ``top_p`` (on the top-k renormalised distribution)
8. sample: probabilities divided by i.i.d. Exponential(1) noise, argmax (equivalent to drawing
   from them, without ``torch.multinomial``'s host sync); seeded rows draw their noise from
   their own generator, so their output does not depend on what else is in the batch
9. logprobs: ``log_softmax`` of the *processed* logits the token was drawn from (after step 7;
   for greedy rows after step 5, no temperature), i.e. vLLM's ``processed_logprobs`` mode. Per
   row: the sampled token with its rank (1 = most likely; ties count against it), then the
   top-N tokens with ranks 1..N. Masked tokens have logprob -inf.

Invariant: nothing here reads a tensor back to the host.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

_MIX = 0x9E3779B97F4A7C15
_MASK63 = (1 << 63) - 1


def token_seed(seed: int, index: int) -> int:
    """Seed of the noise for output token ``index`` of a seeded request.

    Derived from (seed, index) alone, so a seeded request samples the same tokens whatever
    else is in the batch and even after preemption and recompute.
    """
    return ((seed & _MASK63) * 1_000_003 + (index + 1) * _MIX) & _MASK63


@dataclass
class SamplingMetadata:
    """Per-step sampling inputs for ``S`` rows; optional fields are None when no row uses them."""

    temperature: torch.Tensor  # [S] float32; 0 marks a greedy row
    all_greedy: bool
    all_random: bool
    top_k: torch.Tensor | None = None  # [S] int64; <= 0 means disabled
    top_p: torch.Tensor | None = None  # [S] float32; 1.0 means disabled
    min_p: torch.Tensor | None = None  # [S] float32; 0.0 means disabled
    generators: dict[int, torch.Generator] = field(default_factory=dict)
    # [S, V] bool, True where a token is *not* allowed (rows without a list are all False).
    allowed_token_ids_mask: torch.Tensor | None = None
    # Structured outputs: (constrained row indices; packed int32 bitmask [S, ceil(V / 32)] whose
    # rows at those indices apply, the others are ignored).
    token_bitmask: tuple[list[int], torch.Tensor] | None = None
    # (row indices, token ids) to set to -inf.
    bad_words_mask: tuple[torch.Tensor, torch.Tensor] | None = None
    min_tokens_mask: tuple[torch.Tensor, torch.Tensor] | None = None
    # (row indices, token ids, biases) to add.
    logit_bias: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
    # Penalties: all three set, or all None when no row has one.
    presence_penalties: torch.Tensor | None = None  # [S] float32
    frequency_penalties: torch.Tensor | None = None  # [S] float32
    repetition_penalties: torch.Tensor | None = None  # [S] float32
    prompt_token_ids: torch.Tensor | None = None  # [S, P] int64, padded with V
    output_token_ids: torch.Tensor | None = None  # [S, O] int64, padded with V
    # Largest ``logprobs`` any row asked for; None when no row did.
    max_num_logprobs: int | None = None


@dataclass
class LogprobsTensors:
    """Column 0 is the sampled token, columns 1..N the top-N of the processed distribution."""

    token_ids: torch.Tensor  # [S, 1 + N] int64
    logprobs: torch.Tensor  # [S, 1 + N] float32
    sampled_ranks: torch.Tensor  # [S] int64, rank of the sampled token (1 = most likely)


@dataclass
class SamplerOutput:
    sampled_token_ids: torch.Tensor  # [S] int64
    logprobs: LogprobsTensors | None = None


# -- host-side helpers that build masks (used by the runner's metadata builder) ------------
def bad_words_positions(
    bad_words: dict[int, list[list[int]]], output_token_ids: dict[int, np.ndarray]
) -> tuple[list[int], list[int]]:
    """(rows, token ids) to forbid: a bad word's last token when the rest of it ends the output.

    Single-token bad words are always forbidden. Only generated tokens count as history
    (as in vLLM), so a bad word may still be completed across the prompt/output boundary.
    """
    rows: list[int] = []
    toks: list[int] = []
    for row, words in bad_words.items():
        past = output_token_ids[row]
        n = len(past)
        for w in words:
            k = len(w) - 1
            if k == 0 or (n >= k and past[n - k :].tolist() == w[:k]):
                rows.append(row)
                toks.append(w[-1])
    return rows, toks


# -- pipeline stages -------------------------------------------------------------------------
def apply_token_bitmask_reference(logits: torch.Tensor, rows: list[int], bitmask: torch.Tensor) -> None:
    """In place, for each ``r`` in ``rows``: ``logits[r, t] = -inf`` where bit ``t % 32`` of
    ``bitmask[r, t // 32]`` is clear. Rows not listed are left alone.

    Plain torch, any device: the readable definition ``apply_token_bitmask`` is tested against.
    """
    vocab = logits.shape[-1]
    bits = torch.bitwise_left_shift(torch.ones(32, dtype=torch.int64, device=bitmask.device),
                                    torch.arange(32, device=bitmask.device)).to(torch.int32)
    idx = torch.tensor(rows, dtype=torch.int64, device=logits.device)
    banned = ((bitmask[idx].unsqueeze(-1) & bits) == 0).flatten(1)
    if banned.shape[1] < vocab:  # tokens past the grammar's vocabulary are never allowed
        banned = torch.nn.functional.pad(banned, (0, vocab - banned.shape[1]), value=True)
    logits.index_put_((idx,), logits[idx].masked_fill_(banned[:, :vocab], float("-inf")))


BitmaskKernel = Callable[[torch.Tensor, list[int], torch.Tensor], None]
FirstMaxKernel = Callable[[torch.Tensor], torch.Tensor]  # [rows, n] -> int64 [rows], as first_max_index


def apply_token_bitmask(logits: torch.Tensor, rows: list[int], bitmask: torch.Tensor) -> None:
    """``apply_token_bitmask_reference`` for tensors in host memory (float32/float16 logits):
    numpy unpacks the words to one byte per token and fills -inf where a byte is 0, on one
    thread and without per-row Python. When ``rows`` is every row (the usual decode batch)
    nothing is gathered or scattered. 2-3x faster than xgrammar's CPU kernel, which tests
    bit by bit, at batch 32 (``benchmarks/bitmask_apply_bench.py``); single-threaded on
    purpose: torch's two-thread elementwise ops stalled for 100 ms on an oversubscribed host."""
    lg = logits.numpy()  # shares memory; refuses a device tensor
    full = len(rows) == lg.shape[0] == bitmask.shape[0]
    words = bitmask.numpy().astype("<i4", copy=False)  # bit t % 32 of word t // 32 = byte order
    if not full:
        words = words[rows]
    vocab = lg.shape[1]
    n = min(vocab, words.shape[1] * 32)
    allowed = np.unpackbits(np.ascontiguousarray(words).view(np.uint8), axis=-1, count=n, bitorder="little")
    target = lg if full else lg[rows]
    np.copyto(target[:, :n], -np.inf, where=allowed == 0)
    target[:, n:] = -np.inf  # tokens past the grammar's vocabulary are never allowed
    if not full:
        lg[rows] = target


def apply_token_bitmask_xgrammar(logits: torch.Tensor, rows: list[int], bitmask: torch.Tensor) -> None:
    """``apply_token_bitmask_reference`` as xgrammar's one kernel call, on any device (CUDA or
    Triton on GPUs, where the runner uses it; a scalar C++ loop on the CPU). Tokens past the
    bitmask's width stay allowed there, so the grammar's vocabulary must cover the logits (the
    engine builds it with the model's vocab size)."""
    import xgrammar as xgr

    xgr.apply_token_bitmask_inplace(logits, bitmask, indices=list(rows))


def get_token_bin_counts_and_mask(
    token_ids: torch.Tensor, vocab_size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row token counts [S, V] (float32) and presence mask; ``vocab_size`` is padding."""
    counts = torch.zeros(token_ids.shape[0], vocab_size + 1, dtype=torch.float32, device=token_ids.device)
    counts.scatter_add_(1, token_ids, torch.ones_like(token_ids, dtype=torch.float32))
    counts = counts[:, :vocab_size]
    return counts, counts > 0


def apply_penalties(
    logits: torch.Tensor,
    prompt_token_ids: torch.Tensor,
    output_token_ids: torch.Tensor,
    presence_penalties: torch.Tensor,
    frequency_penalties: torch.Tensor,
    repetition_penalties: torch.Tensor,
) -> torch.Tensor:
    """vLLM's penalties; neutral values (0, 0, 1) leave a row unchanged."""
    vocab = logits.shape[1]
    _, prompt_mask = get_token_bin_counts_and_mask(prompt_token_ids, vocab)
    output_counts, output_mask = get_token_bin_counts_and_mask(output_token_ids, vocab)
    rep = repetition_penalties[:, None].expand_as(logits)
    rep = torch.where(prompt_mask | output_mask, rep, torch.ones_like(rep))
    logits = torch.where(logits > 0, logits / rep, logits * rep)
    logits = logits - frequency_penalties[:, None] * output_counts
    logits = logits - presence_penalties[:, None] * output_mask.to(logits.dtype)
    return logits


def apply_min_p(logits: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """Mask tokens whose probability is below ``min_p`` times the row's largest probability."""
    probs = logits.softmax(dim=-1)
    threshold = probs.amax(dim=-1, keepdim=True) * min_p[:, None]
    return logits.masked_fill(probs < threshold, float("-inf"))


def apply_top_k_top_p(
    logits: torch.Tensor, top_k: torch.Tensor | None, top_p: torch.Tensor | None
) -> torch.Tensor:
    """Mask (to -inf) tokens outside each row's top-k, then outside the top-p nucleus.

    top-k keeps exactly ``k`` tokens (ties broken by sort order); top-p keeps the smallest
    set of most likely tokens whose mass reaches ``p`` (of the distribution renormalised
    over the top-k), always at least one.
    """
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


def first_max_index(x: torch.Tensor) -> torch.Tensor:
    """``x.argmax(dim=-1)``: the index of each row's first maximum (a NaN counts as the maximum,
    as in ``argmax``), through ``torch.max``'s indices, which return the same index and on CPUs
    run several times faster than ``argmax`` over a vocabulary-wide row (bf16 and float32)."""
    return x.max(dim=-1).indices


def random_sample(
    probs: torch.Tensor, generators: dict[int, torch.Generator], first_max: FirstMaxKernel | None = None
) -> torch.Tensor:
    """One draw per row from ``probs`` (rows need not be normalised); consumes ``probs``.
    ``first_max``: a kernel equal to ``first_max_index`` (the default)."""
    q = torch.empty_like(probs)
    if len(generators) != probs.shape[0]:
        q.exponential_()
    for row, gen in generators.items():
        q[row].exponential_(generator=gen)
    # A noise value of exactly 0 would make p / q inf (or NaN for a masked token, which
    # argmax would pick); some backends can draw it, so keep q strictly positive.
    q.clamp_(min=torch.finfo(q.dtype).tiny)
    return (first_max or first_max_index)(probs.div_(q))


def gather_logprobs(
    logprobs: torch.Tensor, num_logprobs: int, token_ids: torch.Tensor
) -> LogprobsTensors:
    """The given token per row with its rank, plus the row's top ``num_logprobs``."""
    token_ids = token_ids.long()
    token_lp = logprobs.gather(-1, token_ids[:, None])
    ranks = (logprobs >= token_lp).sum(dim=-1)
    if num_logprobs > 0:
        top_lp, top_ids = logprobs.topk(num_logprobs, dim=-1)
        ids = torch.cat([token_ids[:, None], top_ids], dim=1)
        lps = torch.cat([token_lp, top_lp], dim=1)
    else:
        ids, lps = token_ids[:, None], token_lp
    return LogprobsTensors(ids, lps, ranks)


def _modifies_logits(md: SamplingMetadata) -> bool:
    """Some row has a mask, bias or penalty that ``apply_logits_processors`` applies."""
    return (
        md.allowed_token_ids_mask is not None or md.token_bitmask is not None or md.bad_words_mask is not None
        or md.min_tokens_mask is not None or md.logit_bias is not None or md.repetition_penalties is not None
    )


class Sampler(nn.Module):
    """The fixed pipeline described in the module docstring, over every row at once.

    ``apply_bitmask``: how step 2 applies a grammar bitmask (``apply_token_bitmask`` or
    ``apply_token_bitmask_xgrammar``; both equal ``apply_token_bitmask_reference``). The model
    runner picks the faster one for its device. ``first_max``: the greedy and sampling argmax,
    a kernel returning exactly what ``first_max_index`` returns (its default), e.g. the CPU
    extension's row argmax."""

    def __init__(self, apply_bitmask: BitmaskKernel | None = None, first_max: FirstMaxKernel | None = None) -> None:
        super().__init__()
        self.apply_bitmask = apply_bitmask or apply_token_bitmask_xgrammar
        self.first_max = first_max or first_max_index

    def apply_logits_processors(self, logits: torch.Tensor, md: SamplingMetadata) -> torch.Tensor:
        """Steps 2-5: masks, min_tokens, logit bias, penalties (in place where possible)."""
        neg_inf = float("-inf")
        allowed_only = None
        if md.allowed_token_ids_mask is not None:
            logits.masked_fill_(md.allowed_token_ids_mask, neg_inf)
            if md.bad_words_mask is not None or md.min_tokens_mask is not None:
                allowed_only = logits.clone()
        if md.token_bitmask is not None:
            self.apply_bitmask(logits, *md.token_bitmask)
        if md.bad_words_mask is not None:
            logits.index_put_(md.bad_words_mask, torch.full((), neg_inf, device=logits.device))
        if md.min_tokens_mask is not None:
            logits.index_put_(md.min_tokens_mask, torch.full((), neg_inf, device=logits.device))
        if allowed_only is not None:
            # allowed_token_ids is the hard constraint: a row whose every allowed token another
            # mask removed samples from its allowed tokens (never outside them; no host sync).
            dead = torch.isneginf(logits).all(dim=-1, keepdim=True)
            logits = torch.where(dead, allowed_only, logits)
        if md.logit_bias is not None:
            rows, toks, vals = md.logit_bias
            logits.index_put_((rows, toks), vals, accumulate=True)
        if md.repetition_penalties is not None:
            assert md.prompt_token_ids is not None and md.output_token_ids is not None
            assert md.presence_penalties is not None and md.frequency_penalties is not None
            logits = apply_penalties(
                logits,
                md.prompt_token_ids,
                md.output_token_ids,
                md.presence_penalties,
                md.frequency_penalties,
                md.repetition_penalties,
            )
        return logits

    def process(self, logits: torch.Tensor, md: SamplingMetadata) -> torch.Tensor:
        """Step 7 for random rows (greedy rows pass through unchanged)."""
        temp = torch.where(md.temperature > 0, md.temperature, torch.ones_like(md.temperature))
        logits = logits / temp[:, None]
        if md.min_p is not None:
            logits = apply_min_p(logits, md.min_p)
        return apply_top_k_top_p(logits, md.top_k, md.top_p)

    def forward(self, logits: torch.Tensor, md: SamplingMetadata) -> SamplerOutput:
        if md.all_greedy and md.max_num_logprobs is None and not _modifies_logits(md):
            # Nothing would read the float32 copy: converting to float32 is exact, so the argmax
            # of the model's logits is the same token (same order, same first maximum).
            return SamplerOutput(self.first_max(logits), None)
        logits = logits.to(torch.float32, copy=True)
        logits = self.apply_logits_processors(logits, md)
        greedy = self.first_max(logits) if not md.all_random else None
        if md.all_greedy:
            assert greedy is not None
            processed, sampled = logits, greedy
        else:
            processed = self.process(logits, md)
            sampled = random_sample(processed.softmax(dim=-1), md.generators, self.first_max)
            if greedy is not None:
                sampled = torch.where(md.temperature > 0, sampled, greedy)
        lps = None
        if md.max_num_logprobs is not None:
            lps = gather_logprobs(processed.log_softmax(dim=-1), md.max_num_logprobs, sampled)
        return SamplerOutput(sampled, lps)
