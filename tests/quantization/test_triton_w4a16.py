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

from octavo.quantization.kernels import triton_gemv as g  # noqa: E402
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


def test_pack_int4_layout():
    q = torch.arange(16, dtype=torch.uint8).repeat(3, 2)  # [3, 32]
    words = w4.pack_int4(q)
    assert words.dtype == torch.int32 and words.shape == (3, 4)
    unpacked = (words[:, :, None] >> torch.arange(0, 32, 4)) & 0xF
    assert torch.equal(unpacked.reshape(3, 32).to(torch.uint8), q)


def test_prepack_refuses_bad_layouts():
    q, s, z = (t.cpu() for t in make(8, 64, 32))
    with pytest.raises(ValueError, match="divisible by 8"):
        w4.prepack_w4a16(q[:, :60], s, z, 30)
    with pytest.raises(ValueError, match="must both be"):
        w4.prepack_w4a16(q, s[:, :1], z, 32)
    with pytest.raises(ValueError, match="uint8"):
        w4.prepack_w4a16(q.to(torch.int32), s, z, 32)
    assert w4.tile_k(32, 4096, 1024) == 32 and w4.tile_k(4096, 4096, 1024) == 1024


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


@pytest.mark.skipif(HAS_GPU, reason="interpreter tests run where there is no GPU")
@pytest.mark.parametrize("group,cfg", [
    (128, g.GemvConfig(32, 128, 1)), (128, g.GemvConfig(16, 64, 2)), (32, g.GemvConfig(8, 32, 3)),
    (256, g.GemvConfig(16, 256, 1)),
], ids=str)
def test_w4a16_fma_tiles_inside_one_group_interpreted(group, cfg):
    """FMA tiles that sit inside one scale group (one scale and zero per row and tile)."""
    n, k = 72, 512
    q, s, z = make(n, k, group, seed=group)
    packed = w4.prepack_w4a16(q, s, z, group)
    x = torch.randn(1, k, generator=torch.Generator(device=DEVICE).manual_seed(3), device=DEVICE).bfloat16()
    y = g.launch(x, packed.packed, n, k, cfg, out_dtype=x.dtype, wfmt=g.WFMT_INT4, scale_mode=g.SCALE_GROUP,
                 w_scale=packed.scales, w_zs=packed.zeros, group=group)
    ref = x.double() @ dequant(q, s, z, group).T
    assert float((y.double() - ref).norm() / ref.norm()) < 8e-3
