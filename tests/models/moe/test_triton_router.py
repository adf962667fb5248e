"""The router GEMV fused with the routing (``kernels.triton_router``) against
``route(F.linear(x, w))``.

Without a GPU the kernel runs under ``TRITON_INTERPRET=1`` in float32 on ragged tiles
(experts and hidden not multiples of the blocks) and an expert-parallel slice: ids must be
identical. ``cuda``-marked tests run bf16 at 1-64 tokens: a fused logit may round to the
other neighbouring bf16 value (float32 summation order), so a choice may differ only between
experts tied to within that rounding; they also check that the arrival counters are zero
after every launch and that a captured graph replays correctly.
"""

from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F

HAS_GPU = torch.cuda.is_available()
if not HAS_GPU:  # before anything imports triton (it reads this once, at import)
    os.environ.setdefault("TRITON_INTERPRET", "1")

pytest.importorskip("triton")

from octavo.models.moe.kernels.base import ExpertsKernel  # noqa: E402
from octavo.models.moe.kernels.triton_router import router_route  # noqa: E402


@pytest.mark.skipif(HAS_GPU, reason="interpreter tests run where there is no GPU")
@pytest.mark.parametrize("renormalize", [True, False])
@pytest.mark.parametrize("tokens,experts,top_k,hidden,start,local", [(1, 8, 2, 32, 0, 8), (5, 12, 3, 40, 4, 4)])
def test_router_route_interpreted(renormalize, tokens, experts, top_k, hidden, start, local):
    g = torch.Generator().manual_seed(tokens)
    x = torch.randn(tokens, hidden, generator=g)
    w = torch.randn(experts, hidden, generator=g)
    counters = torch.zeros(8, dtype=torch.int32)
    weights, ids = router_route(x, w, top_k, renormalize, start, local, counters, block_e=8, block_k=16)
    ref_w, ref_ids = ExpertsKernel(torch.float32).route(F.linear(x, w), top_k, renormalize, start, local)
    assert ids.tolist() == ref_ids.tolist()
    torch.testing.assert_close(weights, ref_w, rtol=1e-5, atol=1e-6)
    assert not counters.any()


def test_router_route_rejects_bad_arguments():
    x, w = torch.zeros(3, 16), torch.zeros(8, 16)
    with pytest.raises(ValueError, match="counters"):
        router_route(x, w, 2, True, 0, 8, torch.zeros(2, dtype=torch.int32))
    with pytest.raises(ValueError, match="router weight"):
        router_route(x, w.half(), 2, True, 0, 8, torch.zeros(4, dtype=torch.int32))
    with pytest.raises(ValueError, match="top_k"):
        router_route(x, w, 9, True, 0, 8, torch.zeros(4, dtype=torch.int32))


def _check_near_reference(x, w, top_k, weights, ids):
    """Chosen experts are the reference top-k up to logits tied within 2 bf16 units; weights
    match the reference softmax over the chosen experts."""
    ref_logits = (x.double() @ w.double().T).to(x.dtype).double()
    kth = ref_logits.sort(dim=-1, descending=True).values[:, top_k - 1 : top_k]
    chosen = ref_logits.gather(1, ids.long())
    assert bool((chosen >= kth - 2 * 2.0 ** (torch.floor(torch.log2(kth.abs() + 1e-30)) - 7)).all())
    assert all(len(set(row)) == top_k for row in ids.tolist())
    probs = torch.softmax(ref_logits, dim=-1).gather(1, ids.long())
    torch.testing.assert_close(weights.double(), probs / probs.sum(-1, keepdim=True), rtol=2e-2, atol=1e-3)
    ref_ids = ExpertsKernel(torch.float32).route(ref_logits.float(), top_k, True, 0, w.shape[0])[1]
    same = (ids.long().sort(-1).values == ref_ids.sort(-1).values).all(-1).float().mean()
    assert same >= 0.9  # ties at the k-th place are rare


@pytest.mark.cuda
@pytest.mark.parametrize("tokens", [1, 2, 8, 64])
@pytest.mark.parametrize("experts,top_k,hidden", [(8, 2, 4096), (128, 8, 2048), (60, 4, 2048)])
def test_router_route_on_gpu(tokens, experts, top_k, hidden):
    if not HAS_GPU:
        pytest.skip("needs a CUDA GPU")
    g = torch.Generator(device="cuda").manual_seed(tokens * experts)
    x = torch.randn(tokens, hidden, generator=g, device="cuda").bfloat16()
    w = (torch.randn(experts, hidden, generator=g, device="cuda") * hidden**-0.5).bfloat16()
    counters = torch.zeros(64, dtype=torch.int32, device="cuda")
    for _ in range(3):  # the counters go back to zero: every launch routes again
        weights, ids = router_route(x, w, top_k, True, 0, experts, counters)
        assert not counters.any()
        _check_near_reference(x, w, top_k, weights, ids)


@pytest.mark.cuda
def test_router_route_replays_from_a_graph():
    if not HAS_GPU:
        pytest.skip("needs a CUDA GPU")
    x = torch.randn(1, 2048, device="cuda").bfloat16()
    w = (torch.randn(128, 2048, device="cuda") * 2048**-0.5).bfloat16()
    counters = torch.zeros(64, dtype=torch.int32, device="cuda")
    router_route(x, w, 8, True, 0, 128, counters)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        weights, ids = router_route(x, w, 8, True, 0, 128, counters)
    for seed in range(5):
        x.copy_(torch.randn(1, 2048, device="cuda", generator=torch.Generator(device="cuda").manual_seed(seed)))
        graph.replay()
        torch.cuda.synchronize()
        assert not counters.any()
        _check_near_reference(x, w, 8, weights, ids)


@pytest.mark.cuda
@pytest.mark.parametrize("tokens", [1, 3, 8, 16])
def test_fused_moe_forward_from_router_on_gpu(tokens):
    """The layer with the router fused (few tokens) gives ``forward(x, F.linear(x, w))``."""
    if not HAS_GPU:
        pytest.skip("needs a CUDA GPU")
    from octavo.models.moe.layer import FusedMoE

    e, k, h, i = 128, 8, 2048, 768
    with torch.device("cuda"):
        layer = FusedMoE(e, k, h, i, True, torch.bfloat16).to(torch.bfloat16)
    g = torch.Generator(device="cuda").manual_seed(tokens)
    with torch.no_grad():
        for p, fan_in in ((layer.w13_weight, h), (layer.w2_weight, i)):
            p.copy_(torch.randn(p.shape, generator=g, device="cuda") * fan_in**-0.5)
    x = torch.randn(tokens, h, generator=g, device="cuda").bfloat16()
    router = (torch.randn(e, h, generator=g, device="cuda") * h**-0.5).bfloat16()
    with torch.inference_mode():
        out = layer.forward_from_router(x, router)
        ref = layer(x, F.linear(x, router))
    assert not layer.route_counters.any()
    torch.testing.assert_close(out.float(), ref.float(), rtol=2e-2, atol=2e-2)
