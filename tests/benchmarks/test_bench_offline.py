"""``octavo bench throughput`` and ``octavo bench latency`` on the tiny fixture model."""

from __future__ import annotations

import json

from octavo.entrypoints.cli import main

ENV_KEYS = ("octavo_version", "platform", "attention_backend", "torch_version", "cpu")


def _run(*argv: str) -> int:
    return main(["bench", *argv])


def _check_env(report: dict) -> None:
    env = report["environment"]
    for k in ENV_KEYS:
        assert env.get(k), k


def test_throughput_octavo_and_hf(llama_dir, tmp_path, capsys):
    out = tmp_path / "tp.json"
    n, i, o = 4, 12, 6
    rc = _run("throughput", "--model", llama_dir, "--num-prompts", str(n), "--input-len", str(i),
              "--output-len", str(o), "--backend", "octavo,hf", "--repeats", "2",
              "--max-model-len", "128", "--disable-tqdm", "--output-json", str(out))
    assert rc == 0
    report = json.loads(out.read_text())
    assert report["benchmark"] == "throughput"
    assert report["config"]["num_prompts"] == n and report["config"]["backend"] == "octavo,hf"
    _check_env(report)
    assert report["environment"]["hf_attn_implementation"]
    for backend in ("octavo", "hf"):
        res = report["results"][backend]
        s = res["summary"]
        assert len(res["runs"]) == 2
        for run in res["runs"]:
            assert run["output_tokens"] == run["expected_output_tokens"] == n * o
            assert run["prompt_tokens"] == n * i
        assert s["total_output_tokens"] == n * o and s["total_input_tokens"] == n * i
        assert s["num_requests"] == n
        for k in ("requests_per_s", "input_tok_per_s", "output_tok_per_s", "total_tok_per_s",
                  "wall_s", "model_load_s", "startup_s"):
            assert s[k] > 0, (backend, k)
        assert abs(s["output_tok_per_s"] * s["wall_s"] - n * o) < 1e-6 * n * o
        assert abs(s["requests_per_s"] * s["wall_s"] - n) < 1e-6 * n
    ratios = report["ratios"]["octavo_vs_hf"]
    assert ratios["output_tok_per_s"] > 0
    assert ratios["total_output_tokens"] == 1.0
    assert len(report["results"]["paired"]["per_repeat"]) == 2
    text = capsys.readouterr().out
    assert "octavo / hf" in text and "output_tok_per_s" in text

    # --compare against itself: every ratio is exactly 1.
    capsys.readouterr()
    rc = _run("throughput", "--model", llama_dir, "--num-prompts", "2", "--input-len", "8",
              "--output-len", "3", "--max-model-len", "128", "--disable-tqdm",
              "--compare", str(out))
    assert rc == 0
    text = capsys.readouterr().out
    assert "Comparison with" in text and "results.octavo.summary.output_tok_per_s" in text


def test_throughput_sharegpt(llama_dir, tmp_path):
    out = tmp_path / "sg.json"
    rc = _run("throughput", "--model", llama_dir, "--dataset", "sharegpt", "--num-prompts", "3",
              "--output-len", "4", "--max-model-len", "512", "--disable-tqdm",
              "--output-json", str(out))
    assert rc == 0
    s = json.loads(out.read_text())["results"]["octavo"]["summary"]
    assert s["total_output_tokens"] == 12 and s["total_input_tokens"] > 3 * 4
    assert s["output_tok_per_s"] > 0


def test_latency_octavo_and_hf(llama_dir, tmp_path):
    out = tmp_path / "lat.json"
    b, o, iters = 2, 5, 2
    rc = _run("latency", "--model", llama_dir, "--batch-size", str(b), "--input-len", "8",
              "--output-len", str(o), "--num-iters", str(iters), "--num-iters-warmup", "1",
              "--backend", "octavo,hf", "--max-model-len", "128", "--disable-tqdm",
              "--output-json", str(out))
    assert rc == 0
    report = json.loads(out.read_text())
    assert report["benchmark"] == "latency"
    _check_env(report)
    for backend in ("octavo", "hf"):
        res = report["results"][backend]
        s = res["summary"]
        assert len(res["runs"]) == iters
        for run in res["runs"]:
            assert run["output_tokens"] == b * o
            assert len(run["ttft_s"]) == b
            assert all(0 < t <= run["e2e_s"] for t in run["ttft_s"])
        for stat in ("mean", "median", "p99"):
            for m in ("ttft_ms", "tpot_ms", "e2e_s"):
                assert s[f"{stat}_{m}"] > 0, (backend, stat, m)
        assert s["median_ttft_ms"] <= s["p99_ttft_ms"]
        assert s["median_e2e_s"] * 1e3 >= s["median_ttft_ms"] * 0.999
        assert s["output_tokens_per_iter"] == b * o
    assert report["ratios"]["octavo_vs_hf"]["median_tpot_ms"] > 0
    paired = report["results"]["paired"]
    assert len(paired["per_repeat"]) == iters and paired["median"] > 0


def test_bench_errors_are_clear(llama_dir, capsys):
    rc = _run("throughput", "--model", llama_dir, "--backend", "vllm", "--disable-tqdm")
    assert rc == 2
    assert "--backend" in capsys.readouterr().err
    rc = _run("latency", "--model", llama_dir, "--input-len", "100", "--output-len", "100",
              "--max-model-len", "128", "--disable-tqdm")
    assert rc == 2
    assert "max_model_len" in capsys.readouterr().err


def test_threads_flag_sizes_the_engine_team(monkeypatch):
    """--threads N also tells the engine's placement (default: every core) to use N cores."""
    import argparse
    import os

    import torch

    from octavo.benchmarks.common import setup_run
    from octavo.platforms.cpu_threads import plan_cpus

    before = torch.get_num_threads()
    monkeypatch.delenv("OCTAVO_CPU_THREADS_BIND", raising=False)
    try:
        facts = setup_run(argparse.Namespace(threads=1))
        assert os.environ["OCTAVO_CPU_THREADS_BIND"] == str(plan_cpus("auto")[0])
        assert facts["torch_num_threads"] == 1 and plan_cpus(os.environ["OCTAVO_CPU_THREADS_BIND"]) == plan_cpus("auto")[:1]
        monkeypatch.setenv("OCTAVO_CPU_THREADS_BIND", "none")  # the user's setting wins
        setup_run(argparse.Namespace(threads=1))
        assert os.environ["OCTAVO_CPU_THREADS_BIND"] == "none"
    finally:
        torch.set_num_threads(before)
