"""A real ``octavo serve`` subprocess on a free loopback port, for the server tests."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

STARTUP_TIMEOUT_S = 240


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def child_pids(pid: int) -> list[int]:
    """Direct children of ``pid`` (from /proc; no psutil needed)."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[1]) == pid:
            out.append(int(entry.name))
    return out


class RemoteServer:
    def __init__(self, args: list[str], env: dict[str, str] | None = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = [sys.executable, "-m", "octavo.entrypoints.cli", "serve", *args, "--port", str(self.port)]
        full_env = {**os.environ, "OCTAVO_CPU_KVCACHE_SPACE": "0.25", **(env or {})}
        self.proc = subprocess.Popen(cmd, env=full_env)
        self._wait_ready()

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"octavo serve exited with code {self.proc.returncode}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.25)
        self.proc.kill()
        raise RuntimeError("octavo serve did not become healthy in time")

    @property
    def engine_pid(self) -> int:
        (pid,) = child_pids(self.proc.pid)
        return pid

    def metrics(self) -> dict[str, float]:
        """``/metrics`` samples without labels' model_name: ``{"octavo:x_total": v, ...}``."""
        text = httpx.get(self.url + "/metrics", timeout=10).text
        out: dict[str, float] = {}
        for line in text.splitlines():
            if line.startswith("#") or not line.startswith("octavo:"):
                continue
            name_labels, value = line.rsplit(" ", 1)
            name = name_labels.split("{", 1)[0]
            if "finished_reason=" in name_labels:
                name += "|" + name_labels.split('finished_reason="', 1)[1].split('"', 1)[0]
            out[name] = out.get(name, 0.0) + float(value)
        return out

    def stop(self, timeout: float = 60) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode
