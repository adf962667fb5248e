"""The split-K decode GEMV (``octavo.quantization.kernels.triton_gemv``) against fp32 torch.

Without a GPU the kernel runs under ``TRITON_INTERPRET=1`` on small, ragged shapes (every tile
masked somewhere); the ``cuda``-marked tests run the Llama-3.1-8B linear shapes at batch 1-8,
the load-time timing against cuBLAS, and a CUDA-graph capture of a split-K launch.
"""

from __future__ import annotations

import os
import re

import pytest
import torch

HAS_GPU = torch.cuda.is_available()
if not HAS_GPU:
    os.environ.setdefault("TRITON_INTERPRET", "1")

pytest.importorskip("triton")

import triton  # noqa: E402

from octavo.quantization.kernels import triton_gemv as g  # noqa: E402

DEVICE = "cuda" if HAS_GPU else "cpu"
# [N, K] of every Llama-3.1-8B linear: qkv, o, gate_up, down, lm_head.
LLAMA8B = [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336), (128256, 4096)]


def rel_err(y: torch.Tensor, ref: torch.Tensor) -> float:
    return float((y.double() - ref.double()).norm() / ref.double().norm())


def check(n, k, m, cfgs, dtype=torch.bfloat16, bias=True, seed=0):
    gen = torch.Generator(device=DEVICE).manual_seed(seed)
    x = torch.randn(m, k, generator=gen, device=DEVICE).to(dtype)
    w = torch.randn(n, k, generator=gen, device=DEVICE).to(dtype)
    b = torch.randn(n, generator=gen, device=DEVICE).to(dtype) if bias else None
    ref = x.double() @ w.double().T + (b.double() if bias else 0)
    for cfg in cfgs:
        y = g.launch(x, w, n, k, cfg, out_dtype=dtype, bias=b, dot_dtype=dtype)
        assert y.dtype == dtype and y.shape == (m, n)
        assert not torch.isnan(y).any()
        # bf16 output rounding (the interpreter truncates, the GPU rounds to nearest)
        assert rel_err(y, ref) < 8e-3, (cfg, m, rel_err(y, ref))


INTERP_CONFIGS = [
    g.GemvConfig(8, 64, 1, False), g.GemvConfig(8, 64, 3, False), g.GemvConfig(4, 128, 2, False),
    g.GemvConfig(16, 32, 2, True), g.GemvConfig(32, 64, 1, True),
    g.GemvConfig(8, 64, 1, rows=True), g.GemvConfig(4, 128, 3, rows=True),
]


@pytest.mark.skipif(HAS_GPU, reason="interpreter tests run where there is no GPU")
@pytest.mark.parametrize("cfg", INTERP_CONFIGS, ids=lambda c: c.describe())
@pytest.mark.parametrize("m", [1, 3, 8])
def test_gemv_interpreted(cfg, m):
    check(40, 200, m, [cfg], bias=m != 3)


@pytest.mark.parametrize("cfg", [g.GemvConfig(8, 64, 3, False), g.GemvConfig(16, 32, 2, True),
                                 g.GemvConfig(4, 128, 3, rows=True)], ids=lambda c: c.describe())
@pytest.mark.parametrize("m", [1, 5])
def test_split_summed_by_the_last_program(cfg, m):
    """With counters a K split is summed in the kernel by the program that finishes last: the
    same values as the separate reduce kernel (fp32 output: the same partials summed in the
    same split order), bias included, and the counters back at zero after every call (a CUDA
    graph replays the launch as captured)."""
    n, k = 40, 200 if not HAS_GPU else 1032
    gen = torch.Generator(device=DEVICE).manual_seed(m)
    x = torch.randn(m, k, generator=gen, device=DEVICE)
    w = torch.randn(n, k, generator=gen, device=DEVICE)
    b = torch.randn(n, generator=gen, device=DEVICE)
    counters = torch.zeros(g.tiles(n, m, cfg), dtype=torch.int32, device=DEVICE)
    plain = g.launch(x, w, n, k, cfg, out_dtype=torch.float32, bias=b, dot_dtype=torch.float32)
    for _ in range(2):
        fused = g.launch(x, w, n, k, cfg, out_dtype=torch.float32, bias=b, dot_dtype=torch.float32,
                         counters=counters)
        assert torch.equal(fused, plain) and int(counters.abs().sum()) == 0
    short = torch.zeros(g.tiles(n, m, cfg) - 1, dtype=torch.int32, device=DEVICE)  # too few: the reduce kernel
    assert torch.equal(g.launch(x, w, n, k, cfg, out_dtype=torch.float32, bias=b, dot_dtype=torch.float32,
                                counters=short), plain)


@pytest.mark.skipif(HAS_GPU, reason="interpreter tests run where there is no GPU")
def test_gemv_fp16_and_zero_rows_interpreted():
    check(24, 96, 2, [g.GemvConfig(16, 32, 2, True)], dtype=torch.float16)
    x = torch.empty(0, 64, dtype=torch.bfloat16)
    w = torch.randn(8, 64).bfloat16()
    assert g.launch(x, w, 8, 64, g.GemvConfig(8, 64), out_dtype=torch.bfloat16).shape == (0, 8)


def test_split_fills_the_gpu_and_keeps_whole_tiles():
    """Every Llama-8B candidate covers K with whole tiles; the table default (and at least one
    candidate) gives >= 2 programs per SM or splits K down to 4 tiles per program."""
    for n, k in LLAMA8B:
        for m in g.BATCH_BUCKETS:
            cands = g.candidates(n, k, m, 132)
            assert cands and len(set(cands)) == len(cands)
            for cfg in cands:
                per = g.split_extent(k, cfg)
                assert per % cfg.block_k == 0 and per * cfg.split_k >= k
                assert (cfg.use_dot or cfg.rows) == (m > 1)
            # at least one candidate fills the GPU (>= 2 programs per SM, or K split to 4 tiles)
            assert any(-(-n // c.block_n) * c.split_k >= 2 * 132 or k // c.split_k < 8 * c.block_k for c in cands)
            d = g.default_config(n, k, m, 132)
            assert -(-n // d.block_n) * d.split_k >= 2 * 132 or k // d.split_k < 8 * d.block_k
    assert [g.bucket(m) for m in range(1, 9)] == [1, 2, 4, 4, 8, 8, 8, 8]


def test_rotation_copies_span_the_budget_within_the_cap():
    mb = 1 << 20
    assert g.rotation_copies(32 * mb, 128 * mb) == 4  # Llama-8B o_proj: 4 copies = 128 MB
    assert g.rotation_copies(1000 * mb, 128 * mb) == 1  # an LM head alone exceeds L2
    assert g.rotation_copies(mb, 128 * mb, cap=64) == 64
    assert g.rotation_copies(48 * mb, 128 * mb) == 3
    for size in (1, 7 * mb, 33 * mb, 300 * mb):
        c = g.rotation_copies(size, 128 * mb)
        assert 1 <= c <= g.MAX_COPIES and (c - 1) * size <= 128 * mb


class _FakeTimer:
    """Stands in for the device clock: runs the first call for real (a recorder notes which
    tiling launched, none for cuBLAS) and returns that method's scripted time."""

    def __init__(self, monkeypatch, times: dict[str, float]):
        self.times, self.calls, self.last = times, [], None
        real = g.launch

        def recording_launch(*a, **kw):
            self.last = a[4].describe()
            return real(*a, **kw)

        monkeypatch.setattr(g, "launch", recording_launch)

    def __call__(self, calls):
        self.last = None
        calls[0]()
        self.calls.append((self.last or "cublas", len(calls)))
        return self.times.get(self.last or "cublas", 1.0)


@pytest.mark.skipif(HAS_GPU, reason="interpreter tests run where there is no GPU")
def test_selection_picks_the_fastest_by_the_rotating_timer(monkeypatch):
    n, k = 16, 1024
    w = torch.randn(n, k, generator=torch.Generator().manual_seed(0)).bfloat16()
    cands = [c.describe() for c in g.candidates(n, k, 1, 132)]
    fastest = cands[-1]
    timer = _FakeTimer(monkeypatch, {"cublas": 10.0, **dict.fromkeys(cands, 9.9), fastest: 5.0})
    budget = 4 * w.numel() * w.element_size()
    cfg, times = g.time_against_cublas(w, 1, 132, timer=timer, budget=budget)
    assert cfg is not None and cfg.describe() == fastest and times[fastest] == 5.0
    # every method timed once, over the same 4 rotating copies
    assert [c for c, _ in timer.calls] == ["cublas", *cands] and {n for _, n in timer.calls} == {4}


@pytest.mark.skipif(HAS_GPU, reason="interpreter tests run where there is no GPU")
def test_selection_keeps_cublas_within_the_margin_and_skips_wrong_results(monkeypatch):
    n, k = 16, 1024
    w = torch.randn(n, k, generator=torch.Generator().manual_seed(1)).bfloat16()
    cands = [c.describe() for c in g.candidates(n, k, 2, 132)]
    # within 3% of cuBLAS is no win: cuBLAS stays
    timer = _FakeTimer(monkeypatch, {"cublas": 10.0, **dict.fromkeys(cands, 9.8)})
    cfg, _ = g.time_against_cublas(w, 2, 132, timer=timer)
    assert cfg is None
    # a tiling whose numbers are wrong is never timed nor chosen, however fast it would be
    bad = g.candidates(n, k, 2, 132)[0]
    real = g.launch

    def corrupt(x, wt, nn, kk, c, **kw):
        y = real(x, wt, nn, kk, c, **kw)
        return y * 2 if c == bad else y

    monkeypatch.setattr(g, "launch", corrupt)
    timer = _FakeTimer(monkeypatch, {"cublas": 10.0, **dict.fromkeys(cands, 8.0), bad.describe(): 1.0})
    cfg, times = g.time_against_cublas(w, 2, 132, timer=timer)
    assert cfg is not None and cfg != bad and times[cfg.describe()] == 8.0
    assert times[bad.describe()] != times[bad.describe()]  # nan
    assert bad.describe() not in [c for c, _ in timer.calls]


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_GPU, reason="needs a GPU")
@pytest.mark.parametrize("shape", LLAMA8B, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("m", [1, 2, 4, 8])
def test_gemv_llama8b_shapes_gpu(shape, m):
    n, k = shape
    check(n, k, m, g.candidates(n, k, m, g.num_sms(torch.device("cuda"))), bias=False, seed=m)


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_GPU, reason="needs a GPU")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_gemv_ragged_and_bias_gpu(dtype):
    for m in (1, 5, 8):
        check(1000, 1032, m, INTERP_CONFIGS + [g.GemvConfig(16, 512, 4, True, 8)], dtype=dtype)


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_GPU, reason="needs a GPU")
def test_split_k_launch_replays_in_a_cuda_graph():
    n, k = 4096, 14336
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(2, k, device="cuda", dtype=torch.bfloat16)
    cfg = g.GemvConfig(16, 256, 4, True)
    g.launch(x, w, n, k, cfg, out_dtype=torch.bfloat16)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = g.launch(x, w, n, k, cfg, out_dtype=torch.bfloat16)
    for seed in range(3):
        x.copy_(torch.randn(2, k, device="cuda", generator=torch.Generator("cuda").manual_seed(seed)))
        graph.replay()
        assert rel_err(y, x.double() @ w.double().T) < 8e-3


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_GPU, reason="needs a GPU")
def test_timing_keeps_cublas_unless_the_gemv_wins():
    w = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    cfg, times = g.time_against_cublas(w, 1, g.num_sms(w.device))
    assert "cublas" in times and len(times) > 1
    if cfg is not None:
        assert times[cfg.describe()] < times["cublas"]


def _compile_sm90(fn, signature: dict, constexprs: dict, num_warps: int = 4):
    """Compile a jitted kernel ahead of time for an H100/H200 (no GPU needed: Triton's own
    front end, MLIR passes and ptxas); returns the PTX."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    names = fn.arg_names
    sig = {**signature, **dict.fromkeys(constexprs, "constexpr")}
    # Pointers, sizes and strides divisible by 16, as Llama-shaped launches specialise them
    # (M, the batch, is not).
    attrs = {(names.index(a),): [["tt.divisibility", 16]] for a in signature if a != "M"}
    src = ASTSource(fn, sig, constexprs={(names.index(k),): v for k, v in constexprs.items()}, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": num_warps}).asm["ptx"]


def check_sm90_variants() -> None:
    """Every weight format on both inner products compiles for sm_90, and the weight loads are
    128-bit (``ld.global.v4``) or asynchronous 16-byte copies into shared memory (the dot)."""
    import triton.language as tl

    sig = {"x_ptr": "*bf16", "xs_ptr": "*fp32", "w_ptr": "*bf16", "ws_ptr": "*fp32",
           "bias_ptr": "*bf16", "out_ptr": "*bf16", "part_ptr": "*fp32", "cnt_ptr": "*i32"}
    sig.update(dict.fromkeys(["M", "N", "K", "k_per_split", "stride_xm", "stride_wn",
                              "stride_sn", "stride_om"], "i32"))
    cases = [  # (x, w, SCALE_MODE, USE_DOT, BLOCK_M, BLOCK_N, BLOCK_K, SPLIT)
        ("bf16", "bf16", g.SCALE_NONE, False, 1, 8, 512, 1),
        ("bf16", "bf16", g.SCALE_NONE, False, 1, 8, 512, 4),  # split summed in-kernel
        ("bf16", "bf16", g.SCALE_NONE, True, 16, 16, 256, 1),
        ("fp8e4nv", "fp8e4nv", g.SCALE_CHANNEL, False, 1, 8, 1024, 1),
        ("fp8e4nv", "fp8e4nv", g.SCALE_CHANNEL, True, 16, 32, 256, 4),  # fp8 x fp8 tensor cores
        ("fp8e4nv", "fp8e4nv", g.SCALE_BLOCK, True, 16, 32, 128, 1),
    ]
    rows_cases = [  # the rows FMA path: (x, w, SCALE_MODE, BLOCK_M, BLOCK_N, BLOCK_K, VEC)
        ("bf16", "bf16", g.SCALE_NONE, 8, 4, 256, 8),
        ("fp8e4nv", "fp8e4nv", g.SCALE_CHANNEL, 8, 4, 512, 16),
        ("fp8e4nv", "fp8e4nv", g.SCALE_BLOCK, 4, 16, 128, 16),
    ]
    for xt, wt, mode, bm, bn, bk, vec in rows_cases:
        ptx = _compile_sm90(g._gemv_rows_kernel, {**sig, "x_ptr": f"*{xt}", "w_ptr": f"*{wt}"}, dict(
            SCALE_MODE=mode, X_SCALED=wt == "fp8e4nv", HAS_BIAS=True, SPLIT=1, FUSED_REDUCE=False,
            BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, VEC=vec, EVEN_K=True,
        ))
        assert "ld.global.v4.b32" in ptx, (wt, mode)
    for xt, wt, mode, dot, bm, bn, bk, split in cases:
        fp8_dot = dot and wt == "fp8e4nv"
        ptx = _compile_sm90(g._gemv_kernel, {**sig, "x_ptr": f"*{xt}", "w_ptr": f"*{wt}"}, dict(
            SCALE_MODE=mode, X_SCALED=wt == "fp8e4nv", HAS_BIAS=True, SPLIT=split,
            FUSED_REDUCE=split > 1, USE_DOT=dot, DOT_DTYPE=tl.float8e4nv if fp8_dot else tl.bfloat16,
            BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, EVEN_K=True,
        ))
        case = (wt, mode, dot, split)
        assert ("cp.async.cg.shared.global" in ptx) if dot else ("ld.global.v4.b32" in ptx), case
        if fp8_dot:  # fp8 codes into a 16-row MMA with fp32 accumulation (as e4m3, or exact fp16 copies)
            assert re.search(r"mma\.sync\.aligned\.\w+\.row\.col\.f32\.(f16\.f16|e4m3\.e4m3)\.f32", ptx), case
        if split > 1:  # the last program's sum: one ticket, partials read past L1
            assert "atom.global" in ptx and "ld.global.cg" in ptx, case


def run_sm90_check(module: str, check: str) -> None:
    """Run ``module.check()`` in a fresh process with the interpreter off (AOT compilation needs
    the real JIT functions, which ``TRITON_INTERPRET=1`` replaces); skip without Triton's NVIDIA
    backend."""
    import subprocess
    import sys

    try:
        from triton.backends.nvidia.compiler import CUDABackend  # noqa: F401
    except Exception as e:  # a Triton build without the NVIDIA backend
        pytest.skip(f"no NVIDIA backend in this Triton: {e}")
    code = f"from {module} import {check} as c; c()"
    env = {**os.environ, "TRITON_INTERPRET": "0"}
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]


def test_gemv_variants_compile_for_sm90_with_vector_loads():
    run_sm90_check("tests.quantization.test_triton_gemv", "check_sm90_variants")
