"""The model runner of ``--model-impl onnxruntime``: an exported decoder under octavo's engine.

It is octavo's ``ModelRunner`` (input batch, flattened step layout, sampler, prompt logprobs,
step handles) with the forward replaced: ``OnnxDecoder`` runs the ONNX model in ONNX Runtime
and returns the logits of every scheduled token, so ``compute_logits`` is the identity.

KV cache: the scheduler hands out paged blocks exactly as for the torch path, and the runner
keeps one host tensor ``[layers, 2, num_blocks * block_size, kv_heads, head_size]`` indexed by
those slots. Per step it gathers each request's past from its block table into the contiguous
``past_key_values`` the model takes, and scatters the new tokens' K/V out of the ``present``
outputs into their slots. Because the cache is paged and shared like the torch path's, prefix
caching, preemption (by recompute), chunked prefill and sliding-window block freeing all work
unchanged. Decodes of a step run as one batch; each prompt chunk runs on its own.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import numpy as np
import torch

from octavo.attention.backend import AttentionBackend, CommonAttentionMetadata
from octavo.onnx.genai_config import read_genai_config
from octavo.onnx.model_dir import MODEL_FILE, export_kv_dtype
from octavo.worker.model_runner import ModelRunner

logger = logging.getLogger(__name__)


class OnnxKVLayout(AttentionBackend):
    """Names the runner's cache layout; attention itself runs inside the ONNX model."""

    name = "onnxruntime"

    @staticmethod
    def get_kv_cache_shape(num_blocks: int, block_size: int, num_kv_heads: int, head_size: int) -> tuple[int, ...]:
        return (2, num_blocks * block_size, num_kv_heads, head_size)


class OnnxDecoder:
    """An ONNX Runtime session over an exported decoder, fed from a paged host KV cache."""

    def __init__(self, model_dir: str, num_threads: int) -> None:
        import onnxruntime as ort

        cfg = read_genai_config(model_dir)
        dec = cfg["model"]["decoder"]
        self.num_layers, self.num_kv_heads, self.head_size = (
            dec["num_hidden_layers"], dec["num_key_value_heads"], dec["head_size"])
        self.vocab_size = cfg["model"]["vocab_size"]
        self.context_length = int(cfg["model"]["context_length"])  # the positions the export covers
        self.dtype = export_kv_dtype(model_dir)
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = num_threads
        opts.inter_op_num_threads = 1
        # No spinning after a run: torch's threads (the KV gather and scatter, the sampler) run
        # between two ONNX Runtime calls on the same cores, and spinning pool threads would
        # take those cores from them (measured: the torch ops of a step took ~6x longer).
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        self.session = ort.InferenceSession(str(Path(model_dir) / MODEL_FILE), opts, providers=["CPUExecutionProvider"])
        self.past_names = [(dec["inputs"]["past_key_names"] % i, dec["inputs"]["past_value_names"] % i)
                           for i in range(self.num_layers)]
        outs = dec["outputs"]
        self.output_names = [outs["logits"]] + [outs[f"present_{t}_names"] % i
                                                for i in range(self.num_layers) for t in ("key", "value")]
        self.files_bytes = sum(f.stat().st_size for f in Path(model_dir).glob(MODEL_FILE + "*"))
        self.cache: torch.Tensor | None = None
        self.block_size = 0

    def allocate(self, num_blocks: int, block_size: int) -> None:
        shape = (self.num_layers, 2, num_blocks * block_size, self.num_kv_heads, self.head_size)
        self.cache = torch.zeros(shape, dtype=self.dtype)
        self.block_size = block_size

    def compute_logits(self, logits: torch.Tensor) -> torch.Tensor:
        return logits  # the forward already returns logits

    def __call__(self, input_ids: torch.Tensor, positions: torch.Tensor, md: CommonAttentionMetadata) -> torch.Tensor:
        """Logits [T, vocab] (float32) of every token of the flattened step."""
        qsl = md.query_start_loc_cpu
        n = np.diff(qsl)
        past = np.asarray(md.seq_lens_cpu, dtype=np.int64) - n
        step = (input_ids.numpy(), positions.numpy(), md.slot_mapping.numpy())
        block_table = md.block_table.numpy()
        logits = np.empty((len(step[0]), self.vocab_size), dtype=np.float32)
        decodes = np.nonzero(n == 1)[0]
        groups = ([decodes] if len(decodes) else []) + [np.array([i]) for i in np.nonzero(n > 1)[0]]
        for g in groups:
            tok = qsl[g][:, None] + np.arange(n[g[0]])  # [B, S] token indices; equal S per group
            logits[tok.reshape(-1)] = self._run(tok, past[g], step, block_table[g])
        return torch.from_numpy(logits)

    def _run(self, tok: np.ndarray, past: np.ndarray, step: tuple, block_table: np.ndarray) -> np.ndarray:
        """One ONNX Runtime call for a group of requests (rows of ``tok``); returns [B*S, V]."""
        ids, pos, slot_mapping = step
        b, s = tok.shape
        p = int(past.max())
        real_past = np.arange(p)[None, :] < past[:, None]
        feed = {
            "input_ids": ids[tok], "position_ids": pos[tok],
            "attention_mask": np.concatenate([real_past, np.ones((b, s), dtype=bool)], axis=1).astype(np.int64),
        }
        kv = self._gather(block_table, real_past)
        for i, (kname, vname) in enumerate(self.past_names):
            feed[kname], feed[vname] = kv[i, 0], kv[i, 1]
        out = self.session.run(self.output_names, feed)
        self._scatter(out[1:], p, torch.from_numpy(slot_mapping[tok.reshape(-1)]))
        return out[0].reshape(b * s, -1)

    def _gather(self, block_table: np.ndarray, real_past: np.ndarray) -> np.ndarray:
        """Past K/V of the group as [L, 2, B, kv_heads, P, D] (padding reads the null block)."""
        bs = self.block_size
        b, p = real_past.shape
        pos = np.arange(p)
        slots = block_table[:, pos // bs].astype(np.int64) * bs + pos % bs
        slots = torch.from_numpy(np.where(real_past, slots, 0).reshape(-1))
        kv = self.cache.index_select(2, slots).view(self.num_layers, 2, b, p, self.num_kv_heads, self.head_size)
        return kv.permute(0, 1, 2, 4, 3, 5).contiguous().numpy()

    def _scatter(self, presents: list[np.ndarray], p: int, slots: torch.Tensor) -> None:
        """Write the new tokens' K/V (past length ``p`` on in each present) into their slots."""
        for i, present in enumerate(presents):
            new = torch.from_numpy(present)[:, :, p:].permute(0, 2, 1, 3).reshape(-1, self.num_kv_heads, self.head_size)
            self.cache[i // 2, i % 2].index_copy_(0, slots, new)


class OnnxModelRunner(ModelRunner):
    """``ModelRunner`` with the model an ``OnnxDecoder`` (CPU execution provider)."""

    def _choose_attn_backend(self):
        return OnnxKVLayout, []

    def load_model(self) -> None:
        t0 = time.perf_counter()
        self.model = OnnxDecoder(self.config.model_config.model, torch.get_num_threads())
        if self.max_model_len > self.model.context_length:
            raise ValueError(
                f"--max-model-len {self.max_model_len} exceeds the {self.model.context_length} positions "
                "this ONNX export covers; pass --max-model-len "
                f"{self.model.context_length} or re-export with a larger --max-model-len"
            )
        self.load_seconds = time.perf_counter() - t0
        logger.info("ONNX Runtime %s: %s on %d threads", _ort_version(), self.config.model_config.model,
                    torch.get_num_threads())

    def model_bytes(self) -> int:
        return self.model.files_bytes

    def kv_bytes_per_block(self) -> int:
        m = self.model
        return 2 * self.block_size * m.num_kv_heads * m.head_size * m.num_layers * m.dtype.itemsize

    def initialize_kv_cache(self, num_blocks: int) -> None:
        if num_blocks * self.block_size < self.max_model_len and self.config.cache_config.num_gpu_blocks_override is None:
            raise ValueError(
                f"the KV cache holds {num_blocks * self.block_size} tokens, fewer than --max-model-len "
                f"{self.max_model_len}; lower --max-model-len or give the cache more memory"
            )
        self.model.allocate(num_blocks, self.block_size)
        self.num_blocks = num_blocks
        logger.info("graphs: none (ONNX Runtime runs its own optimized graph)")


def _ort_version() -> str:
    import onnxruntime

    return onnxruntime.__version__
