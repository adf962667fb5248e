#!/usr/bin/env python3
"""The CPU graph mode against eager on one engine, interleaved in one run.

One ``LLMEngine`` is built with ``OCTAVO_CPU_GRAPH_MODE=torch_compile``; its compiled decode
step is switched off and on between rounds (``runner.cpu_graph.enabled``), so both modes run
the same weights, threads and KV cache. Per round and mode: batch-1 time per output token
(``--input-len`` prompt, ``--output-len`` greedy tokens) and the throughput of ``--batch``
requests of the same shape. Prints medians and the compiled/eager ratio.

``--startup`` instead times engine construction in fresh processes: eager, compiled with an
empty inductor cache (first start), compiled again with that cache (second start)::

    python benchmarks/cpu_graph_bench.py --model /tmp/smol-135m --rounds 3
    python benchmarks/cpu_graph_bench.py --model /tmp/smol-135m --startup
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np


def make_engine(args, graph: bool):
    os.environ["OCTAVO_CPU_GRAPH_MODE"] = "torch_compile" if graph else "none"
    from octavo.engine.arg_utils import EngineArgs
    from octavo.engine.llm_engine import LLMEngine

    ea = EngineArgs(model=args.model, dtype=args.dtype, max_model_len=args.max_model_len,
                    max_num_seqs=args.max_num_seqs)
    return LLMEngine.from_engine_args(ea)


def run_batch(engine, prompts: list[list[int]], output_len: int) -> tuple[float, float]:
    """(seconds per output token after the first, output tokens per second overall)."""
    from octavo.sampling_params import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=output_len, min_tokens=output_len, ignore_eos=True)
    for i, p in enumerate(prompts):
        engine.add_request(f"b{time.monotonic_ns()}-{i}", {"prompt_token_ids": p}, params)
    stamps = [time.perf_counter()]
    while engine.has_unfinished_requests():
        engine.step()
        stamps.append(time.perf_counter())
    steps = np.diff(stamps)
    decode = steps[-(output_len - 1):]  # the steps after the one that finished the prompts
    return float(decode.mean()), len(prompts) * output_len / (stamps[-1] - stamps[0])


def bench(args) -> dict:
    t0 = time.perf_counter()
    engine = make_engine(args, graph=True)
    construct = time.perf_counter() - t0
    graph = engine.core.runner.cpu_graph
    if graph is None:
        raise SystemExit("the CPU graph mode is off for this model (see the log for why)")
    rng = np.random.default_rng(0)
    vocab = engine.config.model_config.hf_config.vocab_size

    def prompts(n):
        return [rng.integers(10, min(vocab, 1000), args.input_len).tolist() for _ in range(n)]

    res = {"eager": {"tpot": [], "tok_s": []}, "compiled": {"tpot": [], "tok_s": []}}
    run_batch(engine, prompts(1), 8)  # warm up both paths
    graph.enabled = False
    run_batch(engine, prompts(1), 8)
    for _ in range(args.rounds):
        for mode in ("eager", "compiled"):
            graph.enabled = mode == "compiled"
            res[mode]["tpot"].append(run_batch(engine, prompts(1), args.output_len)[0])
            if args.batch > 1:
                res[mode]["tok_s"].append(run_batch(engine, prompts(args.batch), args.output_len)[1])
    out = {"construct_s": construct, "compile_s": graph.compile_seconds}
    for mode, r in res.items():
        out[f"{mode}_tpot_ms"] = 1e3 * statistics.median(r["tpot"])
        if r["tok_s"]:
            out[f"{mode}_batch{args.batch}_tok_s"] = statistics.median(r["tok_s"])
    out["tpot_ratio_compiled_over_eager"] = out["compiled_tpot_ms"] / out["eager_tpot_ms"]
    if args.batch > 1:
        out["throughput_ratio_compiled_over_eager"] = (
            out[f"compiled_batch{args.batch}_tok_s"] / out[f"eager_batch{args.batch}_tok_s"])
    return out


def construct_once(args, graph: bool) -> float:
    t0 = time.perf_counter()
    make_engine(args, graph)
    return time.perf_counter() - t0


def startup(args) -> dict:
    """Construction seconds in fresh processes: eager, compiled cold, compiled warm."""
    cache = tempfile.mkdtemp(prefix="octavo-inductor-")
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=cache)
    out = {}
    for name, graph in (("eager", False), ("compiled_first", True), ("compiled_second", True)):
        cmd = [sys.executable, __file__, "--construct-only", "--graph" if graph else "--no-graph"] + _passthrough(args)
        line = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1]
        out[f"construct_{name}_s"] = float(line)
    return out


def _passthrough(args) -> list[str]:
    return ["--model", args.model, "--dtype", args.dtype, "--max-model-len", str(args.max_model_len),
            "--max-num-seqs", str(args.max_num_seqs)]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None)
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--max-model-len", type=int, default=512)
    p.add_argument("--max-num-seqs", type=int, default=32)
    p.add_argument("--startup", action="store_true")
    p.add_argument("--construct-only", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--graph", dest="graph", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--no-graph", dest="graph", action="store_false", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.model is None:
        from octavo.engine.model_files import DEFAULT_MODEL_DIR

        args.model = str(DEFAULT_MODEL_DIR)
    if args.construct_only:
        print(construct_once(args, args.graph))
        return
    from octavo.cpu_isa import select_variant

    result = {"model": args.model, "dtype": args.dtype, "isa": select_variant()[0],
              "threads": __import__("torch").get_num_threads()}
    result.update(startup(args) if args.startup else bench(args))
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
