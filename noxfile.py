"""nox sessions: lint, test-<platform>, ... (one session per platform, registered in a loop).

CPU torch is pinned and installed *before* the package so pip never resolves a multi-GB CUDA
build of torch. Inside the per-platform images run with ``--no-venv``: the stack is there.
"""

from __future__ import annotations

import nox

nox.options.sessions = ["lint", "test-cpu"]
nox.options.reuse_existing_virtualenvs = True

CPU_TORCH = "torch==2.13.0"
PYTEST_NO_TESTS = 5  # pytest's exit code when nothing was collected


def _install(session: nox.Session, extra: str, torch_spec: str | None) -> None:
    if session.venv_backend == "none":
        return  # --no-venv: the image or machine provides the stack
    if torch_spec:
        session.install(torch_spec)
    session.install("-e", f".[{extra}]")


@nox.session(name="lint")
def lint(session: nox.Session) -> None:
    if session.venv_backend != "none":
        session.install("ruff>=0.6")
    session.run("ruff", "check", "octavo", "tests", "noxfile.py", "tools", "benchmarks")


@nox.session(name="test-cpu")
def test_cpu(session: nox.Session) -> None:
    _install(session, "serve,test", CPU_TORCH)
    session.run(
        "pytest", "-m", "not (cuda or rocm or xpu or tpu)", "-q", "-p", "no:cacheprovider",
        *session.posargs,
    )


for _platform, _extra in (("cuda", "cuda"), ("rocm", "rocm"), ("xpu", "xpu"), ("tpu", "tpu")):

    def _session(session: nox.Session, platform: str = _platform, extra: str = _extra) -> None:
        # The accelerator stacks ship their own torch build: don't pin the CPU one.
        _install(session, f"serve,test,{extra}", None)
        session.run(
            "pytest", "-m", f"{platform} or not (cuda or rocm or xpu or tpu)", "-q",
            "-p", "no:cacheprovider", *session.posargs,
            success_codes=[0, PYTEST_NO_TESTS],
        )

    nox.session(name=f"test-{_platform}")(_session)
