"""Startup memory profiling: how much device memory the KV cache may take.

KV bytes = ``gpu_memory_utilization x total - in use - activation peak - graph pool``, where
"in use" is everything allocated on the device after loading (weights, CUDA context, other
processes), the activation peak is measured by a dummy forward of the largest step the
scheduler can produce (``max_num_batched_tokens`` tokens over up to ``max_num_seqs`` requests,
logits and a sampler-sized sort included), and the graph pool by a dummy decode forward at the
largest captured batch, or with mixed-step graphs (``cuda_graph.mixed_sizes_for``) by a dummy
forward of the largest mixed token count when that holds more. The dummies attend over a small
scratch KV cache shared by all layers, allocated before the peak counter is reset so it is not
counted.
"""

from __future__ import annotations

import logging

import numpy as np
import torch

from octavo.attention.backend import CommonAttentionMetadata

logger = logging.getLogger(__name__)

GiB = 1 << 30


def _dummy_forward(runner, lengths: list[int], kv: torch.Tensor, with_logits: bool) -> None:
    bs = runner.block_size
    dev = runner.device
    n = len(lengths)
    lens = np.asarray(lengths, dtype=np.int64)
    qsl = np.zeros(n + 1, dtype=np.int64)
    qsl[1:] = np.cumsum(lens)
    blocks = -(-lens // bs)
    width = int(blocks.max())
    table = np.zeros((n, width), dtype=np.int32)
    start = 1
    for i, b in enumerate(blocks.tolist()):
        table[i, :b] = np.arange(start, start + b)
        start += b
    req = np.repeat(np.arange(n), lens)
    pos = np.arange(int(qsl[-1])) - qsl[:-1][req]
    slots = table[req, pos // bs].astype(np.int64) * bs + pos % bs
    md = CommonAttentionMetadata(
        query_start_loc=torch.from_numpy(qsl.astype(np.int32)).to(dev),
        seq_lens=torch.from_numpy(lens.astype(np.int32)).to(dev),
        block_table=torch.from_numpy(table).to(dev),
        slot_mapping=torch.from_numpy(slots).to(dev),
        query_start_loc_cpu=qsl,
        seq_lens_cpu=lens,
        num_reqs=n,
        num_actual_tokens=int(qsl[-1]),
        max_query_len=int(lens.max()),
        max_seq_len=int(lens.max()),
        block_size=bs,
    )
    layers = runner.model.attention_layers()
    for layer in layers:
        layer.kv_cache = kv
    try:
        ids = torch.zeros(int(qsl[-1]), dtype=torch.int64, device=dev)
        hidden = runner.model(ids, torch.from_numpy(pos).to(dev), runner.attn_backend.build_metadata(md))
        if with_logits:
            last = torch.from_numpy(qsl[1:] - 1).to(dev)
            logits = runner.model.compute_logits(hidden[last])
            del hidden
            if logits is not None:  # None on tensor-parallel ranks != 0
                # What a top-k/top-p sampling step holds at once: sorted values + indices, probs.
                vals, idx = logits.float().sort(dim=-1, descending=True)
                probs = vals.softmax(dim=-1).cumsum(dim=-1)
                del vals, idx, probs, logits
    finally:
        for layer in layers:
            layer.kv_cache = None


def _peak_of(runner, lengths: list[int], kv: torch.Tensor, with_logits: bool) -> int:
    platform, device = runner.platform, runner.device
    platform.synchronize()
    base = platform.memory_allocated(device)
    platform.reset_peak_memory_stats(device)
    with torch.inference_mode():
        _dummy_forward(runner, lengths, kv, with_logits)
    platform.synchronize()
    return max(0, platform.max_memory_allocated(device) - base)


def _moe_peak(runner, num_tokens: int) -> int:
    """What one MoE layer's grouped kernels hold at ``num_tokens`` tokens (0 for dense models).

    Their buffers scale with tokens x top-k, not with the routing the dummy batch happens to
    produce, so the budget never goes below them.
    """
    moe_layers = getattr(runner.model, "moe_layers", None)
    moe = moe_layers() if callable(moe_layers) else []
    if not moe:
        return 0
    peak = moe[0].activation_bytes(num_tokens)
    logger.info(
        "memory: MoE grouped kernels hold %.3f GiB at %d tokens (%d token-expert pairs per layer)",
        peak / GiB, num_tokens, num_tokens * moe[0].top_k,
    )
    return peak


def _split(num_tokens: int, max_num_seqs: int) -> list[int]:
    """``num_tokens`` over up to ``max_num_seqs`` requests whose lengths differ by at most one:
    none is longer than ``ceil(num_tokens / max_num_seqs)``, so none passes max_model_len when
    the step's tokens fit ``max_num_seqs`` requests of max_model_len."""
    num_reqs = max(1, min(max_num_seqs, num_tokens))
    base, extra = divmod(num_tokens, num_reqs)
    return [base + 1] * extra + [base] * (num_reqs - extra)


def profile_kv_cache_budget(runner) -> int:
    """Bytes the KV cache may take on this accelerator (see the module docstring)."""
    from octavo.worker.cuda_graph import capture_sizes, graph_mode, mixed_sizes_for

    config = runner.config
    sc = config.scheduler_config
    mc = config.model_config
    num_tokens = max(1, min(sc.max_num_batched_tokens, sc.max_num_seqs * runner.max_model_len))
    lengths = _split(num_tokens, sc.max_num_seqs)
    graphs = graph_mode(runner)[0] != "none"
    largest = capture_sizes(sc.max_num_seqs)[-1] if graphs else 0
    blocks = max(sum(-(-n // runner.block_size) for n in lengths), largest) + 1
    shape = runner.attn_backend.get_kv_cache_shape(blocks, runner.block_size, runner.num_kv_heads_local, mc.head_size)
    kv = torch.zeros(shape, dtype=runner.kv_dtype, device=runner.device)

    peak = max(_peak_of(runner, lengths, kv, with_logits=True), _moe_peak(runner, num_tokens))
    graph_pool = 0
    if graphs:
        # Captured graphs share one pool sized by the largest: decode rows of one token each, or
        # one chunk of the largest mixed graph's tokens.
        pool_peak = _peak_of(runner, [1] * largest, kv, with_logits=False)
        mixed = [t for t in mixed_sizes_for(runner) if t <= num_tokens]
        if mixed:  # as many tokens, over requests no longer than max_model_len (RoPE's table)
            pool_peak = max(pool_peak, _peak_of(runner, _split(mixed[-1], sc.max_num_seqs), kv, with_logits=False))
        graph_pool = runner.platform.graph_pool_bytes(pool_peak)
        if mixed:  # plus the mixed graphs' shared output buffer, outside the pool
            graph_pool += mixed[-1] * mc.hidden_size * mc.dtype.itemsize
    del kv
    runner.platform.synchronize()
    runner.platform.empty_cache()

    free, total = runner.platform.mem_get_info()
    util = config.cache_config.gpu_memory_utilization
    budget = runner.platform.kv_cache_memory_bytes(config, runner.model_bytes(), peak + graph_pool)
    logger.info(
        "memory: KV cache %.2f GiB = %.2f x %.2f GiB total - %.2f GiB in use (weights %.2f GiB) "
        "- %.2f GiB activation peak (%d tokens, %d requests) - %.2f GiB graph pool",
        budget / GiB, util, total / GiB, (total - free) / GiB, runner.model_bytes() / GiB,
        peak / GiB, num_tokens, len(lengths), graph_pool / GiB,
    )
    runner.profiled_peak_bytes = peak
    runner.profiled_graph_pool_bytes = graph_pool
    return budget
