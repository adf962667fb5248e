"""Simulated machines for platform selection tests on a CPU-only box.

``simulate(monkeypatch, Machine(...))`` replaces the detection probes of the built-in platforms
(``_probe_*`` in cuda.py, xpu.py, tpu.py) and the optional-package probe
(``octavo.utils.packages.package_available``), and resets ``current_platform`` so it re-resolves. Backends
whose real module imports fine without their package (flash_attn, ipex, xla) run their real
``validate``; ``triton_paged`` and ``cpu_paged`` are replaced by stand-ins of the right name,
since their own checks look at the real machine (the stand-in ``cpu_paged`` runs only when
``Machine.cpu_kernels`` says the C++ extension is built). Everything is undone by monkeypatch
at teardown.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from octavo.attention.backends import xla as xla_backend
from octavo.attention.backends.torch_ref import TorchRefBackend
from octavo.platforms import cuda, interface, reset_current_platform, tpu, xpu
from octavo.utils import packages, plugins

STAND_INS = ("triton_paged", "cpu_paged")


@dataclass(frozen=True)
class Machine:
    cuda_devices: int = 0  # NVIDIA GPUs, or AMD GPUs when ``hip`` is set
    capability: tuple[int, int] = (9, 0)
    hip: str | None = None
    xpu_devices: int = 0
    xpu_bf16: bool = True
    xccl: bool = True
    tpu: bool = False
    cpu_kernels: bool = False  # octavo's C++ CPU extension built for this CPU
    packages: frozenset[str] = field(default_factory=frozenset)  # importable optional packages


def simulate(monkeypatch: pytest.MonkeyPatch, m: Machine) -> None:
    cuda_build = m.cuda_devices > 0 and m.hip is None
    monkeypatch.setattr(cuda, "_probe_hip_version", lambda: m.hip)
    monkeypatch.setattr(cuda, "_probe_cuda_version", lambda: "12.8" if cuda_build else None)
    monkeypatch.setattr(cuda, "_probe_device_count", lambda: m.cuda_devices)
    monkeypatch.setattr(cuda, "_probe_capability", lambda device_id=0: m.capability)
    monkeypatch.setattr(cuda, "_probe_device_name", lambda device_id=0: "Simulated GPU")
    monkeypatch.setattr(cuda, "_probe_total_memory", lambda device_id=0: 80 << 30)
    monkeypatch.setattr(xpu, "_probe_has_torch_xpu", lambda: m.xpu_devices > 0)
    monkeypatch.setattr(xpu, "_probe_device_count", lambda: m.xpu_devices)
    monkeypatch.setattr(xpu, "_probe_bf16_supported", lambda: m.xpu_bf16)
    monkeypatch.setattr(xpu, "_probe_xccl_available", lambda: m.xccl)
    monkeypatch.setattr(tpu, "_probe_xla_device_type", lambda: "TPU" if m.tpu else "CPU")
    monkeypatch.setattr(tpu, "_probe_device_count", lambda: 4 if m.tpu else 0)
    monkeypatch.setattr(xla_backend, "_has_ragged_kernel", lambda: "torch_xla" in m.packages)
    monkeypatch.setattr(packages, "package_available", lambda name: name in m.packages)
    real_import = interface._import_backend

    def cpu_kernel_reasons(cls, *args) -> list[str]:
        return [] if m.cpu_kernels else ["C++ CPU kernels unavailable (simulated)"]

    def import_backend(name: str):
        if name in STAND_INS:
            extra = {"extra_reasons": classmethod(cpu_kernel_reasons)} if name == "cpu_paged" else {}
            return type(f"StandIn_{name}", (TorchRefBackend,), {"name": name, **extra})
        return real_import(name)

    monkeypatch.setattr(interface, "_import_backend", import_backend)
    monkeypatch.delenv("OCTAVO_PLATFORM", raising=False)
    monkeypatch.delenv("OCTAVO_ATTENTION_BACKEND", raising=False)
    monkeypatch.setattr(plugins, "entry_points", lambda group: [])
    reset_current_platform()
