"""Which build of octavo's C++ CPU kernels this process runs, and why.

The package ships one extension module per ISA variant (``setup.py``): ``_C_avx512_bf16``,
``_C_avx512``, ``_C_avx2``, ``_C_scalar`` on x86-64 and ``_C_neon``, ``_C_scalar`` on AArch64.
The CPU's features are read from the CPU itself (CPUID / HWCAP, through the baseline
``_C_scalar`` module, so an emulator's CPU model is honoured), falling back to
``/proc/cpuinfo`` and ``torch.backends.cpu.get_cpu_capability()``. The best variant the CPU can
run is imported; ``OCTAVO_CPU_ISA=avx512|avx2|neon|scalar`` picks one instead and is refused
with a clear message when the CPU lacks it -- octavo never executes an instruction the CPU
does not have (the SIGILL that images built on one machine hit on another).

Importing a variant also points its thread pool at the OpenMP runtime torch has loaded, so
the kernels run on torch's intra-op threads (``torch.set_num_threads`` sizes both).
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import os
import platform as _platform
from functools import cache, lru_cache
from types import ModuleType

from octavo import envs

logger = logging.getLogger(__name__)

# User-facing ISA names (OCTAVO_CPU_ISA) -> module variants, best first.
ISA_VARIANTS: dict[str, tuple[str, ...]] = {
    "avx512": ("avx512_bf16", "avx512"),
    "avx2": ("avx2",),
    "neon": ("neon",),
    "scalar": ("scalar",),
}
ARCH_ISAS: dict[str, tuple[str, ...]] = {
    "x86_64": ("avx512", "avx2", "scalar"),
    "aarch64": ("neon", "scalar"),
}


def machine() -> str:
    m = _platform.machine().lower()
    return {"amd64": "x86_64", "arm64": "aarch64"}.get(m, m)


def _proc_cpuinfo_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


@lru_cache(maxsize=1)
def cpu_features() -> dict[str, bool]:
    """Feature bits that decide the variant: avx2, fma, f16c, avx512f/bw/vl/dq, avx512_bf16, neon."""
    try:
        mod = importlib.import_module("octavo._C_scalar")
        feats = dict(mod.cpu_features())
        feats.pop("best", None)
        feats["source"] = "cpuid"
        return feats
    except ImportError:
        pass
    flags = _proc_cpuinfo_flags()
    feats: dict = {k: k in flags for k in ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_bf16")}
    feats["neon"] = machine() == "aarch64"
    feats["source"] = "/proc/cpuinfo"
    if not flags and machine() == "x86_64":
        import torch

        cap = torch.backends.cpu.get_cpu_capability()  # "AVX512", "AVX2", "DEFAULT", ...
        feats["source"] = f"torch cpu capability {cap}"
        if cap in ("AVX512", "AVX2"):
            feats.update(avx2=True, fma=True, f16c=True)
        if cap == "AVX512":
            feats.update(avx512f=True, avx512bw=True, avx512vl=True, avx512dq=True)
    return feats


def variant_runs_here(variant: str, feats: dict | None = None) -> bool:
    f = cpu_features() if feats is None else feats
    avx512 = all(f.get(k) for k in ("avx512f", "avx512bw", "avx512vl", "avx512dq", "fma", "f16c"))
    return {
        "avx512_bf16": avx512 and bool(f.get("avx512_bf16")),
        "avx512": avx512,
        "avx2": all(f.get(k) for k in ("avx2", "fma", "f16c")),
        "neon": bool(f.get("neon")),
        "scalar": True,
    }.get(variant, False)


def best_isa(feats: dict | None = None) -> tuple[str, str]:
    """(best ISA this CPU runs, why), whether or not its kernels are built."""
    f = cpu_features() if feats is None else feats
    for isa in ARCH_ISAS.get(machine(), ("scalar",)):
        runs = [v for v in ISA_VARIANTS[isa] if variant_runs_here(v, f)]
        if runs:
            return isa, f"{runs[0]} is the best variant this {machine()} CPU runs (features from {f.get('source')})"
    return "scalar", f"no vector ISA octavo uses on this {machine() or 'unknown'} CPU"


def cpu_name() -> str:
    """The CPU's model name from /proc/cpuinfo with its family and model numbers where the file
    has them (virtual machines often name only "AMD EPYC"; the family tells the generations
    apart: AMD 25 is Zen 3/4, 26 is Zen 5), else what ``platform`` knows."""
    fields: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if not line.strip():
                    break  # the first processor's block is enough
                fields.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    name = fields.get("model name")
    if not name:
        return _platform.processor() or _platform.machine()
    if "cpu family" in fields and "model" in fields:
        return f"{name} (family {fields['cpu family']}, model {fields['model']})"
    return name


def _variant_built(variant: str) -> bool:
    return importlib.util.find_spec(f"octavo._C_{variant}") is not None


def usable_variants(isa: str | None = None, feats: dict | None = None) -> list[str]:
    """Kernel module variants this CPU runs and this installation built, best first (only
    ``isa``'s variants when given)."""
    isas = (isa,) if isa else ARCH_ISAS.get(machine(), ("scalar",))
    return [v for i in isas for v in ISA_VARIANTS[i] if variant_runs_here(v, feats) and _variant_built(v)]


def isa_of(variant: str) -> str:
    return next(isa for isa, vs in ISA_VARIANTS.items() if variant in vs)


def select_variant(forced: str | None = None) -> tuple[str, str]:
    """(module variant, why). ``forced`` (or ``OCTAVO_CPU_ISA``) names an ISA.

    Raises ``ValueError`` for an unknown ISA, one the CPU lacks, or one not built into this
    installation; ``ImportError`` when no variant is built at all.
    """
    forced = forced if forced is not None else envs.OCTAVO_CPU_ISA
    feats = cpu_features()
    if forced:
        isa = forced.strip().lower()
        if isa not in ISA_VARIANTS:
            raise ValueError(f"OCTAVO_CPU_ISA={forced!r} is not one of {list(ISA_VARIANTS)}")
        runnable = [v for v in ISA_VARIANTS[isa] if variant_runs_here(v, feats)]
        if not runnable:
            raise ValueError(
                f"OCTAVO_CPU_ISA={isa} but this CPU ({machine()}) lacks it; it can run "
                f"{[i for i in ARCH_ISAS.get(machine(), ('scalar',)) if any(variant_runs_here(v, feats) for v in ISA_VARIANTS[i])]} "
                f"(features from {feats.get('source')})"
            )
        built = [v for v in runnable if _variant_built(v)]
        if not built:
            raise ValueError(f"OCTAVO_CPU_ISA={isa}: octavo was built without the {isa} kernels")
        return built[0], "OCTAVO_CPU_ISA"
    usable = usable_variants(feats=feats)
    if usable:
        return usable[0], f"best variant this CPU runs (features from {feats.get('source')})"
    raise ImportError(
        "octavo's C++ CPU kernels are not built (no octavo._C_* module: the install found no "
        "working C++ compiler, or OCTAVO_SKIP_CPU_EXT=1 was set; reinstall with g++ to build them)"
    )


def _openmp_runtime_path() -> str | None:
    """The OpenMP runtime already mapped into this process (torch's), if any."""
    try:
        with open("/proc/self/maps") as f:
            paths = {line.split()[-1] for line in f if line.rstrip().endswith(".so") or ".so." in line}
    except OSError:
        return None
    for pat in ("libgomp", "libiomp5", "libomp"):
        for p in sorted(paths):
            if os.path.basename(p).startswith(pat):
                return p
    return None


@cache
def load_variant(variant: str) -> ModuleType:
    """Import one variant (the caller has checked that the CPU runs it) and set up its threads."""
    import torch  # torch loads its OpenMP runtime; the kernels share it

    mod = importlib.import_module(f"octavo._C_{variant}")
    torch.get_num_threads()
    path = _openmp_runtime_path()
    err = mod.init_openmp(path) if path else "no OpenMP runtime loaded in this process"
    if err:
        logger.warning("octavo CPU kernels run on their own threads: %s", err)
    return mod


@lru_cache(maxsize=1)
def _load() -> tuple[ModuleType | None, str]:
    try:
        variant, why = select_variant()
    except (ValueError, ImportError) as e:
        return None, str(e)
    try:
        mod = load_variant(variant)
    except ImportError as e:
        return None, f"octavo._C_{variant} failed to import: {e}"
    logger.debug("octavo CPU kernels: %s (%s)", variant, why)
    return mod, why


def load_extension() -> ModuleType:
    """The extension module for this CPU (cached); ``ImportError`` with the reason otherwise."""
    mod, why = _load()
    if mod is None:
        raise ImportError(why)
    return mod


def extension_unavailable_reason() -> str | None:
    mod, why = _load()
    return None if mod is not None else why


def describe() -> str:
    mod, why = _load()
    return f"{mod.ISA} ({why})" if mod is not None else f"unavailable: {why}"


def clear_cache() -> None:
    """Forget the selection (tests change OCTAVO_CPU_ISA)."""
    _load.cache_clear()
