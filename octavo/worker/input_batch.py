"""Persistent per-request state of the model runner, kept in preallocated rows.

A request occupies one row from admission until it finishes or is preempted. Per step only
deltas arrive (new block ids); token ids sampled by the runner are appended here directly, so
input preparation is pure array indexing with no per-token Python loop.
Invariant: ``token_ids[row, :num_tokens[row]]`` are the request's prompt + output tokens and
``block_tables[g, row, :num_blocks[g, row]]`` its blocks of KV cache group ``g`` in position
order (``block_table`` is group 0's; most models have only that one).

Sampling parameters are unpacked into per-row arrays once, at admission, so building a step's
``SamplingMetadata`` is slicing by row (plus short per-request loops only for the rows that
use ragged features: allowed tokens, logit bias, bad words, min_tokens, seeds).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from octavo.core.sampler import SamplingMetadata, bad_words_positions, token_seed
from octavo.core.scheduler_output import NewRequestData
from octavo.sampling_params import SamplingParams, SamplingType
from octavo.worker.transfer import DeviceTransfer

_EMPTY = np.zeros(0, dtype=np.int64)
ToDevice = Callable[[np.ndarray], torch.Tensor]


class InputBatch:
    def __init__(self, max_num_reqs: int, max_model_len: int, block_size: int, num_kv_groups: int = 1) -> None:
        self.max_num_reqs = max_num_reqs
        self.max_model_len = max_model_len
        self.block_size = block_size
        self.max_blocks_per_req = -(-max_model_len // block_size)
        self.token_ids = np.zeros((max_num_reqs, max_model_len), dtype=np.int64)
        self.num_tokens = np.zeros(max_num_reqs, dtype=np.int64)
        self.num_prompt_tokens = np.zeros(max_num_reqs, dtype=np.int64)
        self.num_computed = np.zeros(max_num_reqs, dtype=np.int64)
        self.num_kv_groups = num_kv_groups
        self.block_tables = np.zeros((num_kv_groups, max_num_reqs, self.max_blocks_per_req), dtype=np.int32)
        self.num_blocks_per_group = np.zeros((num_kv_groups, max_num_reqs), dtype=np.int64)
        self.block_table = self.block_tables[0]  # views of group 0
        self.num_blocks = self.num_blocks_per_group[0]
        self.params: list[SamplingParams | None] = [None] * max_num_reqs
        self.req_ids: list[str | None] = [None] * max_num_reqs
        self.row_of: dict[str, int] = {}
        # Bumped at every admission: (row, serial) names one occupancy of a row, so a step
        # still in flight never writes into a row that was freed and reused meanwhile.
        self.serial = np.zeros(max_num_reqs, dtype=np.int64)
        self._next_serial = 0
        self._free_rows = list(range(max_num_reqs - 1, -1, -1))

        # Sampling parameters per row (neutral values in free rows).
        r = max_num_reqs
        self.temperature = np.zeros(r, dtype=np.float32)  # 0 = greedy
        self.top_k = np.zeros(r, dtype=np.int64)
        self.top_p = np.ones(r, dtype=np.float32)
        self.min_p = np.zeros(r, dtype=np.float32)
        self.presence_penalty = np.zeros(r, dtype=np.float32)
        self.frequency_penalty = np.zeros(r, dtype=np.float32)
        self.repetition_penalty = np.ones(r, dtype=np.float32)
        self.has_penalty = np.zeros(r, dtype=bool)
        self.seed = np.zeros(r, dtype=np.int64)
        self.has_seed = np.zeros(r, dtype=bool)
        self.min_tokens = np.zeros(r, dtype=np.int64)
        self.num_logprobs = np.full(r, -1, dtype=np.int64)  # -1 = not requested
        self.num_prompt_logprobs = np.full(r, -1, dtype=np.int64)
        # Ragged per-row extras, None when unused (flags say which rows use them).
        self.has_allowed = np.zeros(r, dtype=bool)
        self.has_bias = np.zeros(r, dtype=bool)
        self.has_bad_words = np.zeros(r, dtype=bool)
        # A structured-output grammar: the engine validates the row's drafts and builds one
        # mask per verified position on the host, so its drafts never stay on the device.
        self.has_grammar = np.zeros(r, dtype=bool)
        self.allowed_token_ids: list[np.ndarray | None] = [None] * r
        self.logit_bias: list[tuple[np.ndarray, np.ndarray] | None] = [None] * r
        self.bad_words: list[list[list[int]] | None] = [None] * r
        self.min_tokens_stop_ids: list[np.ndarray] = [_EMPTY] * r
        self.num_min_tokens_stop_ids = np.zeros(r, dtype=np.int64)  # len(min_tokens_stop_ids[row])
        # Rows that sample with their temperature alone (no seed, top-k/p, min-p, masks, bias,
        # penalties, min_tokens stop ids or logprobs): a step of only such rows skips every
        # per-feature check (the usual greedy or plain-random decode batch).
        self.plain = np.zeros(r, dtype=bool)

    def __len__(self) -> int:
        return len(self.row_of)

    def add_request(self, new: NewRequestData) -> int:
        if not self._free_rows:
            raise RuntimeError("input batch is full (more running requests than max_num_seqs)")
        row = self._free_rows.pop()
        self._next_serial += 1
        self.serial[row] = self._next_serial
        self.row_of[new.req_id] = row
        self.req_ids[row] = new.req_id
        toks = new.prompt_token_ids + new.output_token_ids
        self.token_ids[row, : len(toks)] = toks
        self.num_tokens[row] = len(toks)
        self.num_prompt_tokens[row] = len(new.prompt_token_ids)
        self.num_computed[row] = new.num_computed_tokens
        self.num_blocks_per_group[:, row] = 0
        self.append_block_ids(row, new.block_ids)
        self.params[row] = new.sampling_params
        self._set_sampling_params(row, new.sampling_params, new.eos_token_id)
        return row

    def _set_sampling_params(self, row: int, p: SamplingParams, eos_token_id: int | None) -> None:
        greedy = p.sampling_type == SamplingType.GREEDY
        self.temperature[row] = 0.0 if greedy else p.temperature
        self.top_k[row] = max(p.top_k, 0)
        self.top_p[row] = p.top_p
        self.min_p[row] = p.min_p
        self.presence_penalty[row] = p.presence_penalty
        self.frequency_penalty[row] = p.frequency_penalty
        self.repetition_penalty[row] = p.repetition_penalty
        self.has_penalty[row] = (
            p.presence_penalty != 0.0 or p.frequency_penalty != 0.0 or p.repetition_penalty != 1.0
        )
        self.has_seed[row] = p.seed is not None and not greedy
        self.seed[row] = p.seed if p.seed is not None else 0
        self.min_tokens[row] = p.min_tokens
        self.num_logprobs[row] = -1 if p.logprobs is None else p.logprobs
        self.num_prompt_logprobs[row] = -1 if p.prompt_logprobs is None else p.prompt_logprobs
        self.allowed_token_ids[row] = (
            None if p.allowed_token_ids is None else np.asarray(p.allowed_token_ids, dtype=np.int64)
        )
        if p.logit_bias:
            ids = np.fromiter(p.logit_bias.keys(), dtype=np.int64, count=len(p.logit_bias))
            vals = np.fromiter(p.logit_bias.values(), dtype=np.float32, count=len(p.logit_bias))
            self.logit_bias[row] = (ids, vals)
        else:
            self.logit_bias[row] = None
        self.bad_words[row] = p.bad_words_token_ids or None
        self.has_allowed[row] = self.allowed_token_ids[row] is not None
        self.has_bias[row] = self.logit_bias[row] is not None
        self.has_bad_words[row] = self.bad_words[row] is not None
        self.has_grammar[row] = p.structured_outputs is not None
        stop_ids = set(p.stop_token_ids or ())
        if eos_token_id is not None and not p.ignore_eos:
            stop_ids.add(eos_token_id)
        self.min_tokens_stop_ids[row] = np.array(sorted(stop_ids), dtype=np.int64)
        self.num_min_tokens_stop_ids[row] = len(stop_ids)
        self.plain[row] = not (
            self.has_seed[row] or self.has_penalty[row] or self.has_allowed[row] or self.has_bias[row]
            or self.has_bad_words[row] or self.top_k[row] > 0 or self.top_p[row] < 1.0 or self.min_p[row] > 0.0
            or (self.min_tokens[row] > 0 and stop_ids) or self.num_logprobs[row] >= 0
        )

    def remove_request(self, req_id: str) -> None:
        row = self.row_of.pop(req_id, None)
        if row is None:
            return
        self.req_ids[row] = None
        self.params[row] = None
        self.allowed_token_ids[row] = None
        self.logit_bias[row] = None
        self.bad_words[row] = None
        self.has_allowed[row] = self.has_bias[row] = self.has_bad_words[row] = self.has_grammar[row] = False
        self._free_rows.append(row)

    def append_block_ids(self, row: int, block_ids: list[list[int]]) -> None:
        """Append new blocks of each KV cache group (one list per group)."""
        if len(block_ids) != self.num_kv_groups:
            raise ValueError(f"got block ids for {len(block_ids)} KV cache groups, expected {self.num_kv_groups}")
        for g, ids in enumerate(block_ids):
            if ids:
                start = self.num_blocks_per_group[g, row]
                self.block_tables[g, row, start : start + len(ids)] = ids
                self.num_blocks_per_group[g, row] = start + len(ids)

    def output_token_ids(self, row: int, num_drafts: int = 0) -> np.ndarray:
        """Generated tokens of ``row``, followed by its first ``num_drafts`` draft tokens."""
        return self.token_ids[row, self.num_prompt_tokens[row] : self.num_tokens[row] + num_drafts]

    def write_drafts(self, row: int, drafts: list[int]) -> None:
        """Speculative decoding: drafts sit right after the known tokens (``num_tokens`` is
        unchanged), so input preparation and penalties read them like any token."""
        start = int(self.num_tokens[row])
        self.token_ids[row, start : start + len(drafts)] = drafts

    def append_token_runs(self, rows: np.ndarray, tokens: np.ndarray, counts: np.ndarray) -> None:
        """Append ``counts[i]`` tokens (consecutive in ``tokens``) to each of ``rows``."""
        room = np.maximum(self.max_model_len - self.num_tokens[rows], 0)
        take = np.minimum(counts, room)
        starts = np.cumsum(counts) - counts
        seg = np.repeat(np.arange(len(rows)), take)
        within = np.arange(int(take.sum())) - np.repeat(np.cumsum(take) - take, take)
        self.token_ids[rows[seg], self.num_tokens[rows][seg] + within] = tokens[starts[seg] + within]
        self.num_tokens[rows] += take

    def append_tokens(self, rows: np.ndarray, tokens: np.ndarray) -> None:
        """Append one sampled token to each of ``rows`` (vectorised)."""
        ok = self.num_tokens[rows] < self.max_model_len
        rows, tokens = rows[ok], tokens[ok]
        self.token_ids[rows, self.num_tokens[rows]] = tokens
        self.num_tokens[rows] += 1

    # -- sampling metadata ----------------------------------------------------------------
    def make_sampling_metadata(
        self, rows: np.ndarray, vocab_size: int, transfer: DeviceTransfer, num_pending: np.ndarray | None = None,
        num_drafts: np.ndarray | None = None,
    ) -> SamplingMetadata:
        """Metadata for sampling the next token of ``rows`` (in that order).

        Speculative decoding repeats a verifying request's row once per position; position
        ``num_drafts[i]`` (0 for the first) samples as if the drafts before it were accepted:
        they count as output for seeds, ``min_tokens``, penalties and bad words.

        ``num_pending[i]`` counts tokens of ``rows[i]`` sampled by a step still in flight (async
        scheduling): they count towards seeds and ``min_tokens``. Penalties and bad words need
        the tokens themselves, so the engine never overlaps steps for requests that use them.
        Every optional field is None when no row of ``rows`` uses its feature.
        """
        dev = transfer.to_device
        if self.plain[rows].all():  # what the full pass below gives for such rows
            temps = self.temperature[rows]
            greedy = temps == 0.0
            return SamplingMetadata(temperature=dev(temps), all_greedy=bool(greedy.all()),
                                    all_random=not bool(greedy.any()))
        temps, top_k, top_p, min_p = (a[rows] for a in (self.temperature, self.top_k, self.top_p, self.min_p))
        greedy = temps == 0.0
        num_out = self.num_tokens[rows] - self.num_prompt_tokens[rows]
        if num_pending is not None:
            num_out = num_out + num_pending
        drafts = num_drafts  # None: no row samples after drafts
        if drafts is not None:
            num_out = num_out + drafts
        nlp = self.num_logprobs[rows]
        return SamplingMetadata(
            temperature=dev(temps),
            all_greedy=bool(greedy.all()),
            all_random=not bool(greedy.any()),
            top_k=dev(top_k) if (top_k > 0).any() else None,
            top_p=dev(top_p) if (top_p < 1.0).any() else None,
            min_p=dev(min_p) if (min_p > 0.0).any() else None,
            generators=self._generators(rows, num_out, transfer.device),
            allowed_token_ids_mask=self._allowed_mask(rows, vocab_size, dev),
            bad_words_mask=self._bad_words_mask(rows, dev, drafts),
            min_tokens_mask=self._min_tokens_mask(rows, num_out, dev),
            logit_bias=self._logit_bias(rows, dev),
            **self._penalties(rows, vocab_size, dev, drafts),
            max_num_logprobs=int(nlp.max()) if (nlp >= 0).any() else None,
        )

    def _generators(self, rows: np.ndarray, num_out: np.ndarray, device: torch.device) -> dict[int, torch.Generator]:
        """Seeded rows: a generator seeded from (seed, output position), so a seeded request
        samples the same tokens whatever batch it runs in."""
        generators: dict[int, torch.Generator] = {}
        for i in np.nonzero(self.has_seed[rows])[0].tolist():
            g = torch.Generator(device=device)
            g.manual_seed(token_seed(int(self.seed[rows[i]]), int(num_out[i])))
            generators[i] = g
        return generators

    def _allowed_mask(self, rows: np.ndarray, vocab_size: int, dev: ToDevice) -> torch.Tensor | None:
        """allowed_token_ids: a dense [S, V] mask, only when some row restricts its vocabulary."""
        restricted = np.nonzero(self.has_allowed[rows])[0].tolist()
        if not restricted:
            return None
        mask = np.zeros((len(rows), vocab_size), dtype=bool)
        mask[restricted] = True
        for i in restricted:
            mask[i, self.allowed_token_ids[rows[i]]] = False
        return dev(mask)

    def _bad_words_mask(
        self, rows: np.ndarray, dev: ToDevice, drafts: np.ndarray | None
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Bad words, against each row's generated tokens: (row, token) pairs to forbid."""
        bad = {i: self.bad_words[rows[i]] for i in np.nonzero(self.has_bad_words[rows])[0].tolist()}
        if not bad:
            return None
        past = {i: self.output_token_ids(rows[i], 0 if drafts is None else int(drafts[i])) for i in bad}
        b_rows, b_toks = bad_words_positions(bad, past)
        if not b_rows:
            return None
        return dev(np.array(b_rows, np.int64)), dev(np.array(b_toks, np.int64))

    def _min_tokens_mask(
        self, rows: np.ndarray, num_out: np.ndarray, dev: ToDevice
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """min_tokens: stop tokens are forbidden while too few tokens were generated."""
        # Rows with no stop token to forbid (ignore_eos, no stop_token_ids) are left out up front.
        gated = np.nonzero((num_out < self.min_tokens[rows]) & (self.num_min_tokens_stop_ids[rows] > 0))[0]
        if not len(gated):
            return None
        gated_rows = rows[gated]
        ids = [self.min_tokens_stop_ids[r] for r in gated_rows.tolist()]
        return dev(np.repeat(gated, self.num_min_tokens_stop_ids[gated_rows])), dev(np.concatenate(ids))

    def _logit_bias(self, rows: np.ndarray, dev: ToDevice) -> tuple[torch.Tensor, ...] | None:
        """(row, token id, bias) triples of every biased row."""
        biased = np.nonzero(self.has_bias[rows])[0].tolist()
        if not biased:
            return None
        pairs = [self.logit_bias[rows[i]] for i in biased]
        counts = np.array([len(p[0]) for p in pairs], dtype=np.int64)
        return (
            dev(np.repeat(np.array(biased, dtype=np.int64), counts)),
            dev(np.concatenate([p[0] for p in pairs])),
            dev(np.concatenate([p[1] for p in pairs])),
        )

    def _penalties(
        self, rows: np.ndarray, vocab_size: int, dev: ToDevice, drafts: np.ndarray | None
    ) -> dict[str, torch.Tensor]:
        """All five penalty fields, or none: prompt/output tokens padded with ``vocab_size``."""
        if not self.has_penalty[rows].any():
            return {}
        n_tok = self.num_tokens[rows] if drafts is None else self.num_tokens[rows] + drafts
        n_prompt = self.num_prompt_tokens[rows]
        width = int(n_tok.max())
        toks = self.token_ids[rows, :width]
        pos = np.arange(width)[None, :]
        is_prompt = pos < n_prompt[:, None]
        is_output = ~is_prompt & (pos < n_tok[:, None])
        return {
            "prompt_token_ids": dev(np.where(is_prompt, toks, vocab_size)),
            "output_token_ids": dev(np.where(is_output, toks, vocab_size)),
            "presence_penalties": dev(self.presence_penalty[rows]),
            "frequency_penalties": dev(self.frequency_penalty[rows]),
            "repetition_penalties": dev(self.repetition_penalty[rows]),
        }
