"""The router GEMV and the routing of few tokens in one launch.

At decode the router is a small GEMV (Qwen3-30B-A3B: 128 x 2048, 0.5 MB) followed by the
routing of ``triton_routing.route`` (softmax, top-k, renormalisation): two launches whose
cost is their latency, not their bytes. Here program ``(e-block, token)`` computes
``BLOCK_E`` logits of one token (float32 FMAs, rounded to the activations' dtype as
``F.linear`` rounds its output) and stores them in a float32 scratch row; then it counts
itself done on the token's arrival counter. The last program of a token to arrive (it sees
every other program's logits: the stores precede a CTA barrier and the counter's
acquire-release add) routes the token exactly as ``triton_routing.route`` does and sets the
counter back to zero, so the counter is zero between launches, and in every replay of a
captured graph.

The counters are a persistent int32 buffer of the caller (``FusedMoE`` owns one per layer,
zeroed at build): at most ``counters.numel()`` tokens per launch. Logits differ from cuBLAS's
only in float32 summation order (before rounding), so a top-k choice can differ only between
experts whose logits tie to within that rounding.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from octavo.models.moe.kernels.triton_routing import _select_store


@triton.jit
def _router_route_kernel(
    x_ptr, w_ptr, logits_ptr, counter_ptr, weights_ptr, ids_ptr,
    num_experts, hidden, stride_xm, stride_wn, expert_start, num_local,
    TOP_K: tl.constexpr, K_PAD: tl.constexpr, E_PAD: tl.constexpr, RENORM: tl.constexpr,
    BLOCK_E: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr,
):
    row = tl.program_id(1).to(tl.int64)
    offs_e = tl.program_id(0) * BLOCK_E + tl.arange(0, BLOCK_E)
    mask_e = offs_e < num_experts
    offs_k = tl.arange(0, BLOCK_K)
    x_ptrs = x_ptr + row * stride_xm + offs_k[None, :]
    w_ptrs = w_ptr + offs_e[:, None] * stride_wn + offs_k[None, :]
    acc = tl.zeros((BLOCK_E, BLOCK_K), dtype=tl.float32)
    for k0 in range(0, hidden, BLOCK_K):
        mask_k = (offs_k[None, :] < hidden - k0) | EVEN_K
        xk = tl.load(x_ptrs + k0, mask=mask_k, other=0.0)
        wk = tl.load(w_ptrs + k0, mask=mask_e[:, None] & mask_k, other=0.0)
        acc += wk.to(tl.float32) * xk.to(tl.float32)
    logit = tl.sum(acc, axis=1).to(x_ptr.dtype.element_ty).to(tl.float32)  # F.linear's rounding
    tl.store(logits_ptr + row * num_experts + offs_e, logit, mask=mask_e)
    tl.debug_barrier()  # every thread's logits are stored before the (release) arrival
    arrived = tl.atomic_add(counter_ptr + row, 1, sem="acq_rel")
    if arrived == tl.num_programs(0) - 1:
        offs = tl.arange(0, E_PAD)
        mask = offs < num_experts
        # Past L1 (not coherent across SMs), as triton_gemv's in-kernel split sum reads.
        row_logits = tl.load(logits_ptr + row * num_experts + offs, mask=mask, other=-float("inf"),
                             cache_modifier=".cg")
        _select_store(row_logits, offs, mask, weights_ptr, ids_ptr, row, expert_start, num_local,
                      TOP_K, K_PAD, E_PAD, RENORM)
        tl.atomic_xchg(counter_ptr + row, 0)


def router_route(
    x: torch.Tensor, router_weight: torch.Tensor, top_k: int, renormalize: bool, expert_start: int,
    num_local: int, counters: torch.Tensor, block_e: int = 2, block_k: int = 2048,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``triton_routing.route(F.linear(x, router_weight), ...)`` in one launch: (weights [T, k]
    float32, local ids [T, k] int32). ``counters``: int32, all zero, >= T entries; left zero.
    The default tiles take a 2048-wide row in one pass (2 rows per program, 64 programs for
    128 experts): the launch is latency-bound, so few serial loads per program matter most."""
    num_tokens, hidden = x.shape
    num_experts = router_weight.shape[0]
    if not 1 <= top_k <= num_experts:
        raise ValueError(f"top_k {top_k} must be in [1, {num_experts}]")
    if router_weight.shape[1] != hidden or router_weight.dtype != x.dtype:
        raise ValueError(f"router weight {tuple(router_weight.shape)} {router_weight.dtype} for x "
                         f"{tuple(x.shape)} {x.dtype}")
    if counters.dtype != torch.int32 or counters.numel() < num_tokens:
        raise ValueError(f"{num_tokens} tokens need >= {num_tokens} int32 counters, got {counters.numel()}")
    x = x if x.stride(-1) == 1 else x.contiguous()
    w = router_weight if router_weight.stride(-1) == 1 else router_weight.contiguous()
    logits = torch.empty(num_tokens, num_experts, dtype=torch.float32, device=x.device)
    weights = torch.empty(num_tokens, top_k, dtype=torch.float32, device=x.device)
    ids = torch.empty(num_tokens, top_k, dtype=torch.int32, device=x.device)
    if num_tokens:
        block_k = min(block_k, triton.next_power_of_2(hidden))
        _router_route_kernel[(triton.cdiv(num_experts, block_e), num_tokens)](
            x, w, logits, counters, weights, ids,
            num_experts, hidden, x.stride(0), w.stride(0), expert_start, num_local,
            TOP_K=top_k, K_PAD=triton.next_power_of_2(top_k), E_PAD=triton.next_power_of_2(num_experts),
            RENORM=renormalize, BLOCK_E=block_e, BLOCK_K=block_k, EVEN_K=hidden % block_k == 0,
            num_warps=4,
        )
    return weights, ids
