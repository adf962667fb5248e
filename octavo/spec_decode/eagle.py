"""EAGLE proposals: the head (``eagle_head``; EAGLE-3: ``eagle3_head``) drafts from the
target's hidden states (EAGLE-3: from three of its layers, which the target then keeps).

The head keeps its own KV cache on the pool's block ids, with scratch blocks past a request's
own blocks, exactly as a draft model does (``DraftModel``: allocation, block tables and
input staging are shared); what differs is where its inputs come from.

1. absorb (in the target's step, right after sampling): the head computes every position
   ``p`` the target computed, from the target's hidden state ``h[p]`` and the token ``p + 1``:
   the next scheduled token, the next prompt token for the last token of a prompt chunk, or
   the token the target sampled at ``p`` for a sampling position (verifying drafts, the
   sample at an accepted position is the draft itself, at the first rejected one the
   correction: the true next token either way). Positions past a request's accepted tokens
   get K/V from rejected inputs; the next step computes them again before any pass reads them.
   For each request that sampled, the head's output at its last valid position (the known
   tokens' second-to-last, ``n - 2``, picked on the device from the verification) is kept.
2. propose (once the step's tokens are in the input batch: after its result, or with async
   scheduling when the runner stages the next step): draft 1 is the argmax of the kept output; draft
   ``j + 1`` comes from a single-token pass at position ``n - 2 + j`` fed draft ``j`` and the
   head's previous output in place of the target's hidden state.

A request proposed for that did not sample in the last step (not scheduled then) gets no
drafts this time: the kept output is of an older context. Exactness never depends on the
head: drafts are verified like any greedy drafts. The head's passes run eagerly (its
inputs include a hidden state per token, which the decode graphs do not stage).
"""

from __future__ import annotations

import logging

import numpy as np
import torch

from octavo.attention.backend import CommonAttentionMetadata
from octavo.spec_decode.draft_model import DraftModel, _Pass

logger = logging.getLogger(__name__)


class EagleDrafter(DraftModel):
    """The EAGLE head, its KV tensors, and per row the head's output after the last step."""

    def __init__(self, config, platform, device: torch.device, transfer) -> None:
        super().__init__(config, platform, device, transfer)
        self.kept: torch.Tensor | None = None  # [rows, hidden] the head's output at n - 2
        self.kept_serial = np.full(self.num_rows, -1, dtype=np.int64)  # row occupancy of ``kept``
        self.kept_step = np.full(self.num_rows, -1, dtype=np.int64)  # absorb call that kept it
        self.steps = 0

    def load(self, target=None) -> None:
        from octavo.spec_decode.eagle_head import build_eagle_head

        if target is None:
            raise RuntimeError("an EAGLE head is built on its target model")
        self.model = build_eagle_head(self.mc, target, self.attn_backend, self.device, self.platform,
                                      self.max_model_len)
        self.target = target
        if self.config.speculative_config.method == "eagle3":
            self._keep_target_aux(target)
        self.kept = torch.zeros(self.num_rows, self.mc.hidden_size, dtype=self.mc.dtype, device=self.device)
        logger.info("EAGLE head %s: %d layer(s), attention %s", self.mc.model, self.mc.num_layers,
                    self.attn_backend.name)

    def _keep_target_aux(self, target) -> None:
        """Make the target keep the residual streams an EAGLE-3 head reads (before its graphs
        are captured, so replays write them too)."""
        from octavo.spec_decode.eagle_check import aux_layer_ids

        tm = target.model
        ids = aux_layer_ids(self.mc.hf_config, len(tm.layers))
        sc = self.config.scheduler_config
        rows = max(sc.max_num_batched_tokens, sc.max_num_seqs)
        h = self.config.model_config.hidden_size
        tm.aux_out = torch.zeros(rows, len(ids) * h, dtype=self.config.model_config.dtype, device=self.device)
        tm.aux_layers = ids
        logger.info("EAGLE-3: the target keeps the inputs of its layers %s", list(ids))

    def _capture_graphs(self) -> None:
        if not self.platform.device_is_host():
            self.step_buffers = self.make_step_buffers()
            logger.info("EAGLE head graphs: none (its passes read hidden states; they run eagerly)")

    def _model_forward(self, ids: torch.Tensor, pos: torch.Tensor, md: CommonAttentionMetadata,
                       p: _Pass) -> torch.Tensor:
        return self.model(ids, pos, p.hidden, self.attn_backend.build_metadata(md))

    # -- 1. absorb ------------------------------------------------------------------------
    @torch.inference_mode()
    def absorb(self, batch, step, hidden: torch.Tensor, logits_idx: torch.Tensor | None, sampled) -> None:
        """Run the head over the target's step ``step`` (``StepInputs``) whose hidden states are
        ``hidden``; ``logits_idx`` (device) are its sampled token indices and ``sampled`` its
        ``SampledTokens`` (None when nothing sampled)."""
        self.steps += 1
        md: CommonAttentionMetadata = step.metadata
        t = md.num_actual_tokens
        ids = step.input_ids[:t]
        nxt = torch.empty_like(ids)
        nxt[:-1] = ids[1:]
        dev = self.transfer.to_device
        last = md.query_start_loc_cpu[1:] - 1
        width = batch.token_ids.shape[1]
        after = batch.token_ids[step.rows, np.minimum(md.seq_lens_cpu, width - 1)]
        nxt[dev(last)] = dev(after).to(nxt.dtype)
        if sampled is not None:
            nxt[logits_idx] = sampled.device.to(nxt.dtype)
        features = hidden[:t] if self.target.model.aux_out is None else self.target.model.aux_out[:t]
        g = self.model(nxt, step.positions[:t], self.model.combine(features), self.attn_backend.build_metadata(md))
        if sampled is None:
            return
        if sampled.num_emitted_device is None:  # one sampled position per request
            keep_idx = logits_idx
        else:
            starts = dev(sampled.position_starts)
            keep_idx = logits_idx[starts + sampled.num_emitted_device - 1]
        rows = sampled.rows
        self.kept[dev(rows)] = g[keep_idx]
        self.kept_serial[rows] = sampled.serials
        self.kept_step[rows] = self.steps

    # -- 2. propose -----------------------------------------------------------------------
    def num_drafts_of(self, batch, rows: np.ndarray, num_drafts: np.ndarray) -> np.ndarray:
        """``num_drafts`` where the kept output is of the row's current context (kept by the
        last step, same occupancy), else 0."""
        fresh = (self.kept_step[rows] == self.steps) & (self.kept_serial[rows] == batch.serial[rows])
        return np.where(fresh, num_drafts, 0).astype(np.int64)

    @torch.inference_mode()
    def propose_on_device(self, batch, rows: np.ndarray, num_drafts: np.ndarray) -> tuple[torch.Tensor, np.ndarray]:
        """Up to ``num_drafts[i]`` greedy drafts after the known tokens of ``rows[i]``, on the
        device (see ``DraftModel.propose_on_device``); none for a row whose kept output is not of
        its current context."""
        counts = self.num_drafts_of(batch, rows, num_drafts)
        drafts = torch.full((len(rows), max(int(counts.max()), 1)), -1, dtype=torch.int64, device=self.device)
        sel = np.nonzero(counts > 0)[0]
        if not len(sel):
            return drafts, counts
        r, n, k = rows[sel], batch.num_tokens[rows[sel]], counts[sel]
        dev = self.transfer.to_device
        rows_out = dev(sel)
        g = self.kept[dev(r)]
        drafts[rows_out, 0] = self._argmax(g)
        for j in range(1, int(k.max())):
            active = np.nonzero(k > j)[0]
            a = dev(active)
            pos = n[active] - 2 + j
            p = _Pass(r[active], drafts[rows_out[a], j - 1], pos, np.ones(len(active), dtype=np.int64), pos + 1,
                      hidden=g[a])
            g_next = self._forward(batch, p)
            g[a] = g_next
            drafts[rows_out[a], j] = self._argmax(g_next)
        return drafts, counts

    def _argmax(self, g: torch.Tensor) -> torch.Tensor:
        return self.model.greedy(g)
