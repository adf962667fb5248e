"""Mixture-of-experts benchmarks: a Qwen3-30B-A3B shape (random weights, bf16), every number
beside a baseline measured in the same run.

    python benchmarks/bench_moe.py all --out moe.json         # kernel, octavo, hf (subprocesses)
    python benchmarks/bench_moe.py kernel                     # grouped GEMM vs per-expert loops
    python benchmarks/bench_moe.py kernel --tune              # + tile sweep, prints table entries
    python benchmarks/bench_moe.py octavo                     # batch-1 TPOT vs roofline, throughput
    python benchmarks/bench_moe.py hf                         # HF transformers generate, same shape
    python benchmarks/bench_moe.py all --shape tiny_moe       # dry run on a CPU (small shape)
    python benchmarks/bench_moe.py decode --out d.json        # gemv --tune + octavo batch 1 only
    python benchmarks/bench_moe.py gemv [--tune]              # per-pair GEMV vs grouped, 1-16 tokens
    python benchmarks/bench_moe.py profile                    # batch-1 step: fusions on/off, kernel by kernel

The model is a ``config.json`` written here (no download): octavo loads it with
``load_format="dummy"``, HF with ``from_config``. Each engine runs in its own process.

- kernel: one MoE layer (E=128, top-8, H=2048, I=768) over 1..4096 tokens: the Triton grouped
  GEMM (CUDA) against the per-expert loop transformers uses (``torch_ref``: mask, gather, two
  GEMMs, index_add per expert) and the sorted loop (``cpu_grouped``: one sort, one GEMM pair per
  active expert); CUDA-event medians; the grouped result is checked against the loop.
- octavo: batch-1 time per output token = (T(256 tokens) - T(1 token)) / 255 on fresh 512-token
  prompts (median of 3) against the roofline of the *active* weights (attention, norms, router
  and the top-8 experts of every layer, plus the LM head) / the copy bandwidth measured in the
  same process; then 128 requests x (512 prompt / 256 output tokens) throughput.
- gemv (CUDA only): the experts alone at 1, 2, 4, 8, 16 tokens, replayed from CUDA graphs over
  rotating routings and weight copies: the per-pair GEMV path against the grouped GEMM and the
  roofline of the distinct routed experts' bytes; ``--tune`` times GEMV tile candidates.
- octavo also times the batch-1 device step (graph replay) with the GEMV path and with the
  grouped GEMM forced (``OCTAVO_MOE_GEMV_MAX_PAIRS=0``), each in a fresh size-1 graph.
- hf: the same two measurements with HF ``generate`` (batch 1, then the 128 prompts at once).
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
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import bench_cuda  # noqa: E402  (shared helpers: bandwidth, timed generate, prompts)
from bench_cuda import _decode_step_time, _timed_generate, log, random_prompts, result  # noqa: E402

QWEN3_30B_A3B = {
    "architectures": ["Qwen3MoeForCausalLM"],
    "model_type": "qwen3_moe",
    "hidden_size": 2048,
    "intermediate_size": 6144,
    "moe_intermediate_size": 768,
    "num_hidden_layers": 48,
    "num_attention_heads": 32,
    "num_key_value_heads": 4,
    "head_dim": 128,
    "num_experts": 128,
    "num_experts_per_tok": 8,
    "norm_topk_prob": True,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [],
    "vocab_size": 151936,
    "max_position_embeddings": 40960,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0,
    "hidden_act": "silu",
    "tie_word_embeddings": False,
    "attention_bias": False,
    "use_sliding_window": False,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "torch_dtype": "bfloat16",
}
SHAPES = {
    "qwen3_30b_a3b": QWEN3_30B_A3B,
    "tiny_moe": {**QWEN3_30B_A3B, "hidden_size": 64, "intermediate_size": 128, "moe_intermediate_size": 32,
                 "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
                 "num_experts": 8, "num_experts_per_tok": 2, "vocab_size": 512},
}
bench_cuda.SHAPES.update(SHAPES)


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def _sizes(args) -> tuple[int, int, int]:
    """(prompt length, output length, requests) of this run (smaller for the CPU dry run)."""
    if args.shape == "tiny_moe":
        return 32, 16, 8
    return bench_cuda.PROMPT_LEN, bench_cuda.OUTPUT_LEN, bench_cuda.NUM_REQS


def _time(fn, reps: int = 20) -> float:
    """Median seconds of ``fn()`` (CUDA events on a GPU, wall clock on a CPU)."""
    import torch

    fn()
    samples = []
    for _ in range(reps):
        if _cuda():
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            samples.append(a.elapsed_time(b) / 1e3)
        else:
            t0 = time.perf_counter()
            fn()
            samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


# -- one MoE layer ------------------------------------------------------------------------
TUNE_CANDIDATES = [
    dict(BLOCK_M=m, BLOCK_N=n, BLOCK_K=k, GROUP_M=g, num_warps=w, num_stages=s)
    for m, n, k, g, w, s in [
        (16, 32, 128, 1, 4, 4), (16, 32, 256, 1, 4, 3), (16, 64, 128, 1, 4, 4), (16, 128, 128, 1, 4, 3), (16, 64, 64, 1, 4, 4), (16, 256, 64, 1, 4, 3),
        (32, 64, 128, 8, 4, 3), (32, 128, 64, 8, 4, 4), (64, 64, 64, 8, 4, 4), (64, 128, 64, 8, 4, 3),
        (64, 128, 128, 8, 8, 3), (128, 128, 64, 8, 8, 3), (128, 256, 64, 8, 8, 3), (128, 128, 128, 8, 8, 2),
    ]
]


def cmd_kernel(args) -> dict:
    import torch

    from octavo.models.moe.kernels.cpu_grouped import CpuGroupedExperts
    from octavo.models.moe.kernels.torch_ref import TorchRefExperts

    cfg = SHAPES[args.shape]
    e, k, h, i = cfg["num_experts"], cfg["num_experts_per_tok"], cfg["hidden_size"], cfg["moe_intermediate_size"]
    dev = "cuda" if _cuda() else "cpu"
    dtype = torch.bfloat16 if dev == "cuda" else torch.float32
    torch.manual_seed(0)
    w13 = torch.randn(e, 2 * i, h, device=dev, dtype=dtype) * h**-0.5
    w2 = torch.randn(e, h, i, device=dev, dtype=dtype) * i**-0.5
    r: dict = {"bench": "moe_kernel", "shape": args.shape, "device": dev, "dtype": str(dtype), "rows": []}
    kernels = {"loop": TorchRefExperts(dtype), "sorted_loop": CpuGroupedExperts(dtype)}
    kernels["sorted_loop"].compute_dtype = dtype  # same dtype as the others on every device
    if dev == "cuda":
        r["bandwidth_Bps"] = bench_cuda.cmd_bandwidth(args)["bandwidth_Bps"]
        torch.cuda.empty_cache()
        from octavo.models.moe.kernels.triton_gemm import fused_experts
        from octavo.models.moe.kernels.triton_grouped import TritonGroupedExperts

        kernels["grouped"] = TritonGroupedExperts(dtype)

    def layer(kernel, x, logits):  # what FusedMoE.forward runs on one rank: route, then experts
        weights, ids = kernel.route(logits, k, True, 0, e)
        return kernel.apply(x, w13, w2, weights, ids)

    reps = max(10, 5 * args.reps)
    sizes = [1, 8, 32, 128, 512, 4096] if args.shape != "tiny_moe" else [1, 8, 64]
    for t in sizes:
        x = torch.randn(t, h, device=dev, dtype=dtype)
        logits = torch.randn(t, e, device=dev)
        ids = kernels["loop"].route(logits, k, True, 0, e)[1]
        row = {"tokens": t, "active_experts": int(torch.unique(ids).numel())}
        for name, kernel in kernels.items():
            row[f"{name}_s"] = _time(lambda kernel=kernel, x=x, logits=logits: layer(kernel, x, logits), reps=reps)
        if "grouped" in kernels:
            ref = layer(kernels["loop"], x, logits).float()
            out = layer(kernels["grouped"], x, logits).float()
            row["grouped_rel_err"] = float((out - ref).norm() / ref.norm())
            row["grouped_vs_loop"] = row["loop_s"] / row["grouped_s"]
            row["grouped_vs_sorted_loop"] = row["sorted_loop_s"] / row["grouped_s"]
            touched = row["active_experts"] * 3 * h * i * w13.element_size()
            row["expert_bytes_roofline_s"] = touched / r["bandwidth_Bps"]
            if args.tune:
                weights, ids = kernels["grouped"].route(logits, k, True, 0, e)
                row["tune"] = _tune(fused_experts, (x, w13, w2, weights, ids), reps)
        log(json.dumps(row))
        r["rows"].append(row)
    result(r)
    return r


def _tune(fused_experts, case, reps) -> dict:
    best = None
    for cand in TUNE_CANDIDATES:
        try:
            s = _time(lambda cand=cand: fused_experts(*case, config=cand), reps=reps)
        except Exception as e:  # out of shared memory for this tile: skip it
            log("candidate failed", cand, type(e).__name__)
            continue
        if best is None or s < best[0]:
            best = (s, cand)
    return {"best_s": best[0], "config": best[1]} if best else {}


# -- the small-batch GEMV path against the grouped GEMM ----------------------------------
GEMV_TOKENS = (1, 2, 4, 8, 16)
GEMV_TUNE_TOKENS = (1, 8)
# (gate/up BLOCK_N, BLOCK_K, warps, down BLOCK_N, BLOCK_K, warps); the first is the default.
GEMV_CANDIDATES = [
    dict(GATE_UP_BLOCK_N=gn, GATE_UP_BLOCK_K=gk, GATE_UP_WARPS=gw, DOWN_BLOCK_N=dn, DOWN_BLOCK_K=dk, DOWN_WARPS=dw)
    for gn, gk, gw, dn, dk, dw in [
        (4, 512, 4, 2, 256, 4), (8, 512, 4, 4, 256, 4), (16, 256, 4, 8, 128, 4),
        (4, 1024, 4, 4, 128, 4), (8, 512, 8, 8, 256, 8), (16, 512, 8, 4, 512, 4),
    ]
]
WEIGHT_COPIES = 4  # distinct expert weights the timed calls rotate over (none served from L2)
CALLS = 8  # calls per captured graph, each with its own routing


def _gemv_cases(t: int, shape: dict, weights: list) -> list[tuple]:
    """``CALLS`` routed batches of ``t`` tokens (x, weights, ids, w13, w2), Triton-routed,
    rotating over the weight copies."""
    import torch

    from octavo.models.moe.kernels import triton_routing

    e, k, h = shape["num_experts"], shape["num_experts_per_tok"], shape["hidden_size"]
    dev, dtype = weights[0][0].device, weights[0][0].dtype
    out = []
    for c in range(CALLS):
        g = torch.Generator(device=dev).manual_seed(1000 * t + c)
        x = torch.randn(t, h, generator=g, device=dev).to(dtype)
        w, ids = triton_routing.route(torch.randn(t, e, generator=g, device=dev), k, True, 0, e)
        out.append((x, w, ids, *weights[c % len(weights)]))
    return out


def _timer():
    """ms per call of a list of calls: CUDA-graph replay on a GPU, wall clock elsewhere (the
    interpreter dry run)."""
    if _cuda():
        from octavo.quantization.kernels.triton_gemv import graph_time_ms

        return graph_time_ms
    return lambda calls: _time(lambda: [c() for c in calls], reps=1) * 1e3 / len(calls)


def _gemv_row(t: int, shape: dict, weights: list, bw: float) -> dict:
    import torch

    from octavo.models.moe.kernels.torch_ref import TorchRefExperts
    from octavo.models.moe.kernels.triton_gemm import fused_experts
    from octavo.models.moe.kernels.triton_gemv import gemv_experts

    cases = _gemv_cases(t, shape, weights)
    h, i = shape["hidden_size"], shape["moe_intermediate_size"]
    distinct = statistics.mean(int(torch.unique(c[2]).numel()) for c in cases)
    row = {"tokens": t, "pairs": t * shape["num_experts_per_tok"], "distinct_experts": distinct,
           "roofline_s": distinct * 3 * h * i * 2 / bw}
    for name, fn in (("gemv", gemv_experts), ("grouped", fused_experts)):
        row[f"{name}_s"] = _timer()([lambda c=c, fn=fn: fn(c[0], c[3], c[4], c[1], c[2]) for c in cases]) / 1e3
        row[f"{name}_vs_roofline"] = row[f"{name}_s"] / row["roofline_s"]
    row["grouped_vs_gemv"] = row["grouped_s"] / row["gemv_s"]
    x, w, ids, w13, w2 = cases[0]
    ref = TorchRefExperts(w13.dtype).apply(x, w13, w2, w, ids).float()
    for name, fn in (("gemv", gemv_experts), ("grouped", fused_experts)):
        row[f"{name}_rel_err"] = float((fn(x, w13, w2, w, ids).float() - ref).norm() / ref.norm())
    return row


def _gemv_tune(t: int, shape: dict, weights: list) -> dict[str, float]:
    """us per call of every ``GEMV_CANDIDATES`` tiling at ``t`` tokens (same timing as the rows)."""
    from octavo.models.moe.kernels.triton_gemv import gemv_experts

    cases, out = _gemv_cases(t, shape, weights), {}
    for cand in GEMV_CANDIDATES:
        key = ",".join(str(v) for v in cand.values())
        try:
            calls = [lambda c=c, cand=cand: gemv_experts(c[0], c[3], c[4], c[1], c[2], config=cand) for c in cases]
            out[key] = _timer()(calls) * 1e3
        except Exception as e:  # a tile that does not compile: skip it
            log("gemv candidate failed", key, type(e).__name__, e)
    return out


def cmd_gemv(args) -> dict:
    """Kernel time of the experts alone at 1-16 tokens, every call replayed from a CUDA graph
    (as in decode: no host launch gaps) over ``CALLS`` routings and ``WEIGHT_COPIES`` weight
    copies: the per-pair GEMV path, the grouped GEMM (align + two GEMMs + top-k sum), and the
    roofline of the distinct experts' bytes at the copy bandwidth of this run."""
    import torch

    shape = SHAPES[args.shape]
    e, h, i = shape["num_experts"], shape["hidden_size"], shape["moe_intermediate_size"]
    if _cuda():
        dev, dtype = "cuda", torch.bfloat16
        bw = bench_cuda.cmd_bandwidth(args)["bandwidth_Bps"]
        torch.cuda.empty_cache()
    else:  # a dry run of the script under TRITON_INTERPRET=1 (the times mean nothing)
        dev, dtype, bw = "cpu", torch.float32, 1e10
    weights = [((torch.randn(e, 2 * i, h, device=dev) * h**-0.5).to(dtype),
                (torch.randn(e, h, i, device=dev) * i**-0.5).to(dtype)) for _ in range(WEIGHT_COPIES)]
    r: dict = {"bench": "moe_gemv", "shape": args.shape, "device": dev, "bandwidth_Bps": bw, "rows": []}
    for t in GEMV_TOKENS:
        row = _gemv_row(t, shape, weights, bw)
        log(json.dumps(row))
        r["rows"].append(row)
        result(r)  # partial results survive a timeout
    if args.tune:  # after every row: the sweep is what a timeout may cut
        for t in GEMV_TUNE_TOKENS:
            r.setdefault("tune_us", {})[str(t)] = _gemv_tune(t, shape, weights)
            log(f"tune {t} tokens", json.dumps(r["tune_us"][str(t)]))
            result(r)
    return r


# -- octavo -------------------------------------------------------------------------------
def cmd_octavo(args) -> dict:
    import torch

    from octavo import LLM
    from octavo.models.moe.summary import moe_cost

    prompt_len, out_len, num_reqs = _sizes(args)
    r: dict = {"bench": "octavo_moe", "shape": args.shape, "unfused": args.unfused}
    if args.unfused:
        _set_fusions(*FUSION_VARIANTS["unfused"])
    if _cuda():
        r["bandwidth_Bps"] = bench_cuda.cmd_bandwidth(args)["bandwidth_Bps"]
        torch.cuda.empty_cache()
    model_dir = bench_cuda.write_model_dir(args.shape, Path(args.model_root))
    vocab = SHAPES[args.shape]["vocab_size"]
    t0 = time.perf_counter()
    llm = LLM(str(model_dir), load_format="dummy", dtype="bfloat16", max_model_len=1024,
              max_num_seqs=4 if args.skip_throughput else num_reqs, max_num_batched_tokens=8192,
              enable_prefix_caching=False, gpu_memory_utilization=0.85, enforce_eager=args.enforce_eager)
    runner = llm.llm_engine.core.runner
    cost = moe_cost(llm.llm_engine.config.model_config.hf_config)
    r.update(startup_s=time.perf_counter() - t0, weight_bytes=runner.model_bytes(),
             active_weight_bytes=cost.active_params * 2, moe=llm.llm_engine.core.executor.worker_infos[0]["moe"],
             graphs=runner.graph_runner is not None)
    log("startup", r)
    if not args.skip_throughput:
        _timed_generate(llm, random_prompts(num_reqs, prompt_len, vocab, 99), 4)  # warm every shape
    _timed_generate(llm, random_prompts(1, prompt_len, vocab, 98), 4)
    bench_cuda.PROMPT_LEN = prompt_len
    tpot, samples = _decode_step_time(llm, 1, vocab, 1000, out_len, reps=args.reps)
    r.update(tpot_b1_s=tpot, tpot_b1_samples=samples)
    if "bandwidth_Bps" in r:
        r["roofline_active_s"] = r["active_weight_bytes"] / r["bandwidth_Bps"]
        r["tpot_b1_vs_roofline"] = tpot / r["roofline_active_s"]
    log(f"batch-1 TPOT {tpot * 1e3:.3f} ms {r.get('tpot_b1_vs_roofline', '')}")
    result(r)  # partial: batch 1 survives a timeout in the throughput run
    if r["graphs"]:
        r.update(_gemv_on_off(llm))
        result(r)
    if not args.skip_throughput:
        t, n = _timed_generate(llm, random_prompts(num_reqs, prompt_len, vocab, 7), out_len)
        r.update(throughput_s=t, throughput_tokens=n, throughput_tok_per_s=n / t)
        log(f"throughput {n} tokens in {t:.2f}s = {n / t:.0f} tok/s")
    llm.shutdown()
    result(r)
    return r


def _gemv_on_off(llm) -> dict:
    """Batch-1 device step (graph replay + logits, 767-token context) with the experts' GEMV
    path (the default) and with the grouped GEMM (``OCTAVO_MOE_GEMV_MAX_PAIRS=0``), each in a
    freshly captured size-1 graph of the same engine."""
    from octavo.worker.cuda_graph import GraphRunner

    runner, res = llm.llm_engine.core.runner, {}
    old = os.environ.get("OCTAVO_MOE_GEMV_MAX_PAIRS")
    for name, bound in (("device_step_gemv_s", old), ("device_step_grouped_s", "0")):
        if bound is None:
            os.environ.pop("OCTAVO_MOE_GEMV_MAX_PAIRS", None)
        else:
            os.environ["OCTAVO_MOE_GEMV_MAX_PAIRS"] = bound
        gr = GraphRunner(runner, [1])
        gr.capture()
        res[name] = bench_cuda._device_step_time(llm, gr=gr)
        log(f"{name} {res[name] * 1e3:.3f} ms")
    if old is None:
        os.environ.pop("OCTAVO_MOE_GEMV_MAX_PAIRS", None)
    else:
        os.environ["OCTAVO_MOE_GEMV_MAX_PAIRS"] = old
    return res


# -- kernel-by-kernel profile of the batch-1 decode step ----------------------------------
# The fusions of the batch-1 decode step, each switchable for same-run comparisons:
# variant name -> (fused q/k norm + RoPE, fused router GEMV + routing, split-KV merge in the
# attention launch, KV write in the q/k norm + RoPE launch). "fused" is the engine's default;
# "main" the step before the KV write moved into the RoPE launch.
FUSION_VARIANTS = {"unfused": (False, False, False, False),
                   "main": (True, True, False, False),
                   "fused": (True, True, False, True),
                   "split_reduce_fused": (True, True, True, True)}
# The variants whose kernel tables are compared; batch-1 TPOT of the first two.
COMPARED = ("main", "fused", "split_reduce_fused")


def _set_fusions(qk_norm_rope: bool, router: bool, split_reduce: bool = False, kv_write: bool = True) -> None:
    from octavo.attention.ops import paged_attention
    from octavo.models import fused_ops
    from octavo.models.moe.kernels import triton_grouped

    fused_ops.QK_NORM_ROPE_ENABLED = qk_norm_rope
    triton_grouped.FUSED_ROUTER = router
    paged_attention.FUSED_SPLIT_REDUCE = split_reduce
    fused_ops.KV_WRITE_IN_ROPE = kv_write


def _profile_step(llm, gr, steps: int = 20) -> dict:
    """Kernel table of ``steps`` device steps replayed from ``gr``."""
    import torch

    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        bench_cuda._device_step_time(llm, iters=steps, gr=gr)
    table = bench_cuda.kernel_table(prof, steps + 5)  # _device_step_time runs 5 warm-up steps
    return {"kernels_per_step": sum(k["per_step"] for k in table),
            "kernel_us_per_step": sum(k["us_per_step"] for k in table), "kernels": table[:40]}


def _tpot_compared(llm, graphs: dict, vocab: int, reps: int) -> dict:
    """Batch-1 TPOT (``bench_cuda._decode_step_time``: 512-token prompts, 256 tokens) with the
    engine's size-1 graph swapped for the first two ``COMPARED`` variants', interleaved."""
    runner, out = llm.llm_engine.core.runner, {}
    own = runner.graph_runner
    samples: dict = {name: [] for name in COMPARED[:2]}
    for rep in range(reps):
        for name in samples:
            _set_fusions(*FUSION_VARIANTS[name])  # eager steps (the prompts) follow the graph
            runner.graph_runner = graphs[name]
            t, _ = _decode_step_time(llm, 1, vocab, 1000 + 10 * rep, bench_cuda.OUTPUT_LEN, reps=1)
            samples[name].append(t)
    runner.graph_runner = own
    _set_fusions(*FUSION_VARIANTS["fused"])
    for name, ts in samples.items():
        out[f"tpot_b1_{name}_s"], out[f"tpot_b1_{name}_samples"] = statistics.median(ts), ts
        log(f"{name}: batch-1 TPOT {out[f'tpot_b1_{name}_s'] * 1e3:.3f} ms")
    return out


def cmd_profile(args) -> dict:
    """Batch-1 decode step (graph replay + logits + argmax over a 767-token context,
    ``bench_cuda._device_step_time``) of every ``FUSION_VARIANTS`` entry, each in a freshly
    captured size-1 graph of one engine, in interleaved rounds; batch-1 TPOT and the step kernel
    by kernel under torch.profiler of each ``COMPARED`` variant; the active-weight roofline at
    this run's copy bandwidth."""
    import torch

    from octavo import LLM
    from octavo.models.moe.summary import moe_cost
    from octavo.worker.cuda_graph import GraphRunner

    r: dict = {"bench": "moe_profile", "shape": args.shape,
               "bandwidth_Bps": bench_cuda.cmd_bandwidth(args)["bandwidth_Bps"]}
    torch.cuda.empty_cache()
    model_dir = bench_cuda.write_model_dir(args.shape, Path(args.model_root))
    vocab = SHAPES[args.shape]["vocab_size"]
    llm = LLM(str(model_dir), load_format="dummy", dtype="bfloat16", max_model_len=1024, max_num_seqs=4,
              max_num_batched_tokens=8192, enable_prefix_caching=False, gpu_memory_utilization=0.85)
    _timed_generate(llm, random_prompts(1, 512, vocab, 98), 8)
    cost = moe_cost(llm.llm_engine.config.model_config.hf_config)
    r["roofline_active_s"] = cost.active_params * 2 / r["bandwidth_Bps"]
    graphs = {}
    for name, flags in FUSION_VARIANTS.items():
        _set_fusions(*flags)
        graphs[name] = GraphRunner(llm.llm_engine.core.runner, [1])
        graphs[name].capture()
    _set_fusions(*FUSION_VARIANTS["fused"])
    samples: dict = {name: [] for name in graphs}
    for _ in range(args.reps + 2):  # interleaved rounds: drift hits every variant alike
        for name, gr in graphs.items():
            samples[name].append(bench_cuda._device_step_time(llm, iters=100, gr=gr))
    for name, ts in samples.items():
        r[f"device_step_{name}_s"] = statistics.median(ts)
        r[f"device_step_{name}_vs_roofline"] = r[f"device_step_{name}_s"] / r["roofline_active_s"]
        log(f"{name}: device step {r[f'device_step_{name}_s'] * 1e6:.0f} us = "
            f"{r[f'device_step_{name}_vs_roofline']:.2f}x active roofline ({r['roofline_active_s'] * 1e6:.0f} us)")
    result(r)  # partial: the step times survive a timeout below
    r.update(_tpot_compared(llm, graphs, vocab, args.reps))
    result(r)
    for name in COMPARED:
        r[f"profile_{name}"] = p = _profile_step(llm, graphs[name])
        log(f"{name}: kernels {p['kernels_per_step']:.0f}/step summing {p['kernel_us_per_step']:.0f} us")
        for k in p["kernels"]:
            log(f"{k['us_per_step']:9.1f} us  x{k['per_step']:5.1f}  {k['name']}")
    llm.shutdown()
    result(r)
    return r


# -- HF transformers ----------------------------------------------------------------------
def cmd_hf(args) -> dict:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    prompt_len, out_len, num_reqs = _sizes(args)
    dev = "cuda" if _cuda() else "cpu"
    cfg = AutoConfig.from_pretrained(bench_cuda.write_model_dir(args.shape, Path(args.model_root)))
    t0 = time.perf_counter()
    with torch.device(dev):
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16).eval()
    r: dict = {"bench": "hf_moe", "shape": args.shape, "load_s": time.perf_counter() - t0,
               "experts_implementation": str(getattr(model.config, "_experts_implementation", None))}
    vocab = cfg.vocab_size
    kw = dict(do_sample=False, pad_token_id=0)

    def gen(prompts, n):
        ids = torch.tensor(prompts, device=dev)
        if dev == "cuda":
            torch.cuda.synchronize()
        t = time.perf_counter()
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n, **kw)
        if dev == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - t, (out.shape[1] - ids.shape[1]) * out.shape[0]

    with torch.no_grad():
        gen(random_prompts(1, 32, vocab, 1), 4)
        samples = []
        for rep in range(max(1, args.reps - 1)):  # one fewer than octavo: HF is the slow one
            t_long, _ = gen(random_prompts(1, prompt_len, vocab, 10 + rep), out_len)
            t_one, _ = gen(random_prompts(1, prompt_len, vocab, 20 + rep), 1)
            samples.append((t_long - t_one) / (out_len - 1))
        r.update(tpot_b1_s=statistics.median(samples), tpot_b1_samples=samples)
        log(f"HF batch-1 TPOT {r['tpot_b1_s'] * 1e3:.3f} ms")
        result(r)  # partial
        t, n = gen(random_prompts(num_reqs, prompt_len, vocab, 7), out_len)
    r.update(throughput_s=t, throughput_tokens=n, throughput_tok_per_s=n / t)
    log(f"HF throughput {n} tokens in {t:.2f}s = {n / t:.0f} tok/s")
    result(r)
    return r


# -- orchestration ------------------------------------------------------------------------
def _results(text: str) -> dict | None:
    """The last ``RESULT`` line of a subcommand's output (partial results come first)."""
    found = [json.loads(line[7:]) for line in text.splitlines() if line.startswith("RESULT ")]
    return found[-1] if found else None


def _sub(argv: list[str], timeout: float, logf) -> dict | None:
    cmd = [sys.executable, __file__, *argv]
    log("$", " ".join(cmd))
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        err = e.stderr.decode() if isinstance(e.stderr, bytes) else (e.stderr or "")
        logf.write(f"$ {' '.join(cmd)}\nTIMEOUT after {timeout}s\n{out}{err}\n")
        log(f"  timed out after {timeout:.0f}s")
        return {**(_results(out) or {}), "timeout_s": timeout}
    logf.write(f"$ {' '.join(cmd)}\n{p.stdout}\n{p.stderr}\n")
    logf.flush()
    r = _results(p.stdout)
    if r is None:
        log(f"  failed (rc {p.returncode}): {p.stderr[-3000:]}")
    return r


def cmd_all(args) -> dict:
    """kernel, octavo and hf (``all``); or gemv + octavo batch 1 only (``decode``)."""
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    common = ["--shape", args.shape, "--model-root", args.model_root, "--reps", str(args.reps)]
    tune = ["--tune"] if args.tune else []
    if args.cmd == "decode":
        steps = (("gemv", ["--tune"], args.kernel_timeout), ("octavo", ["--skip-throughput"], args.timeout))
    else:
        steps = (("kernel", tune, args.kernel_timeout), ("octavo", [], args.timeout), ("hf", [], args.hf_timeout))
    res: dict = {}
    with open(out.with_suffix(".log"), "a") as logf:
        for name, extra, limit in steps:
            res[name] = _sub([name, *common, *extra], limit, logf)
            out.write_text(json.dumps(res, indent=1))
    summarize(res)
    return res


def _gemv_lines(g: dict) -> list[str]:
    lines = []
    for row in g.get("rows", []):
        line = (f"[gemv] {row['tokens']:>2} tokens ({row['distinct_experts']:.1f} experts): per-pair GEMV "
                f"{row['gemv_s'] * 1e6:.1f} us = {row['gemv_vs_roofline']:.2f}x expert-weight roofline "
                f"({row['roofline_s'] * 1e6:.1f} us), grouped {row['grouped_s'] * 1e6:.1f} us = "
                f"{row['grouped_vs_roofline']:.2f}x -> GEMV {row['grouped_vs_gemv']:.2f}x faster; "
                f"rel err vs torch_ref {row['gemv_rel_err']:.1e} / {row['grouped_rel_err']:.1e}")
        lines.append(line)
    for t, times in (g.get("tune_us") or {}).items():
        if times:
            best = min(times, key=times.get)
            first = next(iter(times))  # the default tiles
            lines.append(f"[gemv] tiles at {t} tokens: default {first} {times[first]:.1f} us, best {best} "
                         f"{times[best]:.1f} us ({len(times)} timed)")
    return lines


def summarize(res: dict) -> None:
    lines = _gemv_lines(res.get("gemv") or {})
    k = res.get("kernel") or {}
    for row in k.get("rows", []):
        line = f"[kernel {k['device']}] {row['tokens']:>5} tokens ({row['active_experts']} experts): loop {row['loop_s'] * 1e6:.0f} us, sorted loop {row['sorted_loop_s'] * 1e6:.0f} us"
        if "grouped_s" in row:
            line += (f", grouped {row['grouped_s'] * 1e6:.0f} us = {row['grouped_vs_loop']:.1f}x faster than the loop "
                     f"({row['grouped_vs_sorted_loop']:.1f}x the sorted loop), "
                     f"{row['grouped_s'] / row['expert_bytes_roofline_s']:.2f}x expert-weight roofline, rel err {row['grouped_rel_err']:.1e}")
        if row.get("tune"):
            line += f"; tuned {row['tune']['best_s'] * 1e6:.0f} us with {row['tune']['config']}"
        lines.append(line)
    o, h = res.get("octavo") or {}, res.get("hf") or {}
    if o.get("tpot_b1_s"):
        line = f"[octavo] batch-1 TPOT {o['tpot_b1_s'] * 1e3:.3f} ms"
        if o.get("roofline_active_s"):
            line += f" vs active-weight roofline {o['roofline_active_s'] * 1e3:.3f} ms = {o['tpot_b1_vs_roofline']:.2f}x"
        if h.get("tpot_b1_s"):
            line += f"; HF generate {h['tpot_b1_s'] * 1e3:.3f} ms -> {h['tpot_b1_s'] / o['tpot_b1_s']:.1f}x"
        lines.append(line)
    if o.get("device_step_gemv_s") and o.get("device_step_grouped_s"):
        line = (f"[octavo] batch-1 device step: experts as GEMVs {o['device_step_gemv_s'] * 1e3:.3f} ms, "
                f"as grouped GEMM {o['device_step_grouped_s'] * 1e3:.3f} ms "
                f"({o['device_step_grouped_s'] / o['device_step_gemv_s']:.2f}x)")
        one = next((r for r in (res.get("gemv") or {}).get("rows", []) if r["tokens"] == 1), None)
        if one:  # how much of the step the experts' kernels account for (routing not included)
            experts = SHAPES[o["shape"]]["num_hidden_layers"] * one["gemv_s"]
            line += f"; of it {experts * 1e3:.3f} ms = layers x the 1-token GEMV kernel time"
        lines.append(line)
    if o.get("throughput_tok_per_s"):
        line = f"[octavo] throughput {o['throughput_tok_per_s']:.0f} tok/s"
        if h.get("throughput_tok_per_s"):
            line += f"; HF generate {h['throughput_tok_per_s']:.0f} tok/s -> {o['throughput_tok_per_s'] / h['throughput_tok_per_s']:.1f}x"
        elif h.get("timeout_s"):
            n = o.get("throughput_tokens", 0)
            line += (f"; HF generate did not finish {n} tokens within {h['timeout_s']:.0f}s "
                     f"(< {n / h['timeout_s']:.0f} tok/s -> > {o['throughput_tok_per_s'] * h['timeout_s'] / max(n, 1):.1f}x)")
        lines.append(line)
    print("\n".join(lines), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("kernel", "gemv", "octavo", "hf", "all", "decode", "profile"):
        p = sub.add_parser(name)
        p.add_argument("--shape", default="qwen3_30b_a3b", choices=sorted(SHAPES))
        p.add_argument("--model-root", default=os.path.join(tempfile.gettempdir(), "octavo_bench_models"))
        p.add_argument("--reps", type=int, default=3)
        p.add_argument("--enforce-eager", action="store_true")
        p.add_argument("--tune", action="store_true", help="sweep tile configs (grouped GEMM / GEMV)")
        p.add_argument("--skip-throughput", action="store_true", help="octavo: batch 1 only (4 sequences)")
        p.add_argument("--unfused", action="store_true",
                       help="octavo: without the step's fusions (FUSION_VARIANTS['unfused'])")
        if name in ("all", "decode"):
            p.add_argument("--out", default="bench_moe.json")
            p.add_argument("--kernel-timeout", type=float, default=60)
            p.add_argument("--timeout", type=float, default=130)
            p.add_argument("--hf-timeout", type=float, default=110)
    args = ap.parse_args()
    if args.cmd == "octavo":
        from octavo.logger import configure_logging

        configure_logging()  # startup lines: MoE kernel and placement, memory profile, graphs
    cmds = {"kernel": cmd_kernel, "gemv": cmd_gemv, "octavo": cmd_octavo, "hf": cmd_hf, "all": cmd_all, "decode": cmd_all,
            "profile": cmd_profile}
    cmds[args.cmd](args)


if __name__ == "__main__":
    main()
