"""The Triton grouped GEMM over token-expert pairs sorted by expert (CUDA/ROCm experts).

Per MoE layer, after the router GEMM:

0. ``triton_routing.route`` (softmax top-k, one launch) and ``triton_routing.align`` (pairs
   grouped by expert, each expert's run padded to ``BLOCK_M`` so every M-block belongs to
   exactly one expert; one launch);
1. gate/up: each program computes a ``BLOCK_M x BLOCK_N`` tile of both the gate and the up
   projection of its block's tokens against its expert's ``w13``, and stores
   ``silu(gate) * up`` (the fused epilogue) into ``inter`` [N_pairs, I] at the pairs' rows;
2. down: ``inter`` rows times the expert's ``w2``, scaled by the pair's routing weight, into
   ``partial`` [N_pairs, H]; blocks of pairs held by another rank (expert id -1) store zeros.

The k partial rows of each token are then summed. Accumulation is float32; float32 inputs use
IEEE products (no TF32) so they agree with the torch reference. Tile sizes come from
``configs.get_config`` (a tuned table with a heuristic fallback).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from octavo.models.moe.configs import get_config
from octavo.models.moe.kernels import triton_routing


@triton.jit
def _tile_ids(num_slots, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """(pid_m, pid_n) in grouped order: GROUP_M M-blocks share each N-block (L2 reuse)."""
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(num_slots, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    per_group = GROUP_M * num_pid_n
    group = pid // per_group
    first_m = group * GROUP_M
    size_m = tl.minimum(num_pid_m - first_m, GROUP_M)
    pid_m = first_m + ((pid % per_group) % size_m)
    pid_n = (pid % per_group) // size_m
    return pid_m, pid_n


@triton.jit
def _gate_up_kernel(
    x_ptr, w_ptr, out_ptr, sorted_ptr, block_expert_ptr, num_padded_ptr,
    N, K, num_pairs, num_slots,
    stride_xm, stride_xk, stride_we, stride_wn, stride_wk, stride_om, stride_on,
    TOP_K: tl.constexpr, IEEE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
):
    pid_m, pid_n = _tile_ids(num_slots, N, BLOCK_M, BLOCK_N, GROUP_M)
    if pid_m * BLOCK_M >= tl.load(num_padded_ptr):
        return
    expert = tl.load(block_expert_ptr + pid_m).to(tl.int64)
    if expert < 0:
        return  # pairs of experts on other ranks: the down kernel writes their zeros
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    pair = tl.load(sorted_ptr + offs_m).to(tl.int64)
    mask_m = pair < num_pairs
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < N
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = x_ptr + (pair // TOP_K)[:, None] * stride_xm + offs_k[None, :] * stride_xk
    g_ptrs = w_ptr + expert * stride_we + offs_n[None, :] * stride_wn + offs_k[:, None] * stride_wk
    u_ptrs = g_ptrs + N * stride_wn
    acc_g = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, tl.cdiv(K, BLOCK_K)):
        mask_k = offs_k < K - k0 * BLOCK_K
        a = tl.load(a_ptrs, mask=mask_m[:, None] & mask_k[None, :], other=0.0)
        g = tl.load(g_ptrs, mask=mask_k[:, None] & mask_n[None, :], other=0.0)
        u = tl.load(u_ptrs, mask=mask_k[:, None] & mask_n[None, :], other=0.0)
        if IEEE:
            acc_g = tl.dot(a, g, acc_g, input_precision="ieee")
            acc_u = tl.dot(a, u, acc_u, input_precision="ieee")
        else:
            acc_g = tl.dot(a, g, acc_g)
            acc_u = tl.dot(a, u, acc_u)
        a_ptrs += BLOCK_K * stride_xk
        g_ptrs += BLOCK_K * stride_wk
        u_ptrs += BLOCK_K * stride_wk
    h = acc_g / (1.0 + tl.exp(-acc_g)) * acc_u
    o_ptrs = out_ptr + pair[:, None] * stride_om + offs_n[None, :] * stride_on
    tl.store(o_ptrs, h.to(out_ptr.dtype.element_ty), mask=mask_m[:, None] & mask_n[None, :])


@triton.jit
def _down_kernel(
    a_ptr, w_ptr, out_ptr, weight_ptr, sorted_ptr, block_expert_ptr, num_padded_ptr,
    N, K, num_pairs, num_slots,
    stride_am, stride_ak, stride_we, stride_wn, stride_wk, stride_om, stride_on,
    IEEE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
):
    pid_m, pid_n = _tile_ids(num_slots, N, BLOCK_M, BLOCK_N, GROUP_M)
    if pid_m * BLOCK_M >= tl.load(num_padded_ptr):
        return
    expert = tl.load(block_expert_ptr + pid_m).to(tl.int64)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    pair = tl.load(sorted_ptr + offs_m).to(tl.int64)
    mask_m = pair < num_pairs
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < N
    o_ptrs = out_ptr + pair[:, None] * stride_om + offs_n[None, :] * stride_on
    o_mask = mask_m[:, None] & mask_n[None, :]
    if expert < 0:
        tl.store(o_ptrs, tl.zeros((BLOCK_M, BLOCK_N), dtype=out_ptr.dtype.element_ty), mask=o_mask)
        return
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + pair[:, None] * stride_am + offs_k[None, :] * stride_ak
    b_ptrs = w_ptr + expert * stride_we + offs_n[None, :] * stride_wn + offs_k[:, None] * stride_wk
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, tl.cdiv(K, BLOCK_K)):
        mask_k = offs_k < K - k0 * BLOCK_K
        a = tl.load(a_ptrs, mask=mask_m[:, None] & mask_k[None, :], other=0.0)
        b = tl.load(b_ptrs, mask=mask_k[:, None] & mask_n[None, :], other=0.0)
        if IEEE:
            acc = tl.dot(a, b, acc, input_precision="ieee")
        else:
            acc = tl.dot(a, b, acc)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_wk
    w = tl.load(weight_ptr + pair, mask=mask_m, other=0.0)
    acc = acc * w[:, None]
    tl.store(o_ptrs, acc.to(out_ptr.dtype.element_ty), mask=o_mask)


def _launch_grid(num_slots: int, n: int, cfg: dict[str, int]) -> tuple[int]:
    return (triton.cdiv(num_slots, cfg["BLOCK_M"]) * triton.cdiv(n, cfg["BLOCK_N"]),)


def fused_experts(
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    weights: torch.Tensor,
    ids: torch.Tensor,
    config: dict[str, int] | None = None,
) -> torch.Tensor:
    """The experts of the module docstring for ``x`` [T, H]; returns [T, H] in ``x.dtype``."""
    num_tokens, top_k = ids.shape
    num_experts, two_inter, hidden = w13.shape
    inter = two_inter // 2
    if x.shape[1] != hidden or w2.shape != (num_experts, hidden, inter):
        raise ValueError(f"shape mismatch: x {tuple(x.shape)}, w13 {tuple(w13.shape)}, w2 {tuple(w2.shape)}")
    cfg = config or get_config(num_experts, inter, hidden, num_tokens * top_k, x.dtype, top_k)
    sorted_ids, block_experts, num_padded = triton_routing.align(ids, num_experts, cfg["BLOCK_M"])
    num_pairs, num_slots = num_tokens * top_k, sorted_ids.numel()
    ieee = x.dtype == torch.float32
    x = x.contiguous()
    inter_buf = torch.empty(num_pairs, inter, dtype=x.dtype, device=x.device)
    tiles = dict(BLOCK_M=cfg["BLOCK_M"], BLOCK_N=cfg["BLOCK_N"], BLOCK_K=cfg["BLOCK_K"], GROUP_M=cfg["GROUP_M"])
    launch = dict(num_warps=cfg.get("num_warps", 4), num_stages=cfg.get("num_stages", 3))
    _gate_up_kernel[_launch_grid(num_slots, inter, cfg)](
        x, w13, inter_buf, sorted_ids, block_experts, num_padded,
        inter, hidden, num_pairs, num_slots,
        x.stride(0), x.stride(1), w13.stride(0), w13.stride(1), w13.stride(2),
        inter_buf.stride(0), inter_buf.stride(1),
        TOP_K=top_k, IEEE=ieee, **tiles, **launch,
    )
    partial = torch.empty(num_pairs, hidden, dtype=x.dtype, device=x.device)
    flat_weights = weights.reshape(-1).to(torch.float32).contiguous()
    _down_kernel[_launch_grid(num_slots, hidden, cfg)](
        inter_buf, w2, partial, flat_weights, sorted_ids, block_experts, num_padded,
        hidden, inter, num_pairs, num_slots,
        inter_buf.stride(0), inter_buf.stride(1), w2.stride(0), w2.stride(1), w2.stride(2),
        partial.stride(0), partial.stride(1),
        IEEE=ieee, **tiles, **launch,
    )
    if top_k == 1:
        return partial
    return partial.view(num_tokens, top_k, hidden).sum(dim=1)
