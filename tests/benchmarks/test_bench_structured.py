"""``octavo bench latency/throughput --structured-output json``: every iteration also runs
constrained on the same prompts, with exact output lengths, and the report pairs the two."""

from __future__ import annotations

import json

from octavo.entrypoints.cli import main


def test_latency_and_throughput_structured_output(llama_dir, tmp_path, capsys):
    out = tmp_path / "lat.json"
    rc = main(["bench", "latency", "--model", llama_dir, "--batch-size", "2", "--input-len", "8",
               "--output-len", "12", "--num-iters", "2", "--num-iters-warmup", "1",
               "--structured-output", "json", "--max-model-len", "128", "--disable-tqdm",
               "--output-json", str(out)])
    assert rc == 0
    results = json.loads(out.read_text())["results"]
    for key in ("octavo", "octavo+json"):
        assert [r["output_tokens"] for r in results[key]["runs"]] == [24, 24]
        assert results[key]["summary"]["median_tpot_ms"] > 0
    assert results["paired"]["metric"] == "mean_tpot_s" and results["paired"]["median"] > 0
    assert results["paired_cpu"]["metric"] == "cpu_s_per_token" and results["paired_cpu"]["median"] > 0
    assert "octavo+json / octavo time per output token" in capsys.readouterr().out

    out = tmp_path / "tp.json"
    rc = main(["bench", "throughput", "--model", llama_dir, "--num-prompts", "3", "--input-len", "8",
               "--output-len", "10", "--repeats", "2", "--structured-output", "json",
               "--max-model-len", "128", "--disable-tqdm", "--output-json", str(out)])
    assert rc == 0
    results = json.loads(out.read_text())["results"]
    assert [r["output_tokens"] for r in results["octavo+json"]["runs"]] == [30, 30]
    assert len(results["paired"]["per_repeat"]) == 2


def test_structured_output_needs_the_octavo_backend(llama_dir, capsys):
    rc = main(["bench", "latency", "--model", llama_dir, "--backend", "octavo,hf", "--structured-output", "json",
               "--input-len", "8", "--output-len", "8", "--max-model-len", "128", "--disable-tqdm"])
    assert rc == 2
    assert "--structured-output" in capsys.readouterr().err
