"""The C++ weight-only INT8 / INT4 kernels (``cpu_int``) against dequantize-then-matmul in fp32.

Every ISA variant this machine runs and this installation has is tested (the plain AVX-512 build
too where the CPU also has avx512_bf16), over shapes that are not multiples of the 32-channel
tile (N) nor of anything but the group (K; odd K per-channel), group sizes 32/64/128 and
per-channel, symmetric and asymmetric zero points, M = 1..33 (the GEMV, every remainder of the
GEMM row blocks) and beyond (the dequantize + BLAS path, or on a CPU with AMX the AMX path for
bf16 batches of >= 5 rows), the VDPBF16PS path of the avx512_bf16 build for bf16 batches of
DPBF16_MIN_ROWS..GEMM_MAX_ROWS rows, bf16 / fp32 / fp16 activations.
Variants this machine cannot run (NEON) are compile-checked by ``nox -s test-cpu-isa``.
"""

from __future__ import annotations

import pytest
import torch

from octavo import cpu_isa

if cpu_isa.extension_unavailable_reason() is not None:
    pytest.skip(f"C++ CPU kernels unavailable: {cpu_isa.extension_unavailable_reason()}", allow_module_level=True)

from octavo.quantization.kernels import cpu_int  # noqa: E402

VARIANTS = cpu_isa.usable_variants()
ROWS = [1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 16, 17, 31, 33]
# (N, K, group): N never a multiple of 32; per-channel rows with odd K (4-bit pads a nibble)
SHAPES = [(100, 224, 32), (70, 320, 64), (45, 384, 128), (33, 201, None), (161, 576, None)]
TOL = {torch.float32: 1e-5, torch.bfloat16: 8e-3, torch.float16: 1e-3}


def make_weight(n: int, k: int, group: int | None, bits: int, sym: bool, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    group = group or k
    levels = 1 << bits
    q = torch.randint(0, levels, (n, k), generator=g, dtype=torch.uint8)
    scales = torch.rand(n, k // group, generator=g) * 0.02 + 0.001
    if sym:
        zeros = torch.full((n, k // group), levels // 2, dtype=torch.uint8)
    else:
        zeros = torch.randint(0, levels, (n, k // group), generator=g, dtype=torch.uint8)
    return q, scales, zeros


def reference(x, q, scales, zeros, bias=None):
    group = q.shape[1] // scales.shape[1]
    w = (q.float() - zeros.float().repeat_interleave(group, 1)) * scales.repeat_interleave(group, 1)
    y = x.float() @ w.T
    if bias is not None:
        y = y + bias.float()
    return y


def rel_err(y: torch.Tensor, ref: torch.Tensor) -> float:
    return float((y.float() - ref).abs().max() / ref.abs().max().clamp(min=1e-6))


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("sym", [True, False], ids=["sym", "asym"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"n{s[0]}k{s[1]}g{s[2] or 'row'}")
def test_every_variant_matches_reference(variant, bits, sym, shape):
    n, k, group = shape
    q, scales, zeros = make_weight(n, k, group, bits, sym)
    packed = cpu_int.prepack_int(q, scales, zeros, bits, variant=variant)
    assert packed.ext.ISA == variant
    g = torch.Generator().manual_seed(1)
    for dtype in (torch.bfloat16, torch.float32):
        for m in ROWS:
            x = torch.randn(m, k, generator=g).to(dtype)
            y = cpu_int.int_linear(x, packed)
            assert y.dtype == dtype and y.shape == (m, n)
            err = rel_err(y, reference(x, q, scales, zeros))
            assert err < TOL[dtype], f"{variant} {dtype} M={m}: relative error {err:.2e}"


@pytest.mark.parametrize("variant", VARIANTS)
def test_fp16_bias_and_leading_dims(variant):
    q, scales, zeros = make_weight(90, 256, 64, 4, sym=False, seed=3)
    packed = cpu_int.prepack_int(q, scales, zeros, 4, variant=variant)
    bias = torch.randn(90)
    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        for shape in [(1, 1, 256), (3, 5, 256)]:
            x = torch.randn(shape).to(dtype)
            for b in (bias, bias.to(dtype)):
                y = cpu_int.int_linear(x, packed, b)
                assert y.shape == (*shape[:-1], 90) and y.dtype == dtype
                ref = reference(x.reshape(-1, 256), q, scales, zeros, b).view(*shape[:-1], 90)
                assert rel_err(y, ref) < TOL[dtype]


@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("block_tiles", [2, 1000], ids=["blocks", "one_block"])
def test_large_batch_goes_through_dequantize(bits, block_tiles, monkeypatch):
    """Past GEMM_MAX_ROWS the weight is dequantized (block by block for float32; whole for bf16
    without AMX: test_large_bf16_batches_dequantize_the_whole_weight)."""
    n, k = 130, 448  # 5 tiles: blocks of 2, 2 and a partial 1
    monkeypatch.setattr(cpu_int, "BLAS_BLOCK_BYTES", block_tiles * k * 4 * cpu_int.TILE)
    q, scales, zeros = make_weight(n, k, 64, bits, sym=False, seed=4)
    packed = cpu_int.prepack_int(q, scales, zeros, bits, amx=False, dpbf16=False)
    w = reference(torch.eye(k), q, scales, zeros).T
    bias = torch.randn(n)
    for dtype in (torch.float32, torch.bfloat16):
        assert torch.equal(cpu_int.dequantize(packed, dtype), w.to(dtype))
        m = cpu_int.GEMM_MAX_ROWS + 17
        x = torch.randn(m, k).to(dtype)
        tol = TOL[dtype] if dtype == torch.float32 else 2e-2  # bf16 weights in the BLAS
        y = cpu_int.int_linear(x, packed, bias)
        assert y.shape == (m, n) and y.dtype == dtype and y.is_contiguous()
        assert rel_err(y, reference(x, q, scales, zeros, bias)) < tol


@pytest.mark.parametrize("bits", [8, 4])
def test_large_bf16_batches_dequantize_the_whole_weight(bits):
    """Without AMX or the VDPBF16PS kernel, weight-only bf16 batches past GEMM_MAX_ROWS take one
    GEMM over the whole weight in bf16: the same bf16 weight as the block-by-block BLAS path, so
    the same result up to the GEMM's summation order; fewer rows stay in the C++ kernel, other
    dtypes in blocks."""
    n, k = 130, 448
    q, scales, zeros = make_weight(n, k, 64, bits, sym=False, seed=12)
    packed = cpu_int.prepack_int(q, scales, zeros, bits, amx=False, dpbf16=False)
    m = cpu_int.GEMM_MAX_ROWS + 1
    assert cpu_int.runs_in_kernel(packed, m - 1, torch.bfloat16)
    assert cpu_int._dequant_gemm(packed, m, torch.bfloat16)
    assert not cpu_int._dequant_gemm(packed, m, torch.float32)
    # a weight too large to stay in cache dequantized: blocks until WHOLE_DEQUANT_MIN_ROWS
    big = cpu_int.prepack_int(torch.zeros(16384, 576, dtype=torch.uint8), torch.ones(16384, 1),
                              torch.zeros(16384, 1, dtype=torch.uint8), 8, amx=False, dpbf16=False)
    assert big.n * big.k * 2 > cpu_int.WHOLE_DEQUANT_MAX_BYTES
    assert not cpu_int._dequant_gemm(big, m, torch.bfloat16)
    assert cpu_int._dequant_gemm(big, cpu_int.WHOLE_DEQUANT_MIN_ROWS, torch.bfloat16)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(13)).to(torch.bfloat16)
    bias = torch.randn(n)
    y = cpu_int.int_linear(x, packed, bias)
    assert y.shape == (m, n) and y.dtype == torch.bfloat16 and y.is_contiguous()
    assert rel_err(y, reference(x, q, scales, zeros, bias)) < 2e-2  # bf16 weights in the GEMM
    blocks = cpu_int._blas_linear(x, packed) + bias.to(torch.bfloat16)
    assert rel_err(y, blocks.float()) < 8e-3


AMX_VARIANTS = [v for v in VARIANTS if cpu_isa.load_variant(v).int_amx()]
AMX_ROWS = [5, 16, 17, 31, 32, 33, 40, 41, 64, 100]


@pytest.mark.skipif(not AMX_VARIANTS, reason="no kernel variant runs AMX on this CPU")
@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("sym", [True, False], ids=["sym", "asym"])
@pytest.mark.parametrize("shape", [*SHAPES, (1000, 1536, 32)], ids=lambda s: f"n{s[0]}k{s[1]}g{s[2] or 'row'}")
def test_amx_batches_match_reference(bits, sym, shape):
    """bf16 batches of >= 5 rows on AMX, for any number of rows (past GEMM_MAX_ROWS too: no BLAS),
    several 32-row blocks, a partial last block, bias, strided rows; close to the register path."""
    n, k, group = shape
    q, scales, zeros = make_weight(n, k, group, bits, sym, seed=6)
    packed = cpu_int.prepack_int(q, scales, zeros, bits, variant=AMX_VARIANTS[0])
    plain = cpu_int.prepack_int(q, scales, zeros, bits, variant=AMX_VARIANTS[0], amx=False)
    assert packed.amx and not plain.amx
    g = torch.Generator().manual_seed(7)
    bias = torch.randn(n, generator=g)
    for m in AMX_ROWS:
        x = torch.randn(m, k + 8, generator=g).to(torch.bfloat16)[:, 3:3 + k]  # row stride k + 8
        ref = reference(x, q, scales, zeros, bias)
        y = cpu_int.int_linear(x, packed, bias)
        assert y.shape == (m, n) and y.dtype == torch.bfloat16
        assert rel_err(y, ref) < TOL[torch.bfloat16], f"M={m}: relative error {rel_err(y, ref):.2e}"
        if m <= cpu_int.GEMM_MAX_ROWS:  # both fp32 sums of exact products, rounded once to bf16
            assert rel_err(y, cpu_int.int_linear(x, plain, bias).float()) < 8e-3


@pytest.mark.skipif(not AMX_VARIANTS, reason="no kernel variant runs AMX on this CPU")
def test_amx_needs_groups_of_32():
    """Groups that are not a multiple of 32 (nor one per row) stay on the register GEMM / BLAS."""
    q, scales, zeros = make_weight(64, 320, 16, 8, sym=False, seed=8)
    packed = cpu_int.prepack_int(q, scales, zeros, 8, variant=AMX_VARIANTS[0])
    assert not packed.amx
    for m in (8, cpu_int.GEMM_MAX_ROWS + 3):
        x = torch.randn(m, 320).to(torch.bfloat16)
        assert rel_err(cpu_int.int_linear(x, packed), reference(x, q, scales, zeros)) < 2e-2


@pytest.mark.skipif(not AMX_VARIANTS, reason="no kernel variant runs AMX on this CPU")
@pytest.mark.parametrize("bits", [8, 4])
def test_prefill_batches_dequantize_for_the_gemm(bits):
    """bf16 batches of DEQUANT_GEMM_MIN_ROWS rows and more (AMX CPUs, weight-only): the weight in
    bf16 through torch's GEMM, close to the reference; fewer rows stay in the C++ kernel."""
    n, k = 130, 448
    q, scales, zeros = make_weight(n, k, 64, bits, sym=False, seed=10)
    packed = cpu_int.prepack_int(q, scales, zeros, bits, variant=AMX_VARIANTS[0])
    m = cpu_int.DEQUANT_GEMM_MIN_ROWS[bits]
    assert cpu_int.runs_in_kernel(packed, m - 1, torch.bfloat16)
    assert not cpu_int.runs_in_kernel(packed, m, torch.bfloat16)
    x = torch.randn(m + 3, k, generator=torch.Generator().manual_seed(11)).to(torch.bfloat16)
    bias = torch.randn(n)
    y = cpu_int.int_linear(x, packed, bias)
    assert y.shape == (m + 3, n) and y.dtype == torch.bfloat16
    assert rel_err(y, reference(x, q, scales, zeros, bias)) < 2e-2  # bf16 weights in the GEMM
    y3 = cpu_int.int_linear(x.view(1, m + 3, k), packed, bias)
    assert y3.shape == (1, m + 3, n) and torch.equal(y3[0], y)


DP_VARIANTS = [v for v in VARIANTS if cpu_isa.load_variant(v).int_dpbf16()]


@pytest.mark.skipif(not DP_VARIANTS, reason="no kernel variant has the VDPBF16PS path on this CPU")
@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("sym", [True, False], ids=["sym", "asym"])
@pytest.mark.parametrize("shape", [*SHAPES, (64, 96, 16), (1000, 1536, 32)],
                         ids=lambda s: f"n{s[0]}k{s[1]}g{s[2] or 'row'}")
def test_dpbf16_batches_match_reference(bits, sym, shape):
    """bf16 batches of DPBF16_MIN_ROWS rows and more on VDPBF16PS (kept off AMX, so the vector
    kernel runs on any CPU with the build), past GEMM_MAX_ROWS too (no BLAS): every remainder of
    the row blocks (one group and several), N not a multiple of the tile, odd K, bias, strided
    rows; close to the reference and to the fp32-FMA GEMM; fp32 batches and fewer rows keep the
    other kernels."""
    n, k, group = shape
    q, scales, zeros = make_weight(n, k, group, bits, sym, seed=14)
    packed = cpu_int.prepack_int(q, scales, zeros, bits, variant=DP_VARIANTS[0], amx=False)
    plain = cpu_int.prepack_int(q, scales, zeros, bits, variant=DP_VARIANTS[0], amx=False, dpbf16=False)
    lo = cpu_int.DPBF16_MIN_ROWS[bits]
    assert packed.dpbf16 and packed.dp_min_rows == lo and plain.dp_min_rows == 0
    g = torch.Generator().manual_seed(15)
    bias = torch.randn(n, generator=g)
    top = cpu_int.GEMM_MAX_ROWS
    for m in sorted({lo - 1, *range(lo, lo + 9), 13, 16, 31, 32, 33, top, top + 1, 100}):
        for dtype in (torch.bfloat16, torch.float32):
            x = torch.randn(m, k + 8, generator=g).to(dtype)[:, 3:3 + k]  # row stride k + 8
            ref = reference(x, q, scales, zeros, bias)
            y = cpu_int.int_linear(x, packed, bias)
            assert y.shape == (m, n) and y.dtype == dtype
            assert rel_err(y, ref) < TOL[dtype], f"M={m} {dtype}: relative error {rel_err(y, ref):.2e}"
            assert cpu_int.runs_in_kernel(packed, m, dtype) == (dtype == torch.bfloat16 or m <= top)
            if m > top:  # the other weight takes a BLAS path there (bf16 weights)
                continue
            other = cpu_int.int_linear(x, plain, bias)
            if dtype == torch.float32 or m < lo:  # the same kernel either way
                assert torch.equal(y, other), f"M={m} {dtype}"
            else:  # both fp32 sums of the same products, rounded once to bf16
                assert rel_err(y, other.float()) < 8e-3, f"M={m}"


@pytest.mark.skipif(not DP_VARIANTS, reason="no kernel variant has the VDPBF16PS path on this CPU")
def test_dpbf16_path_is_taken():
    """dp_min_rows selects the kernel: its fp32 sums run in another order (pairs of k, then the
    scale once per group) than the FMA GEMM's, so some bf16 outputs differ by a rounding; with
    dp_min_rows above M, or 0, the GEMM runs (the same bits as without the argument)."""
    q, scales, zeros = make_weight(1000, 576, None, 8, sym=False, seed=16)
    packed = cpu_int.prepack_int(q, scales, zeros, 8, variant=DP_VARIANTS[0], amx=False)
    x = torch.randn(32, 576, generator=torch.Generator().manual_seed(17)).to(torch.bfloat16)
    ys = {}
    for rows in (0, 33, 32, 5):
        ys[rows] = torch.empty(32, 1000, dtype=torch.bfloat16)
        packed.ext.int_linear(x=x, out=ys[rows], allow_amx=False, dp_min_rows=rows, **packed._kw())
    assert torch.equal(ys[0], ys[33]) and torch.equal(ys[32], ys[5])
    assert not torch.equal(ys[0], ys[32])
    assert not cpu_int._dequant_gemm(packed, 2048, torch.bfloat16)  # every bf16 size in the kernel
    assert cpu_int._dequant_gemm(packed, 2048, torch.float32) is False  # fp32: blocks past GEMM_MAX_ROWS
    assert not cpu_int.runs_in_kernel(packed, 2048, torch.float32)
    with pytest.raises(ValueError, match="dp_min_rows"):
        packed.ext.int_linear(x=x, out=ys[0], dp_min_rows=-1, **packed._kw())
    if "avx512" in VARIANTS:  # the plain AVX-512 build has no such kernel and ignores the argument
        plain = cpu_int.prepack_int(q, scales, zeros, 8, variant="avx512")
        assert not plain.dpbf16 and not plain.ext.int_dpbf16()


def test_threads_do_not_change_the_result():
    q, scales, zeros = make_weight(1000, 576, 32, 4, sym=True, seed=5)
    packed = cpu_int.prepack_int(q, scales, zeros, 4)
    x = torch.randn(3, 576)
    outs = []
    for t in (1, 2):
        y = torch.empty(3, 1000)
        packed.ext.int_linear(x=x, out=y, num_threads=t, **packed._kw())
        outs.append(y)
    assert torch.equal(outs[0], outs[1])
    assert rel_err(outs[0], reference(x, q, scales, zeros)) < TOL[torch.float32]


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("group", [64, None], ids=["g64", "row"])
def test_batch1_multi_tile_passes(variant, bits, group):
    """One row streams several tiles side by side: 31 tiles (the last partial) in work items that
    end in 4-, 2- and 1-tile passes for 1, 2 and 3 threads; every thread count gives the same
    output, close to the reference."""
    n, k = 32 * 30 + 7, 256
    q, scales, zeros = make_weight(n, k, group, bits, sym=False, seed=9)
    packed = cpu_int.prepack_int(q, scales, zeros, bits, variant=variant)
    x = torch.randn(1, k, generator=torch.Generator().manual_seed(2))
    bias = torch.randn(n, generator=torch.Generator().manual_seed(3))
    outs = []
    for t in (1, 2, 3):
        y = torch.empty(1, n)
        packed.ext.int_linear(x=x, out=y, bias=bias, num_threads=t, **packed._kw())
        outs.append(y)
    assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], outs[2])
    assert rel_err(outs[0], reference(x, q, scales, zeros) + bias) < TOL[torch.float32]


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("bits", [8, 4])
def test_constant_zero_point_is_read_from_a_register(variant, bits):
    """Symmetric weights (every zero the same code) carry it as ``zero_point``: batch 1 then does
    not stream ``zeros``, with the same result as when it does; other weights carry none."""
    n, k = 100, 224
    q, scales, zeros = make_weight(n, k, 32, bits, sym=True, seed=4)
    packed = cpu_int.prepack_int(q, scales, zeros, bits, variant=variant)
    assert packed.zero_point == 1 << (bits - 1)
    assert cpu_int.prepack_int(*make_weight(n, k, 32, bits, sym=False), bits, variant=variant).zero_point == -1
    x = torch.randn(1, k, generator=torch.Generator().manual_seed(5)).to(torch.bfloat16)
    y_reg, y_mem = torch.empty(1, n, dtype=torch.bfloat16), torch.empty(1, n, dtype=torch.bfloat16)
    packed.ext.int_linear(x=x, out=y_reg, zero_point=packed.zero_point, **packed._kw())
    packed.ext.int_linear(x=x, out=y_mem, **packed._kw())
    assert torch.equal(y_reg, y_mem)
    assert rel_err(y_reg, reference(x, q, scales, zeros)) < TOL[torch.bfloat16]
    with pytest.raises(ValueError, match="zero_point must be below 2\\^bits"):
        packed.ext.int_linear(x=x, out=y_reg, zero_point=float(1 << bits), **packed._kw())


@pytest.mark.parametrize("isa", [i for i in ("avx512", "avx2", "scalar") if i in cpu_isa.ARCH_ISAS.get(cpu_isa.machine(), ())])
def test_octavo_cpu_isa_picks_the_variant(isa, monkeypatch):
    runs = cpu_isa.usable_variants(isa)
    if not runs:
        pytest.skip(f"this CPU / build has no {isa} variant")
    monkeypatch.setenv("OCTAVO_CPU_ISA", isa)
    cpu_isa.clear_cache()
    try:
        q, scales, zeros = make_weight(40, 64, 32, 8, sym=True)
        assert cpu_int.prepack_int(q, scales, zeros, 8).ext.ISA == runs[0]
    finally:
        monkeypatch.delenv("OCTAVO_CPU_ISA")
        cpu_isa.clear_cache()


def test_bad_canonical_tensors_are_refused():
    q, scales, zeros = make_weight(40, 64, 32, 4, sym=True)
    with pytest.raises(ValueError, match="bits must be 4 or 8"):
        cpu_int.prepack_int(q, scales, zeros, 3)
    with pytest.raises(ValueError, match="codes and zero points must be < 16"):
        cpu_int.prepack_int(q | 16, scales, zeros, 4)
    with pytest.raises(ValueError, match="q must be uint8"):
        cpu_int.prepack_int(q.to(torch.int32), scales, zeros, 4)
    with pytest.raises(ValueError, match="K % G == 0"):
        cpu_int.prepack_int(q[:, :63], scales, zeros, 4)
    with pytest.raises(ValueError, match="zeros must be uint8"):
        cpu_int.prepack_int(q, scales, zeros.float(), 4)
    q3, s3, z3 = make_weight(8, 66, 33, 4, sym=True)
    with pytest.raises(ValueError, match="even group size"):
        cpu_int.prepack_int(q3, s3, z3, 4)


def test_bad_call_arguments_are_refused():
    q, scales, zeros = make_weight(40, 64, 32, 8, sym=True)
    packed = cpu_int.prepack_int(q, scales, zeros, 8)
    with pytest.raises(ValueError, match="K=64"):
        cpu_int.int_linear(torch.randn(2, 65), packed)
    with pytest.raises(ValueError, match="x .* must be float32, float16 or bfloat16"):
        cpu_int.int_linear(torch.ones(2, 64, dtype=torch.int32), packed)
    with pytest.raises(ValueError, match="bias .* must be contiguous float32 \\[40\\]"):
        packed.ext.int_linear(x=torch.randn(1, 64), out=torch.empty(1, 40), bias=torch.randn(41), **packed._kw())
    with pytest.raises(ValueError, match="out .* must be \\[1, 40\\]"):
        packed.ext.int_linear(x=torch.randn(1, 64), out=torch.empty(1, 41), **packed._kw())
    kw = packed._kw() | {"weight": packed.weight[:, :32]}
    with pytest.raises(ValueError, match="weight .* must be contiguous \\[2, 64, 32\\]"):
        packed.ext.int_linear(x=torch.randn(1, 64), out=torch.empty(1, 40), **kw)
    with pytest.raises(ValueError, match="k a multiple of group"):
        packed.ext.int_linear(x=torch.randn(1, 64), out=torch.empty(1, 40), **(packed._kw() | {"group": 48}))
