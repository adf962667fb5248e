"""``octavo bench serve`` against real servers: ``octavo serve`` and an independent one.

The second server (``openai_stub_server``) shares no code with ``octavo/entrypoints/openai``:
it proves that the benchmark speaks only the public OpenAI completions API.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from octavo.entrypoints.cli import main

ROOT = Path(__file__).resolve().parents[2]
SERVED_NAME = "tiny-llama"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(cmd: list[str], log: Path):
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    f = open(log, "w")
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT), f


def _wait_up(proc, f, port: int, log: Path) -> None:
    import httpx

    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            f.close()
            pytest.fail(f"server exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    _stop(proc, f)
    pytest.fail(f"server did not come up:\n{log.read_text()[-3000:]}")


def _stop(proc, f) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    f.close()


def _has_octavo_serve() -> bool:
    from octavo.entrypoints.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return "serve" in sub.choices


@pytest.fixture(scope="module")
def servers(llama_dir, tmp_path_factory):
    """Both servers, started in parallel: ``{"octavo": url or None, "stub": url}``."""
    root = tmp_path_factory.mktemp("servers")
    started = {}
    if _has_octavo_serve():
        port = _free_port()
        started["octavo"] = (port, root / "octavo.log", *_launch(
            [sys.executable, "-m", "octavo.entrypoints.cli", "serve", llama_dir, "--port", str(port),
             "--max-model-len", "512", "--shutdown-timeout", "1",
             # A name that is no local path: the benchmark must ask the server to tokenize.
             "--served-model-name", SERVED_NAME], root / "octavo.log"))
    port = _free_port()
    started["stub"] = (port, root / "stub.log", *_launch(
        [sys.executable, "-m", "tests.benchmarks.openai_stub_server", "--model", llama_dir,
         "--port", str(port)], root / "stub.log"))
    try:
        for port, log, proc, f in started.values():
            _wait_up(proc, f, port, log)
        yield {name: f"http://127.0.0.1:{v[0]}" for name, v in started.items()}
    finally:
        for _, _, proc, f in started.values():
            _stop(proc, f)


@pytest.fixture
def octavo_server(servers):
    if "octavo" not in servers:
        pytest.skip("octavo serve is not available")
    return servers["octavo"]


@pytest.fixture
def stub_server(servers):
    return servers["stub"]


def _check_point(summary: dict, n: int, out_len: int) -> None:
    assert summary["completed"] == n and summary["failed"] == 0
    assert summary["total_output_tokens"] == n * out_len
    for k in ("duration_s", "request_throughput_req_s", "output_throughput_tok_s"):
        assert summary[k] > 0, k
    for m in ("ttft_ms", "tpot_ms", "itl_ms", "e2el_ms"):
        for stat in ("mean", "median", "p90", "p99"):
            assert summary[f"{stat}_{m}"] >= 0, (stat, m)
        assert summary[f"median_{m}"] <= summary[f"p99_{m}"] + 1e-9
    assert summary["mean_ttft_ms"] > 0 and summary["mean_e2el_ms"] >= summary["mean_ttft_ms"]
    assert summary["output_throughput_tok_s"] * summary["duration_s"] == pytest.approx(n * out_len)


def test_bench_serve_octavo_server(octavo_server, llama_dir, tmp_path):
    out = tmp_path / "serve.json"
    n, o = 6, 5
    rc = main(["bench", "serve", "--base-url", octavo_server, "--tokenizer", llama_dir,
               "--num-prompts", str(n), "--input-len", "8", "--output-len", str(o),
               "--request-rate", "20", "--max-concurrency", "3", "--slo", "ttft=60000,tpot=60000",
               "--disable-tqdm", "--output-json", str(out)])
    assert rc == 0
    report = json.loads(out.read_text())
    assert report["benchmark"] == "serve"
    assert report["environment"]["server_base_url"] == octavo_server
    s = report["results"]["serve"]["summary"]
    _check_point(s, n, o)
    assert s["goodput_req_s"] == pytest.approx(s["request_throughput_req_s"])  # generous SLOs
    reqs = report["results"]["serve"]["requests"]
    assert all(r["usage_reported"] and r["prompt_len"] == 8 for r in reqs)


def test_bench_serve_sweep_any_openai_server(stub_server, tmp_path, capsys):
    out = tmp_path / "sweep.json"
    n, o = 4, 4
    rc = main(["bench", "serve", "--base-url", stub_server, "--dataset", "sharegpt",
               "--num-prompts", str(n), "--output-len", str(o), "--sweep-rates", "50,inf",
               "--disable-tqdm", "--output-json", str(out)])
    assert rc == 0
    report = json.loads(out.read_text())
    sweep = report["results"]["sweep"]
    assert [p["label"] for p in sweep] == ["50", "inf"]
    for p in sweep:
        _check_point(p["summary"], n, o)
    png = Path(report["results"]["plot"])
    assert png == out.with_suffix(".png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "load-latency sweep" in capsys.readouterr().out


def test_bench_serve_unreachable_server_is_a_clear_error(capsys):
    rc = main(["bench", "serve", "--base-url", f"http://127.0.0.1:{_free_port()}",
               "--num-prompts", "1", "--disable-tqdm"])
    assert rc == 2
    assert "cannot list models" in capsys.readouterr().err


def test_bench_serve_tokenizes_through_the_server(octavo_server, llama_dir, tmp_path):
    """No --tokenizer and a served name that is no local folder: /tokenize + /detokenize."""
    from transformers import AutoTokenizer

    from octavo.benchmarks.remote_tokenizer import RemoteTokenizer

    local = AutoTokenizer.from_pretrained(llama_dir)
    remote = RemoteTokenizer(octavo_server, SERVED_NAME)
    assert len(remote) == len(local)  # found by binary search over /detokenize
    text = "def add(a, b):\n    return a + b"
    ids = local.encode(text, add_special_tokens=False)
    assert remote.encode(text) == ids and remote.decode(ids) == local.decode(ids)

    out = tmp_path / "serve.json"
    rc = main(["bench", "serve", "--base-url", octavo_server, "--num-prompts", "2",
               "--input-len", "8", "--output-len", "3", "--disable-tqdm", "--output-json", str(out)])
    assert rc == 0
    report = json.loads(out.read_text())
    assert report["environment"]["served_model"] == SERVED_NAME
    _check_point(report["results"]["serve"]["summary"], 2, 3)


def test_bench_serve_tokenizer_for_the_shipped_model_name():
    """`octavo serve` with no model serves 'octavo-default': its tokenizer is the shipped one."""
    from octavo.benchmarks.serve import load_client_tokenizer
    from octavo.engine.model_files import DEFAULT_MODEL_DIR

    args = argparse.Namespace(tokenizer=None, base_url="http://127.0.0.1:9")  # never contacted
    tok = load_client_tokenizer(args, "octavo-default")
    assert tok.name_or_path == str(DEFAULT_MODEL_DIR)
    assert tok.encode("def f():") == load_client_tokenizer(
        argparse.Namespace(tokenizer=str(DEFAULT_MODEL_DIR), base_url=""), "x").encode("def f():")
