"""The CPU graph mode: decode steps run the model forward compiled by ``torch.compile``.

What CUDA graphs are to the GPU step, this is to the CPU one: the per-op Python and dispatch
work of an eager forward (module calls, views, splits, small elementwise ops) leaves the hot
path. Inductor fuses RMSNorm + residual, RoPE and SiLU·mul into its own C++ loops; octavo's C++
paged attention (``octavo::cpu_paged_attention``) and bf16 GEMV (``octavo::cpu_gemv``) stay in
the graph as custom ops, and the larger linears call oneDNN with the weights prepacked once.

Which steps: pure decode steps (every request runs one query token, nothing padded). Prefill
chunks and mixed steps run eagerly: they are GEMM-bound, and a graph per prompt length would
cost compiles for nothing. Shapes: batch size 1 is compiled with static shapes (the batch-1
stream is what a single user feels); the first larger batch recompiles once with a dynamic
batch dimension (dynamo's automatic dynamic shapes), and in bf16 once more above the GEMV's
row limit. The block tables are passed at full width, so their width never recompiles.
``warm_up`` compiles those graphs at startup on dummy steps (slot ``-1``: no KV is written);
inductor's on-disk cache (``TORCHINDUCTOR_CACHE_DIR``) makes the next start of the same model
skip code generation.

The choice (``graph_mode``): ``--enforce-eager`` and ``OCTAVO_CPU_GRAPH_MODE`` (see
``octavo/envs.py``) decide whether the platform asks for ``torch_compile``; configurations the
compiled step cannot honour run eagerly with the reason logged (``unsupported_reason``).
"""

from __future__ import annotations

import dataclasses
import logging
import time
import types

import numpy as np
import torch

from octavo.attention.backend import CommonAttentionMetadata

logger = logging.getLogger(__name__)

MODE = "torch_compile"


def unsupported_reason(runner) -> str | None:
    """Why the compiled decode step cannot run for this runner's configuration (None: it can)."""
    cfg = runner.config
    if runner.attn_backend.name != "cpu_paged":
        return f"attention backend {runner.attn_backend.name} has no compiled-graph op (only cpu_paged)"
    if cfg.parallel_config.tensor_parallel_size > 1:
        return "--tensor-parallel-size > 1 (collectives are not compiled)"
    if cfg.model_config.quantization is not None:
        return f"quantization {cfg.model_config.quantization} (its kernels are not compiled-graph ops)"
    if cfg.speculative_config is not None:
        return f"speculative decoding ({cfg.speculative_config.method}) runs eagerly"
    moe_layers = getattr(runner.model, "moe_layers", None)
    if callable(moe_layers) and moe_layers():
        return "mixture-of-experts layers (the expert routing's shapes depend on the data)"
    if getattr(runner.model, "supports_cpu_graph", True) is False:
        return f"{type(runner.model).__name__} is not compiled (its layers call uncompiled kernels)"
    return None


def graph_mode(runner) -> tuple[str, str]:
    """(mode, reason): ``torch_compile`` for this runner, or ``none`` with the reason why not."""
    choice = runner.platform.get_graph_capture(runner.config)  # --enforce-eager included
    if choice.value != MODE:
        return "none", choice.reason
    why = unsupported_reason(runner)
    if why is not None:
        return "none", why
    return MODE, choice.reason


class CpuGraphRunner:
    """The compiled forward of one model, used for the decode steps it ``accepts``."""

    def __init__(self, runner) -> None:
        import octavo.attention.ops.cpu_custom_ops  # noqa: F401  (registers octavo::cpu_paged_attention)

        self.runner = runner
        self.model = runner.model
        ops = getattr(self.model, "fused_ops", None)
        if ops is not None and hasattr(ops, "prepack") and runner.dtype == torch.bfloat16:
            ops.prepack(self.model)  # the graph reads packed weights, it never packs them
        self.max_num_seqs = runner.config.scheduler_config.max_num_seqs
        self.enabled = True  # benchmarks flip this to time eager steps on the same engine
        self.compiled = torch.compile(_own_code(self._forward), fullgraph=True, dynamic=None)
        self.steps = 0  # compiled steps run (tests and benchmarks read it)
        self.compile_seconds = 0.0

    def _forward(self, input_ids: torch.Tensor, positions: torch.Tensor, attn_metadata) -> torch.Tensor:
        return self.model(input_ids, positions, attn_metadata)

    def accepts(self, num_reqs: int, num_tokens: int, max_query_len: int) -> bool:
        """A pure decode step: one query token per request."""
        return self.enabled and max_query_len == 1 and num_tokens == num_reqs

    def run(self, input_ids: torch.Tensor, positions: torch.Tensor, attn_metadata) -> torch.Tensor:
        self.steps += 1
        return self.compiled(input_ids, positions, attn_metadata)

    def warm_bucket_sizes(self) -> list[int]:
        """Batch sizes whose dummy steps compile every graph decode steps will use."""
        from octavo.models.cpu_fused_ops import GEMV_MAX_ROWS

        sizes = [1, 2, GEMV_MAX_ROWS + 1] if self.runner.dtype == torch.bfloat16 else [1, 2]
        return [s for s in sizes if s <= self.max_num_seqs]

    @torch.inference_mode()
    def warm_up(self) -> None:
        t0 = time.perf_counter()
        width = self.runner.input_batch.max_blocks_per_req
        for size in self.warm_bucket_sizes():
            md = self.runner.build_attn_metadata(dummy_metadata(self.runner, size, width))
            zeros = torch.zeros(size, dtype=torch.int64)
            self.compiled(zeros, zeros.clone(), md)
        self.compile_seconds = time.perf_counter() - t0


def _own_code(method):
    """``method`` bound to its own copy of the function's code object. Dynamo keeps compiled
    graphs per code object; a private one keeps this runner's graphs (and the recompile limit)
    apart from other models' in the same process, and frees them with the runner."""
    fn = method.__func__
    own = types.FunctionType(fn.__code__.replace(), fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)
    return types.MethodType(own, method.__self__)


def dummy_metadata(runner, size: int, width: int) -> list[CommonAttentionMetadata]:
    """A decode step of ``size`` dummy rows that reads the null block and writes no KV."""
    qsl = np.arange(size + 1, dtype=np.int64)
    seq_lens = np.ones(size, dtype=np.int64)
    md = CommonAttentionMetadata(
        query_start_loc=torch.arange(size + 1, dtype=torch.int32),
        seq_lens=torch.ones(size, dtype=torch.int32),
        block_table=torch.zeros((size, width), dtype=torch.int32),
        slot_mapping=torch.full((size,), -1, dtype=torch.int64),
        query_start_loc_cpu=qsl,
        seq_lens_cpu=seq_lens,
        num_reqs=size,
        num_actual_tokens=size,
        max_query_len=1,
        max_seq_len=1,
        block_size=runner.block_size,
    )
    # One table and slot mapping per KV cache group, sharing the rest (as real steps do: dynamo
    # guards on which inputs alias, so the dummy must alias the same way).
    return [md] + [
        dataclasses.replace(md, block_table=md.block_table.clone(), slot_mapping=md.slot_mapping.clone())
        for _ in range(runner.num_kv_groups - 1)
    ]


def maybe_compile(runner) -> CpuGraphRunner | None:
    """Compile decode steps when the platform, configuration and flags allow; log the decision."""
    mode, reason = graph_mode(runner)
    if mode == "none":
        logger.info("graphs: none (%s)", reason)
        return None
    gr = CpuGraphRunner(runner)
    gr.warm_up()
    logger.info(
        "graphs: %s (%s): decode steps compiled for batch sizes %s in %.1fs (inductor cache: %s)",
        mode, reason, f"1 and 2..{gr.max_num_seqs} (dynamic)" if gr.max_num_seqs > 1 else "1",
        gr.compile_seconds, _inductor_cache_dir(),
    )
    return gr


def _inductor_cache_dir() -> str:
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    return cache_dir()
