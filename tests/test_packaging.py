"""Packaging: pyproject metadata, the optional C++ build, nox's CPU torch index, the fallback."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_license_is_spdx_with_the_full_text():
    project = PYPROJECT["project"]
    assert project["license"] == "Apache-2.0"
    assert project["license-files"] == ["LICENSE"]
    text = (ROOT / "LICENSE").read_text()
    assert text.lstrip().startswith("Apache License") and "END OF TERMS AND CONDITIONS" in text
    requires = PYPROJECT["build-system"]["requires"]
    setuptools = next(r for r in requires if r.startswith("setuptools"))
    assert ">=77" in setuptools and "<" in setuptools  # SPDX support, and an upper bound


def test_classifiers_cover_the_claimed_pythons_and_typing():
    project = PYPROJECT["project"]
    assert project["requires-python"] == ">=3.10"
    classifiers = set(project["classifiers"])
    for minor in (10, 11, 12, 13):
        assert f"Programming Language :: Python :: 3.{minor}" in classifiers
    assert "Typing :: Typed" in classifiers
    assert (ROOT / "octavo" / "py.typed").exists()
    assert "py.typed" in PYPROJECT["tool"]["setuptools"]["package-data"]["octavo"]


def test_transformers_has_a_tested_range():
    dep = next(d for d in PYPROJECT["project"]["dependencies"] if d.startswith("transformers"))
    assert ">=" in dep and "<" in dep
    import transformers
    from packaging.specifiers import SpecifierSet
    from packaging.version import Version

    assert Version(transformers.__version__) in SpecifierSet(dep.removeprefix("transformers"))


def test_cibuildwheel_builds_manylinux_2_28_for_both_architectures():
    cfg = PYPROJECT["tool"]["cibuildwheel"]
    assert set(cfg["archs"]) == {"x86_64", "aarch64"}
    assert cfg["manylinux-x86_64-image"] == cfg["manylinux-aarch64-image"] == "manylinux_2_28"
    assert cfg["environment"]["OCTAVO_REQUIRE_CPU_EXT"] == "1"
    assert "tools/check_wheel.py" in cfg["repair-wheel-command"]


@pytest.mark.skipif(importlib.util.find_spec("pybind11") is None, reason="pybind11 (a build requirement) missing")
def test_build_without_a_compiler_warns_and_succeeds(tmp_path):
    env = dict(os.environ, CC="/bin/false", CXX="/bin/false")
    env.pop("OCTAVO_SKIP_CPU_EXT", None)
    r = subprocess.run(
        [sys.executable, "setup.py", "-q", "build_ext", "--build-lib", str(tmp_path / "lib"),
         "--build-temp", str(tmp_path / "tmp")],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert "octavo's C++ CPU kernels were NOT built" in r.stderr
    assert "torch_ref" in r.stderr and "octavo info" in r.stderr
    assert not list(tmp_path.rglob("*.so"))

    r = subprocess.run(
        [sys.executable, "setup.py", "-q", "build_ext", "--build-lib", str(tmp_path / "lib2"),
         "--build-temp", str(tmp_path / "tmp2")],
        cwd=ROOT, env={**env, "OCTAVO_REQUIRE_CPU_EXT": "1"}, capture_output=True, text=True, timeout=300,
    )
    assert r.returncode != 0 and "OCTAVO_REQUIRE_CPU_EXT=1" in r.stderr


def _load_noxfile():
    spec = importlib.util.spec_from_file_location("_octavo_noxfile_pkg", ROOT / "noxfile.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class _RecordingSession:
    venv_backend = "virtualenv"
    posargs: list[str] = []

    def __init__(self) -> None:
        self.installs: list[tuple[str, ...]] = []

    def install(self, *args: str, **_: object) -> None:
        self.installs.append(args)

    def run(self, *args: str, **_: object) -> None:
        pass

    def log(self, *_: object) -> None:
        pass


def test_nox_test_cpu_takes_torch_from_the_cpu_index():
    pytest.importorskip("nox")
    noxfile = _load_noxfile()
    session = _RecordingSession()
    noxfile.test_cpu(session)
    index = json.loads((ROOT / "docker" / "versions.json").read_text())["platforms"]["cpu"]["torch_index_url"]
    torch_install = next(a for a in session.installs if a[0].startswith("torch=="))
    assert torch_install == (noxfile.CPU_TORCH, "--index-url", index)
    assert index.endswith("/cpu")


def test_info_says_which_backend_it_fell_back_to_and_why(monkeypatch):
    from octavo import cpu_isa
    from octavo.entrypoints.info import collect_info
    from octavo.platforms import current_platform

    if current_platform.name != "cpu":
        pytest.skip("the CPU platform's fallback")
    monkeypatch.setattr(cpu_isa, "_variant_built", lambda variant: False)  # as after a no-compiler install
    cpu_isa.clear_cache()
    try:
        info = collect_info()
    finally:
        monkeypatch.undo()
        cpu_isa.clear_cache()
    assert info["attention"].startswith("torch_ref (") and "fallback: cpu_paged cannot run" in info["attention"]
    assert "no working C++ compiler" in info["  not cpu_paged"]
