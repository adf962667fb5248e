"""Smoke-test a built octavo CPU image (``nox -s image-smoke -- cpu`` runs this).

Checks, each against the real image with a real Docker engine:
  1. the image: its size, a non-root numeric USER, no compiler or make on its PATH;
  2. ``octavo info`` and ``octavo generate`` (the model shipped in the package) in a container;
  3. ``octavo serve`` in a container on the host network, bound to 127.0.0.1 on a free port:
     GET /health, GET /v1/models, POST /v1/completions answered (greedy, 8 tokens); then the
     image as shipped (0.0.0.0:8000, no network) until Docker's HEALTHCHECK says healthy;
  4. unless ``--no-suite``: ``nox --no-venv -s test-cpu`` inside the image against the
     installed package (tools/image_suite.sh), with the test tools installed from the package
     index into the container's user site; arguments after ``--`` go to pytest.
Every container it starts is removed on the way out with its anonymous volumes, also on failure.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
COMPILERS = ("gcc", "g++", "cc", "c++", "clang", "make")


class SmokeError(RuntimeError):
    """A check failed; the message says which and what was seen."""


def docker(cli: str, *args: str, check: bool = True, timeout: float | None = None) -> str:
    """Run ``cli args``; its stdout (stderr is shown on failure)."""
    proc = subprocess.run([cli, *args], capture_output=True, text=True, timeout=timeout, check=False)
    if check and proc.returncode != 0:
        raise SmokeError(f"`{cli} {' '.join(args)}` exited {proc.returncode}:\n{proc.stdout}{proc.stderr}")
    return proc.stdout


def remove_container(cli: str, name: str) -> None:
    """Remove the container ``name`` if it exists, with its anonymous volumes (the image's
    VOLUME /cache gets one per container; a plain `docker rm` would leave it behind)."""
    docker(cli, "rm", "--force", "--volumes", name, check=False)


def check_image(cli: str, image: str) -> None:
    """Size, non-root user, no build toolchain."""
    info = json.loads(docker(cli, "image", "inspect", image))[0]
    user = info["Config"].get("User", "")
    print(f"image {image}: {info['Size'] / 1e6:.0f} MB ({info['Size'] / 2**30:.2f} GiB), user {user!r}")
    if not user or user.split(":")[0] in ("root", "0"):
        raise SmokeError(f"the image runs as {user!r}, not a non-root user")
    found = docker(cli, "run", "--rm", "--network", "none", "--entrypoint", "sh", image, "-c",
                   " ".join(f"command -v {c};" for c in COMPILERS) + " true").split()
    if found:
        raise SmokeError(f"build tools in the final image: {found}")
    uid = docker(cli, "run", "--rm", "--network", "none", "--entrypoint", "id", image, "-u").strip()
    print(f"no {'/'.join(COMPILERS)} in the image; processes run as uid {uid}")


def check_cli(cli: str, image: str) -> None:
    """`octavo info` and `octavo generate` with the shipped model, no network."""
    run = [cli, "run", "--rm", "--network", "none", "--entrypoint", "octavo", image]
    info = subprocess.run([*run, "info"], capture_output=True, text=True, check=False)
    print(f"$ octavo info (exit {info.returncode})\n{info.stdout.strip()}")
    if info.returncode != 0 or "cpu" not in info.stdout.lower():
        raise SmokeError(f"octavo info failed or names no cpu platform:\n{info.stderr}")
    attention = [line for line in info.stdout.splitlines() if line.startswith("attention")]
    if not attention or "cpu_paged" not in attention[0]:
        raise SmokeError(f"the image does not use its compiled CPU kernels: {attention}")
    gen = subprocess.run([*run, "generate", "--max-tokens", "8", "--temperature", "0", "Hello, my name is"],
                         capture_output=True, text=True, check=False)
    print(f"$ octavo generate --max-tokens 8 --temperature 0 'Hello, my name is' (exit {gen.returncode})")
    print(gen.stdout.strip())
    if gen.returncode != 0 or not gen.stdout.strip():
        raise SmokeError(f"octavo generate failed or printed nothing:\n{gen.stderr}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http(url: str, body: dict | None = None, timeout: float = 60.0) -> dict | str:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        text = resp.read().decode()
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def wait_healthy(cli: str, name: str, base: str, deadline_s: float) -> None:
    """Poll /health until it answers; fail early if the container stopped."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        state = docker(cli, "inspect", "--format", "{{.State.Running}}", name, check=False).strip()
        if state != "true":
            raise SmokeError(f"the server container stopped:\n{docker(cli, 'logs', name, check=False)}")
        try:
            http(f"{base}/health", timeout=2)
            return
        except OSError:
            time.sleep(1)
    raise SmokeError(f"no /health answer within {deadline_s:.0f} s")


def check_serve(cli: str, image: str, startup_s: float) -> None:
    """`octavo serve` (the image's entrypoint) on 127.0.0.1:<free port>, queried from here."""
    port, name = free_port(), f"octavo-smoke-{os.getpid()}-serve"
    base = f"http://127.0.0.1:{port}"
    # Later flags win: the entrypoint's --host 0.0.0.0 --port 8000 become loopback, a free port.
    docker(cli, "run", "-d", "--name", name, "--network", "host", image,
           "--host", "127.0.0.1", "--port", str(port))
    try:
        started = time.monotonic()
        wait_healthy(cli, name, base, startup_s)
        print(f"octavo serve healthy on {base} after {time.monotonic() - started:.1f} s")
        models = http(f"{base}/v1/models")
        model = models["data"][0]["id"]
        body = {"model": model, "prompt": "The capital of France is", "max_tokens": 8, "temperature": 0}
        out = http(f"{base}/v1/completions", body)
        print(f"POST /v1/completions model={model!r} -> {json.dumps(out)[:400]}")
        choice = out["choices"][0]
        if out["usage"]["completion_tokens"] < 1 or choice["finish_reason"] not in ("length", "stop"):
            raise SmokeError(f"unexpected completion: {out}")
    finally:
        logs = subprocess.run([cli, "logs", "--tail", "5", name], capture_output=True, text=True,
                              check=False)
        logs = logs.stdout + logs.stderr
        remove_container(cli, name)
        print(f"(server container removed; last log lines:)\n{logs.strip()}")


def check_healthcheck(cli: str, image: str, deadline_s: float) -> None:
    """The image as shipped (entrypoint's 0.0.0.0:8000, no arguments) in a container with its
    own network namespace: Docker's HEALTHCHECK must report it healthy."""
    name = f"octavo-smoke-{os.getpid()}-health"
    docker(cli, "run", "-d", "--name", name, "--network", "none", image)
    try:
        started, end = time.monotonic(), time.monotonic() + deadline_s
        status = ""
        while time.monotonic() < end:
            status = docker(cli, "inspect", "--format", "{{.State.Status}} {{.State.Health.Status}}",
                            name, check=False).strip()
            if status == "running healthy" or not status.startswith("running"):
                break
            time.sleep(2)
        if status != "running healthy":
            logs = subprocess.run([cli, "logs", name], capture_output=True, text=True, check=False)
            raise SmokeError(f"HEALTHCHECK: {status!r} after {time.monotonic() - started:.0f} s\n"
                             f"{logs.stdout}{logs.stderr}")
        print(f"default entrypoint (0.0.0.0:8000): Docker HEALTHCHECK healthy after "
              f"{time.monotonic() - started:.0f} s")
    finally:
        remove_container(cli, name)


def export_tree(dest: Path) -> None:
    """The repository's files (tracked and untracked-but-not-ignored), without octavo/."""
    listed = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z", "--cached", "--others",
                             "--exclude-standard"], capture_output=True, check=True).stdout
    for rel in filter(None, listed.decode().split("\0")):
        src = ROOT / rel
        if rel.split("/")[0] == "octavo" or not src.is_file():
            continue
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dest / rel)
    for path in [dest, *dest.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)


def run_suite(cli: str, image: str, pytest_args: list[str]) -> None:
    """`nox --no-venv -s test-cpu` inside the image (tools/image_suite.sh)."""
    name = f"octavo-smoke-{os.getpid()}-suite"
    with tempfile.TemporaryDirectory(prefix="octavo-suite-") as tmp:
        export_tree(Path(tmp))
        os.chmod(tmp, 0o755)
        started = time.monotonic()
        cmd = [cli, "run", "--rm", "--name", name, "--network", "host", "--no-healthcheck",
               "-v", f"{tmp}:/src:ro",
               "--entrypoint", "bash", image, "/src/tools/image_suite.sh", *pytest_args]
        print("$", " ".join(cmd), flush=True)
        try:
            rc = subprocess.run(cmd, check=False).returncode
        finally:
            remove_container(cli, name)
        print(f"test-cpu inside the image: exit {rc} after {time.monotonic() - started:.0f} s")
        if rc != 0:
            raise SmokeError(f"nox --no-venv -s test-cpu inside {image} exited {rc}")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    pytest_args = argv[argv.index("--") + 1 :] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--image", required=True, help="the image to test, e.g. octavo:0.1.0-cpu")
    ap.add_argument("--docker", default="docker", help="the docker client")
    ap.add_argument("--no-suite", action="store_true", help="skip the test suite inside the image")
    ap.add_argument("--startup-timeout", type=float, default=300.0, help="seconds for /health")
    args = ap.parse_args(argv)
    try:
        check_image(args.docker, args.image)
        check_cli(args.docker, args.image)
        check_serve(args.docker, args.image, args.startup_timeout)
        check_healthcheck(args.docker, args.image, args.startup_timeout)
        if not args.no_suite:
            run_suite(args.docker, args.image, pytest_args)
    except SmokeError as e:
        print(f"SMOKE TEST FAILED: {e}", file=sys.stderr)
        return 1
    print(f"smoke test of {args.image} passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
