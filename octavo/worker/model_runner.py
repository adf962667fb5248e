"""Turns a SchedulerOutput into one flattened forward pass and sampled tokens.

Per step: apply deltas to the persistent ``InputBatch``; lay requests out in scheduler order;
build token ids, positions, slot mapping, query start locations, sequence lengths and block
tables with array ops (no per-token Python); run the model; keep the hidden state of the last
scheduled token of each request whose known tokens are then all computed (the others are
mid-prompt chunks and sample nothing); sample.
"""

from __future__ import annotations

import logging
import time

import numpy as np
import torch

from octavo.attention.backend import CommonAttentionMetadata
from octavo.config import OctavoConfig
from octavo.core.sampler import Sampler, SamplingMetadata
from octavo.core.scheduler_output import ModelRunnerOutput, SchedulerOutput
from octavo.worker.input_batch import InputBatch

logger = logging.getLogger(__name__)

_MIX = 0x9E3779B97F4A7C15
_MASK63 = (1 << 63) - 1


def token_seed(seed: int, index: int) -> int:
    """Seed of the noise for output token ``index`` of a seeded request.

    Derived from (seed, index) alone, so a seeded request samples the same tokens whatever
    else is in the batch and even after preemption and recompute.
    """
    return ((seed & _MASK63) * 1_000_003 + (index + 1) * _MIX) & _MASK63


class ModelRunner:
    def __init__(self, config: OctavoConfig, platform) -> None:
        self.config = config
        self.platform = platform
        mc = config.model_config
        self.device = platform.device()
        self.dtype = mc.dtype
        self.block_size = config.cache_config.block_size
        self.max_model_len = mc.max_model_len
        self.attn_backend, self.skipped_backends = platform.get_attn_backend(
            mc.head_size, mc.dtype, config.cache_config.kv_cache_dtype, self.block_size
        )
        self.model = None
        self.kv_caches: list[torch.Tensor] = []
        self.num_blocks = 0
        self.input_batch = InputBatch(
            config.scheduler_config.max_num_seqs, self.max_model_len, self.block_size
        )
        self.sampler = Sampler()
        self.load_seconds = 0.0

    # -- setup ----------------------------------------------------------------------------
    def load_model(self) -> None:
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
        if mc.load_format == "dummy":
            init_dummy_weights(model, seed=mc.seed)
        else:
            load_weights(model, mc.model)
        self.model = model.eval()
        self.load_seconds = time.perf_counter() - t0

    def model_bytes(self) -> int:
        assert self.model is not None
        return sum(p.numel() * p.element_size() for p in self.model.parameters())

    def kv_bytes_per_block(self) -> int:
        mc = self.config.model_config
        shape = self.attn_backend.get_kv_cache_shape(1, self.block_size, mc.num_kv_heads, mc.head_size)
        return int(np.prod(shape)) * torch.empty((), dtype=self.dtype).element_size() * mc.num_layers

    def determine_num_blocks(self) -> int:
        cc = self.config.cache_config
        if cc.num_gpu_blocks_override is not None:
            return cc.num_gpu_blocks_override
        budget = self.platform.kv_cache_memory_bytes(self.config, self.model_bytes(), 0)
        num = budget // self.kv_bytes_per_block()
        # More blocks than every sequence at full length (x4 for the prefix cache) buy nothing.
        sc = self.config.scheduler_config
        useful = 4 * sc.max_num_seqs * self.input_batch.max_blocks_per_req + 1
        return int(min(num, useful))

    def initialize_kv_cache(self, num_blocks: int) -> None:
        mc = self.config.model_config
        if num_blocks * self.block_size < self.max_model_len and self.config.cache_config.num_gpu_blocks_override is None:
            raise ValueError(
                f"the KV cache holds {num_blocks * self.block_size} tokens, fewer than "
                f"--max-model-len {self.max_model_len}; lower --max-model-len or give the cache "
                "more memory"
            )
        shape = self.attn_backend.get_kv_cache_shape(num_blocks, self.block_size, mc.num_kv_heads, mc.head_size)
        self.kv_caches = [
            torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in range(mc.num_layers)
        ]
        for layer, cache in zip(self.model.attention_layers(), self.kv_caches, strict=True):
            layer.kv_cache = cache
        self.num_blocks = num_blocks

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

    def _prepare_inputs(self, so: SchedulerOutput):
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
        slot_mapping = batch.block_table[token_rows, positions // bs].astype(np.int64) * bs + positions % bs
        seq_lens = computed + n
        max_blocks = int(-(-seq_lens.max() // bs))
        block_table = batch.block_table[rows, :max_blocks]
        sample_mask = seq_lens == batch.num_tokens[rows]
        logits_indices = cu[sample_mask] - 1

        dev = self.device
        md = CommonAttentionMetadata(
            query_start_loc=torch.from_numpy(qsl.astype(np.int32)).to(dev),
            seq_lens=torch.from_numpy(seq_lens.astype(np.int32)).to(dev),
            block_table=torch.from_numpy(np.ascontiguousarray(block_table)).to(dev),
            slot_mapping=torch.from_numpy(slot_mapping).to(dev),
            query_start_loc_cpu=qsl,
            seq_lens_cpu=seq_lens,
            num_reqs=len(rows),
            num_actual_tokens=total,
            max_query_len=int(n.max()),
            max_seq_len=int(seq_lens.max()),
            block_size=bs,
        )
        inputs = (
            torch.from_numpy(token_ids).to(dev),
            torch.from_numpy(positions).to(dev),
        )
        return req_ids, rows, inputs, md, sample_mask, logits_indices

    def _sampling_metadata(self, rows: np.ndarray) -> SamplingMetadata:
        batch = self.input_batch
        params = [batch.params[r] for r in rows]
        temps = np.array([p.temperature for p in params], dtype=np.float32)
        greedy = temps < 1e-5
        temps[greedy] = 0.0
        top_k = np.array([p.top_k for p in params], dtype=np.int64)
        top_p = np.array([p.top_p for p in params], dtype=np.float32)
        generators = {}
        for i, (row, p) in enumerate(zip(rows, params, strict=True)):
            if p.seed is not None and not greedy[i]:
                g = torch.Generator(device=self.device)
                n_out = int(batch.num_tokens[row] - batch.num_prompt_tokens[row])
                g.manual_seed(token_seed(p.seed, n_out))
                generators[i] = g
        dev = self.device
        return SamplingMetadata(
            temperature=torch.from_numpy(temps).to(dev),
            all_greedy=bool(greedy.all()),
            all_random=not bool(greedy.any()),
            top_k=torch.from_numpy(top_k).to(dev) if (top_k > 0).any() else None,
            top_p=torch.from_numpy(top_p).to(dev) if (top_p < 1.0).any() else None,
            generators=generators,
        )

    @torch.inference_mode()
    def execute_model(self, so: SchedulerOutput) -> ModelRunnerOutput:
        self._update_states(so)
        if so.total_num_scheduled_tokens == 0:
            return ModelRunnerOutput([], [])
        req_ids, rows, (input_ids, positions), md, sample_mask, logits_indices = self._prepare_inputs(so)
        attn_md = self.attn_backend.build_metadata(md)
        hidden = self.model(input_ids, positions, attn_md)
        sampled_lists: list[list[int]] = [[] for _ in req_ids]
        if len(logits_indices):
            idx = torch.from_numpy(logits_indices).to(self.device)
            logits = self.model.compute_logits(hidden[idx])
            sample_rows = rows[sample_mask]
            out = self.sampler(logits, self._sampling_metadata(sample_rows))
            sampled = out.sampled_token_ids.cpu().numpy()
            self.input_batch.append_tokens(sample_rows, sampled)
            for i, t in zip(np.nonzero(sample_mask)[0], sampled.tolist(), strict=True):
                sampled_lists[i] = [t]
        return ModelRunnerOutput(req_ids=req_ids, sampled_token_ids=sampled_lists)
