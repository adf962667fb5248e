"""Kernel selection, the canonical weights' slicing, and what ``octavo info`` / the bench say."""

from __future__ import annotations

import json

import torch

from octavo.quantization.canonical import Fp8Weight, IntWeight, cat_shards
from octavo.quantization.kernels import select, torch_ref


def _int_weight(n=16, k=64, group=32, bits=4, seed=0) -> IntWeight:
    gen = torch.Generator().manual_seed(seed)
    top = (1 << bits) - 1
    return IntWeight(
        torch.randint(0, top + 1, (n, k), generator=gen, dtype=torch.int64).to(torch.uint8),
        torch.rand(n, k // group, generator=gen) + 0.1,
        torch.randint(0, top + 1, (n, k // group), generator=gen, dtype=torch.int64).to(torch.uint8), bits, group,
    )


def test_int_reference_is_dequantize_then_matmul():
    w = _int_weight()
    x = torch.randn(3, 64)
    deq = torch.empty(16, 64)
    for n in range(16):
        for k in range(64):
            deq[n, k] = (int(w.q[n, k]) - int(w.zeros[n, k // 32])) * float(w.scales[n, k // 32])
    torch.testing.assert_close(torch_ref.int_linear(x, w), x @ deq.T)
    assert torch_ref.int_linear(x.bfloat16(), w).dtype == torch.bfloat16


def test_canonical_slices_are_slices_of_the_dequantized_weight():
    a, b = _int_weight(seed=1), _int_weight(n=8, seed=2)
    fused = cat_shards([a, b])
    full = torch_ref.dequantize_int(fused)
    torch.testing.assert_close(torch_ref.dequantize_int(fused.rows(16, 8)), full[16:24])
    torch.testing.assert_close(torch_ref.dequantize_int(fused.cols(32, 32)), full[:, 32:])
    per_channel = _int_weight(group=64, bits=8, seed=3)
    torch.testing.assert_close(
        torch_ref.dequantize_int(per_channel.cols(16, 32)), torch_ref.dequantize_int(per_channel)[:, 16:48]
    )
    fp8 = Fp8Weight(torch.randn(256, 256).to(torch.float8_e4m3fn), torch.rand(2, 2) + 0.5, block=(128, 128))
    full8 = torch_ref.dequantize_fp8(fp8)
    torch.testing.assert_close(torch_ref.dequantize_fp8(fp8.rows(128, 128).cols(0, 128)), full8[128:, :128])


def test_kernel_choice_falls_back_to_the_reference_and_says_why():
    kernel, skipped = select.select_kernel(_int_weight(), ("cpu_int", "triton_w4a16"))
    try:
        import octavo.quantization.kernels.cpu_int  # noqa: F401
        assert kernel.name == "cpu_int"
    except ImportError:
        assert kernel.name in ("torch_ref", "triton_w4a16")
        assert "not available here" in skipped["cpu_int"]
    _, skipped8 = select.select_kernel(_int_weight(bits=8, group=64), ("triton_w4a16",))
    assert skipped8["triton_w4a16"].startswith("runs 4-bit weight-only layers")


def test_info_shows_method_and_kernel(llama_dir, cpu_platform):
    from octavo.entrypoints.info import collect_info

    info = collect_info(llama_dir, quantization="int8")
    assert "int8" in info["quantization methods"] and "(online: int8)" in info["quantization methods"]
    assert info["quantization"] == "int8 (online weight-only, per-channel)"
    assert info["quant kernel (int)"] in ("cpu_int", "torch_ref")


def test_bench_latency_with_quantization(llama_dir, tmp_path, cpu_platform):
    from octavo.entrypoints.cli import main

    out = tmp_path / "lat.json"
    rc = main(["bench", "latency", "--model", llama_dir, "--quantization", "int8", "--batch-size", "1",
               "--input-len", "8", "--output-len", "4", "--num-iters", "1", "--num-iters-warmup", "1",
               "--backend", "octavo", "--max-model-len", "128", "--disable-tqdm", "--output-json", str(out)])
    assert rc == 0
    env = json.loads(out.read_text())["environment"]
    assert env["quantization"] == "int8"
    assert env["quantization_kernels"].startswith("int8 weight-only, per-channel -> ")
