"""Draft-model proposals: a smaller checkpoint with the target's vocabulary drafts greedily.

The draft runs in the target's worker, on the same device. Where the target captures decode
graphs (CUDA/HIP), the draft captures its own for its single-token passes (every pass but a
catch-up of several tokens), with its own persistent input buffers; other passes run eagerly.
Its KV cache is its own tensors, one per draft layer, indexed by the SAME
block ids and block tables as the target's: block ``b`` of the pool holds the target's K/V in
the target's tensors and the draft's K/V in the draft's, so the scheduler and the KV cache
manager are unchanged and the bytes of one block (``kv_bytes_per_block``) count both models.

Proposing for a request (after its step, when all its known tokens but the last are
computed by the target; on an accelerator a step of caught-up decoding rows queues the same
proposals inside the step instead, see ``draft_in_step``):

1. catch up: the draft computes the known tokens it has not computed yet (the whole prompt
   the first time, later the accepted drafts and the new token), in chunks of at most
   ``max_num_batched_tokens`` per forward; the logits of the last known token give draft 1;
2. draft ``j + 1`` is the argmax after feeding draft ``j``, up to ``min(k, room)`` drafts.

Positions past the blocks the request holds (the last drafts, and a bonus token past the
verified chunk) are written into *scratch* blocks: ``ceil(k / block_size) + 1`` per input
batch row, after the pool's blocks in the draft's tensors only. The draft's computed count
of a row is therefore capped at the tokens its own blocks hold; the rest is recomputed by the
next catch-up. KV written at rejected draft positions is overwritten before it is read
(every forward writes its tokens' K/V before attending). A row's count belongs to one
occupancy of the row (``InputBatch.serial``): a new or re-admitted (preempted) request starts
from position 0, so blocks it shares through the prefix cache never hand it draft K/V that
was never written.

With tensor parallelism the draft is sharded over the same ranks as the target (every rank
runs every pass on the same inputs); rank 0's argmax is broadcast after each pass.

Greedy drafts are a deterministic function of the context: the draft distribution is a
point mass, which ``rejection_sampler.verify_one_hot_drafts`` verifies exactly.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import torch

from octavo.attention.backend import CommonAttentionMetadata
from octavo.attention.kv_cache_dtype import kv_cache_torch_dtype
from octavo.config import ModelConfig, OctavoConfig
from octavo.distributed.parallel_state import get_tp
from octavo.spec_decode.draft_in_step import InStepLauncher

logger = logging.getLogger(__name__)


def build_model(mc: ModelConfig, attn_backend, device: torch.device, platform, max_model_len: int):
    """An unquantized model of ``mc`` on ``device`` with its weights loaded (or dummy)."""
    from octavo.models.layers import bind_fused_ops
    from octavo.models.loader import init_dummy_weights, load_weights
    from octavo.models.registry import resolve_architecture

    _, model_cls = resolve_architecture([mc.architecture])
    old = torch.get_default_dtype()
    torch.set_default_dtype(mc.dtype)
    try:
        with torch.device(device):
            model = model_cls(mc.hf_config, attn_backend, mc.dtype, max_model_len)
    finally:
        torch.set_default_dtype(old)
    if mc.load_format == "dummy":
        init_dummy_weights(model, seed=mc.seed)
    else:
        load_weights(model, mc.model, mc.load_format)
    bind_fused_ops(model, platform.fused_op_kernels, platform.decode_gemv_policy())
    return model.eval()


@dataclass
class _Pass:
    """One draft forward: each listed row computes its tokens at ``positions``."""

    rows: np.ndarray  # [B] input-batch rows
    token_ids: np.ndarray | torch.Tensor  # [T] known tokens (host) or drafts (device)
    positions: np.ndarray  # [T]
    query_lens: np.ndarray  # [B]
    seq_lens: np.ndarray  # [B] positions computed after the pass
    hidden: torch.Tensor | None = None  # [T, H] what an EAGLE head reads beside the tokens


class DraftModel:
    """The draft checkpoint, its KV tensors and the per-row progress of its catch-up."""

    def __init__(self, config: OctavoConfig, platform, device: torch.device, transfer) -> None:
        spec = config.speculative_config
        self.config = config
        self.mc: ModelConfig = spec.draft_model_config
        self.k = spec.num_speculative_tokens
        self.platform, self.device, self.transfer = platform, device, transfer
        self.block_size = config.cache_config.block_size
        self.max_model_len = config.model_config.max_model_len
        self.max_tokens_per_pass = config.scheduler_config.max_num_batched_tokens
        self.num_kv_heads = self.mc.kv_heads_per_rank(config.parallel_config.tensor_parallel_size)
        self.attn_backend, _ = platform.get_attn_backend(
            self.mc.head_size, self.mc.dtype, config.cache_config.kv_cache_dtype, self.block_size
        )
        self.kv_dtype = kv_cache_torch_dtype(config.cache_config.kv_cache_dtype, self.mc.dtype)
        self.scratch_per_row = -(-self.k // self.block_size) + 1
        max_rows = config.scheduler_config.max_num_seqs
        self.num_rows = max_rows
        self.computed = np.zeros(max_rows, dtype=np.int64)  # draft K/V valid below this position
        # Draft K/V valid below this position counting the drafts fed after the known tokens
        # (where they landed in the row's own blocks): the in-step catch-up (``draft_in_step``)
        # reuses those of the accepted drafts.
        self.fed = np.zeros(max_rows, dtype=np.int64)
        self.serial = np.full(max_rows, -1, dtype=np.int64)  # the row occupancy ``computed`` is of
        self.model = None
        self.kv_caches: list[torch.Tensor] = []
        self.num_blocks = 0
        self.max_blocks_per_req = -(-self.max_model_len // self.block_size)
        # Accelerators: persistent inputs and captured passes (None on the CPU): single-token
        # passes, and the in-step catch-up's two tokens per row (``draft_in_step``).
        self.step_buffers = None
        self.graph_runner = None
        self.in_step = InStepLauncher(self)

    # -- setup ----------------------------------------------------------------------------
    def load(self, target=None) -> None:
        """Build the draft (``target``, the target model, is for drafters that share its parts)."""
        self.model = build_model(self.mc, self.attn_backend, self.device, self.platform, self.max_model_len)
        logger.info("draft model %s: %s, %d layers, attention %s", self.mc.model, self.mc.architecture,
                    self.mc.num_layers, self.attn_backend.name)

    def model_bytes(self) -> int:
        return sum(p.numel() * p.element_size() for p in self.model.parameters())

    def kv_bytes_per_block(self) -> int:
        shape = self.attn_backend.get_kv_cache_shape(1, self.block_size, self.num_kv_heads, self.mc.head_size)
        return int(np.prod(shape)) * self.kv_dtype.itemsize * self.mc.num_layers

    def scratch_bytes(self) -> int:
        return self.num_rows * self.scratch_per_row * self.kv_bytes_per_block()

    def initialize_kv_cache(self, num_blocks: int) -> None:
        """The draft's tensors: the pool's ``num_blocks`` plus the scratch blocks of every row."""
        total = num_blocks + self.num_rows * self.scratch_per_row
        shape = self.attn_backend.get_kv_cache_shape(total, self.block_size, self.num_kv_heads, self.mc.head_size)
        alloc = torch.empty if self.platform.device_is_host() else torch.zeros
        self.kv_caches = [alloc(shape, dtype=self.kv_dtype, device=self.device) for _ in range(self.mc.num_layers)]
        for layer, cache in zip(self.model.attention_layers(), self.kv_caches, strict=True):
            layer.kv_cache = cache
        self.num_blocks = num_blocks
        self._capture_graphs()

    def _capture_graphs(self) -> None:
        """Persistent inputs on an accelerator; decode graphs where the target captures them."""
        if self.platform.device_is_host():
            return
        from octavo.worker.cuda_graph import GraphRunner, capture_sizes, graph_mode

        sc = self.config.scheduler_config
        self.step_buffers = self.make_step_buffers()
        mode, reason = graph_mode(self)
        if mode == "none":
            logger.info("draft model graphs: none (%s)", reason)
            return
        self.graph_runner = GraphRunner(self, capture_sizes(sc.max_num_seqs), (2,))
        self.graph_runner.capture()
        logger.info("draft model graphs: %s for single-token and in-step catch-up passes in %.1fs, pool %.0f MiB",
                    mode,
                    self.graph_runner.capture_seconds, self.graph_runner.pool_bytes / 2**20)

    def make_step_buffers(self):
        """Persistent inputs of the draft's passes: as many tokens as a step, block tables as
        wide as a row's own blocks plus its scratch blocks."""
        from octavo.worker.cuda_graph import StepBuffers

        sc = self.config.scheduler_config
        return StepBuffers(
            max(sc.max_num_batched_tokens, sc.max_num_seqs), sc.max_num_seqs,
            self.max_blocks_per_req + self.scratch_per_row, self.block_size, self.device, self.platform,
        )

    def build_attn_metadata(self, group_metadata: list[CommonAttentionMetadata]):
        """The backend's metadata (what ``GraphRunner`` asks of a runner): one group."""
        return self.attn_backend.build_metadata(group_metadata[0])

    # -- proposing ------------------------------------------------------------------------
    def num_drafts_of(self, batch, rows: np.ndarray, num_drafts: np.ndarray) -> np.ndarray:
        """How many drafts ``propose_on_device`` will give ``rows`` when asked for ``num_drafts``
        (each at most ``k``): all of them."""
        return np.asarray(num_drafts, dtype=np.int64)

    def propose(self, batch, rows: np.ndarray, num_drafts: np.ndarray) -> list[list[int]]:
        """Up to ``num_drafts[i]`` (1..k) greedy drafts after the known tokens of ``rows[i]``
        of the ``InputBatch`` ``batch``; every known token but the last is computed by the target."""
        drafts, counts = self.propose_on_device(batch, rows, num_drafts)
        host = drafts.cpu().numpy()
        return [host[i, : int(n)].tolist() for i, n in enumerate(counts)]

    @torch.inference_mode()
    def propose_on_device(self, batch, rows: np.ndarray, num_drafts: np.ndarray) -> tuple[torch.Tensor, np.ndarray]:
        """``propose`` without reading the drafts back: (``[len(rows), W]`` drafts on the device,
        draft count of each row); row ``i``'s drafts are its first ``counts[i]`` entries. The
        passes are queued; nothing here waits for the device."""
        n_known = batch.num_tokens[rows]
        fresh = self.serial[rows] != batch.serial[rows]
        start = np.where(fresh, 0, np.minimum(self.computed[rows], n_known - 1))
        drafts = torch.full((len(rows), int(num_drafts.max())), -1, dtype=torch.int64, device=self.device)
        self._catch_up(batch, rows, start, n_known, drafts)
        for j in range(1, drafts.shape[1]):
            active = np.nonzero(num_drafts > j)[0]
            pos = n_known[active] - 1 + j
            ids = drafts[self.transfer.to_device(active), j - 1]
            p = _Pass(rows[active], ids, pos, np.ones(len(active), dtype=np.int64), pos + 1)
            self._write_next(batch, p, drafts, active, j)
        own = batch.num_blocks[rows] * self.block_size
        self.computed[rows] = np.minimum(n_known, own)
        self.fed[rows] = np.minimum(n_known + num_drafts - 1, own)  # drafts 1..n-1 fed after n_known - 1
        self.serial[rows] = batch.serial[rows]
        return drafts, num_drafts

    def _catch_up(self, batch, rows, start: np.ndarray, n_known: np.ndarray, drafts: torch.Tensor) -> None:
        """Known tokens ``start[i]:n_known[i]`` of each row, in passes of at most
        ``max_tokens_per_pass`` tokens; a row's last pass writes its first draft."""
        done = start.copy()
        while (done < n_known).any():
            left = np.nonzero(done < n_known)[0]
            cap = max(1, self.max_tokens_per_pass // len(left))
            q = np.minimum(n_known[left] - done[left], cap)
            qsl = np.concatenate([[0], np.cumsum(q)])
            seg = np.repeat(np.arange(len(left)), q)
            pos = done[left][seg] + np.arange(int(qsl[-1])) - qsl[:-1][seg]
            ids = batch.token_ids[rows[left][seg], pos]
            done[left] += q
            p = _Pass(rows[left], ids, pos, q, done[left])
            finishing = np.nonzero(done[left] == n_known[left])[0]
            self._write_next(batch, p, drafts, left, 0, finishing)

    def _write_next(self, batch, p: _Pass, drafts: torch.Tensor, dst: np.ndarray, col: int,
                    which: np.ndarray | None = None) -> None:
        """Run pass ``p``; the argmax after the last token of its rows ``which`` (all when None)
        becomes ``drafts[dst[which], col]``."""
        hidden = self._forward(batch, p)
        which = np.arange(len(p.rows)) if which is None else which
        if not len(which):
            return
        last = np.cumsum(p.query_lens)[which] - 1
        logits = self.model.compute_logits(hidden[self.transfer.to_device(last)])
        if logits is None:  # tensor-parallel rank != 0: receive rank 0's drafts below
            tok = torch.empty(len(which), dtype=torch.int64, device=self.device)
        else:
            tok = logits.argmax(dim=-1).to(torch.int64)
        tp = get_tp()
        if tp.world_size > 1:
            tok = tp.broadcast(tok.contiguous(), src=0)
        drafts[self.transfer.to_device(dst[which]), col] = tok

    def _forward(self, batch, p: _Pass) -> torch.Tensor:
        """The draft's hidden states of pass ``p`` (its K/V written at the draft's slots)."""
        bs = self.block_size
        full = self.step_buffers is not None  # the staged layout: tables at the buffers' width
        table = self._block_table(batch, p.rows, p.seq_lens, full)
        qsl = np.concatenate([[0], np.cumsum(p.query_lens)])
        seg = np.repeat(np.arange(len(p.rows)), p.query_lens)
        slots = table[seg, p.positions // bs].astype(np.int64) * bs + p.positions % bs
        max_q = int(p.query_lens.max())
        if full:
            return self._staged_forward(p, table, qsl, slots, max_q)
        dev = self.transfer.to_device
        md = CommonAttentionMetadata(
            query_start_loc=dev(qsl.astype(np.int32)),
            seq_lens=dev(p.seq_lens.astype(np.int32)),
            block_table=dev(table),
            slot_mapping=dev(slots),
            query_start_loc_cpu=qsl,
            seq_lens_cpu=p.seq_lens,
            num_reqs=len(p.rows),
            num_actual_tokens=int(qsl[-1]),
            max_query_len=max_q,
            max_seq_len=int(p.seq_lens.max()),
            block_size=bs,
        )
        ids = p.token_ids if isinstance(p.token_ids, torch.Tensor) else dev(p.token_ids)
        return self._model_forward(ids, dev(p.positions), md, p)

    def _staged_forward(self, p: _Pass, table: np.ndarray, qsl: np.ndarray, slots: np.ndarray,
                        max_q: int) -> torch.Tensor:
        """Pass ``p`` through the persistent buffers: replayed from a graph when it is a
        single-token pass of a captured size, else eager."""
        b, t = len(p.rows), int(qsl[-1])
        on_device = isinstance(p.token_ids, torch.Tensor)
        gr = self.graph_runner
        pad = gr.padded_size(b, t, max_q) if gr is not None else None
        host_ids = np.zeros(t, dtype=np.int64) if on_device else p.token_ids
        mds, (ids, pos) = self.step_buffers.stage(
            host_ids, p.positions, [slots], qsl, p.seq_lens, [table], np.arange(b),
            int(-(-p.seq_lens.max() // self.block_size)), max_q, pad_to=pad,
        )
        md = mds[0]  # the draft's one KV cache group
        if on_device:
            ids.copy_(p.token_ids)
        if pad is not None:
            return gr.replay(md)
        return self._model_forward(ids, pos, md, p)

    def _model_forward(self, ids: torch.Tensor, pos: torch.Tensor, md: CommonAttentionMetadata,
                       p: _Pass) -> torch.Tensor:
        """The draft network on one pass's inputs (an EAGLE head also reads ``p.hidden``)."""
        return self.model(ids, pos, self.attn_backend.build_metadata(md))

    def _block_table(self, batch, rows: np.ndarray, seq_lens: np.ndarray, full: bool) -> np.ndarray:
        """The rows' block tables, continued past their own blocks with their scratch blocks
        (null blocks after that), ``full``: at the widest a row can need, else as wide as needed."""
        need = -(-seq_lens // self.block_size)
        have = batch.num_blocks[rows]
        if (need - have > self.scratch_per_row).any():
            raise RuntimeError("draft positions reach past a request's blocks and its scratch blocks")
        width = self.max_blocks_per_req + self.scratch_per_row if full else int(need.max())
        own = np.zeros((len(rows), width), dtype=np.int32)
        w = min(width, batch.block_table.shape[1])
        own[:, :w] = batch.block_table[rows, :w]
        cols = np.arange(width)[None, :]
        scratch = self.num_blocks + rows[:, None] * self.scratch_per_row + (cols - have[:, None])
        table = np.where(cols >= have[:, None], scratch, own)
        return np.where(cols < need[:, None], table, 0).astype(np.int32)
