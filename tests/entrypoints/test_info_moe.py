"""``octavo info`` for mixture-of-experts models: experts, placement per rank, weights per
rank, the grouped kernel's activation peak and the MoE kernel choice; ``--models`` lists them."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from octavo.entrypoints.info import collect_info, models_info
from octavo.platforms import reset_current_platform
from tests.platforms.sim import Machine, simulate


@pytest.fixture(autouse=True)
def _fresh_platform():
    reset_current_platform()
    yield
    reset_current_platform()


def test_info_on_cpu_for_qwen2_moe(monkeypatch, checkpoints):
    simulate(monkeypatch, Machine())
    info = collect_info(checkpoints["qwen2_moe"])
    assert info["architecture"] == "Qwen2MoeForCausalLM"
    assert info["experts"] == (
        "2 of 3 layers route to top-2 of 8 experts (I=48, softmax weights, shared expert I=80)"
    )
    assert info["expert placement"].startswith("one rank holds every expert")
    assert "MiB per rank at tp=1" in info["weights"]
    assert info["moe kernel"].startswith("cpu_grouped (GEMMs in float32)")
    assert "token-expert pairs" in info["moe activation peak"]


def test_info_on_a_simulated_gpu_with_expert_parallel(monkeypatch, checkpoints):
    simulate(monkeypatch, Machine(cuda_devices=2, capability=(9, 0), packages=frozenset({"triton"})))
    info = collect_info(checkpoints["qwen3_moe"], tensor_parallel_size=2, enable_expert_parallel=True)
    assert info["expert placement"] == "expert parallel: 4 whole experts per rank over 2 ranks"
    assert info["moe kernel"].startswith("triton_grouped")
    tp2 = collect_info(checkpoints["qwen3_moe"], tensor_parallel_size=2)
    assert tp2["expert placement"].startswith("tensor-sharded: all 8 experts on every rank, 24 rows each")
    # Same bytes per rank either way: E/N whole experts or every expert's I/N rows.
    assert tp2["weights"] == info["weights"]


def test_models_lists_moe_architectures_and_flags():
    info = models_info()
    for arch in ("MixtralForCausalLM", "Qwen2MoeForCausalLM", "Qwen3MoeForCausalLM"):
        assert info[arch] == "mixture of experts"
    assert info["LlamaForCausalLM"] == "dense"
    assert "--enable-expert-parallel" in info["MoE flags"]


def test_cli_info_models():
    env = {**os.environ, "OCTAVO_PLATFORM": "cpu"}
    r = subprocess.run(
        [sys.executable, "-m", "octavo.entrypoints.cli", "info", "--models"],
        capture_output=True, text=True, timeout=300, env=env,
    )
    assert r.returncode == 0, r.stderr
    assert "Qwen3MoeForCausalLM" in r.stdout and "--enable-expert-parallel" in r.stdout
