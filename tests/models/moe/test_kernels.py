"""Routing, block alignment and the expert kernels against ``torch_ref``.

The CPU kernel and (under ``TRITON_INTERPRET=1`` where there is no GPU) the Triton grouped GEMM
run on small random batches, including pairs routed to experts of another rank (the id
``num_local_experts``) which must contribute nothing. ``cuda``-marked tests sweep batch sizes
1-512 and expert counts 8-128 on a GPU.
"""

from __future__ import annotations

import os

import pytest
import torch

from octavo.models.moe.align import align_block_size
from octavo.models.moe.kernels.cpu_grouped import CpuGroupedExperts
from octavo.models.moe.kernels.torch_ref import TorchRefExperts
from octavo.models.moe.router import select_experts

HAS_GPU = torch.cuda.is_available()
if not HAS_GPU:  # before anything imports triton (it reads this once, at import)
    os.environ.setdefault("TRITON_INTERPRET", "1")


def make_case(tokens, experts, top_k, hidden, inter, dtype=torch.float32, device="cpu", seed=0, dropped=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, hidden, generator=g).to(dtype)
    w13 = (torch.randn(experts, 2 * inter, hidden, generator=g) * hidden**-0.5).to(dtype)
    w2 = (torch.randn(experts, hidden, inter, generator=g) * inter**-0.5).to(dtype)
    logits = torch.randn(tokens, experts + dropped, generator=g)
    weights, ids = select_experts(logits, top_k, renormalize=True)
    ids = ids.masked_fill(ids >= experts, experts)  # experts past E live on another rank
    return [t.to(device) for t in (x, w13, w2, weights, ids)]


def test_select_experts_matches_transformers_order():
    logits = torch.tensor([[1.0, 3.0, 2.0, 0.0], [0.0, 0.0, 5.0, 1.0]])
    w, ids = select_experts(logits, 2, renormalize=False)
    probs = logits.softmax(-1)
    assert ids.tolist() == [[1, 2], [2, 3]]
    torch.testing.assert_close(w, probs.gather(1, ids))
    w, _ = select_experts(logits, 2, renormalize=True)
    torch.testing.assert_close(w.sum(-1), torch.ones(2))
    with pytest.raises(ValueError, match="top_k"):
        select_experts(logits, 5, renormalize=True)


@pytest.mark.parametrize("block", [1, 4, 16])
def test_align_block_size_groups_and_pads(block):
    ids = torch.tensor([[2, 0], [2, 1], [0, 4], [3, 2]])  # 4 = dropped bucket (E = 4)
    sorted_ids, block_experts, num_padded = align_block_size(ids, 4, block)
    n = ids.numel()
    used = int(num_padded)
    assert used % block == 0 and sorted_ids.numel() >= used
    flat = ids.reshape(-1)
    real = sorted_ids[:used][sorted_ids[:used] < n].tolist()
    assert sorted(real) == list(range(n))  # every pair exactly once
    assert (sorted_ids[used:] == n).all()
    for b in range(used // block):
        pairs = sorted_ids[b * block:(b + 1) * block]
        pairs = pairs[pairs < n]
        e = int(block_experts[b])
        expected = {int(flat[p]) for p in pairs} or None
        if e == -1:
            assert expected in ({4}, None)
        else:
            assert expected in ({e}, None) and pairs.numel() > 0
    # Within an expert, pairs keep their original (token-major) order.
    assert real == sorted(range(n), key=lambda p: (int(flat[p]), p))


@pytest.mark.parametrize("tokens", [1, 5, 33])
@pytest.mark.parametrize("dropped", [0, 4])
def test_cpu_grouped_matches_reference(tokens, dropped):
    case = make_case(tokens, 8, 2, 32, 24, dropped=dropped)
    ref = TorchRefExperts(torch.float32).apply(*case)
    out = CpuGroupedExperts(torch.float32).apply(*case)
    torch.testing.assert_close(out, ref, rtol=1e-6, atol=1e-6)


def test_cpu_grouped_bf16_policy():
    kernel = CpuGroupedExperts(torch.bfloat16)
    from octavo.cpu_isa import best_isa

    assert kernel.compute_dtype == (torch.bfloat16 if best_isa()[0] == "avx512" else torch.float32)
    assert CpuGroupedExperts(torch.float32).compute_dtype == torch.float32
    case = make_case(9, 8, 2, 32, 24, dtype=torch.bfloat16)
    ref = TorchRefExperts(torch.float32).apply(*[t.float() if t.is_floating_point() else t for t in case])
    out = kernel.apply(*case)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), ref, rtol=3e-2, atol=3e-2)


# -- the Triton grouped GEMM --------------------------------------------------------------


def _triton():
    pytest.importorskip("triton")
    from octavo.models.moe.kernels import triton_gemm

    return triton_gemm


@pytest.mark.skipif(HAS_GPU, reason="interpreter tests run where there is no GPU")
@pytest.mark.parametrize("tokens,experts,top_k,dropped", [(1, 8, 2, 0), (7, 8, 2, 4), (20, 4, 1, 0), (13, 16, 4, 0)])
def test_triton_grouped_interpreted(tokens, experts, top_k, dropped):
    tg = _triton()
    case = make_case(tokens, experts, top_k, 32, 40, dropped=dropped, seed=tokens)
    ref = TorchRefExperts(torch.float32).apply(*case)
    out = tg.fused_experts(*case, config=dict(BLOCK_M=16, BLOCK_N=16, BLOCK_K=16, GROUP_M=2))
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(HAS_GPU, reason="interpreter tests run where there is no GPU")
def test_triton_default_config_interpreted():
    """The heuristic's own tiles (not hand-picked ones) on a shape with ragged N and K."""
    tg = _triton()
    case = make_case(6, 8, 2, 48, 20, seed=3)
    ref = TorchRefExperts(torch.float32).apply(*case)
    torch.testing.assert_close(tg.fused_experts(*case), ref, rtol=1e-5, atol=1e-5)


def test_config_table_and_heuristic():
    from octavo.models.moe.configs import default_config, get_config

    small = default_config(128, 8, torch.bfloat16)
    big = default_config(128, 128 * 512, torch.bfloat16)
    assert small["BLOCK_M"] == 16 and big["BLOCK_M"] == 128
    assert default_config(8, 64, torch.float32)["BLOCK_K"] <= 32
    cfg = get_config(8, 24, 32, 10, torch.float32, 2)
    assert set(cfg) >= {"BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M"}


@pytest.mark.cuda
@pytest.mark.parametrize("tokens", [1, 2, 7, 16, 64, 127, 256, 512])
@pytest.mark.parametrize("experts,top_k", [(8, 2), (64, 6), (128, 8)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_triton_grouped_on_gpu(tokens, experts, top_k, dtype):
    if not HAS_GPU:
        pytest.skip("needs a CUDA GPU")
    tg = _triton()
    hidden, inter = 256, 192
    case = make_case(tokens, experts, top_k, hidden, inter, dtype=dtype, device="cuda", seed=tokens + experts)
    ref = TorchRefExperts(torch.float32).apply(
        *[t.float() if t.is_floating_point() else t for t in case]
    )
    out = tg.fused_experts(*case)
    tol = 1e-4 if dtype == torch.float32 else 3e-2
    torch.testing.assert_close(out.float(), ref, rtol=tol, atol=tol)


@pytest.mark.cuda
@pytest.mark.parametrize("tokens", [1, 64, 512])
def test_triton_grouped_expert_parallel_slice_on_gpu(tokens):
    if not HAS_GPU:
        pytest.skip("needs a CUDA GPU")
    tg = _triton()
    case = make_case(tokens, 32, 8, 256, 128, dtype=torch.bfloat16, device="cuda", dropped=96, seed=1)
    ref = TorchRefExperts(torch.float32).apply(*[t.float() if t.is_floating_point() else t for t in case])
    torch.testing.assert_close(tg.fused_experts(*case).float(), ref, rtol=3e-2, atol=3e-2)


@pytest.mark.cuda
@pytest.mark.parametrize("tokens", [1, 512, 4096])
def test_activation_estimate_covers_measured_peak(tokens):
    """``grouped_activation_bytes`` (what the memory profiler budgets) >= the real peak."""
    if not HAS_GPU:
        pytest.skip("needs a CUDA GPU")
    from octavo.models.moe.layer import grouped_activation_bytes

    tg = _triton()
    experts, top_k, hidden, inter = 128, 8, 2048, 768
    case = make_case(tokens, experts, top_k, hidden, inter, dtype=torch.bfloat16, device="cuda")
    logits = torch.randn(tokens, experts, device="cuda")
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    w, ids = select_experts(logits, top_k, True)
    out = tg.fused_experts(case[0], case[1], case[2], w, ids)
    torch.cuda.synchronize()
    measured = torch.cuda.max_memory_allocated() - base
    del out
    assert measured <= grouped_activation_bytes(tokens, top_k, experts, experts, inter, hidden, 2)


# -- the Triton routing and grouping kernels ---------------------------------------------


def _check_align_contract(ids, num_experts, block, sorted_ids, block_experts, num_padded):
    """The contract of ``align_block_size`` (order inside an expert's run is free)."""
    flat = ids.reshape(-1).cpu()
    sorted_ids, block_experts = sorted_ids.cpu(), block_experts.cpu()
    n, used = flat.numel(), int(num_padded)
    counts = torch.bincount(flat.long(), minlength=num_experts + 1)
    assert used == int(((counts + block - 1) // block * block).sum())
    assert sorted_ids.numel() >= used and (sorted_ids[used:] == n).all()
    real = sorted_ids[:used][sorted_ids[:used] < n]
    assert sorted(real.tolist()) == list(range(n))
    for b in range(sorted_ids.numel() // block):
        pairs = sorted_ids[b * block:(b + 1) * block]
        pairs = pairs[pairs < n]
        e = int(block_experts[b])
        got = {int(flat[p]) for p in pairs}
        if e >= 0:
            assert got <= {e} and b * block < used
        else:
            assert got <= {num_experts}


@pytest.mark.skipif(HAS_GPU, reason="interpreter tests run where there is no GPU")
@pytest.mark.parametrize("tokens,experts,top_k,block", [(1, 8, 2, 16), (37, 8, 2, 16), (5, 16, 4, 4), (64, 130, 8, 32)])
def test_triton_align_interpreted(tokens, experts, top_k, block):
    _triton()
    from octavo.models.moe.kernels import triton_routing

    g = torch.Generator().manual_seed(tokens)
    ids = torch.randint(0, experts + 1, (tokens, top_k), generator=g)  # experts = dropped bucket
    _check_align_contract(ids, experts, block, *triton_routing.align(ids, experts, block))


@pytest.mark.skipif(HAS_GPU, reason="interpreter tests run where there is no GPU")
@pytest.mark.parametrize("renormalize", [True, False])
@pytest.mark.parametrize("experts,top_k,start,local", [(8, 2, 0, 8), (12, 3, 4, 4), (64, 8, 32, 32)])
def test_triton_route_interpreted(renormalize, experts, top_k, start, local):
    _triton()
    from octavo.models.moe.kernels import ExpertsKernel, triton_routing

    logits = torch.randn(9, experts, generator=torch.Generator().manual_seed(experts))
    w, ids = triton_routing.route(logits, top_k, renormalize, start, local)
    ref_w, ref_ids = ExpertsKernel(torch.float32).route(logits, top_k, renormalize, start, local)
    assert ids.tolist() == ref_ids.tolist()
    torch.testing.assert_close(w, ref_w, rtol=1e-6, atol=1e-7)


@pytest.mark.cuda
@pytest.mark.parametrize("tokens", [1, 3, 64, 512, 4096])
@pytest.mark.parametrize("experts,top_k", [(8, 2), (128, 8)])
@pytest.mark.parametrize("block", [16, 64])
def test_triton_route_and_align_on_gpu(tokens, experts, top_k, block):
    if not HAS_GPU:
        pytest.skip("needs a CUDA GPU")
    _triton()
    from octavo.models.moe.kernels import ExpertsKernel, triton_routing

    logits = torch.randn(tokens, experts, device="cuda")
    w, ids = triton_routing.route(logits, top_k, True, 0, experts)
    ref_w, ref_ids = ExpertsKernel(torch.float32).route(logits, top_k, True, 0, experts)
    assert torch.equal(ids.long(), ref_ids)
    torch.testing.assert_close(w, ref_w, rtol=1e-5, atol=1e-6)
    _check_align_contract(ids, experts, block, *triton_routing.align(ids, experts, block))
    same = torch.zeros_like(ids)  # every pair on expert 0 (the memory profiler's dummy batch)
    _check_align_contract(same, experts, block, *triton_routing.align(same, experts, block))
