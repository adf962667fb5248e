"""Build octavo's CPU kernels: one pybind11 extension module per ISA variant.

All metadata lives in pyproject.toml; this file only declares the C++ extensions. The same
sources (csrc/cpu) are compiled once per variant with that variant's flags, and octavo picks the
module to import at run time from the CPU's features (``octavo/cpu_isa.py``), so one wheel runs
on every x86-64 or AArch64 machine and never executes an instruction the CPU lacks.

  x86-64:  octavo._C_avx512_bf16, octavo._C_avx512, octavo._C_avx2, octavo._C_scalar
  aarch64: octavo._C_neon, octavo._C_scalar
  other:   octavo._C_scalar

No libtorch linkage and no OpenMP library linked: the kernels run on the OpenMP runtime torch
has already loaded (see csrc/cpu/threading.cpp). ``OCTAVO_SKIP_CPU_EXT=1`` skips the build
(octavo then falls back to the ``torch_ref`` attention backend); ``OCTAVO_CPU_EXT_VARIANTS=avx2,scalar``
builds a subset.
"""

from __future__ import annotations

import os
import platform

from setuptools import setup

CSRC = "csrc/cpu"
SOURCES = [f"{CSRC}/kernels.cpp", f"{CSRC}/threading.cpp", f"{CSRC}/bindings.cpp"]
HEADERS = sorted(str(p) for p in __import__("pathlib").Path(CSRC).glob("*.h"))  # rebuild on change
COMMON_FLAGS = ["-O3", "-ffp-contract=off", "-fno-math-errno", "-Wall", "-Wno-unused-function", "-Wno-maybe-uninitialized", "-Wno-uninitialized"]

X86_AVX512 = ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mfma", "-mf16c"]
VARIANTS_BY_ARCH = {
    # variant: (vector header macro, compile flags)
    "x86_64": {
        "avx512_bf16": ("OCTAVO_ISA_AVX512", [*X86_AVX512, "-mavx512bf16"]),
        "avx512": ("OCTAVO_ISA_AVX512", X86_AVX512),
        "avx2": ("OCTAVO_ISA_AVX2", ["-mavx2", "-mfma", "-mf16c"]),
        "scalar": ("OCTAVO_ISA_SCALAR", []),
    },
    "aarch64": {
        "neon": ("OCTAVO_ISA_NEON", []),
        "scalar": ("OCTAVO_ISA_SCALAR", []),
    },
}


def _arch() -> str:
    m = platform.machine().lower()
    return {"amd64": "x86_64", "arm64": "aarch64"}.get(m, m)


def extensions():
    if os.environ.get("OCTAVO_SKIP_CPU_EXT") == "1":
        return []
    from pybind11.setup_helpers import Pybind11Extension

    variants = VARIANTS_BY_ARCH.get(_arch(), {"scalar": ("OCTAVO_ISA_SCALAR", [])})
    wanted = os.environ.get("OCTAVO_CPU_EXT_VARIANTS")
    if wanted:
        keep = {v.strip() for v in wanted.split(",") if v.strip()}
        variants = {k: v for k, v in variants.items() if k in keep}
    exts = []
    for name, (macro, flags) in variants.items():
        exts.append(
            Pybind11Extension(
                f"octavo._C_{name}",
                SOURCES,
                depends=HEADERS,
                include_dirs=[CSRC],
                define_macros=[
                    (macro, "1"),
                    ("OCTAVO_ISA_NS", f"isa_{name}"),
                    ("OCTAVO_MODULE_NAME", f"_C_{name}"),
                ],
                extra_compile_args=COMMON_FLAGS + flags,
                libraries=["dl"] if platform.system() == "Linux" else [],
                cxx_std=17,
            )
        )
    return exts


def _cmdclass():
    try:
        from pybind11.setup_helpers import ParallelCompile, build_ext
    except ImportError:  # only metadata commands run without pybind11
        return {}
    ParallelCompile("OCTAVO_BUILD_JOBS", default=0).install()
    return {"build_ext": build_ext}


setup(ext_modules=extensions(), cmdclass=_cmdclass())
