#!/usr/bin/env python3
"""Where the time of an offline throughput run goes, kernel by kernel (torch profiler).

Runs ``--num-prompts`` requests of ``--input-len`` random tokens + ``--output-len`` output
tokens (ignore_eos) through ``octavo.LLM`` on dummy weights at a model shape, once to warm up
(compiles, captured graphs), ``--passes`` times plain and once under ``torch.profiler``, each pass
with prompts of its own (no prefix-cache hits); prints the output tokens per second of every pass
and the device kernels by total time in the profiled one (top ``--top``; on a CPU its ops'
self time), grouped into attention / KV write / GEMM / other. One variant per process, ``METHOD[:KV_CACHE_DTYPE]``.
A last pass times the host side per engine step: wall minus the wait for the device's sampled
tokens (scheduler, input preparation, launches, output processing); with ``--host-pstats FILE``
one more runs under cProfile and its stats are written to FILE. With ``OCTAVO_MIXED_GRAPHS=1``
(the mixed-step graphs, opt-in) ``--ab-mixed-graphs`` follows every plain pass with one whose
mixed steps run eagerly (``GraphRunner.mixed_enabled`` off; decode graphs kept), and times the
host split that way too:

    python benchmarks/profile_throughput.py --shape llama8b --variant fp8:fp8 --json-out p.json
    python -m pstats FILE  # then: sort tottime / stats 30
"""

from __future__ import annotations

import argparse
import cProfile
import json
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench_quant import bench_model  # noqa: E402

GROUPS = (("attention", ("paged_attention", "_reduce_segments")), ("kv_write", ("write_kv", "_kv_write")),
          ("gemm/gemv", ("gemm", "gemv", "_mm", "sm90", "cutlass", "nvjet", "fp8", "w4a16")))


def group_of(name: str) -> str:
    low = name.lower()
    for group, keys in GROUPS:
        if any(k in low for k in keys):
            return group
    return "other"


def run(llm, prompts, params) -> float:
    t0 = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    dt = time.perf_counter() - t0
    return sum(len(o.outputs[0].token_ids) for o in outs) / dt


def host_split(llm, prompts, params, profile: cProfile.Profile | None = None) -> dict:
    """One pass with the engine's steps counted and ``StepHandle.result`` (the one wait per
    step for the device's sampled tokens) timed: host ms per step = wall minus those waits.
    With ``profile``, the pass runs under it (cProfile slows the host side about twofold)."""
    from octavo.worker.step_handle import StepHandle

    engine, inner, result = llm.llm_engine, llm.llm_engine.step, StepHandle.result
    steps, wait = [0], [0.0]

    def step():
        steps[0] += 1
        return inner()

    def timed_result(self):
        t = time.perf_counter()
        try:
            return result(self)
        finally:
            wait[0] += time.perf_counter() - t

    engine.step, StepHandle.result = step, timed_result
    try:
        t0 = time.perf_counter()
        if profile is not None:
            profile.enable()
        tok_s = run(llm, prompts, params)
        if profile is not None:
            profile.disable()
        wall = time.perf_counter() - t0
    finally:
        engine.step, StepHandle.result = inner, result
    n = max(steps[0], 1)
    return {"tok_s": round(tok_s, 1), "steps": steps[0], "wall_ms_per_step": round(1e3 * wall / n, 3),
            "wait_ms_per_step": round(1e3 * wait[0] / n, 3),
            "host_ms_per_step": round(1e3 * (wall - wait[0]) / n, 3)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="llama8b")
    ap.add_argument("--variant", default="none")
    ap.add_argument("--num-prompts", type=int, default=128)
    ap.add_argument("--input-len", type=int, default=512)
    ap.add_argument("--output-len", type=int, default=256)
    ap.add_argument("--passes", type=int, default=2, help="timed passes without the profiler")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--json-out")
    ap.add_argument("--host-pstats", help="write a cProfile of one more pass here")
    ap.add_argument("--ab-mixed-graphs", action="store_true",
                    help="also time passes with the mixed-step graphs off (eager mixed steps)")
    args = ap.parse_args()

    import torch

    from octavo import LLM, SamplingParams

    method, _, kv = args.variant.partition(":")
    llm = LLM(str(bench_model(args.shape)), load_format="dummy", dtype="bfloat16",
              kv_cache_dtype=kv or "auto", max_model_len=args.input_len + args.output_len + 16,
              **({"quantization": method} if method != "none" else {}))
    vocab = llm.llm_engine.processor.vocab_size
    rng = random.Random(0)

    def prompts():  # fresh ones for every pass: no prefix-cache hits on an earlier pass's prompts
        return [{"prompt_token_ids": [rng.randrange(1, vocab) for _ in range(args.input_len)]}
                for _ in range(args.num_prompts)]

    params = SamplingParams(max_tokens=args.output_len, ignore_eos=True, temperature=0.0)
    warm = run(llm, prompts(), params)
    runner = getattr(llm.llm_engine.core, "runner", None)  # in-process executor only
    graphs = getattr(runner, "graph_runner", None)
    ab = args.ab_mixed_graphs and graphs is not None and bool(graphs.mixed_sizes)

    def eager_mixed(fn):  # fn() with the mixed graphs off
        graphs.mixed_enabled = False
        try:
            return fn()
        finally:
            graphs.mixed_enabled = True

    plain, plain_eager_mixed = [], []
    for _ in range(args.passes):
        plain.append(run(llm, prompts(), params))
        if ab:
            plain_eager_mixed.append(eager_mixed(lambda: run(llm, prompts(), params)))
    activity = torch.profiler.ProfilerActivity.CUDA if torch.cuda.is_available() else torch.profiler.ProfilerActivity.CPU
    with torch.profiler.profile(activities=[activity]) as prof:
        profiled = run(llm, prompts(), params)
    rows = []
    for e in prof.key_averages():
        t = e.device_time_total if torch.cuda.is_available() else e.self_cpu_time_total
        if t > 0:
            rows.append({"name": e.key[:100], "us": round(t, 1), "count": e.count, "group": group_of(e.key)})
    rows.sort(key=lambda r: -r["us"])
    total = sum(r["us"] for r in rows)
    groups: dict[str, float] = {}
    for r in rows:
        groups[r["group"]] = groups.get(r["group"], 0.0) + r["us"]
    report = {"variant": args.variant, "tok_s": {"warm": round(warm, 1), "plain": [round(p, 1) for p in plain],
                                                 "profiled": round(profiled, 1)},
              "device_ms_total": round(total / 1e3, 1),
              "groups_ms": {g: round(v / 1e3, 1) for g, v in sorted(groups.items(), key=lambda kv: -kv[1])},
              "top": rows[: args.top]}
    report["host"] = host_split(llm, prompts(), params)
    if ab:
        report["eager_mixed"] = {"plain": [round(p, 1) for p in plain_eager_mixed],
                                 "host": eager_mixed(lambda: host_split(llm, prompts(), params))}
    if graphs is not None:
        report["mixed_graph_sizes"], report["mixed_replays"] = graphs.mixed_sizes, graphs.mixed_replays
    if args.host_pstats:
        prof = cProfile.Profile()
        report["host_cprofile"] = host_split(llm, prompts(), params, prof)
        prof.dump_stats(args.host_pstats)
    print(json.dumps(report, indent=1), flush=True)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
