"""int8 activations on the CPU (``int_linear_a8``, W8A8 / W4A8 numerics) against the torch
reference of the same quantized math (``torch_ref.int_a8_linear``).

Every ISA variant this machine runs is tested: those with AVX512-VNNI run the kernel, the others
must refuse clearly. The integer sums are checked exactly (integer activations, a static
activation scale of 1 and power-of-two weight scales make the fp32 epilogue exact too); the
other tests allow only the fp32 epilogue's rounding.
"""

from __future__ import annotations

import pytest
import torch

from octavo import cpu_isa

if cpu_isa.extension_unavailable_reason() is not None:
    pytest.skip(f"C++ CPU kernels unavailable: {cpu_isa.extension_unavailable_reason()}", allow_module_level=True)

from octavo.quantization.canonical import Int8Weight, IntWeight  # noqa: E402
from octavo.quantization.kernels import cpu_int, select, torch_ref  # noqa: E402

VARIANTS = cpu_isa.usable_variants()
A8 = [v for v in VARIANTS if cpu_isa.load_variant(v).int_a8()]
NO_A8 = [v for v in VARIANTS if v not in A8]
ROWS = [1, 2, 3, 4, 5, 7, 8, 9, 17]
# (N, K, group): N not a multiple of 32; K a multiple of 4; per-channel and grouped
SHAPES = [(100, 224, 32), (70, 320, 64), (45, 384, 128), (33, 196, None)]
TOL = {torch.float32: 2e-6, torch.bfloat16: 8e-3, torch.float16: 1e-3}


def make_weight(n: int, k: int, group: int | None, bits: int, sym: bool, seed: int = 0) -> IntWeight:
    g = torch.Generator().manual_seed(seed)
    group = group or k
    top = 1 << bits
    q = torch.randint(0, top, (n, k), generator=g, dtype=torch.uint8)
    scales = torch.rand(n, k // group, generator=g) * 0.02 + 0.001
    zeros = (torch.full((n, k // group), top // 2, dtype=torch.uint8) if sym
             else torch.randint(0, top, (n, k // group), generator=g, dtype=torch.uint8))
    return IntWeight(q, scales, zeros, bits, group)


def pack(w: IntWeight, variant: str, **kw) -> cpu_int.PackedInt:
    return cpu_int.prepack_int(w.q, w.scales, w.zeros, w.bits, variant=variant, act_int8=True, **kw)


def rel_err(y: torch.Tensor, ref: torch.Tensor) -> float:
    return float((y.float() - ref.float()).abs().max() / ref.float().abs().max().clamp(min=1e-6))


@pytest.mark.skipif(not A8, reason="no kernel variant with AVX512-VNNI runs on this CPU")
@pytest.mark.parametrize("variant", A8)
@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"n{s[0]}k{s[1]}g{s[2] or 'row'}")
def test_integer_sums_are_exact(variant, bits, shape):
    n, k, group = shape
    w = make_weight(n, k, group, bits, sym=False)
    w.scales = torch.exp2(torch.randint(-3, 2, w.scales.shape).float())  # epilogue exact
    packed = pack(w, variant, input_scale=1.0)
    g = torch.Generator().manual_seed(2)
    x = torch.randint(-128, 128, (9, k), generator=g).float()
    deq = (w.q.long() - w.zeros.long().repeat_interleave(w.group, 1)).double()
    want = x.double() @ (deq * w.scales.double().repeat_interleave(w.group, 1)).T
    assert torch.equal(cpu_int.int_linear(x, packed).double(), want)


@pytest.mark.skipif(not A8, reason="no kernel variant with AVX512-VNNI runs on this CPU")
@pytest.mark.parametrize("variant", A8)
@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("sym", [True, False], ids=["sym", "asym"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"n{s[0]}k{s[1]}g{s[2] or 'row'}")
def test_dynamic_per_token_matches_reference(variant, bits, sym, shape):
    n, k, group = shape
    w = make_weight(n, k, group, bits, sym)
    packed = pack(w, variant)
    assert packed.a8 and packed.ext.ISA == variant
    g = torch.Generator().manual_seed(1)
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        for m in ROWS:
            x = torch.randn(m, k, generator=g).to(dtype)
            y = cpu_int.int_linear(x, packed)
            assert y.dtype == dtype and y.shape == (m, n)
            err = rel_err(y, torch_ref.int_a8_linear(x, w))
            assert err < TOL[dtype], f"{variant} {dtype} M={m}: relative error {err:.2e}"


@pytest.mark.skipif(not A8, reason="no kernel variant with AVX512-VNNI runs on this CPU")
@pytest.mark.parametrize("variant", A8)
def test_static_scale_saturates_bias_and_leading_dims(variant):
    w = make_weight(90, 256, 64, 4, sym=False, seed=3)
    packed = pack(w, variant, input_scale=0.01)  # |x| / 0.01 reaches far beyond int8: clamped
    bias = torch.randn(90)
    x = torch.randn(2, 3, 256) * 3
    y = cpu_int.int_linear(x, packed, bias)
    ref = torch_ref.int_a8_linear(x.reshape(6, 256), w, bias, torch.tensor(0.01)).view(2, 3, 90)
    assert y.shape == (2, 3, 90) and rel_err(y, ref) < TOL[torch.float32]


@pytest.mark.skipif(not A8, reason="no kernel variant with AVX512-VNNI runs on this CPU")
def test_threads_do_not_change_the_result():
    w = make_weight(300, 512, 32, 4, sym=True)
    packed = pack(w, A8[0])
    x = torch.randn(3, 512, dtype=torch.bfloat16)
    outs = []
    for t in (1, 2):
        out = torch.empty(3, 300, dtype=torch.bfloat16)
        packed.ext.int_linear_a8(x=x, out=out, num_threads=t, **packed._kw())
        outs.append(out)
    assert torch.equal(outs[0], outs[1])


@pytest.mark.skipif(not A8, reason="no kernel variant with AVX512-VNNI runs on this CPU")
@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("group", [64, None], ids=["g64", "row"])
def test_batch1_multi_tile_passes(bits, group):
    """One row streams several tiles side by side (4-, 2- and 1-tile passes, a partial last
    tile): the integer sums are exact, so every thread count gives the same bits and the
    reference's result."""
    n, k = 32 * 30 + 7, 256
    w = make_weight(n, k, group, bits, sym=False, seed=9)
    packed = pack(w, A8[0])
    x = torch.randn(1, k)
    outs = []
    for t in (1, 2, 3):
        out = torch.empty(1, n)
        packed.ext.int_linear_a8(x=x, out=out, num_threads=t, **packed._kw())
        outs.append(out)
    assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], outs[2])
    assert rel_err(outs[0], torch_ref.int_a8_linear(x, w)) < TOL[torch.float32]


@pytest.mark.skipif(not A8, reason="no kernel variant with AVX512-VNNI runs on this CPU")
@pytest.mark.parametrize("bits,group", [(8, None), (4, 64)], ids=["int8-row", "int4-g64"])
@pytest.mark.parametrize("n", [32 * 18, 32 * 41 + 5])
def test_batches_over_many_tiles_are_exact_at_every_thread_count(bits, group, n):
    """Batches deal runs of several tiles to the threads, each block of 8 rows fetching the next
    tile beside its product (18 tiles: items of one per thread pair; 42: runs of two or more):
    exact integer sums, so every thread count gives the reference's bits."""
    k = 256
    w = make_weight(n, k, group, bits, sym=False, seed=11)
    w.scales = torch.exp2(torch.randint(-3, 2, w.scales.shape).float())
    packed = pack(w, A8[0], input_scale=1.0)
    deq = (w.q.long() - w.zeros.long().repeat_interleave(w.group, 1)).double()
    g = torch.Generator().manual_seed(6)
    for m in (8, 33):
        x = torch.randint(-128, 128, (m, k), generator=g).float()
        want = x.double() @ (deq * w.scales.double().repeat_interleave(w.group, 1)).T
        for t in (1, 2, 3):
            out = torch.empty(m, n)
            packed.ext.int_linear_a8(x=x, out=out, num_threads=t, input_scale=1.0, **packed._kw())
            assert torch.equal(out.double(), want), f"M={m} threads={t}"


@pytest.mark.skipif(not A8, reason="no kernel variant with AVX512-VNNI runs on this CPU")
def test_shapes_the_kernel_cannot_run_are_refused():
    w = make_weight(40, 198, None, 8, sym=True)  # K % 4 != 0
    with pytest.raises(LookupError, match="multiples of 4"):
        pack(w, A8[0])
    w = make_weight(40, 200, 50, 8, sym=True)  # group % 4 != 0
    packed = cpu_int.prepack_int(w.q, w.scales, w.zeros, 8, variant=A8[0])
    with pytest.raises(ValueError, match="int_linear_a8: int8 activations need K and the group a multiple of 4"):
        packed.ext.int_linear_a8(x=torch.randn(1, 200), out=torch.empty(1, 40), **packed._kw())


@pytest.mark.skipif(not NO_A8, reason="every kernel variant here has int8 activations")
@pytest.mark.parametrize("variant", NO_A8)
def test_variants_without_vnni_refuse(variant):
    w = make_weight(40, 128, 32, 4, sym=True)
    with pytest.raises(LookupError, match="AVX512-VNNI"):
        pack(w, variant)
    packed = cpu_int.prepack_int(w.q, w.scales, w.zeros, 4, variant=variant)
    with pytest.raises(ValueError, match="int_linear_a8: int8 activations need"):
        packed.ext.int_linear_a8(x=torch.randn(1, 128), out=torch.empty(1, 40), **packed._kw())


def test_weight_only_layers_keep_16_bit_activations_unless_opted_in(monkeypatch):
    w = make_weight(64, 128, 32, 4, sym=True)
    monkeypatch.delenv("OCTAVO_CPU_INT8_ACTIVATIONS", raising=False)
    kernel, skipped = select.select_kernel(w, ("cpu_int_a8", "cpu_int"))
    assert kernel.name == "cpu_int" and "OCTAVO_CPU_INT8_ACTIVATIONS" in skipped["cpu_int_a8"]
    monkeypatch.setenv("OCTAVO_CPU_INT8_ACTIVATIONS", "1")
    if not cpu_isa.load_extension().int_a8():  # the opt-in is refused, named, not run as 16-bit
        with pytest.raises(ValueError, match="OCTAVO_CPU_INT8_ACTIVATIONS=1: int8 activations need AVX512-VNNI"):
            select.select_kernel(w, ("cpu_int_a8", "cpu_int"))
        return
    kernel, _ = select.select_kernel(w, ("cpu_int_a8", "cpu_int"))
    assert kernel.name == "cpu_int_a8"
    x = torch.randn(2, 128)
    y = kernel.apply(x, kernel.prepack(w), None)
    assert rel_err(y, torch_ref.int_a8_linear(x, w)) < TOL[torch.float32]


def test_int8_w8a8_checkpoints_use_integer_activations():
    g = torch.Generator().manual_seed(4)
    w = Int8Weight(torch.randint(-128, 128, (70, 256), generator=g, dtype=torch.int8), torch.rand(70, generator=g) * 0.01)
    kernel, skipped = select.select_kernel(w, ("cpu_w8a8",))
    if not cpu_isa.load_extension().int_a8():
        assert kernel.name == "torch_ref" and "AVX512-VNNI" in skipped["cpu_w8a8"]
        return
    assert kernel.name == "cpu_w8a8"
    packed = kernel.prepack(w)
    for m in (1, 4, 7):
        x = torch.randn(m, 256, generator=g)
        assert rel_err(kernel.apply(x, packed, None), torch_ref.int8_w8a8_linear(x, w)) < TOL[torch.float32]


@pytest.mark.skipif(not A8 or not cpu_isa.load_variant(A8[0]).int_amx(), reason="needs VNNI and AMX")
@pytest.mark.parametrize("bits,group", [(8, None), (4, 32)])
def test_prefill_batches_on_amx_match_reference(bits, group):
    w = make_weight(100, 256, group, bits, sym=False, seed=5)
    packed = pack(w, A8[0])
    assert packed.amx
    bias = torch.randn(100)
    for m in (cpu_int.A8_AMX_MIN_ROWS + 1, 40):
        x = torch.randn(m, 256).bfloat16()
        y = cpu_int.int_linear(x, packed, bias)
        assert y.dtype == torch.bfloat16
        assert rel_err(y, torch_ref.int_a8_linear(x.float(), w, bias)) < 2 * TOL[torch.bfloat16]
