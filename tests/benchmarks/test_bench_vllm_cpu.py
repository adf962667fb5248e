"""The pieces of ``benchmarks/bench_vllm_cpu.py`` that run without vLLM, and the full-vocabulary
tokenizer of ``tools/make_smol_config.py`` it measures with."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.benchmarks.script_loader import load_script

bench = load_script("benchmarks/bench_vllm_cpu.py")
smol = load_script("tools/make_smol_config.py")


def test_widen_tokenizer_pads_to_the_model_vocab_and_keeps_encoding(tmp_path):
    from transformers import AutoTokenizer

    from tests.fixtures.checkpoints import build_tokenizer

    build_tokenizer(tmp_path)
    before = AutoTokenizer.from_pretrained(tmp_path)
    text = "def hello(self): return world  # paged attention é 中文"
    n0 = len(before)
    added = smol.widen_tokenizer(tmp_path, 2048)
    after = AutoTokenizer.from_pretrained(tmp_path)
    assert added == 2048 - n0 and len(after) == 2048
    assert after.encode(text) == before.encode(text)  # no merge makes the new entries
    for i in range(n0, 2048):  # each new id is whole, non-empty text
        piece = after.decode([i])
        assert piece and "\ufffd" not in piece, (i, piece)
    vocab = json.loads((tmp_path / "tokenizer.json").read_text())["model"]["vocab"]
    assert sorted(vocab.values()) == list(range(2048))  # dense ids, no duplicates
    assert smol.widen_tokenizer(tmp_path, 2048) == 0  # already wide enough: nothing to add


def test_parse_workload():
    assert bench.parse_workload("48x200+100") == {"name": "48x200+100", "num_prompts": 48, "input_len": 200,
                                                  "output_len": 100}
    for bad in ("48x200", "0x1+1", "ax1+1"):
        with pytest.raises(SystemExit, match="--workloads"):
            bench.parse_workload(bad)


def test_summary_takes_medians_and_per_round_ratios():
    def offline(o: float, v: float) -> dict:
        return {"stage": "offline", "ratios": {"w": o / v},
                "octavo": {"startup_s": 1.0, "runs": {"w": {"output_tok_s": o}}},
                "vllm": {"startup_s": 9.0, "runs": {"w": {"output_tok_s": v}}}}

    def serve(ttft_o: float, ttft_v: float) -> dict:
        def pt(t: float) -> dict:
            return {"1": {"median_ttft_ms": t, "median_tpot_ms": 10.0, "output_throughput_tok_s": 100.0}}
        return {"stage": "serve", "octavo": {"startup_s": 2.0, "points": pt(ttft_o)},
                "vllm": {"startup_s": 8.0, "points": pt(ttft_v)},
                "ratios": {"1": {"ttft": ttft_o / ttft_v, "tpot": 1.0, "output_tok_s": 1.0}}}

    s = bench.summarize({"rounds": [offline(130, 100), offline(120, 100), offline(150, 100),
                                    serve(50, 100), serve(80, 100)]})
    assert s["offline"]["w"]["ratio_per_round"] == [1.3, 1.2, 1.5]
    assert s["offline"]["w"]["median_ratio"] == 1.3 and s["offline"]["w"]["vllm_output_tok_s"] == 100
    assert s["offline"]["vllm_startup_s"] == [9.0, 9.0, 9.0]
    assert s["serve"]["1"]["median_ttft_ratio"] == pytest.approx(0.65)
    assert s["serve"]["1"]["octavo_median_ttft_ms"] == 65
    assert s["serve"]["octavo_startup_s"] == [2.0, 2.0]


def test_report_names_no_machine_path():
    import argparse

    args = argparse.Namespace(vllm_python="/opt/venv/bin/python", work="/srv/bench")
    rep = {"model": "/srv/bench/smol-135m", "commands": ["x --vllm-python /opt/venv/bin/python"],
           "rounds": [{"n": 1, "path": str(Path.home() / "m")}]}
    assert bench.public(rep, args) == {"model": "<work>/smol-135m", "commands": ["x --vllm-python <vllm-python>"],
                                       "rounds": [{"n": 1, "path": "~/m"}]}
