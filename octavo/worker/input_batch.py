"""Persistent per-request state of the model runner, kept in preallocated rows.

A request occupies one row from admission until it finishes or is preempted. Per step only
deltas arrive (new block ids); token ids sampled by the runner are appended here directly, so
input preparation is pure array indexing with no per-token Python loop.
Invariant: ``token_ids[row, :num_tokens[row]]`` are the request's prompt + output tokens and
``block_table[row, :num_blocks[row]]`` its blocks in position order.
"""

from __future__ import annotations

import numpy as np

from octavo.core.scheduler_output import NewRequestData
from octavo.sampling_params import SamplingParams


class InputBatch:
    def __init__(self, max_num_reqs: int, max_model_len: int, block_size: int) -> None:
        self.max_num_reqs = max_num_reqs
        self.max_model_len = max_model_len
        self.block_size = block_size
        self.max_blocks_per_req = -(-max_model_len // block_size)
        self.token_ids = np.zeros((max_num_reqs, max_model_len), dtype=np.int64)
        self.num_tokens = np.zeros(max_num_reqs, dtype=np.int64)
        self.num_prompt_tokens = np.zeros(max_num_reqs, dtype=np.int64)
        self.num_computed = np.zeros(max_num_reqs, dtype=np.int64)
        self.block_table = np.zeros((max_num_reqs, self.max_blocks_per_req), dtype=np.int32)
        self.num_blocks = np.zeros(max_num_reqs, dtype=np.int64)
        self.params: list[SamplingParams | None] = [None] * max_num_reqs
        self.req_ids: list[str | None] = [None] * max_num_reqs
        self.row_of: dict[str, int] = {}
        self._free_rows = list(range(max_num_reqs - 1, -1, -1))

    def __len__(self) -> int:
        return len(self.row_of)

    def add_request(self, new: NewRequestData) -> int:
        if not self._free_rows:
            raise RuntimeError("input batch is full (more running requests than max_num_seqs)")
        row = self._free_rows.pop()
        self.row_of[new.req_id] = row
        self.req_ids[row] = new.req_id
        toks = new.prompt_token_ids + new.output_token_ids
        self.token_ids[row, : len(toks)] = toks
        self.num_tokens[row] = len(toks)
        self.num_prompt_tokens[row] = len(new.prompt_token_ids)
        self.num_computed[row] = new.num_computed_tokens
        self.num_blocks[row] = 0
        self.append_block_ids(row, new.block_ids)
        self.params[row] = new.sampling_params
        return row

    def remove_request(self, req_id: str) -> None:
        row = self.row_of.pop(req_id, None)
        if row is None:
            return
        self.req_ids[row] = None
        self.params[row] = None
        self._free_rows.append(row)

    def append_block_ids(self, row: int, block_ids: list[int]) -> None:
        if not block_ids:
            return
        start = self.num_blocks[row]
        self.block_table[row, start : start + len(block_ids)] = block_ids
        self.num_blocks[row] = start + len(block_ids)

    def output_token_ids(self, row: int) -> np.ndarray:
        return self.token_ids[row, self.num_prompt_tokens[row] : self.num_tokens[row]]

    def append_tokens(self, rows: np.ndarray, tokens: np.ndarray) -> None:
        """Append one sampled token to each of ``rows`` (vectorised)."""
        ok = self.num_tokens[rows] < self.max_model_len
        rows, tokens = rows[ok], tokens[ok]
        self.token_ids[rows, self.num_tokens[rows]] = tokens
        self.num_tokens[rows] += 1
