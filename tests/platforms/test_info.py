"""``octavo info``: the resolved platform, each choice with its reason, and why each other
built-in was not chosen."""

from __future__ import annotations

import pytest

from octavo.entrypoints.info import collect_info
from octavo.platforms import reset_current_platform
from tests.platforms.sim import Machine, simulate


@pytest.fixture(autouse=True)
def _fresh_platform():
    reset_current_platform()
    yield
    reset_current_platform()


def test_info_on_a_cpu_machine(monkeypatch, llama_dir):
    simulate(monkeypatch, Machine())
    info = collect_info(llama_dir)
    assert info["platform"] == "cpu (first available built-in; no platform plugin active)"
    assert "no CUDA support" in info["  not cuda"]
    assert "not a ROCm build" in info["  not rocm"]
    assert "no XPU support" in info["  not xpu"]
    assert "torch_xla is not installed" in info["  not tpu"]
    assert info["graphs"] == "none (CPU runs eagerly by default (OCTAVO_CPU_GRAPH_MODE=torch_compile compiles decode steps))"
    monkeypatch.setenv("OCTAVO_CPU_GRAPH_MODE", "torch_compile")
    assert collect_info(llama_dir)["graphs"] == "torch_compile (OCTAVO_CPU_GRAPH_MODE)"
    assert info["communicator"].startswith("gloo (")
    assert info["cpu isa"].split()[0] in ("avx512", "avx2", "neon", "scalar")
    assert info["dtype"] == "float32" and info["block_size"] == "16"
    attention = info["attention"]
    assert attention.startswith(("torch_ref (", "cpu_paged ("))
    if attention.startswith("torch_ref"):
        assert info["  not cpu_paged"]  # why the C++ kernels were not taken


def test_info_on_a_simulated_h100(monkeypatch, llama_dir):
    simulate(monkeypatch, Machine(cuda_devices=8, capability=(9, 0), packages=frozenset({"triton"})))
    info = collect_info(llama_dir)
    assert info["platform"].startswith("cuda (first available built-in")
    assert info["device"] == "Simulated GPU (compute capability 9.0)"
    assert info["device count"] == "8"
    assert info["  not cpu"].startswith("available, but cuda comes first")
    assert info["dtype"] == "bfloat16"  # auto on sm90 for a float32 checkpoint
    assert info["graphs"] == "cuda_graph (CUDA graphs replay captured decode steps (mixed steps too with OCTAVO_MIXED_GRAPHS=1))"
    assert info["communicator"] == "nccl (NCCL over NVLink / PCIe) [torch.distributed backend nccl]"
    assert info["attention"].startswith("triton_paged (") and info["attention"].endswith("choice 2 of 3; fallback: flash_attn cannot run, see below)")
    assert info["  not flash_attn"] == "package 'flash_attn' is not installed"


def test_info_without_a_model_still_reports_the_platform(monkeypatch, tmp_path):
    simulate(monkeypatch, Machine())
    info = collect_info(str(tmp_path / "missing"))
    assert info["platform"].startswith("cpu")
    assert info["model"].startswith("unavailable: --model")
    assert info["attention"].startswith("priority ")


def test_cli_info_prints_every_choice(llama_dir):
    import os
    import subprocess
    import sys

    env = {**os.environ, "OCTAVO_PLATFORM": "cpu"}  # the same output on any machine
    r = subprocess.run(
        [sys.executable, "-m", "octavo.entrypoints.cli", "info", "--model", llama_dir],
        capture_output=True, text=True, timeout=300, env=env,
    )
    assert r.returncode == 0, r.stderr
    for label in ("platform", "  not cuda", "  not tpu", "graphs", "communicator", "attention", "cpu isa"):
        assert f"\n{label} " in "\n" + r.stdout, (label, r.stdout)
