"""W4A16 linears (``octavo.quantization.kernels.triton_w4a16``) against fp32 torch on the
contract's canonical tensors (codes, per-group scales and zero points, asymmetric and
symmetric), every group size the formats use, under ``TRITON_INTERPRET=1`` without a GPU and at
the Llama-8B shapes on one (``cuda`` marker)."""

from __future__ import annotations

import os

import pytest
import torch

HAS_GPU = torch.cuda.is_available()
if not HAS_GPU:
    os.environ.setdefault("TRITON_INTERPRET", "1")

pytest.importorskip("triton")

from octavo.quantization.kernels import triton_w4a16 as w4  # noqa: E402

DEVICE = "cuda" if HAS_GPU else "cpu"


def make(n, k, group, symmetric=False, seed=0):
    gen = torch.Generator(device=DEVICE).manual_seed(seed)
    q = torch.randint(0, 16, (n, k), generator=gen, dtype=torch.uint8, device=DEVICE)
    scales = torch.rand(n, k // group, generator=gen, device=DEVICE) * 0.02 + 0.001
    if symmetric:
        zeros = torch.full((n, k // group), 8, dtype=torch.uint8, device=DEVICE)
    else:
        zeros = torch.randint(0, 16, (n, k // group), generator=gen, dtype=torch.uint8, device=DEVICE)
    return q, scales, zeros


def dequant(q, scales, zeros, group):
    z = zeros.double().repeat_interleave(group, 1)
    return (q.double() - z) * scales.double().repeat_interleave(group, 1)


def check(n, k, group, m, dtype, symmetric=False, bias=True, seed=0):
    q, s, z = make(n, k, group, symmetric, seed)
    packed = w4.prepack_w4a16(q, s, z, group)
    gen = torch.Generator(device=DEVICE).manual_seed(seed + 1)
    x = torch.randn(m, k, generator=gen, device=DEVICE).to(dtype)
    b = torch.randn(n, generator=gen, device=DEVICE).to(dtype) if bias else None
    ref = x.double() @ dequant(q, s, z, group).T + (b.double() if bias else 0)
    y = w4.w4a16_linear(x, packed, b)
    assert y.dtype == dtype and y.shape == (m, n)
    err = float((y.double() - ref).norm() / ref.norm())
    assert err < (1e-5 if dtype == torch.float32 else 8e-3), (group, m, dtype, err)


def test_pack_planes_layout():
    """Bits 4i..4i+3 of word j of block b hold code 128 b + 16 i + j; K pads to 128 with 0s."""
    gen = torch.Generator().manual_seed(0)
    q = torch.randint(0, 16, (3, 200), generator=gen, dtype=torch.uint8)
    words = w4.pack_planes(q)
    assert words.dtype == torch.int32 and words.shape == (3, 256 // 8)
    nib = (words.reshape(3, 2, 1, 16) >> (torch.arange(8) * 4).reshape(1, 1, 8, 1)) & 0xF  # [n, b, i, j]
    codes = nib.reshape(3, 256).to(torch.uint8)
    assert torch.equal(codes[:, :200], q) and not codes[:, 200:].any()


def test_prepack_refuses_bad_layouts():
    q, s, z = (t.cpu() for t in make(8, 64, 32))
    with pytest.raises(ValueError, match="must divide K"):
        w4.prepack_w4a16(q[:, :60], s, z, 32)
    with pytest.raises(ValueError, match="must both be"):
        w4.prepack_w4a16(q, s[:, :1], z, 32)
    with pytest.raises(ValueError, match="uint8"):
        w4.prepack_w4a16(q.to(torch.int32), s, z, 32)
    q48, s48, z48 = (t.cpu() for t in make(8, 96, 48))
    with pytest.raises(ValueError, match="group size 48"):
        w4.prepack_w4a16(q48, s48, z48, 48)
    assert w4.group_supported(8, 64) and not w4.group_supported(64, 64) and not w4.group_supported(256, 1024)


@pytest.mark.skipif(HAS_GPU, reason="interpreter tests run where there is no GPU")
@pytest.mark.parametrize("group", [32, 64, 128, 256])
@pytest.mark.parametrize("m", [1, 3, 8, 20])
def test_w4a16_interpreted(group, m):
    check(72, 256, group, m, torch.bfloat16, symmetric=group == 64, bias=m != 8)


@pytest.mark.skipif(HAS_GPU, reason="interpreter tests run where there is no GPU")
def test_w4a16_fp32_and_fp16_interpreted():
    check(40, 128, 128, 2, torch.float32)
    check(40, 128, 32, 4, torch.float16)


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_GPU, reason="needs a GPU")
@pytest.mark.parametrize("group", [32, 64, 128, "channel"])
@pytest.mark.parametrize("shape", [(6144, 4096), (4096, 14336), (1000, 1032)], ids=str)
def test_w4a16_gpu(group, shape):
    n, k = shape
    grp = k if group == "channel" else group
    if k % grp:
        pytest.skip(f"group {grp} does not divide K={k}")
    for m in (1, 2, 5, 8, 64):
        for dtype in (torch.bfloat16, torch.float16):
            check(n, k, grp, m, dtype, symmetric=m == 2, seed=m)
    check(n, k, grp, 3, torch.float32)


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_GPU, reason="needs a GPU")
@pytest.mark.parametrize("group,k", [(128, 4096), (256, 4096), (1032, 1032)], ids=str)
def test_w4a16_asm_unpacking_gpu(group, k):
    """The inline-assembly unpacking (``asm`` tilings), bf16 and fp16, against fp32 torch."""
    n = 1000
    for seed, (m, dtype, cfg) in enumerate([
        (1, torch.bfloat16, w4.W4Config(128, 4, True, 4, asm=True)),
        (3, torch.float16, w4.W4Config(256, 1, True, 8, asm=True)),
        (8, torch.bfloat16, w4.W4Config(128, 2, True, 4, asm=True)),
        (1, torch.float16, w4.W4Config(64, 8, True, 4, asm=True)),
    ]):
        q, s, z = make(n, k, group, symmetric=seed == 2, seed=seed)
        packed = w4.prepack_w4a16(q, s, z, group)
        assert w4.asm_applies(dtype, packed.group)
        x = torch.randn(m, k, generator=torch.Generator(device=DEVICE).manual_seed(seed), device=DEVICE).to(dtype)
        b = torch.randn(n, device=DEVICE).to(dtype)
        y = w4.launch(x, packed, cfg, b)
        ref = x.double() @ dequant(q, s, z, group).T + b.double()
        assert float((y.double() - ref).norm() / ref.norm()) < 8e-3, (m, dtype, cfg)


@pytest.mark.skipif(HAS_GPU, reason="interpreter tests run where there is no GPU")
@pytest.mark.parametrize("group,k,m,cfg", [
    (128, 512, 1, w4.W4Config(32, 1)), (128, 512, 2, w4.W4Config(16, 2)), (32, 512, 1, w4.W4Config(8, 3)),
    (256, 512, 3, w4.W4Config(16, 1)), (200, 200, 1, w4.W4Config(32, 2)), (64, 384, 5, w4.W4Config(32, 3, True)),
    (32, 256, 20, w4.W4Config(16, 2, True)), (136, 136, 4, w4.W4Config(16, 1, True)),
], ids=str)
def test_w4a16_tilings_interpreted(group, k, m, cfg):
    """Every tiling the kernel can run: the FMA path (one program per row) and the dot, K splits
    summed by a second kernel (no counters here) over runs of whole blocks, K not a multiple of
    128 (padded) with one group per row."""
    n = 72
    q, s, z = make(n, k, group, seed=group)
    packed = w4.prepack_w4a16(q, s, z, group)
    packed.counters = None
    x = torch.randn(m, k, generator=torch.Generator(device=DEVICE).manual_seed(3), device=DEVICE).bfloat16()
    y = w4.launch(x, packed, cfg)
    ref = x.double() @ dequant(q, s, z, group).T
    assert float((y.double() - ref).norm() / ref.norm()) < 8e-3


def check_sm90_w4() -> None:
    """Both paths compile for sm_90: the FMA path reads words with 128-bit loads and turns codes
    into floats without a conversion instruction (the and-or of the exponent bits); the dot
    path copies its words into shared memory asynchronously and multiplies on the tensor cores."""
    import re

    import triton.language as tl

    from tests.quantization.test_triton_gemv import _compile_sm90

    sig = {"x_ptr": "*bf16", "w_ptr": "*i32", "s_ptr": "*fp32", "z_ptr": "*fp32", "bias_ptr": "*bf16",
           "out_ptr": "*bf16", "part_ptr": "*fp32", "cnt_ptr": "*i32"}
    sig.update(dict.fromkeys(["M", "N", "K", "blocks_per_split", "stride_xm", "stride_wn", "stride_sn",
                              "stride_om", "magic"], "i32"))
    for dot, bm, bn, group, split, asm in ((False, 1, 256, 128, 4, False), (False, 1, 128, 32, 1, False),
                                           (True, 16, 64, 128, 2, False), (True, 16, 64, 64, 1, False),
                                           (True, 16, 128, 128, 4, True), (True, 16, 256, 256, 1, True)):
        ptx = _compile_sm90(w4._w4_kernel, {**sig, "w_ptr": "*u8" if asm else "*i32"}, dict(
            GROUP=group, HAS_BIAS=True, SPLIT=split, FUSED_REDUCE=split > 1, USE_DOT=dot, DOT_DTYPE=tl.bfloat16,
            BLOCK_M=bm, BLOCK_N=bn, EVEN_K=True, ASM=asm,
        ))
        case = (dot, group, split, asm)
        if asm:  # ptxas accepted the unpacking; the bytes are copied into shared memory asynchronously
            assert "prmt.b32" in ptx and "sub.rn.bf16x2" in ptx and "cp.async.cg.shared.global" in ptx, case
        elif dot:
            assert "cp.async.cg.shared.global" in ptx and re.search(r"mma\.sync\.aligned.*bf16", ptx), case
        else:
            assert "ld.global.v4.b32" in ptx and "cvt.rn.f32.s32" not in ptx, case


def test_w4a16_compiles_for_sm90():
    from tests.quantization.test_triton_gemv import run_sm90_check

    run_sm90_check("tests.quantization.test_triton_w4a16", "check_sm90_w4")
