"""Turns a SchedulerOutput into one flattened forward pass and sampled tokens.

Per step: apply deltas to the persistent ``InputBatch``; lay requests out in scheduler order;
build token ids, positions, slot mapping, query start locations, sequence lengths and block
tables with array ops (no per-token Python); run the model; keep the hidden state of the last
scheduled token of each request whose known tokens are then all computed (the others are
mid-prompt chunks and sample nothing); sample.

Speculative decoding: a request verifying ``k`` drafts computes its last known token and the
drafts (written after its known tokens in the input batch) as one chunk of ``k + 1`` query
tokens through the same paged attention; all ``k + 1`` positions are sampled and
``octavo.spec_decode.rejection_sampler`` keeps the accepted prefix plus one token. With async
scheduling the next step is scheduled before the accepted count is known (the scheduler counts
every draft accepted): when it is launched the runner first waits for the step in flight's
sampled tokens (not its draft passes), appends them to the input batch, rolls the new step's
computed counts back by the drafts that step rejected, and proposes the drafts the engine asked
for meanwhile (placeholders until then); the new step is then staged as after a synchronous one.

KV cache groups (``octavo/core/kv_cache_groups.py``): a model that mixes full and sliding-window
layers gets one block table and slot mapping per group; each attention layer reads its group's
(``KVGroupMetadata``) and its group slot's KV tensor. A model with one group runs exactly the
single-table path.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass

import numpy as np
import torch

from octavo.attention.backend import CommonAttentionMetadata, KVGroupMetadata
from octavo.attention.kv_cache_dtype import kv_cache_torch_dtype
from octavo.config import OctavoConfig
from octavo.core.sampler import (
    BitmaskKernel,
    FirstMaxKernel,
    LogprobsTensors,
    Sampler,
    apply_token_bitmask,
    apply_token_bitmask_xgrammar,
    gather_logprobs,
)
from octavo.core.sampler import token_seed as token_seed  # re-exported
from octavo.core.scheduler_output import ModelRunnerOutput, SchedulerOutput
from octavo.distributed.parallel_state import get_tp
from octavo.spec_decode.device_drafts import DEVICE_DRAFT, DeviceDrafts, grid_drafts_from_inputs
from octavo.spec_decode.rejection_sampler import (
    DraftLayout,
    layout_structure,
    make_layout,
    verify_one_hot_drafts,
    verify_one_hot_drafts_host,
)
from octavo.worker.cuda_graph import MIXED
from octavo.worker.input_batch import InputBatch
from octavo.worker.step_handle import ReadyStep, SampledTokens, StepHandle, logprob_dicts
from octavo.worker.transfer import DeviceTransfer

logger = logging.getLogger(__name__)


@dataclass
class StepInputs:
    """One step laid out for the forward: requests in scheduler order, flattened tokens."""

    req_ids: list[str]
    rows: np.ndarray  # [B] input-batch row of each request
    input_ids: torch.Tensor  # [T] on the device
    positions: torch.Tensor  # [T] on the device
    metadata: CommonAttentionMetadata  # of KV cache group 0
    group_metadata: list[CommonAttentionMetadata]  # one per KV cache group (metadata first)
    sample_mask: np.ndarray  # [B] bool: the request samples a token this step
    has_pending: np.ndarray  # [B] bool: its last input token is still on the device
    # [sum(drafts + 1) over sampling requests] token indices to sample: a request's last token,
    # preceded by the positions of its drafts' predecessors when it verifies drafts.
    logits_indices: np.ndarray
    num_drafts: np.ndarray  # [B] draft tokens each request verifies this step

class ModelRunner:
    def __init__(self, config: OctavoConfig, platform, local_rank: int = 0) -> None:
        self.config = config
        self.platform = platform
        mc = config.model_config
        self.device = platform.device(local_rank)
        self.transfer = DeviceTransfer(platform, self.device)
        self.worker_setup = platform.setup_worker(local_rank, config.parallel_config.tensor_parallel_size)
        self.num_kv_heads_local = mc.kv_heads_per_rank(config.parallel_config.tensor_parallel_size)
        self.dtype = mc.dtype
        self.kv_dtype = kv_cache_torch_dtype(config.cache_config.kv_cache_dtype, mc.dtype)
        self.block_size = config.cache_config.block_size
        self.max_model_len = mc.max_model_len
        self.attn_backend, self.skipped_backends = self._choose_attn_backend()
        self.model = None
        # Length-dependent RoPE (longrope, dynamic): the model takes rope keys for positions.
        self.length_rope = None
        self.quant_kernels = None  # octavo.quantization.linear.KernelChoice when quantized
        self.kv_caches: list[torch.Tensor] = []
        self.num_blocks = 0
        self.kv_cache_groups = config.cache_config.kv_cache_groups
        self.num_kv_groups = len(config.cache_config.group_windows)
        self.input_batch = InputBatch(
            config.scheduler_config.max_num_seqs, self.max_model_len, self.block_size, self.num_kv_groups
        )
        self.sampler = Sampler(_bitmask_kernel(platform), _first_max_kernel(platform))
        self.load_seconds = 0.0
        # GPU step: persistent device inputs (None on CPU) and captured decode and mixed graphs.
        from octavo.worker.cuda_graph import make_step_buffers

        self.step_buffers = make_step_buffers(self)
        self.graph_runner = None
        self.cpu_graph = None  # the CPU graph mode (octavo.worker.cpu_graph) when it is on
        # Async scheduling: launched steps not yet resulted (at most one when launching).
        self._unresulted: list[StepHandle] = []
        # method draft_model: octavo.spec_decode.draft_model.DraftModel; eagle / eagle3: its
        # subclass octavo.spec_decode.eagle.EagleDrafter, which also reads each step's hidden states.
        self.drafter = None
        self.eagle = None
        spec = config.speculative_config
        if spec is not None and spec.method == "draft_model":
            from octavo.spec_decode.draft_model import DraftModel

            self.drafter = DraftModel(config, platform, self.device, self.transfer)
        elif spec is not None and spec.method in ("eagle", "eagle3"):
            from octavo.spec_decode.eagle import EagleDrafter

            self.drafter = self.eagle = EagleDrafter(config, platform, self.device, self.transfer)
        # On an accelerator, and wherever steps are scheduled ahead (async scheduling), the
        # drafter's drafts stay on the device until verified (the scheduler gets placeholders):
        # see octavo.spec_decode.device_drafts.
        self.device_drafts = None
        if self.drafter is not None and (not self.transfer.host or config.scheduler_config.async_scheduling):
            self.device_drafts = DeviceDrafts(config.scheduler_config.max_num_seqs, spec.num_speculative_tokens,
                                              self.device, self.transfer)
        self._step_device_drafts: tuple[np.ndarray, np.ndarray] | None = None  # (rows, counts) this step
        # Drafts asked for while the step they follow was still in flight: (request ids, counts),
        # proposed when the next step is staged (``_fulfil_deferred``).
        self._deferred: tuple[list[str], np.ndarray] | None = None

    # -- setup ----------------------------------------------------------------------------
    def _choose_attn_backend(self) -> tuple[type, list]:
        """(the platform's attention backend, the candidates it skipped and why)."""
        mc = self.config.model_config
        return self.platform.get_attn_backend(
            mc.head_size, mc.dtype, self.config.cache_config.kv_cache_dtype, self.block_size
        )

    def load_model(self) -> None:
        from octavo.models.layers import bind_fused_ops
        from octavo.models.length_rope import length_rope
        from octavo.models.loader import init_dummy_weights, load_weights
        from octavo.models.registry import resolve_architecture

        t0 = time.perf_counter()
        mc = self.config.model_config
        _, model_cls = resolve_architecture([mc.architecture])
        old = torch.get_default_dtype()
        torch.set_default_dtype(mc.dtype)
        try:
            with torch.device(self.device):
                model = model_cls(mc.hf_config, self.attn_backend, mc.dtype, self.max_model_len)
        finally:
            torch.set_default_dtype(old)
        self.quant_kernels = self._quantize(model)
        if mc.load_format == "dummy":
            init_dummy_weights(model, seed=mc.seed)
            if self.quant_kernels is not None:
                from octavo.quantization.linear import init_dummy_quantized

                init_dummy_quantized(model, seed=mc.seed)
        else:
            load_weights(model, mc.model, mc.load_format)
            from octavo.models.kv_scales import apply_kv_scales

            apply_kv_scales(model, self.config.cache_config.kv_cache_dtype,
                            getattr(mc.hf_config, "quantization_config", None))
        bind_fused_ops(model, self.platform.fused_op_kernels, self.platform.decode_gemv_policy())
        self.model = model.eval()
        self.length_rope = length_rope(mc.hf_config, self.max_model_len)
        if self.drafter is not None:
            self.drafter.load(self.model)
        self.load_seconds = time.perf_counter() - t0

    def graph_choice(self) -> tuple[str, str]:
        """(graph mode, why) for this loaded model: what the platform asks for, or ``none`` with
        the reason the configuration cannot honour it (reported by the startup log)."""
        if self.platform.get_graph_capture(self.config).value == "torch_compile":
            from octavo.worker.cpu_graph import graph_mode
        else:
            from octavo.worker.cuda_graph import graph_mode
        return graph_mode(self)

    def _quantize(self, model):
        """Hand the linear layers to the quantization method in effect (None: unquantized)."""
        mc = self.config.model_config
        if mc.quantization is None:
            return None
        from octavo.quantization import get_quant_config
        from octavo.quantization.linear import quantize_model

        qconfig = get_quant_config(mc.quantization, getattr(mc.hf_config, "quantization_config", None))
        logger.info("quantization: %s", qconfig.describe())
        return quantize_model(model, qconfig, dict(getattr(self.platform, "quant_kernel_priority", {})))

    def model_bytes(self) -> int:
        assert self.model is not None
        from octavo.quantization.linear import quantized_bytes

        draft = self.drafter.model_bytes() if self.drafter is not None else 0
        return sum(p.numel() * p.element_size() for p in self.model.parameters()) + quantized_bytes(self.model) + draft

    def kv_bytes_per_block(self) -> int:
        """Bytes of one pool block: the target's K/V, and the draft model's when there is one."""
        mc = self.config.model_config
        shape = self.attn_backend.get_kv_cache_shape(1, self.block_size, self.num_kv_heads_local, mc.head_size)
        draft = self.drafter.kv_bytes_per_block() if self.drafter is not None else 0
        return int(np.prod(shape)) * self.kv_dtype.itemsize * self.num_kv_tensors + draft

    @property
    def num_kv_tensors(self) -> int:
        """KV tensors: one per layer, or one per group slot when layers form several groups."""
        from octavo.core.kv_cache_groups import num_kv_tensors

        return num_kv_tensors(self.kv_cache_groups) if self.kv_cache_groups else self.config.model_config.num_layers

    def build_attn_metadata(self, group_metadata: list[CommonAttentionMetadata]):
        """The backend's metadata of a step: one object, or one per KV cache group."""
        build = self.attn_backend.build_metadata
        if len(group_metadata) == 1:
            return build(group_metadata[0])
        return KVGroupMetadata([build(md) for md in group_metadata])

    def determine_num_blocks(self) -> int:
        cc = self.config.cache_config
        if cc.num_gpu_blocks_override is not None:
            return cc.num_gpu_blocks_override
        if self.platform.supports_memory_profiling():  # measure activations and the graph pool
            from octavo.worker.memory_profile import profile_kv_cache_budget

            budget = profile_kv_cache_budget(self)
        else:
            budget = self.platform.kv_cache_memory_bytes(self.config, self.model_bytes(), 0)
        if self.drafter is not None:  # the draft's scratch blocks come out of the same budget
            budget -= self.drafter.scratch_bytes()
        num = max(budget, 0) // self.kv_bytes_per_block()
        # More blocks than every sequence at full length (x4 for the prefix cache) buy nothing.
        sc = self.config.scheduler_config
        useful = 4 * sc.max_num_seqs * self.input_batch.max_blocks_per_req * self.num_kv_groups + 1
        return int(min(num, useful))

    def initialize_kv_cache(self, num_blocks: int) -> None:
        mc = self.config.model_config
        from octavo.core.kv_cache_groups import max_request_tokens

        cc, sc = self.config.cache_config, self.config.scheduler_config
        fits = num_blocks * self.block_size
        if self.num_kv_groups > 1:  # the longest sequence the groups' blocks hold
            fits = max_request_tokens(num_blocks, self.block_size, cc.group_windows, sc.max_num_batched_tokens)
        if fits < self.max_model_len and cc.num_gpu_blocks_override is None:
            raise ValueError(
                f"the KV cache holds {fits} tokens, fewer than "
                f"--max-model-len {self.max_model_len}; lower --max-model-len or give the cache "
                "more memory"
            )
        shape = self.attn_backend.get_kv_cache_shape(num_blocks, self.block_size, self.num_kv_heads_local, mc.head_size)
        # Host memory: uninitialised, so no page is touched until a token is written there (a
        # zero fill costs seconds per GiB at startup); the kernels read only slots the slot
        # mapping wrote (positions < seq_len, inside any sliding window). Device memory is
        # zeroed (a fast memset): padded graph rows there read the null block.
        alloc = torch.empty if self.platform.device_is_host() else torch.zeros
        self.kv_caches = [alloc(shape, dtype=self.kv_dtype, device=self.device) for _ in range(self.num_kv_tensors)]
        self._bind_kv_caches()
        self.num_blocks = num_blocks
        if self.drafter is not None:
            self.drafter.initialize_kv_cache(num_blocks)
        from octavo.worker.cuda_graph import maybe_capture

        if self.platform.get_graph_capture(self.config).value == "torch_compile":
            from octavo.worker.cpu_graph import maybe_compile

            self.cpu_graph = maybe_compile(self)
        else:
            self.graph_runner = maybe_capture(self)

    def _bind_kv_caches(self) -> None:
        """Give each attention layer its KV tensor (and, with several groups, its group)."""
        layers = self.model.attention_layers()
        if not self.kv_cache_groups or len(self.kv_cache_groups) == 1:
            for layer, cache in zip(layers, self.kv_caches, strict=True):
                layer.kv_cache = cache
            return
        from octavo.core.kv_cache_groups import layer_slots

        for layer, (group, slot) in zip(layers, layer_slots(self.kv_cache_groups, len(layers)), strict=True):
            layer.kv_cache = self.kv_caches[slot]
            layer.kv_group = group
        logger.info(
            "KV cache groups: %s over %d KV tensors (blocks behind a window are freed per group)",
            ", ".join(f"{'full' if g.sliding_window is None else f'window {g.sliding_window}'} x{len(g.layers)} layers"
                      for g in self.kv_cache_groups),
            len(self.kv_caches),
        )

    # -- one step -------------------------------------------------------------------------
    def _update_states(self, so: SchedulerOutput) -> None:
        batch = self.input_batch
        for rid in so.finished_req_ids | so.preempted_req_ids:
            batch.remove_request(rid)
        for new in so.scheduled_new_reqs:
            batch.remove_request(new.req_id)
            batch.add_request(new)
        for c in so.scheduled_cached_reqs:
            row = batch.row_of[c.req_id]
            batch.append_block_ids(row, c.new_block_ids)
            batch.num_computed[row] = c.num_computed_tokens
        spec, on_device = so.scheduled_spec_decode_tokens, {}
        if self.device_drafts is not None:
            spec, on_device = DeviceDrafts.split(spec)
            if self.eagle is None:
                self.drafter.in_step.forget()
        for rid, drafts in spec.items():
            batch.write_drafts(batch.row_of[rid], drafts)
        self._step_device_drafts = self._device_draft_rows(on_device) if on_device else None

    def _device_draft_rows(self, on_device: dict[str, int]) -> tuple[np.ndarray, np.ndarray] | None:
        """(rows, counts) of this step's drafts that stay on the device; the drafts of rows whose
        sampling reads their history on the host (penalties, bad words) are read back here."""
        batch = self.input_batch
        rows = np.fromiter((batch.row_of[r] for r in on_device), dtype=np.int64, count=len(on_device))
        counts = np.fromiter(on_device.values(), dtype=np.int64, count=len(on_device))
        host = batch.has_penalty[rows] | batch.has_bad_words[rows]
        if host.any():
            for row, drafts in zip(rows[host], self.device_drafts.materialize(rows[host], counts[host]), strict=True):
                batch.write_drafts(int(row), drafts)
            rows, counts = rows[~host], counts[~host]
        return (rows, counts) if len(rows) else None

    def _prepare_inputs(self, so: SchedulerOutput) -> StepInputs:
        batch = self.input_batch
        req_ids = list(so.num_scheduled_tokens)
        rows = np.fromiter((batch.row_of[r] for r in req_ids), dtype=np.int64, count=len(req_ids))
        n = np.fromiter((so.num_scheduled_tokens[r] for r in req_ids), dtype=np.int64, count=len(req_ids))
        computed = batch.num_computed[rows]
        cu = np.cumsum(n)
        qsl = np.zeros(len(rows) + 1, dtype=np.int64)
        qsl[1:] = cu
        total = int(cu[-1])
        req_idx = np.repeat(np.arange(len(rows)), n)
        positions = computed[req_idx] + (np.arange(total) - qsl[:-1][req_idx])
        token_rows = rows[req_idx]
        token_ids = batch.token_ids[token_rows, positions]
        bs = self.block_size
        block_idx, offset = positions // bs, positions % bs
        slot_mappings = [t[token_rows, block_idx].astype(np.int64) * bs + offset for t in batch.block_tables]
        seq_lens = computed + n
        max_blocks = int(-(-seq_lens.max() // bs))
        src, has_pending = self._in_flight_inputs(rows, seq_lens)
        num_drafts = _num_drafts(so.scheduled_spec_decode_tokens, req_ids)
        known = batch.num_tokens[rows] + has_pending
        if num_drafts is not None:
            known += num_drafts
        if (seq_lens > known).any():
            raise RuntimeError("a step computes tokens that are neither known nor in flight")
        sample_mask = seq_lens == known
        logits_indices = _logits_indices(cu, sample_mask, num_drafts)
        fixup = None
        if has_pending.any():  # (token index in this step, index in the previous step's samples)
            fixup = (cu[has_pending] - 1, src[has_pending])

        if self.length_rope is not None:  # what the model reads as positions: rope keys
            positions = self.length_rope.keys(positions, batch.num_prompt_tokens[token_rows], known[req_idx])
        if self.step_buffers is not None:  # accelerator: pinned staging into persistent buffers
            q = int(n.max())
            key = self.graph_runner.graph_key(len(rows), total, q) if self.graph_runner else None
            mixed = key is not None and key[1] == MIXED
            mds, inputs = self.step_buffers.stage(
                token_ids, positions, slot_mappings, qsl, seq_lens, batch.block_tables, rows,
                max_blocks, q, pad_to=key[0] if key and not mixed else None, pad_tokens=key[0] if mixed else None,
            )
        else:
            if self.cpu_graph is not None and self.cpu_graph.accepts(len(rows), total, int(n.max())):
                max_blocks = batch.max_blocks_per_req  # full width: the compiled graph's shape
            tables = [t[rows, :max_blocks] for t in batch.block_tables]
            mds, inputs = self._host_inputs(token_ids, positions, slot_mappings, qsl, seq_lens, tables, int(n.max()))
        self._apply_fixup(inputs[0], fixup)
        if self._step_device_drafts is not None:
            self.device_drafts.write_inputs(inputs[0], rows, qsl, *self._step_device_drafts)
        if num_drafts is None:
            num_drafts = np.zeros(len(req_ids), dtype=np.int64)
        return StepInputs(req_ids, rows, inputs[0], inputs[1], mds[0], mds, sample_mask, has_pending,
                          logits_indices, num_drafts)

    def _in_flight_inputs(self, rows: np.ndarray, seq_lens: np.ndarray) -> tuple[np.ndarray | None, np.ndarray]:
        """Requests whose input token this step is the previous (still running) step's sample.

        Returns (index of each request's token in that step's samples, or None when no step is
        pending; mask of the requests that take such a token).
        """
        batch = self.input_batch
        pending = self._pending()
        if pending is None:
            return None, np.zeros(len(rows), dtype=bool)
        src_of_row = np.full(batch.max_num_reqs, -1, dtype=np.int64)
        src_of_row[pending.rows] = np.arange(len(pending.rows))
        serial_of_row = np.zeros(batch.max_num_reqs, dtype=np.int64)
        serial_of_row[pending.rows] = pending.serials
        src = src_of_row[rows]
        same_occupancy = serial_of_row[rows] == batch.serial[rows]
        return src, (src >= 0) & same_occupancy & (seq_lens > batch.num_tokens[rows])

    def _host_inputs(self, token_ids, positions, slot_mappings, qsl, seq_lens, block_tables, max_query_len):
        """Inputs as tensors straight from the numpy arrays (the CPU path: zero-copy); one
        metadata per KV cache group, sharing everything but the block table and slots."""
        dev = self.transfer.to_device
        md = CommonAttentionMetadata(
            query_start_loc=dev(qsl.astype(np.int32)),
            seq_lens=dev(seq_lens.astype(np.int32)),
            block_table=dev(block_tables[0]),
            slot_mapping=dev(slot_mappings[0]),
            query_start_loc_cpu=qsl,
            seq_lens_cpu=seq_lens,
            num_reqs=len(seq_lens),
            num_actual_tokens=len(token_ids),
            max_query_len=max_query_len,
            max_seq_len=int(seq_lens.max()),
            block_size=self.block_size,
        )
        mds = [md] + [
            dataclasses.replace(md, block_table=dev(bt), slot_mapping=dev(sm))
            for bt, sm in zip(block_tables[1:], slot_mappings[1:], strict=True)
        ]
        return mds, (dev(token_ids), dev(positions))

    def _apply_fixup(self, input_ids: torch.Tensor, fixup: tuple[np.ndarray, np.ndarray] | None) -> None:
        """Write the previous step's sampled tokens, still on the device, into ``input_ids``."""
        if fixup is None:
            return
        dst, src = fixup
        values = self._pending().device[self.transfer.to_device(src)]
        input_ids.index_copy_(0, self.transfer.to_device(dst), values.to(input_ids.dtype))

    def _compute_prompt_logprobs(
        self, req_ids: list[str], rows: np.ndarray, md: CommonAttentionMetadata, hidden: torch.Tensor
    ) -> dict[str, tuple[int, list[dict[int, tuple[float, int]]]]] | None:
        """Logprobs of the prompt tokens whose predecessors were computed in this step.

        The hidden state at position ``p`` predicts token ``p + 1``; prompt logprobs are the
        raw model distribution (``log_softmax`` of the fp32 logits, no sampling processing).
        """
        batch = self.input_batch
        want = np.nonzero(batch.num_prompt_logprobs[rows] >= 0)[0]
        if not len(want):
            return None
        qsl = md.query_start_loc_cpu
        out: dict[str, tuple[int, list[dict[int, tuple[float, int]]]]] = {}
        for i in want.tolist():
            row = int(rows[i])
            n = int(qsl[i + 1] - qsl[i])
            start = int(md.seq_lens_cpu[i]) - n
            end = min(start + n, int(batch.num_prompt_tokens[row]) - 1)
            if end <= start:
                continue
            k = int(batch.num_prompt_logprobs[row])
            h = hidden[int(qsl[i]) : int(qsl[i]) + end - start]
            logits = self.model.compute_logits(h)
            if logits is None:  # tensor-parallel rank != 0: the gather above was its part
                continue
            logprobs = logits.float().log_softmax(dim=-1)
            targets = torch.from_numpy(batch.token_ids[row, start + 1 : end + 1].copy()).to(self.device)
            lp = gather_logprobs(logprobs, k, targets)
            out[req_ids[i]] = (start + 1, logprob_dicts(lp, [k] * (end - start)))
        return out or None

    def execute_model(self, so: SchedulerOutput) -> ModelRunnerOutput:
        """One step, waiting for its result."""
        return self.execute_model_async(so).result()

    @torch.inference_mode()
    def execute_model_async(self, so: SchedulerOutput) -> StepHandle:
        """Launch one step; the handle's ``result()`` waits for its sampled tokens.

        The step may take as inputs the tokens of the step launched just before, which need
        not have been resulted yet (they are read on the device); older steps must have been.
        """
        if len(self._unresulted) > 1:
            raise RuntimeError("at most one step may be in flight when the next one is launched")
        collected = self._collect_in_flight(so)
        self._update_states(so)
        if collected is not None:
            self._roll_back_in_flight_drafts(collected, so)
        if so.total_num_scheduled_tokens == 0:
            return ReadyStep(ModelRunnerOutput([], []))
        step = self._prepare_inputs(so)
        attn_md = self.build_attn_metadata(step.group_metadata)
        idx = None
        if len(step.logits_indices):  # staged before the forward: its copy never waits on it
            if self.step_buffers is not None:
                idx = self.step_buffers.indices(step.logits_indices)
            else:
                idx = self.transfer.to_device(step.logits_indices)
        hidden = self.graph_runner.replay(step.metadata) if self.graph_runner is not None else None
        if hidden is None and self.cpu_graph is not None and self.cpu_graph.accepts(
            step.metadata.num_reqs, step.metadata.num_actual_tokens, step.metadata.max_query_len
        ):
            hidden = self.cpu_graph.run(step.input_ids, step.positions, attn_md)
        if hidden is None:
            hidden = self.model(step.input_ids, step.positions, attn_md)
        prompt_logprobs = self._compute_prompt_logprobs(step.req_ids, step.rows, step.metadata, hidden)
        sampled = None if idx is None else self._sample(step, hidden[idx], so)
        if self.eagle is not None:  # before the next forward reuses the hidden-state buffer
            self.eagle.absorb(self.input_batch, step, hidden, idx, sampled)
        elif self.device_drafts is not None and sampled is not None:
            self.drafter.in_step.launch(self.input_batch, step, sampled)  # the next drafts, queued now
        handle = StepHandle(self, step.req_ids, np.nonzero(step.sample_mask)[0], prompt_logprobs, sampled)
        self._unresulted.append(handle)
        return handle

    def _collect_in_flight(self, so: SchedulerOutput) -> SampledTokens | None:
        """Speculative decoding with a step in flight (async scheduling): wait for its sampled
        tokens (not for its draft passes) and put them in the input batch, so this step is
        staged from exact counts; then propose the drafts asked for meanwhile. Returns the
        in-flight step's tokens when it verified drafts (None otherwise: nothing to correct)."""
        deferred, self._deferred = self._deferred, None
        if self.device_drafts is None or not self._unresulted:
            if deferred is not None:
                raise RuntimeError("drafts were deferred but no step is in flight")
            return None
        handle = self._unresulted[-1]
        handle.collect()
        if deferred is not None:
            self._fulfil_deferred(*deferred, gone=so.finished_req_ids | so.preempted_req_ids)
        s = handle.sampled
        return s if s is not None and s.num_emitted_host is not None else None

    def _fulfil_deferred(self, req_ids: list[str], counts: np.ndarray, gone: set[str]) -> None:
        """Propose the drafts deferred by ``propose_drafts`` (before this step's block ids are
        applied: the draft's progress counts only its requests' earlier blocks, as after a
        synchronous step). Requests that finished or were preempted since are skipped."""
        keep = np.fromiter((r not in gone for r in req_ids), dtype=bool, count=len(req_ids))
        if not keep.any():
            return
        ids = [r for r, k in zip(req_ids, keep.tolist(), strict=True) if k]
        rows = np.fromiter((self.input_batch.row_of[r] for r in ids), dtype=np.int64, count=len(ids))
        self.device_drafts.keep(rows, *self._queue_drafts(rows, counts[keep]))

    def _roll_back_in_flight_drafts(self, s: SampledTokens, so: SchedulerOutput) -> None:
        """The scheduler staged this step counting the in-flight step's drafts as accepted; the
        rows it updated (``scheduled_cached_reqs``) compute from their accepted count instead."""
        batch = self.input_batch
        updated = np.zeros(batch.max_num_reqs, dtype=bool)
        for c in so.scheduled_cached_reqs:
            updated[batch.row_of[c.req_id]] = True
        rejected = s.layout.counts - s.num_emitted_host.numpy().astype(np.int64, copy=False)
        fix = updated[s.rows] & (batch.serial[s.rows] == s.serials) & (rejected > 0)
        batch.num_computed[s.rows[fix]] -= rejected[fix]

    def _sample(self, step: StepInputs, hidden: torch.Tensor, so: SchedulerOutput) -> SampledTokens:
        """Sample the requests of ``step`` that sample (every position of a verifying request),
        verify drafts; results are queued to the host."""
        logits = self.model.compute_logits(hidden)
        sample_rows = step.rows[step.sample_mask]
        layout = self._draft_layout(step, so)  # None: no request verifies drafts this step
        flat_rows = sample_rows if layout is None else sample_rows[layout.seg]
        if logits is None:  # tensor-parallel rank != 0: receive rank 0's tokens below
            out = None
            sampled_t = torch.empty(len(flat_rows), dtype=torch.int64, device=self.device)
        else:
            num_pending = step.has_pending[step.sample_mask].astype(np.int64)
            if layout is not None:
                num_pending = num_pending[layout.seg]
            md = self.input_batch.make_sampling_metadata(flat_rows, logits.shape[-1], self.transfer, num_pending,
                                                         num_drafts=None if layout is None else layout.offsets)
            md.token_bitmask = self._token_bitmask(so, step, layout)
            out = self.sampler(logits, md)
            sampled_t = out.sampled_token_ids
        tp = get_tp()
        if tp.world_size > 1:
            sampled_t = tp.broadcast(sampled_t.to(torch.int64).contiguous(), src=0)
        sampled_t = sampled_t.to(torch.int64)
        emitted = emitted_host = None
        if layout is not None and self.transfer.host and self.device_drafts is None:  # tokens in host memory
            emitted = emitted_host = torch.from_numpy(verify_one_hot_drafts_host(sampled_t.numpy(), layout))
        elif layout is not None:  # the drafts as the forward read them (device drafts included)
            dev = self.transfer.to_device
            drafts = grid_drafts_from_inputs(step.input_ids, step.logits_indices, layout.grid, layout.counts, dev)
            emitted = verify_one_hot_drafts(sampled_t, dev(layout.grid), drafts)
            emitted_host = self.transfer.to_host_async(emitted)
        lp_host = num_lp = None
        if out is not None and out.logprobs is not None:
            lp, host = out.logprobs, self.transfer.to_host_async
            lp_host = LogprobsTensors(host(lp.token_ids), host(lp.logprobs), host(lp.sampled_ranks))
            num_lp = self.input_batch.num_logprobs[flat_rows].copy()
        sampled_host = self.transfer.to_host_async(sampled_t)
        event = self.platform.new_event()  # None where device work is synchronous
        if event is not None:
            event.record()
        return SampledTokens(sampled_t, sample_rows, self.input_batch.serial[sample_rows].copy(),
                             sampled_host, lp_host, num_lp, event, emitted_host,
                             layout, emitted)

    @staticmethod
    def _draft_layout(step: StepInputs, so: SchedulerOutput) -> DraftLayout | None:
        """Where each sampling request's positions sit; None when none verifies drafts."""
        if not so.scheduled_spec_decode_tokens:
            return None
        num_drafts = step.num_drafts[step.sample_mask]
        if not num_drafts.any():
            return None
        spec = so.scheduled_spec_decode_tokens  # a request verifying drafts always samples
        return make_layout(num_drafts, [spec[r] for r in step.req_ids if spec.get(r)])

    def _token_bitmask(
        self, so: SchedulerOutput, step: StepInputs, layout: DraftLayout | None
    ) -> tuple[list[int], torch.Tensor] | None:
        """The scheduler's grammar bitmask rows laid out as the sampling positions (others
        all ones): a listed request has one row per position it samples (``1 + k`` when it
        verifies ``k`` drafts), in the order of ``so.structured_output_request_ids``."""
        if not so.structured_output_request_ids:
            return None
        sample_pos = np.nonzero(step.sample_mask)[0]
        index_of = {step.req_ids[p]: i for i, p in enumerate(sample_pos.tolist())}
        ids = so.structured_output_request_ids
        idx = np.fromiter((index_of[r] for r in ids), dtype=np.int64, count=len(ids))
        if layout is None:
            rows, num_positions = idx, len(sample_pos)
        else:
            counts = layout.counts[idx]
            first = np.cumsum(counts) - counts
            rows = np.repeat(layout.starts[idx] - first, counts) + np.arange(int(counts.sum()))
            num_positions = len(layout.seg)
        packed = np.asarray(so.grammar_bitmask, dtype=np.int32)  # a list after msgpack (workers)
        if packed.shape[0] != len(rows):
            raise RuntimeError(f"the grammar bitmask has {packed.shape[0]} rows for {len(rows)} positions of "
                               f"the structured-output requests {ids}")
        bitmask = np.full((num_positions, packed.shape[1]), -1, dtype=np.int32)
        bitmask[rows] = packed
        return rows.tolist(), self.transfer.to_device(bitmask)

    def propose_drafts(self, num_drafts: dict[str, int]) -> dict[str, list[int]]:
        """Draft-model / EAGLE proposals: up to ``num_drafts[req_id]`` drafts for each request, whose
        known tokens but the last are all computed (after its step has been resulted; while that
        step is still in flight, placeholders now and the drafts when the next step is staged)."""
        if self.drafter is None:
            raise RuntimeError("propose_drafts needs speculative method draft_model, eagle or eagle3")
        if not num_drafts:
            return {}
        req_ids = list(num_drafts)
        rows = np.fromiter((self.input_batch.row_of[r] for r in req_ids), dtype=np.int64, count=len(req_ids))
        counts = np.fromiter(num_drafts.values(), dtype=np.int64, count=len(req_ids))
        if self._pending() is not None:
            return self._defer(req_ids, rows, counts)
        if self.device_drafts is None:
            drafts = self.drafter.propose(self.input_batch, rows, counts)
        else:  # nothing waits for the draft passes: the next step is staged meanwhile
            drafts = self.device_drafts.keep(rows, *self._queue_drafts(rows, counts))
            self._read_back_grammar_drafts(rows, drafts)
        return dict(zip(req_ids, drafts, strict=True))

    def _queue_drafts(self, rows: np.ndarray, counts: np.ndarray) -> tuple[torch.Tensor, np.ndarray]:
        """The rows' drafts on the device: queued inside the last step when it qualified, else
        proposed now (the passes are queued; nothing waits for them)."""
        queued = None if self.eagle is not None else self.drafter.in_step.take(self.input_batch, rows, counts)
        if queued is None:
            queued = self.drafter.propose_on_device(self.input_batch, rows, counts)
        return queued

    def _defer(self, req_ids: list[str], rows: np.ndarray, counts: np.ndarray) -> dict[str, list[int]]:
        """Drafts asked for while the step they follow is in flight (async scheduling): the
        scheduler gets placeholders now, the drafts are proposed when the next step is staged
        (``_collect_in_flight``). Only device drafts can wait; a grammar row's cannot (the
        engine validates its drafts on the host, and never overlaps steps for it)."""
        if self.device_drafts is None or self.input_batch.has_grammar[rows].any():
            raise RuntimeError("drafts are proposed after the step that produced their context is resulted "
                               "(only device drafts of rows without a grammar may be deferred)")
        counts = self.drafter.num_drafts_of(self.input_batch, rows, counts)
        self._deferred = (req_ids, counts)
        return {r: [DEVICE_DRAFT] * int(n) for r, n in zip(req_ids, counts.tolist(), strict=True)}

    def _read_back_grammar_drafts(self, rows: np.ndarray, drafts: list[list[int]]) -> None:
        """Replace the placeholders of grammar-constrained rows by their drafts' values (waits
        for the draft passes): the engine validates them against the grammar and masks each
        verified position, on the host. Other rows keep placeholders."""
        host = np.flatnonzero(self.input_batch.has_grammar[rows])
        if not len(host):
            return
        counts = np.fromiter((len(drafts[i]) for i in host.tolist()), dtype=np.int64, count=len(host))
        for i, values in zip(host.tolist(), self.device_drafts.materialize(rows[host], counts), strict=True):
            drafts[i] = values

    def _pending(self) -> SampledTokens | None:
        """Tokens of the last launched step not yet on the host (None when all are)."""
        if not self._unresulted or self._unresulted[-1].collected:
            return None
        return self._unresulted[-1].sampled

    def _finish_step(self, handle: StepHandle) -> None:
        """Called by ``handle.result()``: steps are resulted in launch order."""
        if not self._unresulted or self._unresulted[0] is not handle:
            raise RuntimeError("steps must be resulted in the order they were launched")
        self._unresulted.pop(0)


def _num_drafts(spec: dict[str, list[int]], req_ids: list[str]) -> np.ndarray | None:
    """Draft tokens each of ``req_ids`` verifies this step; None when none verifies any (the
    usual step: speculative decoding off), so no per-request work is done for it."""
    if not spec:
        return None
    return np.fromiter((len(spec.get(r, ())) for r in req_ids), dtype=np.int64, count=len(req_ids))


def _logits_indices(cu: np.ndarray, sample_mask: np.ndarray, num_drafts: np.ndarray | None) -> np.ndarray:
    """Token indices to sample: each sampling request's last token, preceded by the positions
    of its drafts' predecessors (``cu``: cumulative scheduled tokens per request)."""
    if num_drafts is None:
        return cu[sample_mask] - 1
    counts, _, seg, offsets, _, _ = layout_structure(num_drafts[sample_mask])
    return (cu[sample_mask] - counts)[seg] + offsets


def _first_max_kernel(platform) -> FirstMaxKernel | None:
    """The sampler's argmax from the platform's fused kernels where they have one (the CPU
    extension's row argmax), else None: ``torch``'s."""
    from octavo.models.layers import load_fused_ops

    return getattr(load_fused_ops(platform.fused_op_kernels), "first_max_index", None)


def _bitmask_kernel(platform) -> BitmaskKernel:
    """The grammar bitmask op for the sampler: numpy on a host CPU (xgrammar's CPU kernel tests
    bit by bit, several times slower at decode batch sizes), xgrammar's device kernel elsewhere."""
    return apply_token_bitmask if platform.device_is_host() else apply_token_bitmask_xgrammar
