"""Compute-thread placement on CPUs: ``OCTAVO_CPU_THREADS_BIND=auto|<cpu list>|none``.

``auto`` (default): one compute thread per physical core this process may run on (SMT siblings
left out), each OpenMP thread pinned to its core. With tensor parallelism on one host the cores
are split into contiguous groups, one per local rank. ``0-3,8`` pins to exactly those CPUs (one
thread each). ``none`` leaves torch's thread count and the OS placement alone.

Unpinned OpenMP threads migrate and share cores with each other and with the Python thread;
on the reference 2-vCPU machine vLLM's CPU backend ran 1.6x faster with its threads bound.
The kernels and torch's GEMMs run on the same OpenMP team (see ``csrc/cpu/threading.cpp``),
so pinning that team places both. Without octavo's extension the process affinity is set and
the team inherits it (no per-thread pinning).
"""

from __future__ import annotations

import logging
import os

import torch

from octavo import envs

logger = logging.getLogger(__name__)

_APPLIED: dict[int, dict] = {}  # pid -> summary (the pool is per process)


def parse_cpu_list(spec: str) -> list[int]:
    """``"0-3,8,10-11"`` -> ``[0, 1, 2, 3, 8, 10, 11]`` (order kept, duplicates dropped)."""
    cpus: list[int] = []
    for part in spec.split(","):
        part = part.strip()
        if not part:
            continue
        try:
            if "-" in part:
                lo, hi = (int(x) for x in part.split("-", 1))
                if hi < lo:
                    raise ValueError
                cpus.extend(range(lo, hi + 1))
            else:
                cpus.append(int(part))
        except ValueError:
            raise ValueError(
                f"OCTAVO_CPU_THREADS_BIND={spec!r}: expected auto, none or a CPU list like 0-3,8"
            ) from None
    seen: set[int] = set()
    return [c for c in cpus if not (c in seen or seen.add(c))]


def allowed_cpus() -> list[int]:
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return list(range(os.cpu_count() or 1))


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def physical_cores(cpus: list[int]) -> list[int]:
    """The first logical CPU of each physical core among ``cpus`` (sysfs topology)."""
    seen: set[tuple[str, str]] = set()
    out: list[int] = []
    for c in cpus:
        base = f"/sys/devices/system/cpu/cpu{c}/topology"
        core = _read(f"{base}/core_id")
        pkg = _read(f"{base}/physical_package_id")
        if core is None:  # no topology information: treat every CPU as a core
            return list(cpus)
        key = (pkg or "0", core)
        if key not in seen:
            seen.add(key)
            out.append(c)
    return out


def plan_cpus(spec: str, local_rank: int = 0, local_world_size: int = 1) -> list[int] | None:
    """CPUs to pin compute threads to (one thread each), or None for ``none``."""
    spec = (spec or "auto").strip().lower()
    if spec == "none":
        return None
    allowed = allowed_cpus()
    if spec == "auto":
        cores = physical_cores(allowed)
        if local_world_size > 1:
            per = max(1, len(cores) // local_world_size)
            cores = cores[local_rank * per : (local_rank + 1) * per] or cores[-per:]
        return cores
    cpus = parse_cpu_list(spec)
    missing = [c for c in cpus if c not in allowed]
    if missing:
        raise ValueError(
            f"OCTAVO_CPU_THREADS_BIND={spec!r} names CPUs {missing} that this process may not "
            f"run on (allowed: {allowed})"
        )
    if not cpus:
        raise ValueError(f"OCTAVO_CPU_THREADS_BIND={spec!r} names no CPU")
    return cpus


def setup_cpu_threads(local_rank: int = 0, local_world_size: int = 1, spec: str | None = None) -> dict:
    """Apply ``OCTAVO_CPU_THREADS_BIND`` once per process; returns what was done."""
    pid = os.getpid()
    if pid in _APPLIED:
        return _APPLIED[pid]
    spec = spec if spec is not None else envs.OCTAVO_CPU_THREADS_BIND
    cpus = plan_cpus(spec, local_rank, local_world_size)
    if cpus is None:
        summary = {"bind": "none", "threads": torch.get_num_threads(), "cpus": None}
        _APPLIED[pid] = summary
        return summary
    torch.set_num_threads(len(cpus))
    pinned = 0
    try:
        from octavo.cpu_isa import load_extension

        ext = load_extension()
        if ext.have_openmp():
            # Threads 1.. are pinned one per CPU. The calling (Python) thread, OpenMP thread 0,
            # is only confined to the set: pinning it to one CPU would also confine every
            # process and thread it starts later (they inherit its mask).
            pinned = ext.bind_threads(cpus, False)
    except ImportError:
        pass
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, cpus)  # the calling thread, and threads created from now on
    summary = {"bind": spec, "threads": len(cpus), "cpus": cpus, "pinned": pinned}
    logger.info(
        "CPU compute threads: %d on CPUs %s (%s)", len(cpus), cpus,
        "workers pinned one per CPU" if pinned == len(cpus) - 1 else "process affinity",
    )
    _APPLIED[pid] = summary
    return summary


def reset_for_tests() -> None:
    _APPLIED.clear()
