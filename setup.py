"""Build octavo's CPU kernels: one pybind11 extension module per ISA variant.

All metadata lives in pyproject.toml; this file only declares the C++ extensions. The same
sources (csrc/cpu) are compiled once per variant with that variant's flags, and octavo picks the
module to import at run time from the CPU's features (``octavo/cpu_isa.py``), so one wheel runs
on every x86-64 or AArch64 machine and never executes an instruction the CPU lacks.

  x86-64:  octavo._C_avx512_bf16, octavo._C_avx512, octavo._C_avx2, octavo._C_scalar
  aarch64: octavo._C_neon, octavo._C_scalar
  other:   octavo._C_scalar

No libtorch linkage and no OpenMP library linked: the kernels run on the OpenMP runtime torch
has already loaded (see csrc/cpu/threading.cpp). The build is optional: without a working C++17 compiler (or when one variant fails to
compile) it prints a warning and the install succeeds; octavo then falls back to the pure-torch
``torch_ref`` attention backend and ``octavo info`` says so and why. ``OCTAVO_SKIP_CPU_EXT=1``
skips the build on purpose, ``OCTAVO_REQUIRE_CPU_EXT=1`` (release wheels) makes any
build failure an error; ``OCTAVO_CPU_EXT_VARIANTS=avx2,scalar`` builds a subset;
``OCTAVO_BUILD_JOBS`` caps parallel compile jobs. An in-place or editable build keeps modules
that are newer than every source and header.
"""

from __future__ import annotations

import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

from setuptools import setup

CSRC = "csrc/cpu"
SOURCES = [f"{CSRC}/kernels.cpp", f"{CSRC}/threading.cpp", f"{CSRC}/bindings.cpp", f"{CSRC}/quant_kernels.cpp",
           f"{CSRC}/gemv.cpp"]
HEADERS = sorted(str(p) for p in Path(CSRC).glob("*.h"))  # rebuild on change
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


# Release builds (cibuildwheel) set this: a wheel without every kernel variant is an error.
REQUIRED = os.environ.get("OCTAVO_REQUIRE_CPU_EXT") == "1"


def _log(msg: str) -> None:
    # stderr, flushed: shown live by `python setup.py ...`, `python -m build` and `pip install -v`
    # (plain `pip install` shows only its spinner; octavo logs the fallback at run time).
    print(f"octavo: {msg}", file=sys.stderr, flush=True)


NO_COMPILER_WARNING = """
WARNING: octavo's C++ CPU kernels were NOT built: {why}.
  octavo still installs and runs; on the CPU its attention falls back to the pure-torch
  `torch_ref` backend (correct, slower: about 20x on long contexts). `octavo info` shows
  the backend in use. To get the kernels, install a C++17 compiler (e.g. apt-get install g++)
  and reinstall; OCTAVO_SKIP_CPU_EXT=1 skips this step on purpose.
"""


def _cmdclass():
    try:
        from pybind11.setup_helpers import ParallelCompile
        from pybind11.setup_helpers import build_ext as _pybind_build_ext
    except ImportError:  # only metadata commands run without pybind11
        return {}
    ParallelCompile("OCTAVO_BUILD_JOBS", default=0).install()

    class build_ext(_pybind_build_ext):
        """Optional extensions: no working compiler or a failed variant warns, never fails.

        Prints one progress line per ISA variant, and in an in-place/editable build keeps an
        in-place module that is newer than every source and header instead of recompiling it.
        """

        def build_extensions(self) -> None:
            why = self._compiler_problem()
            if why and REQUIRED:
                raise RuntimeError(f"OCTAVO_REQUIRE_CPU_EXT=1 but {why}")
            if why:
                _log(NO_COMPILER_WARNING.format(why=why))
                self.extensions = []
                return
            self._total, self._started = len(self.extensions), time.monotonic()
            _log(f"C++ CPU kernels, {self._total} ISA variants "
                 f"({', '.join(e.name.split('_C_', 1)[1] for e in self.extensions)}): compiling one "
                 "takes about a minute per core (OCTAVO_CPU_EXT_VARIANTS=avx2,scalar builds fewer)")
            self._failed: list = []
            # Every variant compiles the same sources with other flags: one extension at a time,
            # each into its own temp folder, or `build_ext -j` links one variant's objects into
            # another (pybind11's ParallelCompile still compiles each variant's files in parallel).
            self.parallel = False
            self._temp_root = self.build_temp
            super().build_extensions()
            # Later steps (in-place copy, wheel contents) list only what was built.
            self.extensions = [e for e in self.extensions if e not in self._failed]

        def build_extension(self, ext) -> None:
            index = self.extensions.index(ext) + 1
            if self._reuse_inplace(ext):
                _log(f"[{index}/{self._total}] {ext.name}: up to date, not rebuilt")
                return
            _log(f"[{index}/{self._total}] compiling {ext.name} ...")
            self.build_temp = os.path.join(self._temp_root, ext.name.rsplit(".", 1)[-1])
            try:
                super().build_extension(ext)
            except Exception as e:  # a compiler error in one variant must not fail the install
                if REQUIRED:
                    raise
                _log(f"WARNING: {ext.name} failed to build ({e}); octavo will use another variant "
                     "or the pure-torch attention fallback")
                self._failed.append(ext)
                return
            _log(f"[{index}/{self._total}] {ext.name} done ({time.monotonic() - self._started:.0f} s)")

        def _compiler_problem(self) -> str | None:
            """Why no C++17 module can be compiled here (None: a probe compiled)."""
            with tempfile.TemporaryDirectory() as tmp:
                src = Path(tmp) / "probe.cpp"
                src.write_text("#include <vector>\nint octavo_probe() { return std::vector<int>(1).size(); }\n")
                try:
                    self.compiler.compile([str(src)], output_dir=tmp, extra_postargs=["-std=c++17"])
                except Exception as e:
                    cc = (getattr(self.compiler, "compiler_so", None) or ["?"])[0]
                    return f"the C++ compiler {cc!r} cannot compile a test file ({type(e).__name__})"
            return None

        def _reuse_inplace(self, ext) -> bool:
            if not (self.inplace or getattr(self, "editable_mode", False)) or self.force:
                return False
            build_py = self.get_finalized_command("build_py")
            inplace_file, regular_file = self._get_inplace_equivalent(build_py, ext)
            inputs = [*ext.sources, *ext.depends, __file__]
            if not os.path.exists(inplace_file) or any(
                os.path.getmtime(f) > os.path.getmtime(inplace_file) for f in inputs
            ):
                return False
            os.makedirs(os.path.dirname(regular_file) or ".", exist_ok=True)
            shutil.copy2(inplace_file, regular_file)
            return True

    return {"build_ext": build_ext}


setup(ext_modules=extensions(), cmdclass=_cmdclass())
