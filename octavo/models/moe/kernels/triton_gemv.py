"""The small-batch path of the Triton experts: one GEMV per (token, expert) pair.

At decode with few tokens the experts are a weight stream: a token of Qwen3-30B-A3B reads
8 x 3 x 2048 x 768 bf16 weights (75 MB per layer) and does two FLOPs per weight. The grouped
GEMM pads every expert's pairs to a 16-row tensor-core tile and needs the align pass first;
here no grouping is done at all, and every program streams a slice of one expert's rows
against one token's activations in float32 FMAs (no tensor cores, no padding):

1. gate/up: program ``(pair, n-block)`` reads ``BLOCK_N`` gate rows and the matching up rows
   of the pair's expert (``w13[e]``, K = hidden) and stores ``silu(gate) * up`` into
   ``inter[pair]``. Pairs held by another rank (id ``num_experts``) store nothing.
2. down: program ``(token, n-block)`` reads ``BLOCK_N`` rows of the down projection of *all*
   of the token's k experts at once (a ``[K_PAD, BLOCK_N, BLOCK_K]`` tile, so the k experts'
   weights are in flight together), scales each by the pair's routing weight and sums over k
   in registers. The top-k sum therefore needs no atomics and no extra launch, and its order
   is fixed: the result is deterministic run to run.

Both launches have static grids (``n-blocks x pairs`` and ``n-blocks x tokens``) and allocate
only ``inter`` and the output, so the path records into CUDA graphs. Each program reads
``BLOCK_N`` full rows; the grid is what fills the SMs (a Qwen3-30B-A3B token gives 768 gate/up
and 512 down programs with the default tiles, several per SM of an H100/H200, so no split over
K, which would need a second reduction pass, is needed). ``inter`` is stored in the
activations' dtype, as the grouped path and transformers keep it. Expert weights are requested once per *pair*,
not once per expert; program ids run over pairs fastest, so pairs sharing an expert ask for
the same rows at about the same time and the repeats are mostly served from L2
(``configs.use_gemv`` still bounds how many pairs take this path).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from octavo.models.moe.configs import Config, gemv_config


@triton.jit
def _gemv_gate_up_kernel(
    x_ptr, w_ptr, ids_ptr, out_ptr,
    N, K, num_experts, num_pairs,
    stride_xm, stride_we, stride_wn, stride_om,
    TOP_K: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr,
):
    pid = tl.program_id(0)  # n-block major: pairs sharing an expert read its rows together (L2)
    pair = (pid % num_pairs).to(tl.int64)
    offs_n = (pid // num_pairs) * BLOCK_N + tl.arange(0, BLOCK_N)
    expert = tl.load(ids_ptr + pair).to(tl.int64)
    if expert >= num_experts:
        return  # an expert of another rank: the down kernel skips this pair
    mask_n = offs_n < N
    offs_k = tl.arange(0, BLOCK_K)
    # x is loaded with the tile's rank ([1, BLOCK_K]): the broadcast over rows is a plain expand.
    x_ptrs = x_ptr + (pair // TOP_K) * stride_xm + offs_k[None, :]
    g_ptrs = w_ptr + expert * stride_we + offs_n[:, None] * stride_wn + offs_k[None, :]
    u_ptrs = g_ptrs + N * stride_wn
    acc_g = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    acc_u = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        mask_k = (offs_k[None, :] < K - k0) | EVEN_K  # EVEN_K: whole tiles, row masks only (wide loads)
        xk = tl.load(x_ptrs + k0, mask=mask_k, other=0.0).to(tl.float32)
        g = tl.load(g_ptrs + k0, mask=mask_n[:, None] & mask_k, other=0.0).to(tl.float32)
        u = tl.load(u_ptrs + k0, mask=mask_n[:, None] & mask_k, other=0.0).to(tl.float32)
        acc_g += g * xk
        acc_u += u * xk
    gate = tl.sum(acc_g, axis=1)
    up = tl.sum(acc_u, axis=1)
    h = gate / (1.0 + tl.exp(-gate)) * up
    tl.store(out_ptr + pair * stride_om + offs_n, h.to(out_ptr.dtype.element_ty), mask=mask_n)


@triton.jit
def _gemv_down_kernel(
    a_ptr, w_ptr, ids_ptr, weights_ptr, out_ptr,
    N, K, num_experts, num_tokens,
    stride_am, stride_we, stride_wn, stride_om,
    TOP_K: tl.constexpr, K_PAD: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    EVEN_K: tl.constexpr,
):
    pid = tl.program_id(0)  # n-block major, as in the gate/up kernel
    token = (pid % num_tokens).to(tl.int64)
    offs_n = (pid // num_tokens) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < N
    slot = tl.arange(0, K_PAD)
    pair = token * TOP_K + slot
    expert = tl.load(ids_ptr + pair, mask=slot < TOP_K, other=num_experts).to(tl.int64)
    ok = expert < num_experts  # padding slots and experts of other ranks read nothing
    expert = tl.where(ok, expert, 0)
    route_w = tl.load(weights_ptr + pair, mask=ok, other=0.0).to(tl.float32)
    offs_k = tl.arange(0, BLOCK_K)[None, None, :]
    # inter rows [K_PAD, 1, BLOCK_K] against weight rows [K_PAD, BLOCK_N, BLOCK_K], both 3-D.
    a_ptrs = a_ptr + pair[:, None, None] * stride_am + offs_k
    w_ptrs = w_ptr + expert[:, None, None] * stride_we + offs_n[None, :, None] * stride_wn + offs_k
    a_rows_ok = ok[:, None, None]
    w_rows_ok = a_rows_ok & mask_n[None, :, None]
    acc = tl.zeros((K_PAD, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        mask_k = (offs_k < K - k0) | EVEN_K
        a = tl.load(a_ptrs + k0, mask=a_rows_ok & mask_k, other=0.0).to(tl.float32)
        w = tl.load(w_ptrs + k0, mask=w_rows_ok & mask_k, other=0.0).to(tl.float32)
        acc += tl.sum(w * a, axis=2)
    out = tl.sum(acc * route_w[:, None], axis=0)  # the top-k sum, slots in a fixed order
    tl.store(out_ptr + token * stride_om + offs_n, out.to(out_ptr.dtype.element_ty), mask=mask_n)


def _dividing_block(k: int, block: int) -> int:
    """``block`` halved until it divides ``k`` (at most down to 16): whole K tiles keep the
    loads unmasked along K, hence 128-bit wide (e.g. a tensor-parallel shard's I = 384)."""
    while k % block and block > 16:
        block //= 2
    return block


def gemv_experts(
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    weights: torch.Tensor,
    ids: torch.Tensor,
    config: Config | None = None,
) -> torch.Tensor:
    """The experts of ``octavo.models.moe.kernels`` for ``x`` [T, H] in two launches;
    returns [T, H] in ``x.dtype``. ``config`` overrides ``configs.gemv_config``'s tiles."""
    num_tokens, top_k = ids.shape
    num_experts, two_inter, hidden = w13.shape
    inter = two_inter // 2
    if x.shape[1] != hidden or w2.shape != (num_experts, hidden, inter):
        raise ValueError(f"shape mismatch: x {tuple(x.shape)}, w13 {tuple(w13.shape)}, w2 {tuple(w2.shape)}")
    out = torch.empty(num_tokens, hidden, dtype=x.dtype, device=x.device)
    if num_tokens == 0:
        return out
    cfg = config or gemv_config(x.dtype)
    x, w13, w2 = x.contiguous(), w13.contiguous(), w2.contiguous()
    ids, weights = ids.contiguous(), weights.to(torch.float32).contiguous()
    inter_buf = torch.empty(num_tokens * top_k, inter, dtype=x.dtype, device=x.device)
    bn, bk = cfg["GATE_UP_BLOCK_N"], _dividing_block(hidden, cfg["GATE_UP_BLOCK_K"])
    n_blocks = triton.cdiv(inter, bn)
    _gemv_gate_up_kernel[(num_tokens * top_k * n_blocks,)](
        x, w13, ids, inter_buf,
        inter, hidden, num_experts, num_tokens * top_k,
        x.stride(0), w13.stride(0), w13.stride(1), inter_buf.stride(0),
        TOP_K=top_k, BLOCK_N=bn, BLOCK_K=bk, EVEN_K=hidden % bk == 0, num_warps=cfg["GATE_UP_WARPS"],
    )
    bn, bk = cfg["DOWN_BLOCK_N"], _dividing_block(inter, cfg["DOWN_BLOCK_K"])
    n_blocks = triton.cdiv(hidden, bn)
    _gemv_down_kernel[(num_tokens * n_blocks,)](
        inter_buf, w2, ids, weights, out,
        hidden, inter, num_experts, num_tokens,
        inter_buf.stride(0), w2.stride(0), w2.stride(1), out.stride(0),
        TOP_K=top_k, K_PAD=triton.next_power_of_2(top_k), BLOCK_N=bn, BLOCK_K=bk,
        EVEN_K=inter % bk == 0, num_warps=cfg["DOWN_WARPS"],
    )
    return out
