"""FP8 (e4m3) linears (``octavo.quantization.kernels.triton_fp8``) against fp32 torch: weights
dequantized with their per-tensor / per-channel / 128x128-block scales, activations quantized
per token (or with a static scale) exactly as the quantization contract defines W8A8.

Under ``TRITON_INTERPRET=1`` (no GPU) on small ragged shapes; the interpreter rounds fp32 to
e4m3 differently at binade edges (and flushes subnormals), so there the GEMV is checked against the activations the
kernel itself quantized, and the quantizer separately (scales exact, codes within one step).
On the GPU (``cuda`` marker) codes must match torch's cast exactly, at the Llama-8B shapes, and
the ``torch._scaled_mm`` path for batches above 8 is checked too.
"""

from __future__ import annotations

import os

import pytest
import torch

HAS_GPU = torch.cuda.is_available()
if not HAS_GPU:
    os.environ.setdefault("TRITON_INTERPRET", "1")

pytest.importorskip("triton")

from octavo.quantization.kernels import triton_fp8 as f8  # noqa: E402
from octavo.quantization.kernels import triton_gemv as g  # noqa: E402

DEVICE = "cuda" if HAS_GPU else "cpu"


def rel_err(y, ref) -> float:
    return float((y.double() - ref.double()).norm() / ref.double().norm())


def make_weight(n, k, kind, seed=0):
    gen = torch.Generator(device=DEVICE).manual_seed(seed)
    w = (torch.randn(n, k, generator=gen, device=DEVICE) * 3).to(torch.float8_e4m3fn)
    if kind == "tensor":
        s = torch.tensor(0.02, device=DEVICE)
    elif kind == "channel":
        s = torch.rand(n, generator=gen, device=DEVICE) * 0.05 + 0.005
    else:
        s = torch.rand(-(-n // 128), -(-k // 128), generator=gen, device=DEVICE) * 0.05 + 0.005
    return w, s


def dequant(w, s):
    n, k = w.shape
    if s.dim() == 2:
        s = s.repeat_interleave(128, 0)[:n].repeat_interleave(128, 1)[:, :k]
    elif s.dim() == 1:
        s = s[:, None]
    return w.double() * s.double()


def reference_rows(x, input_scale=None):
    """The contract's activation quantization in torch."""
    xf = x.float()
    if input_scale is None:
        s = (xf.abs().amax(-1, keepdim=True) / f8.FP8_MAX).clamp_min(1.0 / (f8.FP8_MAX * 512))
    else:
        s = input_scale.float().reshape(1, 1).expand(x.shape[0], 1)
    return (xf / s).clamp(-f8.FP8_MAX, f8.FP8_MAX).to(torch.float8_e4m3fn), s.reshape(-1)


def check(n, k, m, kind, static, dtype=torch.bfloat16, seed=0, gemm=False):
    w, s = make_weight(n, k, kind, seed)
    packed = f8.prepack_fp8(w, s)
    if gemm and not HAS_GPU:
        packed.scale_row = None  # no _scaled_mm off the GPU: the Triton tiles
    gen = torch.Generator(device=DEVICE).manual_seed(seed + 1)
    x = torch.randn(m, k, generator=gen, device=DEVICE).to(dtype)
    b = torch.randn(n, generator=gen, device=DEVICE).to(dtype)
    in_scale = torch.tensor(0.02, device=DEVICE) if static else None
    xq, xs = f8.quantize_rows(x, in_scale)
    rq, rs = reference_rows(x, in_scale)
    torch.testing.assert_close(xs, rs, rtol=1e-6, atol=0)
    if HAS_GPU:
        assert torch.equal(xq.view(torch.uint8), rq.view(torch.uint8))
    else:  # interpreter rounding at binade edges and subnormals: at most one e4m3 step apart
        assert ((xq.double() - rq.double()).abs() <= rq.double().abs() * 0.5 + 2.0**-9).all()
    ref = (xq.double() * xs.double()[:, None]) @ dequant(w, s).T + b.double()
    y = f8.fp8_linear(x, packed, b, in_scale)
    assert y.dtype == dtype and y.shape == (m, n)
    assert rel_err(y, ref) < 8e-3, (kind, m, static, rel_err(y, ref))


@pytest.mark.skipif(HAS_GPU, reason="interpreter tests run where there is no GPU")
@pytest.mark.parametrize("kind", ["tensor", "channel", "block"])
@pytest.mark.parametrize("m", [1, 3, 8, 20])
def test_fp8_linear_interpreted(kind, m):
    check(136, 320, m, kind, static=m == 3, gemm=m > 8)


def test_prepack_refuses_bad_scales_and_dtypes():
    w = torch.zeros(256, 512, dtype=torch.float8_e4m3fn)
    with pytest.raises(ValueError, match="fits neither"):
        f8.prepack_fp8(w, torch.ones(3))
    with pytest.raises(ValueError, match="float8_e4m3fn"):
        f8.prepack_fp8(torch.zeros(4, 4), torch.ones(()))
    p = f8.prepack_fp8(w, torch.ones(2, 4))
    assert p.scale_mode == g.SCALE_BLOCK and p.scale_row is None
    assert all(c.block_k <= 128 and 128 % c.block_k == 0 for c in p.configs.values())
    assert f8.prepack_fp8(w, torch.ones(1)).scale_mode == g.SCALE_TENSOR
    assert f8.prepack_fp8(w, torch.ones(256)).scale_row.shape == (1, 256)


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_GPU, reason="needs a GPU")
@pytest.mark.parametrize("kind", ["tensor", "channel", "block"])
@pytest.mark.parametrize("shape", [(6144, 4096), (4096, 14336), (1000, 1032)], ids=str)
def test_fp8_linear_gpu(kind, shape):
    for m in (1, 2, 5, 8, 32):
        check(*shape, m, kind, static=m == 5, seed=m)


@pytest.mark.parametrize("kind", ["channel", "block"])
@pytest.mark.parametrize("m,static", [(1, False), (1, True), (4, False), (8, True)])
def test_every_fp8_candidate_computes_the_linear(kind, m, static):
    """Each tiling ``tune_fp8`` may keep (the one-row FMA, the rows FMA, and the fp8 x fp8
    tensor-core tiles; under the interpreter the dot multiplies in fp32: the same exact
    products). With fp32 output the only rounding is fp32 accumulation, which the tensor-core
    tiles must keep (1e-5)."""
    n, k = (136, 320) if not HAS_GPU else (1000, 1032)
    w, s = make_weight(n, k, kind, seed=m)
    packed = f8.prepack_fp8(w, s)
    x = torch.randn(m, k, generator=torch.Generator(device=DEVICE).manual_seed(m), device=DEVICE).bfloat16()
    xq, xs = f8.quantize_rows(x, torch.tensor(0.02, device=DEVICE) if static else None)
    ref = (xq.double() * xs.double()[:, None]) @ dequant(w, s).T
    cands = f8.fp8_candidates(n, k, m, packed.scale_mode, 132)
    assert any(c.use_dot for c in cands)
    for cfg in cands:
        y = f8._gemv(xq, xs, packed, None, torch.float32, cfg)
        assert rel_err(y, ref) < 1e-5, (cfg.describe(), rel_err(y, ref))
        assert rel_err(f8._gemv(xq, xs, packed, None, torch.bfloat16, cfg), ref) < 8e-3, cfg.describe()


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_GPU, reason="needs a GPU")
def test_fp8_gemv_replays_in_a_cuda_graph():
    w, s = make_weight(4096, 4096, "channel")
    packed = f8.prepack_fp8(w, s)
    x = torch.randn(1, 4096, device="cuda", dtype=torch.bfloat16)
    f8.fp8_linear(x, packed)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = f8.fp8_linear(x, packed)
    x.normal_()
    graph.replay()
    xq, xs = reference_rows(x)
    ref = (xq.double() * xs.double()[:, None]) @ dequant(w, s).T
    assert rel_err(y, ref) < 8e-3


class _ScriptedTimer:
    """Stands in for the device clock in ``tune_fp8``: runs the first call for real, notes which
    method ran (a tiling or ``_scaled_mm``) and returns that method's scripted time."""

    def __init__(self, monkeypatch, times):
        self.times, self.seen, self.last = times, [], None
        real_gemv, real_gemm = f8._gemv, f8._gemm

        def gemv(*a):
            self.last, self.m = a[-1].describe(), a[0].shape[0]
            return real_gemv(*a)

        def gemm(*a):
            self.last, self.m = "scaled_mm", a[0].shape[0]
            return real_gemm(*a)

        monkeypatch.setattr(f8, "_gemv", gemv)
        monkeypatch.setattr(f8, "_gemm", gemm)

    def __call__(self, calls):
        calls[0]()
        self.seen.append((self.last, len(calls)))
        return self.times(self.last, self.m)


@pytest.mark.skipif(HAS_GPU, reason="interpreter tests run where there is no GPU")
def test_tune_fp8_keeps_the_fastest_method_per_bucket(monkeypatch):
    n, k = 64, 512
    w, s = make_weight(n, k, "channel")
    packed = f8.prepack_fp8(w, s)
    rows_pick = [c for c in f8.fp8_candidates(n, k, 4, packed.scale_mode, 132) if c.rows][-1].describe()
    first = f8.fp8_candidates(n, k, 1, packed.scale_mode, 132)[0].describe()

    def times(name, m):  # scaled_mm wins at 2 and 8 rows, a non-default tiling at 4, the default at 1
        if name == "scaled_mm":
            return 1.0 if m in (2, 8) else 9.0
        return 0.5 if name == rows_pick and m == 4 else 2.0 if m == 1 and name == first else 3.0

    timer = _ScriptedTimer(monkeypatch, times)
    budget = 3 * n * k
    f8.tune_fp8(packed, timer=timer, budget=budget)
    assert {c for _, c in timer.seen} == {3}  # every method over the same 3 rotating copies
    assert packed.configs[4].describe() == rows_pick
    assert packed.configs[2] is None and packed.configs[8] is None  # _scaled_mm
    assert packed.configs[1].describe() == first and not packed.configs[1].rows


@pytest.mark.skipif(HAS_GPU, reason="interpreter tests run where there is no GPU")
def test_tune_fp8_never_keeps_a_wrong_tiling(monkeypatch):
    n, k = 64, 512
    w, s = make_weight(n, k, "block")
    packed = f8.prepack_fp8(w, s)
    bad = f8.fp8_candidates(n, k, 2, packed.scale_mode, 132)[1]
    real = f8._gemv

    def corrupt(*a):
        y = real(*a)
        return y * 3 if a[-1] == bad else y

    monkeypatch.setattr(f8, "_gemv", corrupt)
    timer = _ScriptedTimer(monkeypatch, lambda name, m: 0.1 if name == bad.describe() else 1.0)
    report = f8.tune_fp8(packed, timer=timer, budget=1)
    assert packed.configs[2] != bad and report[2][bad.describe()] != report[2][bad.describe()]
    assert "scaled_mm" not in report[2]  # block scales: no row-wise _scaled_mm
    for m in (2, 3):  # the kept tilings still compute the linear
        check_packed = f8.fp8_linear(torch.randn(m, k, device=DEVICE).bfloat16(), packed)
        assert check_packed.shape == (m, n) and not torch.isnan(check_packed).any()


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_GPU, reason="needs a GPU")
@pytest.mark.parametrize("kind", ["channel", "block"])
def test_tune_fp8_on_the_gpu_keeps_a_correct_fast_method(kind):
    """The real clock (rotating copies, CUDA graph): every bucket gets a method, the kept one
    is the fastest timed, and the tuned linear still computes the contract."""
    n, k = 4096, 4096
    w, s = make_weight(n, k, kind)
    packed = f8.prepack_fp8(w, s)
    report = f8.tune_fp8(packed)
    for m, times in report.items():
        kept = packed.configs[m]
        name = "scaled_mm" if kept is None else kept.describe()
        finite = [t for t in times.values() if t == t]
        assert finite and times[name] == min(finite), (m, times)
    for m in (1, 2, 5, 8):
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        xq, xs = reference_rows(x)
        ref = (xq.double() * xs.double()[:, None]) @ dequant(w, s).T
        assert rel_err(f8.fp8_linear(x, packed), ref) < 8e-3, (m, packed.configs)
