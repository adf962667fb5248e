#!/usr/bin/env python3
"""Where batch-1 CPU decode time goes: torch profiler and cProfile over one request.

Builds an ``LLMEngine`` on ``--model`` (default: the model shipped in the package), runs one
warm-up request, then one request of ``--input-len`` prompt tokens and ``--output-len`` greedy
output tokens under the torch profiler (op self-times grouped into linears, attention, small
ops, allocation) and, separately, under cProfile (Python time by module: runner, scheduler,
sampler, engine). Prints the split per output token::

    python benchmarks/profile_cpu_decode.py --model /tmp/smol-135m --threads 2
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import time
from collections import defaultdict

import numpy as np
import torch

# torch op name prefix -> bucket of the split
BUCKETS = (
    ("linear", ("mkldnn::_linear_pointwise", "aten::linear", "aten::addmm", "aten::mm", "aten::matmul",
                "octavo::gemv", "aten::bmm", "octavo::int_linear")),
    ("attention", ("octavo::write_kv", "octavo::attention", "octavo::paged_attention")),
    ("fused small ops", ("octavo::rms_norm", "octavo::rope", "octavo::silu_and_mul", "octavo::")),
    ("alloc/view", ("aten::empty", "aten::view", "aten::reshape", "aten::split", "aten::slice",
                    "aten::as_strided", "aten::select", "aten::_reshape_alias", "aten::detach",
                    "aten::unsqueeze", "aten::contiguous", "aten::resize_", "aten::alias")),
)


def bucket_of(name: str) -> str:
    for bucket, prefixes in BUCKETS:
        if any(name.startswith(p) for p in prefixes):
            return bucket
    if name.startswith("aten::") or name.startswith("mkldnn::"):
        return "other torch ops"
    if name.startswith("Torch-Compiled") or name.startswith("CompiledFunction") or "inductor" in name.lower():
        return "compiled graph"
    return "other"


def _labelled(name: str, fn):
    """``fn`` inside a profiler range, so the torch profiler sees octavo's pybind11 kernels."""
    from torch.profiler import record_function

    def call(*a, **kw):
        with record_function(name):
            return fn(*a, **kw)

    return call


def label_kernels(engine) -> None:
    """Wrap the C++ kernels octavo calls (not torch ops) in named profiler ranges."""
    from octavo.models import cpu_fused_ops as cfo

    for attr in ("_rms_norm", "_silu_and_mul", "_rope", "_gemv"):
        if getattr(cfo, attr, None) is not None:
            setattr(cfo, attr, _labelled(f"octavo::{attr.lstrip('_')}", getattr(cfo, attr)))
    for attr in ("rms_norm", "silu_and_mul", "rope", "gemv", "write_kv", "paged_attention"):
        # the lean decoder-layer step (models/cpu_decode_layer.py) calls the extension directly
        setattr(cfo._ext, attr, _labelled(f"octavo::{attr}", getattr(cfo._ext, attr)))
    from octavo.quantization.kernels import cpu_int

    if hasattr(cpu_int, "int_linear"):
        cpu_int.int_linear = _labelled("octavo::int_linear", cpu_int.int_linear)
    for layer in engine.core.runner.model.attention_layers():
        impl = layer.impl
        for attr in ("_attention", "_write_kv"):
            if hasattr(impl, attr):
                setattr(impl, attr, _labelled(f"octavo::{attr.lstrip('_')}", getattr(impl, attr)))


def make_engine(args):
    from octavo.engine.arg_utils import EngineArgs
    from octavo.engine.llm_engine import LLMEngine

    ea = EngineArgs(model=args.model, dtype=args.dtype, max_model_len=args.max_model_len,
                    enforce_eager=args.enforce_eager, max_num_seqs=args.max_num_seqs,
                    quantization=args.quantization)
    return LLMEngine.from_engine_args(ea)


def run_one(engine, prompt: list[int], output_len: int) -> list[float]:
    from octavo.sampling_params import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=output_len, min_tokens=output_len, ignore_eos=True)
    rid = f"prof-{time.monotonic_ns()}"
    engine.add_request(rid, {"prompt_token_ids": prompt}, params)
    stamps = []
    t0 = time.perf_counter()
    while engine.has_unfinished_requests():
        engine.step()
        stamps.append(time.perf_counter())
    return [stamps[0] - t0] + list(np.diff(stamps))


def torch_profile(engine, prompt, output_len) -> None:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        gaps = run_one(engine, prompt, output_len)
    total = sum(gaps[1:])
    n = len(gaps) - 1
    per = defaultdict(float)
    for e in prof.key_averages():
        per[bucket_of(e.key)] += e.self_cpu_time_total / 1e3
    ops_ms = sum(per.values())
    print(f"\n== torch profiler: {n} decode steps, {total / n * 1e3:.2f} ms per token under the profiler "
          f"(TTFT {gaps[0] * 1e3:.1f} ms); op self-time per step:")
    for k, v in sorted(per.items(), key=lambda kv: -kv[1]):
        print(f"  {k:18s} {v / (n + 1):8.3f} ms")
    print(f"  {'(sum of ops)':18s} {ops_ms / (n + 1):8.3f} ms; Python & dispatch outside ops: "
          f"{(total + gaps[0]) * 1e3 / (n + 1) - ops_ms / (n + 1):.3f} ms")
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25))


def cprofile(engine, prompt, output_len) -> None:
    pr = cProfile.Profile()
    pr.enable()
    gaps = run_one(engine, prompt, output_len)
    pr.disable()
    n = len(gaps)
    st = pstats.Stats(pr)
    by_mod = defaultdict(float)
    for (file, _line, _fn), (_cc, _nc, tt, _ct, _callers) in st.stats.items():
        key = "torch/builtins"
        if "octavo" in file:
            key = "octavo/" + file.split("octavo/", 1)[-1].rsplit("/", 1)[0] + "/" + os.path.basename(file)
        by_mod[key] += tt
    print(f"\n== cProfile: {n} steps, {sum(gaps) / n * 1e3:.2f} ms per step under cProfile; self time per step:")
    for k, v in sorted(by_mod.items(), key=lambda kv: -kv[1])[:20]:
        print(f"  {k:48s} {v / n * 1e3:8.3f} ms")
    s = io.StringIO()
    pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(25)
    print(s.getvalue())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None)
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--max-model-len", type=int, default=512)
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--enforce-eager", action="store_true")
    p.add_argument("--quantization", default=None, help="e.g. int8 (online); a quantized --model needs none")
    p.add_argument("--skip-cprofile", action="store_true")
    p.add_argument("--no-gemv", action="store_true", help="oneDNN for every linear (the GEMV's baseline)")
    args = p.parse_args()
    if args.model is None:
        from octavo.engine.model_files import DEFAULT_MODEL_DIR

        args.model = str(DEFAULT_MODEL_DIR)
    torch.set_num_threads(args.threads)
    if args.no_gemv:
        from octavo.models import cpu_fused_ops

        cpu_fused_ops.GEMV = False
    print(f"load average {os.getloadavg()}, torch threads {torch.get_num_threads()}")
    engine = make_engine(args)
    rng = np.random.default_rng(0)
    prompt = rng.integers(10, 4000, args.input_len).tolist()
    gaps = run_one(engine, prompt, args.output_len)  # warm-up (prepacks weights)
    gaps = run_one(engine, rng.integers(10, 4000, args.input_len).tolist(), args.output_len)
    print(f"unprofiled: TTFT {gaps[0] * 1e3:.1f} ms, median decode step {np.median(gaps[1:]) * 1e3:.2f} ms")
    if not args.skip_cprofile:
        cprofile(engine, rng.integers(10, 4000, args.input_len).tolist(), args.output_len)
    label_kernels(engine)
    torch_profile(engine, rng.integers(10, 4000, args.input_len).tolist(), args.output_len)


if __name__ == "__main__":
    main()
