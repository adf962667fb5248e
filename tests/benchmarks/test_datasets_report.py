"""Workloads and reporting helpers of ``octavo bench`` (no model needed except a tokenizer)."""

from __future__ import annotations

import json
import math

import pytest

from octavo.benchmarks import report as rep
from octavo.benchmarks.datasets import (
    SYNTHETIC_SHAREGPT,
    get_requests,
    load_sharegpt,
    random_requests,
    write_synthetic_sharegpt,
)
from octavo.benchmarks.serve import (
    RequestResult,
    compute_metrics,
    parse_rate,
    parse_slo,
    plot_sweep,
)


def test_random_requests_have_exact_lengths_and_no_special_ids():
    reqs = random_requests(5, 17, 9, vocab_size=50, seed=3, exclude_ids={0, 1, 2})
    assert len(reqs) == 5
    for r in reqs:
        assert r.is_token_ids and len(r.prompt) == r.prompt_len == 17
        assert r.expected_output_len == 9
        assert all(3 <= t < 50 for t in r.prompt)
    again = random_requests(5, 17, 9, vocab_size=50, seed=3, exclude_ids={0, 1, 2})
    assert [r.prompt for r in reqs] == [r.prompt for r in again]
    other = random_requests(5, 17, 9, vocab_size=50, seed=4, exclude_ids={0, 1, 2})
    assert [r.prompt for r in reqs] != [r.prompt for r in other]


def test_random_requests_reject_bad_sizes():
    with pytest.raises(ValueError, match="--input-len"):
        random_requests(1, 0, 4, vocab_size=10)


def test_shipped_sharegpt_is_the_generator_output(tmp_path):
    """The shipped file is exactly what ``write_synthetic_sharegpt`` writes (reproducible)."""
    p = tmp_path / "s.json"
    write_synthetic_sharegpt(p)
    assert p.read_text() == SYNTHETIC_SHAREGPT.read_text()
    data = json.loads(p.read_text())
    assert len(data) == 64 and data[0]["conversations"][0]["from"] == "human"


def test_sharegpt_sampling(tokenizer_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    reqs = load_sharegpt(SYNTHETIC_SHAREGPT, tok, num_prompts=10, seed=1)
    assert len(reqs) == 10
    for r in reqs:
        assert isinstance(r.prompt, str)
        assert r.prompt_len == len(tok.encode(r.prompt)) >= 4
        assert r.expected_output_len >= 4
    fixed = get_requests("sharegpt", tok, 200, 0, 7, seed=0, max_model_len=512)
    assert len(fixed) == 200 and {r.expected_output_len for r in fixed} == {7}  # reused round-robin
    with pytest.raises(ValueError, match="--dataset"):
        get_requests("/nonexistent.json", tok, 2, 4, 4)
    with pytest.raises(ValueError, match="max-model-len"):
        get_requests("random", tok, 2, 60, 10, max_model_len=64)


def test_percentiles():
    p = rep.percentiles([1.0, 2.0, 3.0, 4.0], "x_ms", 1000.0)
    assert p["mean_x_ms"] == 2500.0 and p["median_x_ms"] == 2500.0
    assert p["min_x_ms"] == 1000.0 and p["max_x_ms"] == 4000.0
    assert 3000.0 < p["p90_x_ms"] <= p["p99_x_ms"] <= 4000.0
    assert rep.percentiles([], "x") == {}


def test_parse_rate_and_slo():
    assert math.isinf(parse_rate("inf")) and parse_rate("2.5") == 2.5
    for bad in ("0", "-1", "fast"):
        with pytest.raises(ValueError, match="--request-rate"):
            parse_rate(bad)
    assert parse_slo("ttft=500,tpot=50") == {"ttft": 500.0, "tpot": 50.0}
    assert parse_slo(None) == {}
    for bad in ("ttft", "latency=3", "ttft=abc", "tpot=0"):
        with pytest.raises(ValueError, match="--slo"):
            parse_slo(bad)


def _result(ttft, latency, n, itl=()):
    return RequestResult(success=True, prompt_len=10, expected_output_len=n, output_tokens=n,
                         ttft_s=ttft, latency_s=latency, itl_s=list(itl))


def test_serve_metrics_and_goodput():
    results = [
        _result(0.1, 0.5, 5, [0.1] * 4),  # tpot 100 ms
        _result(0.2, 0.4, 5, [0.05] * 4),  # tpot 50 ms
        _result(1.0, 1.2, 5, [0.05] * 4),  # ttft too slow
        RequestResult(success=False, error="boom"),
    ]
    m = compute_metrics(results, duration=2.0, slo={"ttft": 500, "tpot": 60})
    assert m["completed"] == 3 and m["failed"] == 1
    assert m["total_output_tokens"] == 15 and m["total_input_tokens"] == 30
    assert m["output_throughput_tok_s"] == 7.5 and m["request_throughput_req_s"] == 1.5
    assert m["goodput_req_s"] == 0.5  # only the second request meets both SLOs
    assert m["slo_attainment"] == 0.25
    assert m["median_ttft_ms"] == pytest.approx(200.0)
    assert m["mean_tpot_ms"] == pytest.approx((100 + 50 + 50) / 3)
    assert m["mean_itl_ms"] == pytest.approx((0.4 + 0.2 + 0.2) / 12 * 1e3)


def test_compare_and_flatten(capsys, tmp_path):
    base = {"benchmark": "throughput", "config": {"num_prompts": 4},
            "results": {"octavo": {"summary": {"output_tok_per_s": 100.0, "wall_s": 2.0},
                                   "runs": [{"wall_s": 2.0}]}},
            "ratios": {"octavo_vs_hf": {"output_tok_per_s": 2.0}}}
    cur = json.loads(json.dumps(base))
    cur["results"]["octavo"]["summary"]["output_tok_per_s"] = 150.0
    cur["ratios"]["octavo_vs_hf"]["output_tok_per_s"] = 3.0
    rows = {k: r for k, _, _, r in rep.compare(base, cur)}
    assert rows["results.octavo.summary.output_tok_per_s"] == pytest.approx(1.5)
    assert rows["results.octavo.summary.wall_s"] == pytest.approx(1.0)
    assert rows["ratios.octavo_vs_hf.output_tok_per_s"] == pytest.approx(1.5)
    assert not any("runs" in k for k in rows)
    path = tmp_path / "base.json"
    path.write_text(json.dumps(base))
    rep.print_compare(str(path), cur)
    out = capsys.readouterr().out
    assert "1.500x" in out and "results.octavo.summary.output_tok_per_s" in out


def test_sweep_plot_is_a_png(tmp_path):
    pts = [{"label": lab, "summary": {"median_ttft_ms": t, "p99_ttft_ms": 2 * t, "median_itl_ms": 5.0,
                                      "p99_itl_ms": 9.0, "request_throughput_req_s": 1.0}}
           for lab, t in (("1", 10.0), ("2", 20.0), ("inf", 80.0))]
    out = plot_sweep(pts, tmp_path / "sweep.png", "test")
    with open(out, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_counts_print_as_ints_and_table_agrees_with_the_paired_footer(capsys):
    import argparse

    from octavo.benchmarks import report as rep

    results = {
        "octavo": {"summary": {"num_requests": 8, "median_e2e_s": 1.0}},
        "hf": {"summary": {"num_requests": 8, "median_e2e_s": 2.0}},
        # per-repeat ratios whose median (0.9) differs from the ratio of medians (0.5)
        "paired": {"metric": "e2e_s", "per_repeat": [0.8, 0.9, 1.2], "median": 0.9},
    }
    rep.report_run("latency", argparse.Namespace(), results, None, "t", "octavo / hf latency")
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("num_requests"))
    assert row.split()[1:3] == ["8", "8"]
    e2e = next(line for line in out.splitlines() if line.startswith("median_e2e_s"))
    assert e2e.split()[-1] == "0.90x"
    assert "(median 0.90x" in out
