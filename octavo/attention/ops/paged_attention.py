"""Triton paged attention for mixed batches (prefill chunks + decodes), and the KV write.

Layout (shared with ``torch_ref``): one layer's cache is ``[2, num_blocks, block_size,
num_kv_heads, head_size]``; K is ``cache[0]``, V is ``cache[1]``.

``paged_attention`` runs one program per (query block, KV head). A query block is ``BLOCK_Q``
consecutive query tokens of one request times the ``G = num_heads / num_kv_heads`` query heads
that share the KV head, so each K/V tile is loaded once for all of them (``BLOCK_M = BLOCK_Q *
G`` rows per tile). Query blocks never straddle requests: request ``i`` owns program indices
``query_start_loc[i] // BLOCK_Q + i ...``, found by binary search, which keeps the grid a
function of (num tokens, num requests) alone, so a captured CUDA graph can replay it.

With ``num_segments > 1`` (flash-decoding) a third grid axis splits each request's KV range
into segments; each writes an unnormalised partial output with its running max and sum. That
fills the GPU when there are few requests and long contexts (batch 1 decode has only
``num_kv_heads`` programs otherwise). ``_reduce_segments_kernel`` merges them in a second
launch. With ``fused_reduce`` (default ``FUSED_SPLIT_REDUCE``) they are merged inside the
attention launch instead: each program counts itself done on its (query block, KV head)'s
arrival counter, and the last of the ``num_segments`` to arrive (it sees every other segment's
partials: their stores precede a CTA barrier and the counter's acquire-release add) merges them
into ``out`` and sets the counter back to zero, so the counters are zero between launches and
in every replay of a captured graph (the pattern of ``octavo.models.moe.kernels.triton_router``).
Off by default: on an H100 at batch-1 decode (767-token context, 16 segments) the fused merge
made the attention launch ~5 us longer than the separate merge launch costs (~2.5 us with its
gap), see ``benchmarks/h200_results.md``.

Softmax runs in float32 in base 2 (``log2(e)`` folded into the scale). Every kernel also runs
under ``TRITON_INTERPRET=1`` on CPU tensors, which is how CI checks them against torch_ref.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from octavo.attention.kv_cache_dtype import fp8_max, is_fp8

LOG2E = 1.4426950408889634
# Split-KV: merge the segments in the attention launch (last-arriving program) rather than in a
# second launch. Off: measured slower (module docstring). Benchmarks flip it to compare
# (recapture graphs after flipping it).
FUSED_SPLIT_REDUCE = False


@triton.jit
def _find_seq_idx(qsl_ptr, target, num_seqs, BLOCK_Q: tl.constexpr):
    """Largest i with ``qsl[i] // BLOCK_Q + i <= target`` (the request owning query block)."""
    lo = 0
    hi = num_seqs
    while lo < hi:
        mid = (lo + hi) // 2
        start = tl.load(qsl_ptr + mid) // BLOCK_Q + mid
        if start <= target:
            lo = mid + 1
        else:
            hi = mid
    return lo - 1


@triton.jit(do_not_specialize=["scale_log2", "v_scale", "num_seqs"])
def _paged_attention_kernel(
    out_ptr,  # [T, H, D]
    q_ptr,  # [T, H, D] (any strides for T and H; D contiguous)
    k_cache_ptr,  # [num_blocks, block_size, Hk, D]
    v_cache_ptr,
    block_table_ptr,  # [B, max_blocks]
    seq_lens_ptr,  # [B]
    qsl_ptr,  # [B + 1]
    seg_out_ptr,  # [T, H, NUM_SEGMENTS, HEAD_PAD] fp32 (split mode only)
    seg_max_ptr,  # [T, H, NUM_SEGMENTS] fp32
    seg_sum_ptr,  # [T, H, NUM_SEGMENTS] fp32
    counter_ptr,  # [>= T * Hk] int32, zero between launches (fused split reduction only)
    scale_log2,  # softmax scale * log2(e) (* the K scale of an fp8 cache)
    v_scale,  # the V scale of an fp8 cache (1.0 otherwise; applied to the output)
    num_seqs,
    stride_qt,
    stride_qh,
    stride_ot,
    stride_oh,
    stride_kb,
    stride_ks,
    stride_kh,
    stride_vb,
    stride_vs,
    stride_vh,
    stride_bt,
    NUM_HEADS: tl.constexpr,
    G: tl.constexpr,
    HEAD_SIZE: tl.constexpr,
    HEAD_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    TILE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    NUM_SEGMENTS: tl.constexpr,
    IEEE: tl.constexpr,
    SLIDING_WINDOW: tl.constexpr = 0,
    SOFTCAP: tl.constexpr = 0.0,
    KV_FP8: tl.constexpr = False,
    FUSED_REDUCE: tl.constexpr = False,
):
    q_block = tl.program_id(0)
    kv_head = tl.program_id(1)
    segment = tl.program_id(2)

    seq = _find_seq_idx(qsl_ptr, q_block, num_seqs, BLOCK_Q)
    q_start = tl.load(qsl_ptr + seq)
    q_end = tl.load(qsl_ptr + seq + 1)
    query_len = q_end - q_start
    local_block = q_block - (q_start // BLOCK_Q + seq)
    if local_block * BLOCK_Q >= query_len:
        return
    seq_len = tl.load(seq_lens_ptr + seq)
    context_len = seq_len - query_len

    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_PAD)
    offs_t = tl.arange(0, TILE)
    q_pos = local_block * BLOCK_Q + offs_m // G  # query index within the request
    head = kv_head * G + offs_m % G
    row_ok = (offs_m < BLOCK_Q * G) & (q_pos < query_len)
    d_ok = offs_d < HEAD_SIZE
    tok = q_start + q_pos

    q = tl.load(
        q_ptr + tok[:, None] * stride_qt + head[:, None] * stride_qh + offs_d[None, :],
        mask=row_ok[:, None] & d_ok[None, :],
        other=0.0,
    )
    if KV_FP8 and not IEEE:  # 16-bit inputs: dots in fp16, which holds every fp8 value exactly
        q = q.to(tl.float16)

    # Keys this query block can see: up to the causal limit of its last query.
    kv_end = tl.minimum(seq_len, context_len + (local_block + 1) * BLOCK_Q)
    num_tiles = tl.cdiv(kv_end, TILE)
    # Sliding window: keys before the first row's window are never read (not even inside the
    # first tile: the KV cache manager may have freed and reused their blocks).
    first_tile = 0
    first_key = 0
    if SLIDING_WINDOW > 0:
        first_key = tl.maximum(context_len + local_block * BLOCK_Q - SLIDING_WINDOW + 1, 0)
        first_tile = first_key // TILE
    if NUM_SEGMENTS > 1:
        tiles_per_seg = tl.cdiv(tl.cdiv(seq_len, TILE) - first_tile, NUM_SEGMENTS)
        tile_lo = first_tile + segment * tiles_per_seg
        tile_hi = tl.minimum(tile_lo + tiles_per_seg, num_tiles)
    else:
        tile_lo = first_tile
        tile_hi = num_tiles

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_PAD], dtype=tl.float32)
    q_abs = context_len + q_pos  # absolute position of each row's query

    bt_row = block_table_ptr + seq * stride_bt
    for j in range(tile_lo, tile_hi):
        k_pos = j * TILE + offs_t
        k_ok = k_pos < kv_end
        if SLIDING_WINDOW > 0:
            k_ok = k_ok & (k_pos >= first_key)
        blk = tl.load(bt_row + k_pos // BLOCK_SIZE, mask=k_ok, other=0).to(tl.int64)
        slot_in_blk = k_pos % BLOCK_SIZE
        k = tl.load(
            k_cache_ptr
            + blk[None, :] * stride_kb
            + slot_in_blk[None, :] * stride_ks
            + kv_head * stride_kh
            + offs_d[:, None],
            mask=k_ok[None, :] & d_ok[:, None],
            other=0.0,
        )  # [HEAD_PAD, TILE]
        v = tl.load(
            v_cache_ptr
            + blk[:, None] * stride_vb
            + slot_in_blk[:, None] * stride_vs
            + kv_head * stride_vh
            + offs_d[None, :],
            mask=k_ok[:, None] & d_ok[None, :],
            other=0.0,
        )  # [TILE, HEAD_PAD]
        if KV_FP8:  # widened exactly; the scales are folded into scale_log2 and v_scale
            k = k.to(q.dtype)
            v = v.to(q.dtype)
        if IEEE:
            s = tl.dot(q, k, input_precision="ieee")
        else:
            s = tl.dot(q, k)
        if SOFTCAP > 0.0:  # cap * tanh(score / cap), on the scaled score (Gemma 2)
            s = s * (scale_log2 / 1.4426950408889634) / SOFTCAP
            s = (2.0 * tl.sigmoid(2.0 * s) - 1.0) * (SOFTCAP * 1.4426950408889634)
        else:
            s = s * scale_log2
        visible = row_ok[:, None] & k_ok[None, :] & (k_pos[None, :] <= q_abs[:, None])
        if SLIDING_WINDOW > 0:
            visible = visible & (k_pos[None, :] > q_abs[:, None] - SLIDING_WINDOW)
        s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.exp2(s - m_safe[:, None])
        alpha = tl.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None]
        if IEEE:
            acc += tl.dot(p.to(v.dtype), v, input_precision="ieee")
        else:
            acc += tl.dot(p.to(v.dtype), v)
        m_i = m_new

    if KV_FP8:
        acc = acc * v_scale
    if NUM_SEGMENTS > 1:
        base = (tok * NUM_HEADS + head) * NUM_SEGMENTS
        tl.store(seg_max_ptr + base + segment, m_i, mask=row_ok)
        tl.store(seg_sum_ptr + base + segment, l_i, mask=row_ok)
        tl.store(
            seg_out_ptr + (base + segment)[:, None] * HEAD_PAD + offs_d[None, :],
            acc,
            mask=row_ok[:, None],
        )
        if FUSED_REDUCE:
            tl.debug_barrier()  # every thread's partials are stored before the (release) arrival
            # One counter per (query block, KV head), indexed by the block's first token.
            counter = counter_ptr + (q_start + local_block * BLOCK_Q) * (NUM_HEADS // G) + kv_head
            arrived = tl.atomic_add(counter, 1, sem="acq_rel")
            if arrived == NUM_SEGMENTS - 1:
                out = _merge_segments(seg_out_ptr, seg_max_ptr, seg_sum_ptr, base, row_ok, offs_d,
                                      BLOCK_M, HEAD_PAD, NUM_SEGMENTS)
                tl.store(
                    out_ptr + tok[:, None] * stride_ot + head[:, None] * stride_oh + offs_d[None, :],
                    out.to(out_ptr.dtype.element_ty),
                    mask=row_ok[:, None] & d_ok[None, :],
                )
                tl.atomic_xchg(counter, 0)
    else:
        out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
        tl.store(
            out_ptr + tok[:, None] * stride_ot + head[:, None] * stride_oh + offs_d[None, :],
            out.to(out_ptr.dtype.element_ty),
            mask=row_ok[:, None] & d_ok[None, :],
        )


@triton.jit
def _merge_segments(seg_out_ptr, seg_max_ptr, seg_sum_ptr, base, row_ok, offs_d,
                    BLOCK_M: tl.constexpr, HEAD_PAD: tl.constexpr, NUM_SEGMENTS: tl.constexpr):
    """Normalised output [BLOCK_M, HEAD_PAD] of the rows whose partials start at ``base``
    (``(token * H + head) * NUM_SEGMENTS``): what ``_reduce_segments_kernel`` computes for one
    row, up to float32 summation order. Loads bypass L1 (``.cg``): the partials were stored by
    other programs, on other SMs, whose L1 is not coherent with this one's."""
    offs_s = tl.arange(0, NUM_SEGMENTS)
    m = tl.load(seg_max_ptr + base[:, None] + offs_s[None, :], mask=row_ok[:, None],
                other=float("-inf"), cache_modifier=".cg")
    m_all = tl.max(m, axis=1)
    m_all = tl.where(m_all == float("-inf"), 0.0, m_all)  # rows past the batch: no -inf - -inf
    w = tl.where(m == float("-inf"), 0.0, tl.exp2(m - m_all[:, None]))
    l_seg = tl.load(seg_sum_ptr + base[:, None] + offs_s[None, :], mask=row_ok[:, None], other=0.0,
                    cache_modifier=".cg")
    l_all = tl.sum(l_seg * w, axis=1)
    acc = tl.zeros([BLOCK_M, HEAD_PAD], dtype=tl.float32)
    for s in tl.static_range(NUM_SEGMENTS):
        m_s = tl.load(seg_max_ptr + base + s, mask=row_ok, other=float("-inf"), cache_modifier=".cg")
        w_s = tl.where(m_s == float("-inf"), 0.0, tl.exp2(m_s - m_all))
        part = tl.load(seg_out_ptr + (base + s)[:, None] * HEAD_PAD + offs_d[None, :],
                       mask=row_ok[:, None], other=0.0, cache_modifier=".cg")
        acc += part * w_s[:, None]
    return acc / tl.where(l_all == 0.0, 1.0, l_all)[:, None]


@triton.jit
def _reduce_segments_kernel(
    out_ptr,
    seg_out_ptr,
    seg_max_ptr,
    seg_sum_ptr,
    stride_ot,
    stride_oh,
    NUM_HEADS: tl.constexpr,
    HEAD_SIZE: tl.constexpr,
    HEAD_PAD: tl.constexpr,
    NUM_SEGMENTS: tl.constexpr,
):
    tok = tl.program_id(0)
    head = tl.program_id(1)
    offs_s = tl.arange(0, NUM_SEGMENTS)
    offs_d = tl.arange(0, HEAD_PAD)
    base = (tok * NUM_HEADS + head) * NUM_SEGMENTS
    m = tl.load(seg_max_ptr + base + offs_s)
    m_all = tl.max(m, axis=0)
    w = tl.where(m == float("-inf"), 0.0, tl.exp2(m - m_all))
    l_all = tl.sum(tl.load(seg_sum_ptr + base + offs_s) * w, axis=0)
    acc = tl.load(seg_out_ptr + (base + offs_s)[:, None] * HEAD_PAD + offs_d[None, :])
    out = tl.sum(acc * w[:, None], axis=0) / l_all
    tl.store(
        out_ptr + tok * stride_ot + head * stride_oh + offs_d,
        out.to(out_ptr.dtype.element_ty),
        mask=offs_d < HEAD_SIZE,
    )


@triton.jit
def _write_kv_kernel(
    key_ptr,  # [T, Hk, D]
    value_ptr,
    k_cache_ptr,  # [num_blocks, block_size, Hk, D]
    v_cache_ptr,
    slot_ptr,  # [T] int64; < 0 means "don't write" (padding)
    inv_k_scale,  # fp8 cache: values stored as x / scale, saturated at FP8_MAX
    inv_v_scale,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_cb,
    stride_cs,
    stride_ch,
    NUM_KV_HEADS: tl.constexpr,
    HK_PAD: tl.constexpr,
    HEAD_SIZE: tl.constexpr,
    HEAD_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    FP8_MAX: tl.constexpr = 0.0,
):
    t = tl.program_id(0)
    slot = tl.load(slot_ptr + t)
    if slot < 0:
        return
    blk = slot // BLOCK_SIZE
    off = slot % BLOCK_SIZE
    offs_h = tl.arange(0, HK_PAD)
    offs_d = tl.arange(0, HEAD_PAD)
    mask = (offs_h[:, None] < NUM_KV_HEADS) & (offs_d[None, :] < HEAD_SIZE)
    k = tl.load(key_ptr + t * stride_kt + offs_h[:, None] * stride_kh + offs_d[None, :], mask=mask)
    v = tl.load(value_ptr + t * stride_vt + offs_h[:, None] * stride_vh + offs_d[None, :], mask=mask)
    dst = blk * stride_cb + off * stride_cs + offs_h[:, None] * stride_ch + offs_d[None, :]
    if FP8_MAX > 0.0:
        k = tl.clamp(k.to(tl.float32) * inv_k_scale, -FP8_MAX, FP8_MAX)
        v = tl.clamp(v.to(tl.float32) * inv_v_scale, -FP8_MAX, FP8_MAX)
    tl.store(k_cache_ptr + dst, k.to(k_cache_ptr.dtype.element_ty), mask=mask)
    tl.store(v_cache_ptr + dst, v.to(v_cache_ptr.dtype.element_ty), mask=mask)


def write_kv(
    key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor, slot_mapping: torch.Tensor,
    k_scale: float = 1.0, v_scale: float = 1.0,
) -> None:
    """Scatter the K/V of ``slot_mapping.numel()`` tokens into the cache (one launch); an fp8
    cache stores ``x / scale`` saturated at the format's largest value."""
    num_tokens = slot_mapping.shape[0]
    if num_tokens == 0:
        return
    _, _, block_size, num_kv_heads, head_size = kv_cache.shape
    kc, vc = kv_cache[0], kv_cache[1]
    assert key.stride(-1) == 1 and value.stride(-1) == 1 and kc.stride(-1) == 1
    _write_kv_kernel[(num_tokens,)](
        key, value, kc, vc, slot_mapping, 1.0 / k_scale, 1.0 / v_scale,
        key.stride(0), key.stride(1), value.stride(0), value.stride(1),
        kc.stride(0), kc.stride(1), kc.stride(2),
        NUM_KV_HEADS=num_kv_heads,
        HK_PAD=triton.next_power_of_2(num_kv_heads),
        HEAD_SIZE=head_size,
        HEAD_PAD=max(16, triton.next_power_of_2(head_size)),
        BLOCK_SIZE=block_size,
        FP8_MAX=fp8_max(kc.dtype) if is_fp8(kc.dtype) else 0.0,
        num_warps=1 if num_kv_heads * head_size <= 1024 else 4,
    )


def pick_block_m(group: int, max_query_len: int) -> int:
    """Rows per program: 16 for decodes (the tensor-core minimum), 64 for prefill chunks."""
    base = max(16, triton.next_power_of_2(group))
    if max_query_len >= 32 and base < 64:
        return 64
    return base


Workspace = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


def paged_attention(
    query: torch.Tensor,
    kv_cache: torch.Tensor,
    out: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    block_table: torch.Tensor,
    num_seqs: int,
    max_query_len: int,
    scale: float,
    num_segments: int = 1,
    workspace: Workspace | None = None,
    tile: int | None = None,
    sliding_window: int | None = None,
    logits_soft_cap: float | None = None,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
    fused_reduce: bool | None = None,
) -> torch.Tensor:
    """Causal paged attention of ``query`` [T, H, D] over each request's cached + new keys.

    ``num_segments > 1`` selects the split-KV variant (``workspace`` may hold its partial
    buffers and arrival counters, from ``alloc_workspace``: the counters must be zero and are
    left zero; else they are allocated here). ``fused_reduce``: merge the segments in the
    attention launch (default ``FUSED_SPLIT_REDUCE``) or in a second launch. ``tile``: keys per
    loop iteration (default 64, 32 for head sizes over 128). ``sliding_window``: a query at
    position p sees keys (p - window, p] only. ``logits_soft_cap``: scores become
    ``cap * tanh(score / cap)`` before the softmax. An fp8 cache (``--kv-cache-dtype fp8``) is
    read as ``value * scale`` (``k_scale``, ``v_scale``). Writes into ``out``.
    """
    num_tokens, num_heads, head_size = query.shape
    if num_tokens == 0:
        return out
    _, _, block_size, num_kv_heads, _ = kv_cache.shape
    group = num_heads // num_kv_heads
    head_pad = max(16, triton.next_power_of_2(head_size))
    block_m = pick_block_m(group, max_query_len)
    block_q = max(1, block_m // group)
    if tile is None:
        tile = 64 if head_pad <= 128 else 32
    kc, vc = kv_cache[0], kv_cache[1]
    assert query.stride(-1) == 1 and out.stride(-1) == 1 and kc.stride(-1) == 1
    num_q_blocks = num_tokens // block_q + num_seqs
    fused = FUSED_SPLIT_REDUCE if fused_reduce is None else fused_reduce
    if num_segments > 1:
        if num_segments & (num_segments - 1):
            raise ValueError(f"num_segments must be a power of two, got {num_segments}")
        if workspace is None:
            workspace = alloc_workspace(num_tokens, num_heads, head_size, num_segments, query.device)
        _check_workspace(workspace, num_tokens, num_heads, head_pad, num_segments, num_kv_heads)
        seg_out, seg_max, seg_sum, counters = workspace
    else:
        seg_out = seg_max = seg_sum = counters = out  # unused
    num_warps = 8 if block_m * head_pad >= 64 * 256 else 4
    _paged_attention_kernel[(num_q_blocks, num_kv_heads, num_segments)](
        out, query, kc, vc, block_table, seq_lens, query_start_loc,
        seg_out, seg_max, seg_sum, counters,
        scale * LOG2E * k_scale, v_scale, num_seqs,
        query.stride(0), query.stride(1), out.stride(0), out.stride(1),
        kc.stride(0), kc.stride(1), kc.stride(2),
        vc.stride(0), vc.stride(1), vc.stride(2),
        block_table.stride(0),
        NUM_HEADS=num_heads,
        G=group,
        HEAD_SIZE=head_size,
        HEAD_PAD=head_pad,
        BLOCK_SIZE=block_size,
        TILE=tile,
        BLOCK_M=block_m,
        BLOCK_Q=block_q,
        NUM_SEGMENTS=num_segments,
        IEEE=query.dtype == torch.float32,
        SLIDING_WINDOW=sliding_window or 0,
        SOFTCAP=float(logits_soft_cap or 0.0),
        KV_FP8=is_fp8(kc.dtype),
        FUSED_REDUCE=num_segments > 1 and fused,
        num_warps=num_warps,
        num_stages=2,
    )
    if num_segments > 1 and not fused:
        _reduce_segments(out, seg_out, seg_max, seg_sum, head_size, head_pad, num_segments)
    return out


def _reduce_segments(out, seg_out, seg_max, seg_sum, head_size: int, head_pad: int, num_segments: int) -> None:
    """The split-KV merge as a launch of its own (``fused_reduce=False``)."""
    num_tokens, num_heads = out.shape[0], out.shape[1]
    _reduce_segments_kernel[(num_tokens, num_heads)](
        out, seg_out, seg_max, seg_sum,
        out.stride(0), out.stride(1),
        NUM_HEADS=num_heads,
        HEAD_SIZE=head_size,
        HEAD_PAD=head_pad,
        NUM_SEGMENTS=num_segments,
        num_warps=1 if head_pad * num_segments <= 2048 else 4,
    )


def _check_workspace(ws, num_tokens: int, num_heads: int, head_pad: int, num_segments: int,
                     num_kv_heads: int) -> None:
    """A workspace too small for this launch would be written out of bounds: refuse it."""
    if len(ws) != 4:
        raise ValueError(f"a split-KV workspace is (out, max, sum, counters) from alloc_workspace, got {len(ws)} tensors")
    seg_out, seg_max, seg_sum, counters = ws
    rows = num_tokens * num_heads * num_segments
    if seg_out.numel() < rows * head_pad or seg_max.numel() < rows or seg_sum.numel() < rows:
        raise ValueError(f"split-KV workspace too small for {num_tokens} tokens x {num_heads} heads x "
                         f"{num_segments} segments")
    if counters.dtype != torch.int32 or counters.numel() < num_tokens * num_kv_heads:
        raise ValueError(f"{num_tokens} tokens x {num_kv_heads} KV heads need as many int32 counters, "
                         f"got {counters.numel()} {counters.dtype}")


def alloc_workspace(
    num_tokens: int, num_heads: int, head_size: int, num_segments: int, device
) -> Workspace:
    """Buffers of the split-KV variant: partial outputs, maxima and sums (float32), and the
    arrival counters of the in-launch merge (int32, zero; every launch leaves them zero, so one
    workspace serves every layer of a step and every replay of a captured graph)."""
    head_pad = max(16, triton.next_power_of_2(head_size))
    return (
        torch.empty(num_tokens, num_heads, num_segments, head_pad, dtype=torch.float32, device=device),
        torch.empty(num_tokens, num_heads, num_segments, dtype=torch.float32, device=device),
        torch.empty(num_tokens, num_heads, num_segments, dtype=torch.float32, device=device),
        torch.zeros(num_tokens * num_heads, dtype=torch.int32, device=device),
    )
