"""Drafts that stay on the device between the step that proposes them and the step that
verifies them (draft model and EAGLE on an accelerator).

The scheduler needs only how many drafts a request carries, never their values; the runner
needs the values in two places, both on the device: the verifying step's input ids and the
verification grid. So the proposer's drafts are kept in a per-row store on the device and the
scheduler is handed placeholders (``DEVICE_DRAFT``, one per draft). Nothing waits for the draft
passes: the host schedules and stages the next step while the device still runs them, and
stream order puts the draft values into the next step's inputs.

Invariants:
- Row ``r``'s store holds the drafts of the latest proposal for the request in row ``r``;
  a request's placeholders are the first ``n`` of them (the scheduler only ever shortens them).
- The store holds valid token ids only (zeros before any proposal, argmax outputs after):
  a stale entry (the row changed hands since) is still a token, and verification is exact
  for any draft (it only lowers acceptance), so a stale read can never change output.
- Rows whose sampling reads their output history on the host (penalties, bad words) get
  their drafts' values read back before the step (``materialize``), like host drafts; rows
  of grammar-constrained requests as soon as they are proposed (the engine validates them
  against the grammar and builds a mask per position before scheduling), so the scheduler
  never sees placeholders for them.
"""

from __future__ import annotations

import numpy as np
import torch

DEVICE_DRAFT = -1  # a placeholder draft: its value is in the runner's ``DeviceDrafts`` store


class DeviceDrafts:
    """The per-row store ``[max_num_reqs, k]`` of the latest drafts, on the device."""

    def __init__(self, max_num_reqs: int, k: int, device: torch.device, transfer) -> None:
        self.k = k
        self.store = torch.zeros((max_num_reqs, k), dtype=torch.int64, device=device)
        self.transfer = transfer

    def keep(self, rows: np.ndarray, drafts: torch.Tensor, counts: np.ndarray) -> list[list[int]]:
        """Store ``drafts[i, :counts[i]]`` for ``rows[i]``; the placeholders to schedule."""
        width = min(drafts.shape[1], self.k)
        if len(rows) and width:
            dev = self.transfer.to_device
            # -1 pads rows with fewer drafts: keep the old (valid) ids there instead.
            new = drafts[:, :width]
            r = dev(rows)
            self.store[r, :width] = torch.where(new >= 0, new, self.store[r, :width])
        return [[DEVICE_DRAFT] * int(n) for n in counts]

    @staticmethod
    def split(spec: dict[str, list[int]]) -> tuple[dict[str, list[int]], dict[str, int]]:
        """(requests with host drafts, request -> number of device drafts)."""
        host, device = {}, {}
        for rid, drafts in spec.items():
            if drafts and drafts[0] == DEVICE_DRAFT:
                device[rid] = len(drafts)
            else:
                host[rid] = drafts
        return host, device

    def materialize(self, rows: np.ndarray, counts: np.ndarray) -> list[list[int]]:
        """The drafts' values on the host (waits for the device)."""
        values = self.store[self.transfer.to_device(rows)].cpu().numpy()
        return [values[i, : int(n)].tolist() for i, n in enumerate(counts)]

    def write_inputs(self, input_ids: torch.Tensor, step_rows: np.ndarray, qsl: np.ndarray,
                     rows: np.ndarray, counts: np.ndarray) -> None:
        """Write the device drafts of ``rows`` (each verifying ``counts[i]`` drafts this step)
        into ``input_ids``: a verifying request's tokens are its last known token, then its drafts."""
        if not len(rows):
            return
        index_of_row = np.full(int(max(step_rows.max(), rows.max())) + 1, -1, dtype=np.int64)
        index_of_row[step_rows] = np.arange(len(step_rows))
        seg = np.repeat(np.arange(len(rows)), counts)
        j = np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts)
        dst = qsl[index_of_row[rows]][seg] + 1 + j
        src = rows[seg] * self.k + j
        dev = self.transfer.to_device
        values = self.store.view(-1)[dev(src)]
        input_ids.index_copy_(0, dev(dst), values.to(input_ids.dtype))


def grid_drafts_from_inputs(input_ids: torch.Tensor, logits_indices: np.ndarray, grid: np.ndarray,
                            counts: np.ndarray, to_device) -> torch.Tensor:
    """The verification grid's drafts (``DraftLayout.grid_drafts``) read from a step's input ids
    on the device: the draft checked at cell ``(i, j)`` is the input token right after the one
    whose logits sit at flat sampling position ``grid[i, j]``; -1 past a request's drafts."""
    cols = np.arange(grid.shape[1])
    is_draft = cols[None, :] < (counts - 1)[:, None]
    tok = to_device(np.where(is_draft, logits_indices[grid] + 1, -1))
    return torch.where(tok >= 0, input_ids[tok.clamp(min=0)], -1)
