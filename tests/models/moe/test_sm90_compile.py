"""Every tile configuration the Triton experts can pick for the H200 compiles for sm_90 with
no register spills and within its shared memory, checked without a GPU: Triton's compiler
builds the cubin for a Hopper target offline (its bundled ptxas) and ``cuobjdump`` reports
the stack (spill) bytes. Arguments carry the 16-byte divisibility a real launch specialises
on (aligned pointers, sizes and strides that are multiples of 16), so the code is the one the
GPU runs, vectorised loads included. The compiles run in a fresh interpreter: other test
modules switch Triton to its interpreter (``TRITON_INTERPRET=1``) for the whole process.
Slow (seconds per kernel): ``nox -s test-slow``.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.slow

SMEM_LIMIT = 227 * 1024  # per-block shared memory of an H100/H200
E, H, INTER, TOP_K = 128, 2048, 768, 8  # the Qwen3-30B-A3B experts the table is keyed on


def _compile(fn, sig: dict[str, str], consts: dict, values: dict[str, int], warps: int, stages: int = 3):
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    attrs = {(i,): [["tt.divisibility", 16]] for i, (name, ty) in enumerate(sig.items())
             if ty.startswith("*") or values.get(name, 1) % 16 == 0}
    src = ASTSource(fn=fn, signature=sig, constexprs=consts, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps, "num_stages": stages})


def _usage(kernel, tmp: Path) -> dict:
    """Spill (stack) bytes, shared memory and whether the loads are wide, of one compiled kernel."""
    import triton

    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    cubin = tmp / "k.cubin"
    cubin.write_bytes(kernel.asm["cubin"])
    usage = subprocess.run([tool, "--dump-resource-usage", str(cubin)], capture_output=True, text=True, check=True).stdout
    ptx = kernel.asm["ptx"]
    return {"stack": int(re.search(r"STACK:(\d+)", usage).group(1)), "smem": kernel.metadata.shared,
            "wide_loads": "ld.global.v4" in ptx or "cp.async" in ptx}


def _ints(*names: str) -> dict[str, str]:
    return dict.fromkeys(names, "i32")


def _gemv_usage(dtype: torch.dtype, tmp: Path) -> dict[str, dict]:
    from octavo.models.moe.configs import gemv_config
    from octavo.models.moe.kernels import triton_gemv as g

    cfg, ty = gemv_config(dtype), "bf16" if dtype == torch.bfloat16 else "fp32"
    sig = {"x_ptr": f"*{ty}", "w_ptr": f"*{ty}", "ids_ptr": "*i32", "out_ptr": f"*{ty}",
           **_ints("N", "K", "num_experts", "num_pairs", "stride_xm", "stride_we", "stride_wn", "stride_om"),
           **dict.fromkeys(("TOP_K", "BLOCK_N", "BLOCK_K", "EVEN_K"), "constexpr")}
    consts = dict(TOP_K=TOP_K, BLOCK_N=cfg["GATE_UP_BLOCK_N"], BLOCK_K=cfg["GATE_UP_BLOCK_K"], EVEN_K=True)
    values = dict(N=INTER, K=H, num_experts=E, stride_xm=H, stride_we=2 * INTER * H, stride_wn=H, stride_om=INTER)
    out = {f"gemv gate_up {ty}": _usage(_compile(g._gemv_gate_up_kernel, sig, consts, values, cfg["GATE_UP_WARPS"]), tmp)}
    sig = {"a_ptr": f"*{ty}", "w_ptr": f"*{ty}", "ids_ptr": "*i32", "weights_ptr": "*fp32", "out_ptr": f"*{ty}",
           **_ints("N", "K", "num_experts", "num_tokens", "stride_am", "stride_we", "stride_wn", "stride_om"),
           **dict.fromkeys(("TOP_K", "K_PAD", "BLOCK_N", "BLOCK_K", "EVEN_K"), "constexpr")}
    consts = dict(TOP_K=TOP_K, K_PAD=TOP_K, BLOCK_N=cfg["DOWN_BLOCK_N"], BLOCK_K=cfg["DOWN_BLOCK_K"], EVEN_K=True)
    values = dict(N=H, K=INTER, num_experts=E, stride_am=INTER, stride_we=H * INTER, stride_wn=INTER, stride_om=H)
    out[f"gemv down {ty}"] = _usage(_compile(g._gemv_down_kernel, sig, consts, values, cfg["DOWN_WARPS"]), tmp)
    return out


def _tuned():
    from octavo.models.moe.configs import TUNED

    return [cfg for (dev, *_), buckets in TUNED.items() if dev == "H200" for _, cfg in buckets]


def _grouped_usage(cfg: dict, tmp: Path) -> dict[str, dict]:
    from octavo.models.moe.kernels import triton_gemm as gg

    name = "m{BLOCK_M} n{BLOCK_N} k{BLOCK_K} w{num_warps} s{num_stages}".format(**cfg)
    tiles = {k: cfg[k] for k in ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M")}
    launch = (cfg["num_warps"], cfg["num_stages"])
    routing = {"sorted_ptr": "*i32", "block_expert_ptr": "*i32", "num_padded_ptr": "*i32",
               **_ints("N", "K", "num_pairs", "num_slots")}
    strides = ("stride_we", "stride_wn", "stride_wk", "stride_om", "stride_on")
    tile_sig = dict.fromkeys(("IEEE", "BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M"), "constexpr")
    unit = dict(stride_wk=1, stride_on=1)  # unit strides arrive as specialised constants
    sig = {"x_ptr": "*bf16", "w_ptr": "*bf16", "out_ptr": "*bf16", **routing,
           **_ints("stride_xm", "stride_xk", *strides), "TOP_K": "constexpr", **tile_sig}
    values = dict(N=INTER, K=H, stride_xm=H, stride_we=2 * INTER * H, stride_wn=H, stride_om=INTER)
    kernel = _compile(gg._gate_up_kernel, sig, {"TOP_K": TOP_K, "IEEE": False, "stride_xk": 1, **unit, **tiles}, values, *launch)
    out = {f"grouped gate_up {name}": _usage(kernel, tmp)}
    sig = {"a_ptr": "*bf16", "w_ptr": "*bf16", "out_ptr": "*bf16", "weight_ptr": "*fp32", **routing,
           **_ints("stride_am", "stride_ak", *strides), **tile_sig}
    values = dict(N=H, K=INTER, stride_am=INTER, stride_we=H * INTER, stride_wn=INTER, stride_om=H)
    kernel = _compile(gg._down_kernel, sig, {"IEEE": False, "stride_ak": 1, **unit, **tiles}, values, *launch)
    out[f"grouped down {name}"] = _usage(kernel, tmp)
    return out


def report(tmp: str) -> dict[str, dict]:
    """Every kernel's usage (run in the fresh interpreter)."""
    out: dict[str, dict] = {}
    for dtype in (torch.bfloat16, torch.float32):
        out.update(_gemv_usage(dtype, Path(tmp)))
    for cfg in _tuned():
        out.update(_grouped_usage(cfg, Path(tmp)))
    return out


def test_h200_tiles_compile_for_sm90_without_spills(tmp_path):
    triton = pytest.importorskip("triton")
    if not os.path.exists(os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")):
        pytest.skip("this Triton build ships no NVIDIA toolchain")
    root = Path(__file__).resolve().parents[3]
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(root), env.get("PYTHONPATH")]))
    code = f"import json, tests.models.moe.test_sm90_compile as t; print('REPORT', json.dumps(t.report({str(tmp_path)!r})))"
    proc = subprocess.run([sys.executable, "-c", code], cwd=root, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    usage = json.loads(next(line[7:] for line in proc.stdout.splitlines() if line.startswith("REPORT ")))
    assert len(usage) == 4 + 2 * len(_tuned())
    for name, u in usage.items():
        assert u["stack"] == 0, f"{name}: {u['stack']} bytes of register spills"
        assert u["smem"] <= SMEM_LIMIT, f"{name}: {u['smem']} bytes of shared memory"
        assert u["wide_loads"], f"{name}: no 128-bit loads"
