"""The selection matrix: platform, attention backend, graph mode, communicator and dtypes on
simulated machines (CUDA 7.0 / 9.0, ROCm, XPU with and without IPEX, TPU), plus clear errors
for forced backends and platforms that cannot run."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from octavo.engine.arg_utils import EngineArgs
from octavo.platforms import (
    PlatformResolutionError,
    get_current_platform,
    get_resolution,
    reset_current_platform,
)
from tests.platforms.sim import Machine, simulate

FP32, BF16, FP16 = torch.float32, torch.bfloat16, torch.float16
HEAD = 128  # a head size every backend (the TPU kernel too) accepts


@pytest.fixture(autouse=True)
def _fresh_platform():
    reset_current_platform()
    yield
    reset_current_platform()


@dataclass(frozen=True)
class Row:
    machine: Machine
    platform: str
    backend: str
    graphs: str
    communicator: str
    dist_backend: str
    dtypes: tuple[torch.dtype, ...]
    auto_fp32: torch.dtype  # dtype="auto" for a float32 checkpoint
    auto_bf16: torch.dtype  # dtype="auto" for a bfloat16 checkpoint
    block_size: int = 16
    skipped: tuple[str, ...] = ()  # backends walked past, in order


CUDA_PKGS = frozenset({"triton"})
MATRIX = {
    "cpu": Row(Machine(cpu_kernels=True), "cpu", "cpu_paged", "none", "gloo", "gloo",
               (BF16, FP32, FP16), FP32, BF16),
    "cpu-no-kernels": Row(Machine(), "cpu", "torch_ref", "none", "gloo", "gloo", (BF16, FP32, FP16),
                          FP32, BF16, skipped=("cpu_paged",)),
    "cuda-7.0": Row(Machine(cuda_devices=1, capability=(7, 0), packages=CUDA_PKGS), "cuda",
                    "triton_paged", "cuda_graph", "nccl", "nccl", (FP16, FP32), FP16, FP16,
                    skipped=("flash_attn",)),
    "cuda-7.0-flash_attn": Row(
        Machine(cuda_devices=1, capability=(7, 0), packages=CUDA_PKGS | {"flash_attn"}), "cuda",
        "triton_paged", "cuda_graph", "nccl", "nccl", (FP16, FP32), FP16, FP16, block_size=256,
        skipped=("flash_attn",)),
    "cuda-9.0": Row(Machine(cuda_devices=2, capability=(9, 0), packages=CUDA_PKGS), "cuda",
                    "triton_paged", "cuda_graph", "nccl", "nccl", (BF16, FP16, FP32), BF16, BF16,
                    skipped=("flash_attn",)),
    "cuda-9.0-flash_attn": Row(
        Machine(cuda_devices=8, capability=(9, 0), packages=CUDA_PKGS | {"flash_attn"}), "cuda",
        "flash_attn", "cuda_graph", "nccl", "nccl", (BF16, FP16, FP32), BF16, BF16, block_size=256),
    "cuda-9.0-flash_attn-block16": Row(
        Machine(cuda_devices=1, capability=(9, 0), packages=CUDA_PKGS | {"flash_attn"}), "cuda",
        "triton_paged", "cuda_graph", "nccl", "nccl", (BF16, FP16, FP32), BF16, BF16,
        skipped=("flash_attn",)),
    "cuda-9.0-bare": Row(Machine(cuda_devices=1, capability=(9, 0)), "cuda", "torch_ref",
                         "cuda_graph", "nccl", "nccl", (BF16, FP16, FP32), BF16, BF16,
                         skipped=("flash_attn", "triton_paged")),
    "rocm": Row(Machine(cuda_devices=1, hip="6.3.42131", packages=CUDA_PKGS), "rocm", "triton_paged",
                "hip_graph", "rccl", "nccl", (BF16, FP16, FP32), BF16, BF16),
    "xpu-ipex": Row(
        Machine(xpu_devices=1, packages=frozenset({"intel_extension_for_pytorch", "triton"})), "xpu",
        "ipex", "none", "xccl", "xccl", (BF16, FP16, FP32), BF16, BF16),
    "xpu-no-ipex": Row(Machine(xpu_devices=1, packages=frozenset({"triton"})), "xpu", "triton_paged",
                       "none", "xccl", "xccl", (BF16, FP16, FP32), BF16, BF16, skipped=("ipex",)),
    "xpu-no-bf16-oneccl": Row(
        Machine(xpu_devices=1, xpu_bf16=False, xccl=False,
                packages=frozenset({"triton", "oneccl_bindings_for_pytorch"})), "xpu",
        "triton_paged", "none", "ccl", "ccl", (FP16, FP32), FP16, FP16, skipped=("ipex",)),
    "tpu": Row(Machine(tpu=True, packages=frozenset({"torch_xla"})), "tpu", "xla", "none",
               "xla", "xla", (BF16, FP32), BF16, BF16),
    # Order: CUDA before TPU when both are present.
    "cuda-and-tpu": Row(Machine(cuda_devices=1, tpu=True, packages=CUDA_PKGS | {"torch_xla"}),
                        "cuda", "triton_paged", "cuda_graph", "nccl", "nccl", (BF16, FP16, FP32),
                        BF16, BF16, skipped=("flash_attn",)),
}


@pytest.mark.parametrize("case", list(MATRIX))
def test_selection_matrix(monkeypatch, case):
    row = MATRIX[case]
    simulate(monkeypatch, row.machine)
    p = get_current_platform()
    assert p.name == row.platform
    dtype = p.resolve_auto_dtype(FP32)
    backend, skipped = p.get_attn_backend(HEAD, dtype, "auto", row.block_size)
    assert backend.name == row.backend, skipped
    assert tuple(skipped) == row.skipped
    assert all(reasons for reasons in skipped.values())
    assert p.get_graph_capture().value == row.graphs
    assert p.get_communicator().value == row.communicator
    assert p.get_dist_backend() == row.dist_backend
    assert p.supported_dtypes() == row.dtypes
    assert (dtype, p.resolve_auto_dtype(BF16)) == (row.auto_fp32, row.auto_bf16)
    assert p.default_block_size == 16


def _skip_reason(monkeypatch, machine: Machine, block_size: int = 16) -> str:
    simulate(monkeypatch, machine)
    p = get_current_platform()
    _, skipped = p.get_attn_backend(HEAD, p.supported_dtypes()[0], "auto", block_size)
    return "; ".join(skipped["flash_attn"])


def test_flash_attn_skip_reasons_say_why(monkeypatch):
    assert "not installed" in _skip_reason(monkeypatch, Machine(cuda_devices=1, packages=CUDA_PKGS))
    old = Machine(cuda_devices=1, capability=(7, 5), packages=CUDA_PKGS | {"flash_attn"})
    assert "compute capability >= 8.0, this GPU has 7.5" in _skip_reason(monkeypatch, old, 256)
    new = Machine(cuda_devices=1, packages=CUDA_PKGS | {"flash_attn"})
    assert "--block-size 256" in _skip_reason(monkeypatch, new, 16)


def test_resolution_explains_every_builtin(monkeypatch):
    simulate(monkeypatch, Machine(cuda_devices=1, tpu=True, packages=frozenset({"torch_xla"})))
    r = get_resolution()
    assert r.platform.name == "cuda"
    assert "first available built-in" in r.how
    assert r.alternatives["tpu"].startswith("available, but cuda comes first")
    assert r.alternatives["cpu"].startswith("available, but cuda comes first")
    assert "not a ROCm build" in r.alternatives["rocm"]
    assert "no XPU support" in r.alternatives["xpu"]


def test_unavailable_reasons_of_a_cpu_only_machine(monkeypatch):
    simulate(monkeypatch, Machine())
    r = get_resolution()
    assert r.platform.name == "cpu"
    assert "no CUDA support" in r.alternatives["cuda"]
    assert "torch_xla is not installed" in r.alternatives["tpu"]
    simulate(monkeypatch, Machine(packages=frozenset({"torch_xla"})))
    assert "not a TPU" in get_resolution().alternatives["tpu"]


def test_cuda_build_without_gpu_says_so(monkeypatch):
    simulate(monkeypatch, Machine())
    monkeypatch.setattr("octavo.platforms.cuda._probe_cuda_version", lambda: "12.8")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    from octavo.platforms.cuda import CudaPlatform

    assert CudaPlatform.unavailable_reason() == "no NVIDIA GPU is visible (CUDA_VISIBLE_DEVICES='')"


# -- engine config on simulated machines ------------------------------------------------------
def test_engine_config_on_simulated_volta(monkeypatch, llama_dir):
    simulate(monkeypatch, Machine(cuda_devices=1, capability=(7, 0), packages=CUDA_PKGS))
    cfg = EngineArgs(model=llama_dir).create_engine_config()
    assert cfg.model_config.dtype == FP16  # float32 checkpoint, auto, no bf16 before sm80
    assert cfg.device_config.device == "cuda"
    assert cfg.cache_config.block_size == 16
    assert cfg.enforce_eager is False  # CUDA graphs stay on
    with pytest.raises(ValueError, match="dtype.*bfloat16 is not supported on cuda"):
        EngineArgs(model=llama_dir, dtype="bfloat16").create_engine_config()
    with pytest.raises(ValueError, match="tensor-parallel-size.*needs 2 cuda devices; 1 visible"):
        EngineArgs(model=llama_dir, tensor_parallel_size=2).create_engine_config()
    with pytest.raises(ValueError, match="block-size.*8 is not supported on cuda"):
        EngineArgs(model=llama_dir, block_size=8).create_engine_config()


def test_engine_config_on_cpu_records_eager(monkeypatch, llama_dir):
    simulate(monkeypatch, Machine())
    cfg = EngineArgs(model=llama_dir).create_engine_config()
    assert cfg.model_config.dtype == FP32
    assert cfg.enforce_eager is True
    assert cfg.cache_config.cpu_kvcache_space_bytes > 0


def test_enforce_eager_turns_graphs_off(monkeypatch, llama_dir):
    simulate(monkeypatch, Machine(tpu=True, packages=frozenset({"torch_xla"})))
    cfg = EngineArgs(model=llama_dir, enforce_eager=True).create_engine_config()
    assert cfg.model_config.dtype == BF16
    assert get_current_platform().get_graph_capture(cfg).value == "none"


# -- forcing -----------------------------------------------------------------------------------
def test_forced_backend_that_cannot_run_lists_its_reasons(monkeypatch):
    simulate(monkeypatch, Machine())
    monkeypatch.setenv("OCTAVO_ATTENTION_BACKEND", "flash_attn")
    p = get_current_platform()
    with pytest.raises(ValueError) as e:
        p.get_attn_backend(64, FP16, "auto", 256)
    msg = str(e.value)
    assert "'flash_attn'" in msg and "cannot run on cpu" in msg
    assert "package 'flash_attn' is not installed" in msg


def test_forced_backend_wrong_capability(monkeypatch):
    simulate(monkeypatch, Machine(cuda_devices=1, capability=(7, 0), packages=CUDA_PKGS | {"flash_attn"}))
    monkeypatch.setenv("OCTAVO_ATTENTION_BACKEND", "flash_attn")
    with pytest.raises(ValueError, match=r"compute capability >= 8\.0, this GPU has 7\.0"):
        get_current_platform().get_attn_backend(HEAD, FP16, "auto", 256)


def test_forced_unknown_backend_lists_known_ones(monkeypatch):
    simulate(monkeypatch, Machine())
    monkeypatch.setenv("OCTAVO_ATTENTION_BACKEND", "warp_drive")
    with pytest.raises(ValueError, match=r"unknown attention backend 'warp_drive'; known: \[.*torch_ref"):
        get_current_platform().get_attn_backend(64, FP32, "auto", 16)


def test_forced_backend_that_can_run_is_taken(monkeypatch):
    simulate(monkeypatch, Machine(cuda_devices=1, packages=CUDA_PKGS))
    monkeypatch.setenv("OCTAVO_ATTENTION_BACKEND", "torch_ref")
    backend, skipped = get_current_platform().get_attn_backend(HEAD, BF16, "auto", 16)
    assert backend.name == "torch_ref" and skipped == {}


def test_no_backend_can_run_is_a_clear_error(monkeypatch):
    simulate(monkeypatch, Machine(tpu=True, packages=frozenset({"torch_xla"})))
    p = get_current_platform()
    monkeypatch.setattr(p, "attn_backend_priority", ("xla",))
    with pytest.raises(ValueError, match=r"no attention backend of tpu.*xla: head size 64 is not a multiple of 128"):
        p.get_attn_backend(64, BF16, "auto", 16)


@pytest.mark.parametrize("name", ["cuda", "rocm", "xpu", "tpu"])
def test_forcing_an_unavailable_platform_is_a_clear_error(monkeypatch, name):
    simulate(monkeypatch, Machine())
    monkeypatch.setenv("OCTAVO_PLATFORM", name)
    with pytest.raises(PlatformResolutionError, match=f"OCTAVO_PLATFORM={name} but it cannot run here: "):
        get_current_platform()


def test_forcing_an_available_builtin(monkeypatch):
    simulate(monkeypatch, Machine(cuda_devices=1, tpu=True, packages=frozenset({"torch_xla"})))
    monkeypatch.setenv("OCTAVO_PLATFORM", "tpu")
    r = get_resolution()
    assert r.platform.name == "tpu" and r.how == "OCTAVO_PLATFORM=tpu"
    assert r.alternatives["cuda"] == "not chosen: OCTAVO_PLATFORM=tpu"


def test_tpu_reports_the_graph_mode_the_runner_uses(monkeypatch):
    """No bucketed xla_compile claim: the runner pads nothing, so info says no captured graphs."""
    simulate(monkeypatch, Machine(tpu=True, packages=frozenset({"torch_xla"})))
    from octavo.platforms.tpu import TpuPlatform

    choice = TpuPlatform.get_graph_capture()
    assert choice.value == "none" and "not padded to shape buckets" in choice.reason

