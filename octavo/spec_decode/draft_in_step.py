"""Draft-model proposals queued inside the verifying step, before the host reads its result.

After a step, the draft must first catch up on what the step accepted: the accepted drafts and
the bonus token, at positions only the device knows yet (``a``, the number accepted, is on the
device until the step is read back). ``DraftModel.propose`` runs after that read-back, so the
device idles while the host stages the draft's passes. Here the catch-up is made the same shape
for every outcome, so it can be queued right after the step's sampling, its positions and
tokens computed on the device:

- a uniform pass of two tokens per row at positions ``p + a`` and ``p + a + 1`` (``p``: the
  row's last known token before the step): the token before the bonus (the last known token
  when ``a = 0``, else the last accepted draft, which the draft's previous passes had already
  computed at that position, or not when every draft was accepted), then the bonus; the logits
  after the bonus give draft 1;
- ``k - 1`` single-token passes, draft ``j`` at ``p + a + j``.

K/V recomputed at ``p + a`` is the same token at the same position after the same context.
Positions past a row's own blocks go to its scratch blocks, as in ``DraftModel``, and do not
count as computed: the accepted drafts before ``p + a`` are reused only where the draft's
previous passes wrote them into the row's own blocks (``DraftModel.fed``). The host
then collects the drafts with ``take`` when the engine asks for them (after the step's result;
with async scheduling, when the runner stages the next step);
placeholders and the device store do the rest (``device_drafts``).

Only a step of decode/verify rows, every one caught up (the draft's K/V valid below its
last known token + 1, same occupancy), on one rank, is launched this way; anything else falls
back to ``DraftModel.propose`` after the step, and a launch whose rows the engine does not ask
for exactly is dropped (its K/V writes sit at positions a later catch-up rewrites first).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from octavo.distributed.parallel_state import get_tp


class InStepLauncher:
    """Queues a ``DraftModel``'s passes after a step's sampling; hands them out afterwards."""

    def __init__(self, drafter) -> None:
        self.d = drafter
        self._launched: tuple[np.ndarray, np.ndarray, torch.Tensor] | None = None  # rows, serials, drafts
        self.launches = 0  # steps whose proposals were queued in the step (tests and benchmarks read it)
        self.enabled = True  # benchmarks turn it off to time proposals after the step on one engine

    def forget(self) -> None:
        """A launch is for the step that made it: the next step drops what was not taken."""
        self._launched = None

    def applies(self, batch, step) -> bool:
        """A pure decode/verify step whose rows the draft has caught up, on one rank."""
        d = self.d
        if not self.enabled or d.step_buffers is None or get_tp().world_size > 1 or not step.sample_mask.all():
            return False
        rows = step.rows
        qsl = step.metadata.query_start_loc_cpu
        n_known = batch.num_tokens[rows]
        return bool((np.diff(qsl) == step.num_drafts + 1).all()
                    and (d.computed[rows] == n_known).all()
                    and (d.fed[rows] >= n_known + step.num_drafts - 1).all()  # drafts 1..d-1 fed
                    and (d.serial[rows] == batch.serial[rows]).all())

    @torch.inference_mode()
    def launch(self, batch, step, sampled) -> bool:
        """Queue ``k`` drafts for every row of ``step`` (``StepInputs``, sampled as ``sampled``:
        ``SampledTokens``); False when the step does not qualify (see ``applies``)."""
        self._launched = None
        if not self.applies(batch, step):
            return False
        d, rows = self.d, step.rows
        b = len(rows)
        n_known = batch.num_tokens[rows]
        starts = np.arange(b) if sampled.position_starts is None else sampled.position_starts
        host = np.stack([step.metadata.query_start_loc_cpu[:-1], n_known - 1, starts]).astype(np.int64)
        first, last_known, start = d.transfer.to_device(host).unbind(0)
        accepted = torch.zeros_like(first) if sampled.num_emitted_device is None else sampled.num_emitted_device - 1
        bonus = sampled.device[start + accepted]
        pos0 = last_known + accepted  # p + a
        upper = n_known + step.num_drafts + d.k  # per row: seq_len bound of its last pass (a <= its drafts)
        drafts = torch.empty((b, d.k), dtype=torch.int64, device=d.device)
        ids = torch.stack((step.input_ids[first + accepted], bonus), dim=1).reshape(-1)
        pos = (pos0[:, None] + torch.arange(2, device=d.device)).reshape(-1)
        table = d._block_table(batch, rows, upper, True)  # every pass's: rows' blocks + scratch
        drafts[:, 0] = self._pass(table, ids, pos, 2, upper)
        for j in range(1, d.k):
            drafts[:, j] = self._pass(table, drafts[:, j - 1], pos0 + 1 + j, 1, upper)
        self._launched = (rows.copy(), batch.serial[rows].copy(), drafts)
        self.launches += 1
        return True

    def _pass(self, table: np.ndarray, ids: torch.Tensor, pos: torch.Tensor, q: int,
              upper: np.ndarray) -> torch.Tensor:
        """One draft forward of ``q`` tokens per row (``table``: the rows' block tables), inputs
        on the device; its greedy next token after each row's last one. The host stages what
        does not depend on the step's outcome (block tables, query layout) with bounds, the
        device writes the rest."""
        d = self.d
        b, t, bs = len(table), len(table) * q, d.block_size
        gr = d.graph_runner
        pad = gr.padded_size(b, t, q) if gr is not None else None
        zeros = np.zeros(t, dtype=np.int64)
        mds, (ids_buf, pos_buf) = d.step_buffers.stage(
            zeros, zeros, [zeros], np.arange(b + 1, dtype=np.int64) * q, upper, [table], np.arange(b),
            int(-(-upper.max() // bs)), q, pad_to=pad,
        )
        md = mds[0]
        ids_buf.copy_(ids)
        pos_buf.copy_(pos)
        row_of_token = torch.arange(b, device=d.device).repeat_interleave(q)
        md.slot_mapping.copy_(md.block_table[row_of_token, pos // bs].to(torch.int64) * bs + pos % bs)
        md.seq_lens.copy_(pos.view(b, q)[:, -1] + 1)
        md = dataclasses.replace(md, max_seq_len=int(upper.max()))
        hidden = gr.replay(md) if pad is not None else d._model_forward(ids_buf, pos_buf, md, None)
        logits = d.model.compute_logits(hidden.view(b, q, -1)[:, -1])
        return logits.argmax(dim=-1).to(torch.int64)

    def take(self, batch, rows: np.ndarray, num_drafts: np.ndarray) -> tuple[torch.Tensor, np.ndarray] | None:
        """The queued drafts of ``rows`` (each ``min(num_drafts[i], k)`` long), and the draft's
        progress recorded as ``propose`` would; None (nothing taken) unless the last launch
        covered these occupancies of these rows (a row that finished meanwhile is not asked for)."""
        launched, self._launched = self._launched, None
        if launched is None:
            return None
        l_rows, l_serials, drafts = launched
        where = np.full(batch.max_num_reqs, -1, dtype=np.int64)
        where[l_rows] = np.arange(len(l_rows))
        index = where[rows]  # l_rows[index] == rows
        if (index < 0).any() or not (l_serials[index] == batch.serial[rows]).all():
            return None
        d = self.d
        n_known, own = batch.num_tokens[rows], batch.num_blocks[rows] * d.block_size
        d.computed[rows] = np.minimum(n_known, own)
        d.fed[rows] = np.minimum(n_known + d.k - 1, own)  # positions p + a .. p + a + k written
        d.serial[rows] = batch.serial[rows]
        return drafts[d.transfer.to_device(index)], np.minimum(num_drafts, d.k)
