"""The GPU step without waste: persistent input buffers, and CUDA/HIP graphs for decode steps.

``StepBuffers`` holds every per-step input (token ids, positions, slot mapping, query start
locations, sequence lengths, block table) in device tensors allocated once, each with a pinned
host mirror: a step fills the host arrays with numpy and issues one non-blocking copy per
input, so preparing a step allocates nothing and never waits for the device.

A model with several KV cache groups (mixed full/sliding-window layers) has one slot mapping
and one block table buffer per group; ``stage`` and ``graph_metadata`` return one metadata
per group, so captured graphs read every group's table from its own static buffer.

``GraphRunner`` captures the model's forward for pure-decode batches at padded sizes 1, 2, 4,
8, then steps of 8 up to ``max_num_seqs`` (capped at ``MAX_CAPTURE_SIZE``), all reading the
same static buffers. A decode step of ``B`` requests replays the graph of the smallest padded
size ``>= B``; the padding rows decode a dummy token against the null block and write no KV
(slot ``-1``). With speculative decoding, uniform verify steps (every request runs the same
``q = 1 + drafts`` query tokens, ``q`` up to ``1 + num_speculative_tokens``) replay graphs too,
at padded sizes up to ``MAX_VERIFY_CAPTURE_SIZE``: an eager step of a large model at batch 1
is bound by kernel launches, several times a decode step. Other steps (a prefill chunk, mixed
draft counts) run eagerly, or with ``OCTAVO_MIXED_GRAPHS=1`` replay *mixed* graphs when the
attention backend allows it (``supports_mixed_graph_capture``): one graph per padded token count
(``mixed_capture_sizes``), captured over every row of the buffers. A mixed step of ``t`` tokens over ``b`` requests is padded
to the smallest captured count ``T >= t``; row ``b`` takes the ``T - t`` padding tokens as a dummy
chunk that writes no KV and reads the null block, rows after it are empty. The attention kernel's
grid depends only on (tokens, rows) and reads every length from the device, so one graph serves
any mix of prefill chunks and decodes. Without them an eager step of a large model costs tens of
milliseconds of kernel launches, more than its kernels. Steps past the largest count run eagerly;
so does every non-uniform step with speculative decoding. ``--enforce-eager`` turns
capture off. ROCm builds of torch expose HIP graphs through the same ``torch.cuda.CUDAGraph``
API, so the same code serves ``hip_graph``.
"""

from __future__ import annotations

import dataclasses
import logging
import time

import numpy as np
import torch

from octavo import envs
from octavo.attention.backend import CommonAttentionMetadata
from octavo.utils.gc import no_garbage_collection

logger = logging.getLogger(__name__)

MAX_CAPTURE_SIZE = 256
MAX_VERIFY_CAPTURE_SIZE = 8  # verify graphs: small batches, where launches dominate a step
MAX_MIXED_CAPTURE_TOKENS = 16384  # longer mixed steps run eagerly: their kernels dwarf launches
MIXED = 0  # the "query tokens per row" of a mixed graph's key: (tokens, MIXED)
GRAPH_MODES = ("cuda_graph", "hip_graph")


def capture_sizes(max_num_seqs: int, cap: int = MAX_CAPTURE_SIZE) -> list[int]:
    """Padded batch sizes: 1, 2, 4, 8, 16, 24, ... up to ``min(max_num_seqs, cap)``."""
    limit = min(max_num_seqs, cap)
    sizes = [s for s in (1, 2, 4, 8) if s < limit]
    sizes += [s for s in range(16, limit, 8)]
    sizes.append(limit)
    return sorted(set(sizes))


def mixed_capture_sizes(max_tokens: int, cap: int = MAX_MIXED_CAPTURE_TOKENS) -> list[int]:
    """Token counts of the mixed-step graphs: 32, 64, ... 512, then every 512 up to 4096 and
    every 1024 past it, up to ``min(max_tokens, cap)``, which is always one of them. At most
    half of a replayed step's tokens are padding up to 1024, a third past it (the GEMMs there
    are compute-bound, so padding costs time)."""
    limit = min(max_tokens, cap)
    sizes = [s for s in (32, 64, 128, 256, 512) if s < limit]
    sizes += [s for s in range(1024, 4097, 512) if s < limit]
    sizes += list(range(5120, limit, 1024))
    sizes.append(limit)
    return sorted(set(sizes))


class StepBuffers:
    """Device input tensors allocated once, filled from pinned host mirrors each step."""

    def __init__(
        self, max_tokens: int, max_reqs: int, max_blocks_per_req: int, block_size: int,
        device: torch.device, platform, num_kv_groups: int = 1,
    ) -> None:
        self.max_tokens = max_tokens
        self.max_reqs = max_reqs
        self.width = max_blocks_per_req
        self.block_size = block_size
        self.device = device
        pin_memory = bool(platform.is_pin_memory_available())

        def pair(n: int, dtype: torch.dtype):
            host = torch.zeros(n, dtype=dtype, pin_memory=pin_memory)
            return host, host.numpy(), torch.zeros(n, dtype=dtype, device=device)

        self.ids_h, self.ids_np, self.ids = pair(max_tokens, torch.int64)
        self.pos_h, self.pos_np, self.pos = pair(max_tokens, torch.int64)
        self.qsl_h, self.qsl_np, self.qsl = pair(max_reqs + 1, torch.int32)
        self.sl_h, self.sl_np, self.sl = pair(max_reqs, torch.int32)
        # Per KV cache group: slot mapping and block table (group 0's also under the plain names).
        # The tables end in zeros enough for a row of max_tokens keys: a mixed graph's padding
        # row may be longer than a row is wide, and past the last row it reads the null block.
        self.slots = [pair(max_tokens, torch.int64) for _ in range(num_kv_groups)]
        table = max_reqs * max_blocks_per_req + -(-max_tokens // block_size)
        self.bts = [pair(table, torch.int32) for _ in range(num_kv_groups)]
        self.slot_h, self.slot_np, self.slot = self.slots[0]
        self.bt_h, self.bt_np, self.bt = self.bts[0]
        self.li_h, self.li_np, self.li = pair(max(max_reqs, max_tokens), torch.int64)
        # Recorded after each step's copies: the host mirrors are rewritten only once the
        # previous copies have left them (normally long done: a step ends with a read-back).
        self._events = {k: platform.new_event() for k in ("inputs", "indices")}

    def _host_free(self, which: str) -> None:
        ev = self._events[which]
        if ev is not None:
            ev.synchronize()

    def _mark_copied(self, which: str) -> None:
        ev = self._events[which]
        if ev is not None:
            ev.record()

    @staticmethod
    def _copy(dst: torch.Tensor, src: torch.Tensor, n: int) -> None:
        if n:
            dst[:n].copy_(src[:n], non_blocking=True)

    def stage(
        self,
        token_ids: np.ndarray,
        positions: np.ndarray,
        slot_mappings: list[np.ndarray],
        qsl: np.ndarray,
        seq_lens: np.ndarray,
        block_tables,
        rows: np.ndarray,
        max_blocks: int,
        max_query_len: int,
        pad_to: int | None = None,
        pad_tokens: int | None = None,
    ) -> tuple[list[CommonAttentionMetadata], tuple[torch.Tensor, torch.Tensor]]:
        """Copy one step's inputs to the device; returns (metadata per KV cache group,
        (input_ids, positions)).

        ``slot_mappings`` and ``block_tables`` have one entry per group: the step's slots and the
        persistent per-row table (``InputBatch.block_tables[g]``); ``rows`` are this step's rows
        in batch order. With ``pad_to`` (a decode step replayed from a graph), rows ``B ..
        pad_to`` are filled as dummy decodes and the block tables are copied at full width, the
        layout the captured graphs read. With ``pad_tokens`` (a mixed step replayed from a graph)
        the step is padded to that many tokens over every row of the buffers: row ``B`` takes
        the padding tokens as one dummy chunk, the rows after it are empty.
        """
        t, b = len(token_ids), len(rows)
        nb = self.max_reqs if pad_tokens else pad_to or b
        # A decode-padded step is uniform (q tokens per row); a mixed one has pad_tokens tokens.
        n = pad_tokens or (nb * max_query_len if pad_to else t)
        width = self.width if pad_to or pad_tokens else max_blocks
        self._host_free("inputs")
        self.ids_np[:t] = token_ids
        self.pos_np[:t] = positions
        self.qsl_np[: b + 1] = qsl
        self.sl_np[:b] = seq_lens
        if pad_to or pad_tokens:
            self._pad(t, b, n, nb, max_query_len, mixed=bool(pad_tokens))
        copies = [(self.ids, self.ids_h, n), (self.pos, self.pos_h, n), (self.qsl, self.qsl_h, nb + 1),
                  (self.sl, self.sl_h, nb)]
        copies += self._stage_tables(slot_mappings, block_tables, rows, t, n, nb, width)
        for dst, src, k in copies:
            self._copy(dst, src, k)
        self._mark_copied("inputs")
        md = CommonAttentionMetadata(
            query_start_loc=self.qsl[: b + 1],
            seq_lens=self.sl[:b],
            block_table=self.bt[: nb * width].view(nb, width)[:b],
            slot_mapping=self.slot[:t],
            query_start_loc_cpu=qsl,
            seq_lens_cpu=seq_lens,
            num_reqs=b,
            num_actual_tokens=t,
            max_query_len=max_query_len,
            max_seq_len=int(seq_lens.max()),
            block_size=self.block_size,
        )
        mds = [md] + [
            dataclasses.replace(md, block_table=bt[: nb * width].view(nb, width)[:b], slot_mapping=slot[:t])
            for (_, _, slot), (_, _, bt) in zip(self.slots[1:], self.bts[1:], strict=True)
        ]
        return mds, (self.ids[:t], self.pos[:t])

    def _pad(self, t: int, b: int, n: int, nb: int, max_query_len: int, mixed: bool) -> None:
        """Padding tokens ``t .. n`` and rows ``b .. nb`` of the host mirrors: dummy rows of
        ``max_query_len`` tokens each, or (``mixed``) one dummy chunk in row ``b`` and empty rows
        after it."""
        self.ids_np[t:n] = 0
        self.pos_np[t:n] = 0
        if not mixed:
            self.qsl_np[b + 1 : nb + 1] = np.arange(b + 1, nb + 1) * max_query_len
            self.sl_np[b:nb] = max_query_len
            return
        if b >= nb or n < t:
            raise ValueError(f"a mixed graph of {n} tokens over {nb} rows cannot pad {t} tokens of {b} requests")
        self.qsl_np[b + 1 : nb + 1] = n
        self.sl_np[b] = n - t
        self.sl_np[b + 1 : nb] = 0

    def _stage_tables(self, slot_mappings, block_tables, rows: np.ndarray, t: int, n: int, nb: int, width: int):
        """Fill each group's slot and block-table host mirrors (padding rows write no KV and
        read the null block); returns their (device, host, count) copies."""
        copies = []
        for (slot_h, slot_np, slot), (bt_h, bt_np, bt), sm, table in zip(
            self.slots, self.bts, slot_mappings, block_tables, strict=True
        ):
            slot_np[:t] = sm
            slot_np[t:n] = -1
            view = bt_np[: nb * width].reshape(nb, width)
            view[: len(rows)] = table[rows, :width]
            view[len(rows) :] = 0
            copies += [(slot, slot_h, n), (bt, bt_h, nb * width)]
        return copies

    def indices(self, idx: np.ndarray) -> torch.Tensor:
        """A device copy of a small index array (the rows to compute logits for)."""
        k = len(idx)
        self._host_free("indices")
        self.li_np[:k] = idx
        self._copy(self.li, self.li_h, k)
        self._mark_copied("indices")
        return self.li[:k]

    def graph_metadata(self, size: int, max_seq_len: int, q: int = 1) -> list[CommonAttentionMetadata]:
        """Static metadata of a captured graph of ``size`` rows of ``q`` query tokens each
        (views of the buffers), one per KV cache group."""
        return self._static_metadata(size, np.arange(size + 1) * q, q, max_seq_len)

    def mixed_graph_metadata(self, tokens: int, max_seq_len: int) -> list[CommonAttentionMetadata]:
        """Static metadata of a captured mixed graph of ``tokens`` tokens over every row (views of
        the buffers), one per KV cache group. Its ``max_query_len`` is the token count: the
        attention launch takes the prefill-sized tiles, which serve any mix of rows."""
        qsl = np.full(self.max_reqs + 1, tokens, dtype=np.int64)
        qsl[0] = 0
        return self._static_metadata(self.max_reqs, qsl, tokens, max_seq_len)

    def _static_metadata(self, rows: int, qsl: np.ndarray, max_query_len: int, max_seq_len: int):
        """Metadata over the first ``rows`` rows at full width and ``qsl[-1]`` tokens, one per KV
        cache group; ``qsl`` is the capture's layout (host copy only: replays restage it)."""
        w, t = self.width, int(qsl[-1])
        md = CommonAttentionMetadata(
            query_start_loc=self.qsl[: rows + 1],
            seq_lens=self.sl[:rows],
            block_table=self.bt[: rows * w].view(rows, w),
            slot_mapping=self.slot[:t],
            query_start_loc_cpu=qsl,
            seq_lens_cpu=np.diff(qsl),
            num_reqs=rows,
            num_actual_tokens=t,
            max_query_len=max_query_len,
            max_seq_len=max_seq_len,
            block_size=self.block_size,
        )
        return [md] + [
            dataclasses.replace(md, block_table=bt[: rows * w].view(rows, w), slot_mapping=slot[:t])
            for (_, _, slot), (_, _, bt) in zip(self.slots[1:], self.bts[1:], strict=True)
        ]

    def fill_dummy_mixed(self, tokens: int) -> None:
        """Make the device buffers a valid mixed batch for capture: row 0 a dummy chunk of
        ``tokens`` tokens (reading the null block, writing no KV), every other row empty."""
        rows = self.max_reqs
        self.ids[:tokens].zero_()
        self.pos[:tokens].zero_()
        self.qsl[: rows + 1].fill_(tokens)
        self.qsl[0].zero_()
        self.sl[:rows].zero_()
        self.sl[0].fill_(tokens)
        for (_, _, slot), (_, _, bt) in zip(self.slots, self.bts, strict=True):
            slot[:tokens].fill_(-1)
            bt[: rows * self.width].zero_()

    def fill_dummy(self, size: int, q: int = 1) -> None:
        """Make the device buffers a valid batch of ``size`` dummy rows of ``q`` query tokens
        each, reading the null block and writing no KV (for capture)."""
        t = size * q
        self.ids[:t].zero_()
        self.pos[:t].zero_()
        self.qsl[: size + 1].copy_(torch.arange(size + 1, dtype=torch.int32, device=self.device) * q)
        self.sl[:size].fill_(q)
        for (_, _, slot), (_, _, bt) in zip(self.slots, self.bts, strict=True):
            slot[:t].fill_(-1)
            bt[: size * self.width].zero_()


def graph_mode(runner) -> tuple[str, str]:
    """(mode, reason): the graph capture this runner will use, ``none`` with the reason why not."""
    choice = runner.platform.get_graph_capture(runner.config)  # --enforce-eager included
    if choice.value not in GRAPH_MODES:
        return "none", choice.reason
    mode = choice.value
    if not getattr(runner.attn_backend, "supports_graph_capture", False):
        return "none", f"attention backend {runner.attn_backend.name} cannot be captured"
    mixed = mixed_sizes_for(runner)
    return mode, f"decode steps and mixed steps up to {mixed[-1]} tokens" if mixed else "decode steps"


def mixed_sizes_for(runner) -> list[int]:
    """The mixed-graph token counts of a runner that captures graphs: none when its attention
    backend reads host lengths (``supports_mixed_graph_capture``), with speculative decoding
    (its non-uniform verify steps stay eager) and unless ``OCTAVO_MIXED_GRAPHS=1`` (opt-in)."""
    if not getattr(runner.attn_backend, "supports_mixed_graph_capture", False):
        return []
    if runner.config.speculative_config is not None or not envs.OCTAVO_MIXED_GRAPHS:
        return []
    sc = runner.config.scheduler_config
    return mixed_capture_sizes(min(sc.max_num_batched_tokens, sc.max_num_seqs * runner.max_model_len))


class GraphRunner:
    """Captured graphs, one per (padded batch size, query tokens per row), sharing one memory
    pool: decode (``q = 1``) at ``sizes``; each of ``verify_query_lens`` at the sizes up to
    ``MAX_VERIFY_CAPTURE_SIZE`` whose tokens fit the buffers; and one per ``mixed_sizes`` token
    count (key ``(tokens, MIXED)``) that fits the buffers, whose hidden states all land in one
    buffer outside the pool (``mixed_out``), so the pool holds only the largest one's
    activations."""

    def __init__(
        self, runner, sizes: list[int], verify_query_lens: tuple[int, ...] = (), mixed_sizes: list[int] = (),
    ) -> None:
        self.runner = runner
        self.buffers: StepBuffers = runner.step_buffers
        self.sizes = sorted(sizes)
        self.max_size = self.sizes[-1]
        self.plan: dict[int, list[int]] = {1: self.sizes}
        for q in verify_query_lens:
            fit = [s for s in self.sizes if s <= MAX_VERIFY_CAPTURE_SIZE and s * q <= self.buffers.max_tokens]
            if fit:
                self.plan[q] = fit
        self.mixed_sizes = [t for t in sorted(mixed_sizes) if t <= self.buffers.max_tokens]
        self.mixed_out: torch.Tensor | None = None
        self.graphs: dict[tuple[int, int], tuple[object, torch.Tensor, object]] = {}
        self.enabled = True  # benchmarks flip this to time eager steps on the same engine
        self.mixed_enabled = True  # ... or eager mixed steps with decode graphs kept
        self.verify_replays = 0  # verify steps replayed (tests and benchmarks read it)
        self.mixed_replays = 0  # mixed steps replayed
        self.pool_bytes = 0
        self.capture_seconds = 0.0

    def padded_size(self, num_reqs: int, num_tokens: int, max_query_len: int) -> int | None:
        """The graph size (rows) a step replays, or None when it runs eagerly: the step must be
        uniform (``max_query_len`` tokens in every row) with a captured ``max_query_len``."""
        sizes = self.plan.get(max_query_len)
        if not self.enabled or sizes is None or num_tokens != num_reqs * max_query_len:
            return None
        for s in sizes:
            if s >= num_reqs:
                return s
        return None

    def mixed_size(self, num_reqs: int, num_tokens: int, max_query_len: int) -> int | None:
        """The token count of the mixed graph a step replays, or None (eager): for steps no
        decode/verify graph takes, of at most the largest mixed count of tokens, with a row left
        over for the padding. Pure decode steps past the decode graphs stay eager: the mixed
        graphs' prefill-sized attention tiles would hold one query token per request."""
        if self.padded_size(num_reqs, num_tokens, max_query_len) is not None:
            return None
        return self._mixed_tokens(num_reqs, num_tokens, max_query_len)

    def _mixed_tokens(self, num_reqs: int, num_tokens: int, max_query_len: int) -> int | None:
        """``mixed_size`` for a step no decode/verify graph takes."""
        if not (self.enabled and self.mixed_enabled and self.mixed_sizes) or max_query_len <= 1:
            return None
        if num_reqs >= self.buffers.max_reqs:
            return None
        for t in self.mixed_sizes:
            if t >= num_tokens:
                return t
        return None

    def graph_key(self, num_reqs: int, num_tokens: int, max_query_len: int) -> tuple[int, int] | None:
        """The graph a step replays: ``(rows, max_query_len)`` of a decode/verify graph (stage
        with ``pad_to=rows``), ``(tokens, MIXED)`` of a mixed one (``pad_tokens=tokens``), or
        None (eager). Staging and replay both ask this, so they always agree."""
        size = self.padded_size(num_reqs, num_tokens, max_query_len)
        if size is not None:
            return size, max_query_len
        tokens = self._mixed_tokens(num_reqs, num_tokens, max_query_len)
        return None if tokens is None else (tokens, MIXED)

    @torch.inference_mode()
    def capture(self) -> None:
        with no_garbage_collection():
            self._capture()

    def _capture(self) -> None:
        runner = self.runner
        model = runner.model
        platform = runner.platform
        t0 = time.perf_counter()
        platform.synchronize()
        free_before = platform.mem_get_info()[0]
        pool = platform.graph_pool_handle()
        # Largest first (the rest reuse its pool).
        shapes = [(s, q) for q, sizes in self.plan.items() for s in sizes] + [(t, MIXED) for t in self.mixed_sizes]
        for size, q in sorted(shapes, key=lambda sq: -sq[0] * max(sq[1], 1)):
            self.graphs[(size, q)] = self._capture_one(model, platform, pool, size, q)
        platform.synchronize()
        self.pool_bytes = max(0, free_before - platform.mem_get_info()[0])
        self.capture_seconds = time.perf_counter() - t0

    def _capture_one(self, model, platform, pool, size: int, q: int):
        """One graph: ``size`` rows of ``q`` tokens, or (``q == MIXED``) a mixed step of ``size``
        tokens whose hidden states it copies into ``mixed_out``."""
        buf, runner = self.buffers, self.runner
        if q == MIXED:
            buf.fill_dummy_mixed(size)
            md = runner.build_attn_metadata(buf.mixed_graph_metadata(size, runner.max_model_len))
            ids, pos = buf.ids[:size], buf.pos[:size]
        else:
            buf.fill_dummy(size, q)
            md = runner.build_attn_metadata(buf.graph_metadata(size, runner.max_model_len, q))
            ids, pos = buf.ids[: size * q], buf.pos[: size * q]
        for _ in range(2):  # warm up: Triton compiles, cuBLAS picks its kernels
            warm = model(ids, pos, md)
        if q == MIXED and self.mixed_out is None:  # outside the pool, as large as the largest
            self.mixed_out = torch.empty((self.mixed_sizes[-1], *warm.shape[1:]), dtype=warm.dtype, device=warm.device)
        del warm
        platform.synchronize()
        graph = platform.new_graph()
        with platform.graph_capture_context(graph, pool):
            out = model(ids, pos, md)
            if q == MIXED:
                self.mixed_out[:size].copy_(out)
        if q == MIXED:
            del out  # its pool memory is free for the next (smaller) capture
            out = self.mixed_out
        return graph, out, md

    def replay(self, md: CommonAttentionMetadata) -> torch.Tensor | None:
        """Replay for a step whose inputs were staged as its ``graph_key`` says."""
        key = self.graph_key(md.num_reqs, md.num_actual_tokens, md.max_query_len)
        if key is None:
            return None
        graph, out, _ = self.graphs[key]
        graph.replay()
        self.verify_replays += key[1] > 1
        self.mixed_replays += key[1] == MIXED
        return out[: md.num_actual_tokens]


def maybe_capture(runner) -> GraphRunner | None:
    """Capture decode graphs when the platform, backend and flags allow; log the decision."""
    mode, reason = graph_mode(runner)
    if mode == "none" or runner.step_buffers is None:
        logger.info("graphs: none (%s)", reason)
        return None
    sizes = capture_sizes(runner.config.scheduler_config.max_num_seqs)
    spec = runner.config.speculative_config
    verify = tuple(range(2, spec.num_speculative_tokens + 2)) if spec is not None else ()
    gr = GraphRunner(runner, sizes, verify, mixed_sizes_for(runner))
    gr.capture()
    mixed = gr.mixed_sizes
    logger.info(
        "graphs: %s for decode batches of %d sizes (%s)%s%s in %.1fs, pool %.0f MiB",
        mode, len(sizes), ",".join(map(str, sizes)),
        f" and uniform verify batches of {verify[0]}-{verify[-1]} tokens per request" if verify else "",
        f" and mixed steps of {len(mixed)} token counts ({','.join(map(str, mixed))})" if mixed else "",
        gr.capture_seconds, gr.pool_bytes / 2**20,
    )
    return gr


def make_step_buffers(runner) -> StepBuffers | None:
    """Persistent device inputs for accelerator runs (the CPU path keeps zero-copy numpy)."""
    if runner.platform.device_is_host():
        return None
    sc = runner.config.scheduler_config
    max_reqs = sc.max_num_seqs + 1  # a mixed graph's padding row
    max_tokens = max(sc.max_num_batched_tokens, max_reqs)
    return StepBuffers(
        max_tokens, max_reqs, runner.input_batch.max_blocks_per_req, runner.block_size,
        runner.device, runner.platform, runner.num_kv_groups,
    )
