"""Routing and expert grouping for the Triton MoE path, one launch each.

``route``: one program per token: softmax over the router logits in float32, top-k by
repeated argmax (ties to the lower expert id, as ``torch.topk`` on distinct values), optional
renormalisation, and the mapping to this rank's local expert ids. Same contract as
``ExpertsKernel.route``.

``align``: one program groups all token-expert pairs by expert with the contract of
``octavo.models.moe.align.align_block_size`` (the torch version, kept as the readable
reference): a histogram by atomic adds, padded segment starts by a cumulative sum, the
block-to-expert table, then every pair claims the next slot of its expert's segment with an
atomic add. Pairs of one expert therefore land in arbitrary order inside its segment; that is
harmless because every pair's result is written to its own row and the sum over k reads rows
in a fixed order. Replacing ~15 small torch ops per layer by these two launches matters at
batch 1, where a decode step is a few microseconds of work per layer.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _select_store(
    logit, offs, mask, weights_ptr, ids_ptr, row, expert_start, num_local,
    TOP_K: tl.constexpr, K_PAD: tl.constexpr, E_PAD: tl.constexpr, RENORM: tl.constexpr,
):
    """Softmax over one token's ``logit`` [E_PAD] (float32, -inf outside ``mask``), top-k,
    optional renormalisation, local ids; stores the token's k weights and ids."""
    p = tl.exp(logit - tl.max(logit, axis=0))
    p = p / tl.sum(p, axis=0)
    p = tl.where(mask, p, -1.0)
    kk = tl.arange(0, K_PAD)
    w = tl.zeros([K_PAD], dtype=tl.float32)
    ids = tl.zeros([K_PAD], dtype=tl.int32)
    for j in tl.static_range(TOP_K):
        best_p = tl.max(p, axis=0)
        best = tl.min(tl.where(p == best_p, offs, E_PAD), axis=0)  # lowest id among equals
        w = tl.where(kk == j, best_p, w)
        ids = tl.where(kk == j, best, ids)
        p = tl.where(offs == best, -1.0, p)
    if RENORM:
        w = w / tl.sum(w, axis=0)
    local = ids - expert_start
    local = tl.where((local >= 0) & (local < num_local), local, num_local)
    kmask = kk < TOP_K
    tl.store(weights_ptr + row * TOP_K + kk, w, mask=kmask)
    tl.store(ids_ptr + row * TOP_K + kk, local, mask=kmask)


@triton.jit
def _route_kernel(
    logits_ptr, weights_ptr, ids_ptr, stride_l, num_experts, expert_start, num_local,
    TOP_K: tl.constexpr, K_PAD: tl.constexpr, E_PAD: tl.constexpr, RENORM: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, E_PAD)
    mask = offs < num_experts
    logit = tl.load(logits_ptr + row * stride_l + offs, mask=mask, other=-float("inf")).to(tl.float32)
    _select_store(logit, offs, mask, weights_ptr, ids_ptr, row, expert_start, num_local,
                  TOP_K, K_PAD, E_PAD, RENORM)


def route(
    router_logits: torch.Tensor, top_k: int, renormalize: bool, expert_start: int, num_local: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights [T, k] float32, local ids [T, k] int32) in one launch."""
    num_tokens, num_experts = router_logits.shape
    if not 1 <= top_k <= num_experts:
        raise ValueError(f"top_k {top_k} must be in [1, {num_experts}]")
    logits = router_logits if router_logits.stride(-1) == 1 else router_logits.contiguous()
    weights = torch.empty(num_tokens, top_k, dtype=torch.float32, device=logits.device)
    ids = torch.empty(num_tokens, top_k, dtype=torch.int32, device=logits.device)
    if num_tokens:
        _route_kernel[(num_tokens,)](
            logits, weights, ids, logits.stride(0), num_experts, expert_start, num_local,
            TOP_K=top_k, K_PAD=triton.next_power_of_2(top_k), E_PAD=triton.next_power_of_2(num_experts),
            RENORM=renormalize,
        )
    return weights, ids


@triton.jit
def _align_kernel(
    ids_ptr, sorted_ptr, block_expert_ptr, num_padded_ptr, counts_ptr, cursor_ptr,
    num_pairs, capacity, num_experts,
    BLOCK: tl.constexpr, E_PAD: tl.constexpr, CHUNK: tl.constexpr, B_CHUNK: tl.constexpr,
):
    e_offs = tl.arange(0, E_PAD)
    e_mask = e_offs <= num_experts  # buckets 0..E, where E holds pairs of other ranks
    tl.store(counts_ptr + e_offs, tl.zeros([E_PAD], dtype=tl.int32), mask=e_mask)
    for start in range(0, capacity, CHUNK):  # every slot starts as the sentinel num_pairs
        offs = start + tl.arange(0, CHUNK)
        tl.store(sorted_ptr + offs, tl.zeros([CHUNK], dtype=tl.int32) + num_pairs, mask=offs < capacity)
    tl.debug_barrier()
    for start in range(0, num_pairs, CHUNK):
        offs = start + tl.arange(0, CHUNK)
        m = offs < num_pairs
        e = tl.load(ids_ptr + offs, mask=m, other=0).to(tl.int32)
        tl.atomic_add(counts_ptr + e, tl.full([CHUNK], 1, tl.int32), mask=m)
    tl.debug_barrier()
    counts = tl.load(counts_ptr + e_offs, mask=e_mask, other=0, volatile=True)
    padded = (counts + BLOCK - 1) // BLOCK * BLOCK
    ends = tl.cumsum(padded, axis=0)
    tl.store(cursor_ptr + e_offs, ends - padded, mask=e_mask)
    tl.store(num_padded_ptr, tl.sum(padded, axis=0))
    num_blocks = capacity // BLOCK
    for b0 in range(0, num_blocks, B_CHUNK):
        b = b0 + tl.arange(0, B_CHUNK)
        slot = b * BLOCK
        # The expert of a block: how many segments end at or before its first slot.
        expert = tl.sum(((ends[None, :] <= slot[:, None]) & e_mask[None, :]).to(tl.int32), axis=1)
        expert = tl.where(expert >= num_experts, -1, expert)
        tl.store(block_expert_ptr + b, expert, mask=b < num_blocks)
    tl.debug_barrier()
    for start in range(0, num_pairs, CHUNK):
        offs = start + tl.arange(0, CHUNK)
        m = offs < num_pairs
        e = tl.load(ids_ptr + offs, mask=m, other=0).to(tl.int32)
        pos = tl.atomic_add(cursor_ptr + e, tl.full([CHUNK], 1, tl.int32), mask=m)
        tl.store(sorted_ptr + pos, offs, mask=m)


def align(ids: torch.Tensor, num_experts: int, block: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``align_block_size``'s contract (see ``octavo.models.moe.align``) in one launch."""
    dev = ids.device
    flat = ids.reshape(-1)
    n = flat.numel()
    capacity = -(-(n + (num_experts + 1) * (block - 1)) // block) * block
    sorted_ids = torch.empty(capacity, dtype=torch.int32, device=dev)
    block_experts = torch.empty(capacity // block, dtype=torch.int32, device=dev)
    num_padded = torch.empty(1, dtype=torch.int32, device=dev)
    scratch = torch.empty(2, num_experts + 1, dtype=torch.int32, device=dev)
    _align_kernel[(1,)](
        flat, sorted_ids, block_experts, num_padded, scratch[0], scratch[1],
        n, capacity, num_experts,
        BLOCK=block, E_PAD=triton.next_power_of_2(num_experts + 1), CHUNK=1024, B_CHUNK=32,
        num_warps=8,
    )
    return sorted_ids, block_experts, num_padded
