"""The small-batch GEMV path of the Triton experts (``kernels.triton_gemv``) against
``torch_ref``, and the choice between it and the grouped GEMM (``configs.use_gemv``).

Without a GPU the kernels run under ``TRITON_INTERPRET=1`` on tiny shapes with ragged tiles
(N and K not multiples of the blocks), pairs of another rank's experts, top-k not a power of
two and top-1. ``cuda``-marked tests run 1-16 tokens at 8-128 experts in bf16 and fp32, check
that the result is bit-identical run to run (no atomics), and replay it from a CUDA graph.
"""

from __future__ import annotations

import os

import pytest
import torch

from octavo.models.moe.kernels.torch_ref import TorchRefExperts
from tests.models.moe.test_kernels import make_case

HAS_GPU = torch.cuda.is_available()
if not HAS_GPU:  # before anything imports triton (it reads this once, at import)
    os.environ.setdefault("TRITON_INTERPRET", "1")

pytest.importorskip("triton")

from octavo.models.moe import configs  # noqa: E402
from octavo.models.moe.kernels.triton_gemv import gemv_experts  # noqa: E402

# Tiles that leave ragged edges on the interpreter shapes below (N=40/32, K=32/40).
RAGGED = dict(GATE_UP_BLOCK_N=16, GATE_UP_BLOCK_K=16, GATE_UP_WARPS=1, DOWN_BLOCK_N=8, DOWN_BLOCK_K=16, DOWN_WARPS=1)
EVEN = dict(GATE_UP_BLOCK_N=8, GATE_UP_BLOCK_K=16, GATE_UP_WARPS=1, DOWN_BLOCK_N=8, DOWN_BLOCK_K=8, DOWN_WARPS=1)


def _ref(case):
    return TorchRefExperts(torch.float32).apply(*[t.float() if t.is_floating_point() else t for t in case])


@pytest.mark.skipif(HAS_GPU, reason="interpreter tests run where there is no GPU")
@pytest.mark.parametrize(
    "tokens,experts,top_k,dropped,cfg",
    [(1, 8, 2, 0, RAGGED), (3, 8, 3, 4, RAGGED), (2, 4, 1, 0, EVEN), (4, 16, 4, 8, EVEN)],
)
def test_gemv_matches_reference_interpreted(tokens, experts, top_k, dropped, cfg):
    case = make_case(tokens, experts, top_k, 32, 40, dropped=dropped, seed=tokens + top_k)
    out = gemv_experts(*case, config=cfg)
    torch.testing.assert_close(out, _ref(case), rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(HAS_GPU, reason="interpreter tests run where there is no GPU")
def test_gemv_default_tiles_and_all_pairs_elsewhere_interpreted():
    """The default tiles (wider than these shapes: every tile masked), and a token whose every
    expert lives on another rank, which must come out as exact zeros."""
    case = make_case(2, 8, 2, 24, 20, seed=5)
    torch.testing.assert_close(gemv_experts(*case), _ref(case), rtol=1e-5, atol=1e-5)
    x, w13, w2, weights, ids = case
    ids = ids.clone()
    ids[1] = 8  # the dropped bucket
    out = gemv_experts(x, w13, w2, weights, ids)
    assert torch.equal(out[1], torch.zeros_like(out[1]))
    torch.testing.assert_close(out, _ref((x, w13, w2, weights, ids)), rtol=1e-5, atol=1e-5)


def test_use_gemv_bound(monkeypatch):
    monkeypatch.delenv("OCTAVO_MOE_GEMV_MAX_PAIRS", raising=False)
    assert configs.gemv_max_pairs(128, 8) == 64  # Qwen3-30B-A3B: up to 8 tokens
    assert configs.gemv_max_pairs(8, 2) == 4  # Mixtral: up to 2 tokens
    assert configs.gemv_max_pairs(4, 4) == 4  # never below one token's pairs
    assert configs.use_gemv(8, 128, 8) and configs.use_gemv(64, 128, 8)
    assert not configs.use_gemv(72, 128, 8) and not configs.use_gemv(0, 128, 8)
    monkeypatch.setenv("OCTAVO_MOE_GEMV_MAX_PAIRS", "0")
    assert not configs.use_gemv(8, 128, 8)
    monkeypatch.setenv("OCTAVO_MOE_GEMV_MAX_PAIRS", "256")
    assert configs.use_gemv(256, 128, 8)
    monkeypatch.setenv("OCTAVO_MOE_GEMV_MAX_PAIRS", "lots")
    with pytest.raises(ValueError, match="OCTAVO_MOE_GEMV_MAX_PAIRS='lots' is not an integer"):
        configs.use_gemv(8, 128, 8)
    assert configs.gemv_config(torch.float32)["DOWN_BLOCK_K"] == configs.gemv_config(torch.bfloat16)["DOWN_BLOCK_K"] // 2


@pytest.mark.skipif(HAS_GPU, reason="interpreter tests run where there is no GPU")
def test_kernel_dispatches_on_pair_count_interpreted(monkeypatch):
    """``TritonGroupedExperts.apply`` takes the GEMV path at few pairs and the grouped GEMM
    above the bound; both give the reference."""
    from octavo.models.moe.kernels import triton_gemm, triton_gemv
    from octavo.models.moe.kernels.triton_grouped import TritonGroupedExperts

    calls = []
    for mod, name in ((triton_gemv, "gemv_experts"), (triton_gemm, "fused_experts")):
        real = getattr(mod, name)
        monkeypatch.setattr(mod, name, lambda *a, real=real, name=name, **k: calls.append(name) or real(*a, **k))
    kernel = TritonGroupedExperts(torch.float32)
    for tokens in (1, 3):  # E=8, k=2: bound 4 pairs
        case = make_case(tokens, 8, 2, 16, 16, seed=tokens)
        torch.testing.assert_close(kernel.apply(*case), _ref(case), rtol=1e-5, atol=1e-5)
    assert calls == ["gemv_experts", "fused_experts"]


# -- on a GPU ----------------------------------------------------------------------------


@pytest.mark.cuda
@pytest.mark.parametrize("tokens", [1, 2, 4, 8, 16])
@pytest.mark.parametrize("experts,top_k,dropped", [(8, 2, 0), (128, 8, 0), (32, 8, 96)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_gemv_on_gpu(tokens, experts, top_k, dropped, dtype):
    if not HAS_GPU:
        pytest.skip("needs a CUDA GPU")
    case = make_case(tokens, experts, top_k, 256, 192, dtype=dtype, device="cuda", dropped=dropped, seed=tokens)
    out = gemv_experts(*case)
    tol = 1e-4 if dtype == torch.float32 else 3e-2
    torch.testing.assert_close(out.float(), _ref(case), rtol=tol, atol=tol)
    assert torch.equal(gemv_experts(*case), out)  # deterministic: the top-k sum has a fixed order


@pytest.mark.cuda
def test_gemv_in_cuda_graph_qwen3_moe_shape():
    """The Qwen3-30B-A3B expert shape (E=128, top-8, H=2048, I=768) at one token, captured in a
    CUDA graph and replayed on new routing written into the same input buffers."""
    if not HAS_GPU:
        pytest.skip("needs a CUDA GPU")
    x, w13, w2, weights, ids = make_case(1, 128, 8, 2048, 768, dtype=torch.bfloat16, device="cuda")
    gemv_experts(x, w13, w2, weights, ids)  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = gemv_experts(x, w13, w2, weights, ids)
    from octavo.models.moe.router import select_experts

    for seed in (1, 2):
        g = torch.Generator(device="cuda").manual_seed(seed)
        x.copy_(torch.randn(x.shape, generator=g, device="cuda"))
        new_weights, new_ids = select_experts(torch.randn(1, 128, generator=g, device="cuda"), 8, True)
        weights.copy_(new_weights)
        ids.copy_(new_ids)
        graph.replay()
        ref = _ref((x, w13, w2, weights, ids))
        torch.testing.assert_close(out.float(), ref, rtol=3e-2, atol=3e-2)
