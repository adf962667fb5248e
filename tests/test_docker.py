"""The container matrix: one image per platform, every version from docker/versions.json.

Parses each ``docker/Dockerfile.<platform>`` with dockerfile-parse (no Docker engine needed)
and checks the contract of docs/deployment.md: every platform module in ``octavo/platforms``
has an image; each image takes its base image and torch/triton/IPEX/torch_xla versions from
``versions.json`` as build args (no defaults of its own) and installs octavo with the matching
extra; the entrypoint is ``octavo serve`` on 0.0.0.0:8000; it runs as a non-root user, has a
HEALTHCHECK on /health, a cache volume and OCI labels; the final stage installs no compiler.
"""

from __future__ import annotations

import ast
import io
import json
import re
from functools import cache
from pathlib import Path

import pytest

dockerfile_parse = pytest.importorskip("dockerfile_parse")

ROOT = Path(__file__).resolve().parent.parent
DOCKER = ROOT / "docker"
VERSIONS = json.loads((DOCKER / "versions.json").read_text())
PLATFORMS: dict[str, dict] = VERSIONS["platforms"]
BUILT_IN = ("cpu", "cuda", "rocm", "xpu", "tpu")
BUILD_TOOLS = re.compile(
    r"(?<![\w.-])(gcc|g\+\+|clang|build-essential|cmake|make|ninja-build|[\w.+-]+-dev)(?![\w.+-])"
)


def platform_names_in_package() -> set[str]:
    """``name = "..."`` of every Platform class in octavo/platforms/*.py, found without
    importing them (a platform module may need its device stack to import)."""
    names = set()
    for path in (ROOT / "octavo" / "platforms").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ClassDef):
                continue
            bases = [b.id if isinstance(b, ast.Name) else getattr(b, "attr", "") for b in node.bases]
            if not any(b.endswith("Platform") for b in bases):
                continue
            for stmt in node.body:
                if (
                    isinstance(stmt, ast.Assign)
                    and any(isinstance(t, ast.Name) and t.id == "name" for t in stmt.targets)
                    and isinstance(stmt.value, ast.Constant)
                    and isinstance(stmt.value.value, str)
                ):
                    names.add(stmt.value.value)
    return names


@cache
def instructions(platform: str) -> tuple[list[dict], list[dict], list[dict]]:
    """(before the first FROM, every stage but the last, the final stage) of the image."""
    text = (DOCKER / f"Dockerfile.{platform}").read_bytes()
    parser = dockerfile_parse.DockerfileParser(fileobj=io.BytesIO(text), env_replace=False)
    structure = [i for i in parser.structure if i["instruction"] != "COMMENT"]
    froms = [n for n, i in enumerate(structure) if i["instruction"] == "FROM"]
    assert froms, f"Dockerfile.{platform} has no FROM"
    return structure[: froms[0]], structure[froms[0] : froms[-1]], structure[froms[-1] :]


def final(platform: str, instruction: str) -> list[str]:
    return [i["value"] for i in instructions(platform)[2] if i["instruction"] == instruction]


def final_runs(platform: str) -> str:
    """Every RUN of the final stage, whitespace collapsed (line continuations vanish)."""
    return "\n".join(" ".join(run.split()) for run in final(platform, "RUN"))


def test_every_platform_has_an_image():
    in_package = platform_names_in_package()
    assert "cpu" in in_package, "the platform scan found no CpuPlatform: is the scan broken?"
    wanted = set(BUILT_IN) | in_package
    images = {p.name.split(".", 1)[1] for p in DOCKER.glob("Dockerfile.*")}
    assert wanted <= images, f"platforms without docker/Dockerfile.<name>: {sorted(wanted - images)}"
    assert wanted <= set(PLATFORMS), f"platforms missing in versions.json: {sorted(wanted - set(PLATFORMS))}"
    assert images == set(PLATFORMS), "each Dockerfile.<p> and versions.json entry come in pairs"


def test_versions_json_is_complete():
    for platform, spec in PLATFORMS.items():
        assert spec["extra"] == platform
        assert spec["build_platforms"] and all(p.startswith("linux/") for p in spec["build_platforms"])
        assert spec["torch_index_url"].startswith("https://")
        args = spec["build_args"]
        for key in ("BASE_IMAGE", "PYTHON_VERSION", "TORCH_VERSION"):
            assert args.get(key), f"versions.json: {platform} has no {key}"
        for key, value in args.items():
            assert re.fullmatch(r"[A-Z][A-Z0-9_]*", key), key
            if key.endswith("_VERSION"):
                assert re.fullmatch(r"\d+(\.\d+)+", value), f"{platform}.{key}={value!r} is not exact"
        assert ":" in args["BASE_IMAGE"] and not args["BASE_IMAGE"].endswith(":latest")
    assert set(PLATFORMS["cpu"]["build_platforms"]) == {"linux/amd64", "linux/arm64"}
    assert PLATFORMS["cuda"]["build_args"].get("TRITON_VERSION")
    assert PLATFORMS["xpu"]["build_args"].get("IPEX_VERSION")
    assert PLATFORMS["tpu"]["build_args"].get("TORCH_XLA_VERSION")


@pytest.mark.parametrize("platform", sorted(PLATFORMS))
def test_build_args_come_from_versions_json(platform):
    header, _, last = instructions(platform)
    expected = set(PLATFORMS[platform]["build_args"]) | {"OCTAVO_VERSION"}
    declared = [i["value"] for i in header + last if i["instruction"] == "ARG"]
    # No defaults: versions.json is the only place a version is written down.
    assert not [a for a in declared if "=" in a], f"ARG with a default: {declared}"
    assert {"BASE_IMAGE"} == {i["value"] for i in header if i["instruction"] == "ARG"}
    assert set(declared) == expected, (
        f"Dockerfile.{platform} ARGs {sorted(set(declared))} != versions.json + OCTAVO_VERSION "
        f"{sorted(expected)}"
    )
    text = "\n".join(i["value"] for i in instructions(platform)[1] + last)
    for key in expected - {"BASE_IMAGE", "OCTAVO_VERSION"}:
        assert "${" + key + "}" in text, f"Dockerfile.{platform} declares {key} but never uses it"
    for stage in [i for i in instructions(platform)[1] + last if i["instruction"] == "FROM"]:
        assert stage["value"].startswith("${BASE_IMAGE}"), stage["value"]

    args = dict(PLATFORMS[platform]["build_args"], OCTAVO_VERSION="9.9.9")
    resolved = dockerfile_parse.DockerfileParser(
        fileobj=io.BytesIO((DOCKER / f"Dockerfile.{platform}").read_bytes()), build_args=args
    )
    assert resolved.baseimage == args["BASE_IMAGE"]


@pytest.mark.parametrize("platform", sorted(PLATFORMS))
def test_installs_matching_extra_and_pinned_versions(platform):
    runs = final_runs(platform)
    extra = PLATFORMS[platform]["extra"]
    assert re.search(r"pip install [^\n]*/wheels/octavo-\*\.whl\)\[serve," + extra + r"\]", runs), (
        f"Dockerfile.{platform} does not install octavo[serve,{extra}]"
    )
    # torch is either installed at the pinned version or, where the base brings it, asserted.
    pinned = "torch==${TORCH_VERSION}" in runs
    asserted = "torch.__version__" in runs and "'${TORCH_VERSION}'" in runs
    assert pinned or asserted, f"Dockerfile.{platform} neither pins nor checks TORCH_VERSION"
    if "TORCH_INDEX_URL" in PLATFORMS[platform]["build_args"]:
        assert '--index-url "${TORCH_INDEX_URL}" "torch==${TORCH_VERSION}"' in runs
    if platform == "cuda":
        assert "triton==${TRITON_VERSION}" in runs
    if platform == "xpu":
        assert "ipex.__version__" in runs and "'${IPEX_VERSION}'" in runs
    if platform == "tpu":
        assert "torch_xla[tpu]==${TORCH_XLA_VERSION}" in runs
        assert "libtpu==${LIBTPU_VERSION}" in runs
    assert "${PYTHON_VERSION}" in runs
    # Installing the extras must not replace the stack: every octavo install is constrained.
    assert "--constraint /etc/octavo-constraints.txt" in runs


@pytest.mark.parametrize("platform", sorted(PLATFORMS))
def test_entrypoint_is_octavo_serve_on_port_8000(platform):
    (entrypoint,) = final(platform, "ENTRYPOINT")
    argv = json.loads(entrypoint)  # exec form: signals reach octavo, not a shell
    assert argv[:2] == ["octavo", "serve"]
    assert argv[argv.index("--host") + 1] == "0.0.0.0"
    assert argv[argv.index("--port") + 1] == "8000"
    assert final(platform, "EXPOSE") == ["8000"]


@pytest.mark.parametrize("platform", sorted(PLATFORMS))
def test_runs_as_non_root(platform):
    users = final(platform, "USER")
    assert users, f"Dockerfile.{platform} sets no USER in its final stage"
    user = users[-1].split(":")[0]
    assert user not in ("root", "0"), users[-1]
    assert "useradd" in final_runs(platform)


@pytest.mark.parametrize("platform", sorted(PLATFORMS))
def test_healthcheck_on_health(platform):
    (check,) = final(platform, "HEALTHCHECK")
    assert check.strip().upper() != "NONE"
    assert "CMD" in check and "http://127.0.0.1:8000/health" in check


@pytest.mark.parametrize("platform", sorted(PLATFORMS))
def test_cache_volume_and_labels(platform):
    volumes = [v for value in final(platform, "VOLUME") for v in json.loads(value)]
    assert volumes, f"Dockerfile.{platform} has no VOLUME"
    env = " ".join(final(platform, "ENV"))
    hf_home = re.search(r"HF_HOME=(\S+)", env)
    assert hf_home and any(hf_home.group(1).startswith(v) for v in volumes)

    args = dict(PLATFORMS[platform]["build_args"], OCTAVO_VERSION="9.9.9")
    parser = dockerfile_parse.DockerfileParser(
        fileobj=io.BytesIO((DOCKER / f"Dockerfile.{platform}").read_bytes()), build_args=args
    )
    labels = parser.labels  # the final stage's
    assert labels["ai.octavo.platform"] == platform
    assert labels["org.opencontainers.image.title"] == f"octavo-{platform}"
    assert labels["org.opencontainers.image.version"] == "9.9.9"
    assert labels["ai.octavo.version"] == "9.9.9"


@pytest.mark.parametrize("platform", sorted(PLATFORMS))
def test_no_build_tools_in_final_stage(platform):
    for run in final(platform, "RUN"):
        for install in re.findall(r"apt-get install([^&;]*)", run):
            found = BUILD_TOOLS.findall(install)
            assert not found, f"Dockerfile.{platform}: final stage installs {found}"
    # The wheel is built in the builder stage and only copied (mounted) into the final one.
    assert "pip wheel" not in final_runs(platform)
    # ... where a C++ kernel that fails to compile fails the build (no silent torch_ref image).
    builder_runs = [" ".join(i["value"].split()) for i in instructions(platform)[1] if i["instruction"] == "RUN"]
    assert any(re.search(r"OCTAVO_REQUIRE_CPU_EXT=1 [\w/ .-]*pip wheel", r) for r in builder_runs), builder_runs
    assert "from=builder" in final_runs(platform)


def test_build_tools_pattern():
    assert BUILD_TOOLS.findall(" g++ python3.12-dev libgomp1") == ["g++", "python3.12-dev"]
    assert not BUILD_TOOLS.findall(' "python${PYTHON_VERSION}-venv" libgomp1 libtcmalloc-minimal4')


@cache
def load_noxfile():
    pytest.importorskip("nox")
    import importlib.util

    spec = importlib.util.spec_from_file_location("_octavo_noxfile", ROOT / "noxfile.py")
    noxfile = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(noxfile)
    return noxfile


def build_args_of(cmd: list[str]) -> dict[str, str]:
    return dict(a.split("=", 1) for a in (cmd[n + 1] for n, x in enumerate(cmd) if x == "--build-arg"))


def test_images_session_passes_every_build_arg():
    """noxfile's `images` session builds each image with exactly versions.json's args."""
    noxfile = load_noxfile()
    for platform, entry in PLATFORMS.items():
        cmd = noxfile.buildx_command(platform)
        assert cmd[:3] == ["docker", "buildx", "build"] and cmd[-1] == "."
        assert cmd[cmd.index("--file") + 1] == f"docker/Dockerfile.{platform}"
        assert cmd[cmd.index("--platform") + 1] == ",".join(entry["build_platforms"])
        given = build_args_of(cmd)
        assert given == dict(entry["build_args"], OCTAVO_VERSION=noxfile._octavo_version())
        assert ("--load" in cmd) == (len(entry["build_platforms"]) == 1)
    assert "--load" not in noxfile.buildx_command("cuda", ["--push"])
    assert noxfile.CPU_TORCH == f"torch=={PLATFORMS['cpu']['build_args']['TORCH_VERSION']}"


def test_build_arg_overrides_replace_versions_json_values():
    """`nox -s images -- cpu --build-arg KEY=VALUE`: later values win, each arg given once,
    and an arg the Dockerfile does not take is refused (never silently dropped)."""
    noxfile = load_noxfile()
    cmd = noxfile.buildx_command("cpu", [
        "--build-arg", "BASE_IMAGE=local-base:1", "--build-arg=PYTHON_VERSION=3.11",
        "--network", "host", "--build-arg", "BASE_IMAGE=local-base:2", "--platform", "linux/amd64",
    ])
    args = build_args_of(cmd)
    assert args["BASE_IMAGE"] == "local-base:2" and args["PYTHON_VERSION"] == "3.11"
    assert args["TORCH_VERSION"] == PLATFORMS["cpu"]["build_args"]["TORCH_VERSION"]
    assert [x for x in cmd if x == "--build-arg"] == ["--build-arg"] * len(args)
    assert cmd[cmd.index("--platform") + 1] == "linux/amd64" and cmd.count("--platform") == 1
    assert "--load" in cmd  # one platform chosen: loaded into the engine
    assert cmd[-4:] == ["--load", "--network", "host", "."]
    with pytest.raises(ValueError, match="NOT_AN_ARG"):
        noxfile.buildx_command("cpu", ["--build-arg", "NOT_AN_ARG=1"])
    with pytest.raises(ValueError, match="KEY=VALUE"):
        noxfile.buildx_command("cpu", ["--build-arg", "BASE_IMAGE"])


def test_classic_build_fallback_without_buildx():
    """Without the buildx plugin: `docker build` (BuildKit) with the same args, one platform."""
    noxfile = load_noxfile()
    buildx = noxfile.buildx_command("cpu", ["--build-arg", "BASE_IMAGE=b:1", "--network", "host"])
    classic = noxfile.classic_build_command(buildx, "/usr/bin/docker")
    assert classic[:2] == ["/usr/bin/docker", "build"] and classic[-1] == "."
    assert build_args_of(classic) == build_args_of(buildx)
    assert classic[classic.index("--platform") + 1] == noxfile.host_build_platform()
    assert "--load" not in classic and classic[classic.index("--tag") + 1] == noxfile.image_tag("cpu")
    with pytest.raises(ValueError, match="buildx"):
        noxfile.classic_build_command(noxfile.buildx_command("cpu", ["--push"]))


def test_smoke_suite_tree_leaves_out_the_source_package(tmp_path):
    """tools/image_smoke.py mounts the repository without octavo/, so the suite inside the
    image imports the package installed there, not a source tree."""
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout (e.g. the suite already running inside an image)")
    import importlib.util

    spec = importlib.util.spec_from_file_location("_octavo_image_smoke", ROOT / "tools" / "image_smoke.py")
    smoke = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(smoke)
    smoke.export_tree(tmp_path)
    assert not (tmp_path / "octavo").exists()
    for needed in ("pyproject.toml", "noxfile.py", "docker/versions.json", "tools/image_suite.sh",
                   "tests/test_docker.py", "tests/conftest.py"):
        assert (tmp_path / needed).is_file(), needed
    assert not list(tmp_path.rglob("*.so")) and not (tmp_path / ".nox").exists()
