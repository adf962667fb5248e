"""octavo's bf16 GEMV (``csrc/cpu/gemv.cpp``) against torch, on every ISA variant this CPU runs,
and the decode-size dispatch of ``cpu_fused_ops.linear`` to it."""

from __future__ import annotations

import pytest
import torch

try:  # an ImportError when the C++ extension is not built
    from octavo.models import cpu_fused_ops as cfo
except ImportError as e:
    pytest.skip(f"C++ CPU kernels not built: {e}", allow_module_level=True)

from octavo import cpu_isa  # noqa: E402
from octavo.models import layers  # noqa: E402

VARIANTS = cpu_isa.usable_variants()


def _reference(x, w, b):
    ref = x.float() @ w.float().T
    if b is not None:
        ref += b.float()
    return ref


def _check(out, x, w, b):
    ref = _reference(x, w, b)
    # fp32 accumulation in another order, then one rounding to bf16: within one bf16 step.
    torch.testing.assert_close(out.float(), ref, rtol=8e-3, atol=8e-3 * ref.abs().max().item() / 64 + 1e-3)
    exact = (out == ref.to(torch.bfloat16)).float().mean()
    assert exact > 0.9, f"only {exact:.2%} equal torch's rounding of the fp32 result"


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("m", [1, 2, 3, 4, 5, 9, 17, 33, 64])  # with AMX: 2+ rows in 16/32-row tiles
@pytest.mark.parametrize(("n", "k"), [(16, 2), (48, 64), (576, 576), (3072, 576), (576, 1536), (4112, 256)])
def test_gemv_matches_torch(variant, m, n, k):
    ext = cpu_isa.load_variant(variant)
    g = torch.Generator().manual_seed(m * 7919 + n + k)
    x = torch.randn(m, k, generator=g).to(torch.bfloat16)
    w = (torch.randn(n, k, generator=g) / k**0.5).to(torch.bfloat16)
    b = torch.randn(n, generator=g).to(torch.bfloat16)
    packed = cfo.pack_gemv_weight(w)
    for bias in (None, b):
        out = torch.empty(m, n, dtype=torch.bfloat16)
        ext.gemv(x=x, weight=packed, out=out, bias=bias)
        _check(out, x, w, bias)
    xs = torch.randn(m, k + 6, generator=g).to(torch.bfloat16)[:, 2 : k + 2]  # strided rows
    out = torch.full((m, n), float("nan"), dtype=torch.bfloat16)
    ext.gemv(x=xs, weight=packed, out=out, num_threads=1)
    _check(out, xs, w, None)


@pytest.mark.parametrize("variant", VARIANTS)
def test_gemv_rejects_bad_arguments(variant):
    ext = cpu_isa.load_variant(variant)
    x = torch.randn(1, 64).to(torch.bfloat16)
    w = torch.randn(32, 64).to(torch.bfloat16)
    out = torch.empty(1, 32, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="gemv: weight .* packed layout"):
        ext.gemv(x=x, weight=w.view(2, 16, 32, 2).transpose(1, 2), out=out)
    with pytest.raises(ValueError, match="gemv: x .* must be bfloat16"):
        ext.gemv(x=x.float(), weight=cfo.pack_gemv_weight(w), out=out)
    with pytest.raises(ValueError, match="gemv: out"):
        ext.gemv(x=x, weight=cfo.pack_gemv_weight(w), out=torch.empty(1, 48, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="gemv: bias"):
        ext.gemv(x=x, weight=cfo.pack_gemv_weight(w), out=out, bias=torch.zeros(31, dtype=torch.bfloat16))


def test_linear_uses_the_gemv_at_decode_sizes_and_follows_weight_updates(monkeypatch):
    lin = torch.nn.Linear(256, 96, bias=True).to(torch.bfloat16)
    layers.bind_fused_ops(lin, "cpu", "table")
    calls = []
    real = cfo.gemv
    monkeypatch.setattr(cfo, "gemv", lambda *a: calls.append(a[0].shape) or real(*a))
    with torch.inference_mode():
        for m in (1, 4, 16, cfo.GEMV_AMX_MAX_ROWS + 1):
            x = torch.randn(m, 256).to(torch.bfloat16)
            _check(layers.linear(lin, x), x, lin.weight, lin.bias)
        # 16 rows: the GEMV on AMX or VDPBF16PS CPUs, else oneDNN; 65 rows: oneDNN
        wide = [torch.Size([16, 256])] if cfo.GEMV_AMX or cfo.GEMV_DOT else []
        assert calls == [torch.Size([1, 256]), torch.Size([4, 256]), *wide]
        assert cfo.gemv_rows(16, 256) == bool(wide) and not cfo.gemv_rows(cfo.GEMV_AMX_MAX_ROWS + 1, 256)
        lin.weight.mul_(2)  # in place: the packed copy is rebuilt
        x = torch.randn(2, 256).to(torch.bfloat16)
        _check(layers.linear(lin, x), x, lin.weight, lin.bias)
    odd = torch.nn.Linear(256, 40).to(torch.bfloat16)  # 40 rows: not a multiple of 16, oneDNN
    off = torch.nn.Linear(256, 96).to(torch.bfloat16)  # the platform's policy "off": oneDNN
    layers.bind_fused_ops(odd, "cpu", "table")
    layers.bind_fused_ops(off, "cpu", "off")
    calls.clear()
    with torch.inference_mode():
        x = torch.randn(1, 256).to(torch.bfloat16)
        _check(layers.linear(odd, x), x, odd.weight, odd.bias)
        _check(layers.linear(off, x), x, off.weight, off.bias)
    assert calls == []


def test_cpu_platform_binds_the_gemv_unless_turned_off(monkeypatch):
    from octavo.platforms.cpu import CpuPlatform

    assert CpuPlatform.decode_gemv_policy() == "table"
    monkeypatch.setenv("OCTAVO_DECODE_GEMV", "off")
    assert CpuPlatform.decode_gemv_policy() == "off"
    assert "GEMV" not in CpuPlatform.describe()["linear kernels"]


def test_octavo_info_names_the_linear_kernels():
    from octavo.platforms.cpu import CpuPlatform

    line = CpuPlatform.describe()["linear kernels"]
    assert f"GEMV ({cfo._ext.ISA}" in line and "decode batch sizes" in line
