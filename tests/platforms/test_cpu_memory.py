"""``retain_freed_memory``: CPU workers keep freed host memory mapped for the next step."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# A step's activations: four 30 MiB tensors, written, then freed. Under glibc's defaults the
# freed heap top goes back to the OS, so every step page-faults all of its pages again.
PROBE = textwrap.dedent("""
    import resource, statistics, torch
    from octavo.platforms.cpu_memory import retain_freed_memory
    applied = retain_freed_memory()
    def step():
        xs = [torch.ones(30 << 18) for _ in range(4)]
        del xs
    for _ in range(3):
        step()
    faults = []
    for _ in range(9):
        f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        step()
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)
    print(applied, statistics.median(faults))
""")


def _probe(retain: str) -> tuple[bool, float]:
    """(whether the thresholds were set, median page faults per step) in a fresh process."""
    env = {**os.environ, "OCTAVO_CPU_MALLOC_RETAIN": retain, "PYTHONPATH": ROOT}
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, check=True)
    applied, faults = out.stdout.split()
    return applied == "True", float(faults)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt: Linux only")
def test_freed_activations_are_reused_without_page_faults():
    applied, faults = _probe("1")
    if not applied:
        pytest.skip("no glibc mallopt here")
    # Whether glibc's defaults trim the freed top depends on where the interpreter's own
    # allocations landed; a few fresh processes show it.
    if not any(_probe("0")[1] > 0 for _ in range(4)):
        pytest.skip("this allocator reuses the pages without the thresholds too: nothing to show")
    assert faults == 0, f"median {faults:.0f} page faults per step (4 x 30 MiB freed and reallocated)"


def test_the_thresholds_glibc_is_given(monkeypatch):
    from octavo.platforms import cpu_memory

    calls = []

    class FakeLibc:
        class mallopt:  # noqa: N801 (glibc's name)
            argtypes = None

            def __new__(cls, param, value):
                calls.append((param, value))
                return 1

    monkeypatch.setattr(cpu_memory.ctypes, "CDLL", lambda name: FakeLibc)
    monkeypatch.setattr(cpu_memory, "_APPLIED", {})
    monkeypatch.setenv("OCTAVO_CPU_MALLOC_RETAIN", "1")
    if not sys.platform.startswith("linux"):
        assert cpu_memory.retain_freed_memory() is False
        return
    assert cpu_memory.retain_freed_memory() is True
    # M_MMAP_THRESHOLD (-3) at glibc's 64-bit maximum (a larger value is refused), M_TRIM_THRESHOLD (-1)
    assert calls == [(-3, 32 << 20), (-1, 1 << 30)]
    calls.clear()
    assert cpu_memory.retain_freed_memory() is True and calls == []  # once per process


def test_turned_off_leaves_the_allocator_alone():
    applied, _ = _probe("0")
    assert applied is False


def test_the_cpu_platform_applies_it_in_setup_worker(monkeypatch):
    from octavo.platforms import cpu_memory, cpu_threads
    from octavo.platforms.cpu import CpuPlatform

    calls = []
    monkeypatch.setattr(cpu_memory, "retain_freed_memory", lambda: calls.append(1) or True)
    monkeypatch.setattr(cpu_threads, "setup_cpu_threads", lambda rank, world: {"bind": "none"})  # no pinning here
    plan = CpuPlatform.setup_worker(0, 1)
    assert calls and plan == {"bind": "none", "malloc_retain": True}
