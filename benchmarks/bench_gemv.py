"""Decode linears on one NVIDIA GPU: cuBLAS bf16 against octavo's split-K Triton GEMV, FP8
(GEMV and ``torch._scaled_mm``) and W4A16, each next to the copy bandwidth of the same run.

    python benchmarks/bench_gemv.py all --out-dir $OUT          # both below, with timeouts
    python benchmarks/bench_gemv.py linears [--only o,down]      # per-linear times in CUDA graphs
    python benchmarks/bench_gemv.py decode                       # octavo decode, GEMV on vs off
    python benchmarks/bench_gemv.py profile                      # the decode step's kernels

``linears``: for every Llama-3.1-8B linear (qkv 4096->6144, o 4096->4096, gate_up
4096->28672, down 14336->4096, lm_head 4096->128256) and batch M = 1, 2, 4, 8, one CUDA graph
runs the linear of each of the 32 layers back to back (32 distinct weights, so nothing is
served from L2; the LM head: 4 calls on its 1 GB weight). Reported per call: time, achieved
bytes/s as a fraction of the device-to-device copy bandwidth measured in the same process,
and the ratio to cuBLAS. Methods: ``cublas`` (``F.linear``), ``gemv:<tiles>`` (every candidate
tiling), ``gemv_auto`` (what octavo picks at load: its own timing vs cuBLAS), ``fp8_gemv``
(per-channel weight scales, dynamic per-token activations, the activation quantization
included), ``fp8_gemv_block`` (128x128 block scales), ``fp8_scaled_mm`` (``torch._scaled_mm``
at the same M, the baseline the GEMV replaces), ``w4a16_gemv_in_group`` (M = 1 with FMA tiles
inside one scale group), ``fp8_auto`` (per bucket the fastest of the fp8
tilings and ``_scaled_mm`` as ``tune_fp8`` picks at load), ``w4a16_gemv`` (group 128, asymmetric).
Per-token totals add the 32 layers' linears and the LM head; roofline = bf16 weight bytes /
copy bandwidth (targets: FP8 <= 0.6x, INT4 <= 0.4x of it).

``decode``: the Llama-3.1-8B shape in octavo (dummy weights, bf16, CUDA graphs, async
scheduling), batch-1 device step (graph replay + logits, 767-token context) and TPOT (256-token
generate minus 1-token generate, /255) with the decode GEMV on (chosen at load) and off
(cuBLAS, graphs recaptured), against the streamed-bytes roofline: (weight bytes - embedding
table + KV bytes read) / copy bandwidth; also the old roofline (all weight bytes) and the
greedy-token agreement of the two modes.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

LINEARS = {  # name: (N, K, calls per graph with distinct weights)
    "qkv": (6144, 4096, 32), "o": (4096, 4096, 32), "gate_up": (28672, 4096, 32),
    "down": (4096, 14336, 32), "lm_head": (128256, 4096, 1),
}
LAYERS = 32
BATCHES = (1, 2, 4, 8)
DEVICE = "cuda"


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def result(d: dict) -> None:
    print("RESULT " + json.dumps(d), flush=True)


def copy_bandwidth() -> float:
    """Device-to-device copy bytes (read + written) per second, median of 10 x 4 GiB."""
    from bench_cuda import copy_bandwidth_s

    moved, t = copy_bandwidth_s()
    return moved / t


def graph_seconds(calls, reps: int = 10) -> float:
    """Seconds per call of ``calls`` (callables) run back to back inside one CUDA graph."""
    import torch

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for c in calls:  # warm-up: compiles, cuBLAS heuristics, allocator
            c()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for c in calls:
            c()
    for _ in range(2):
        graph.replay()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(reps):
        graph.replay()
    b.record()
    b.synchronize()
    return a.elapsed_time(b) / 1e3 / reps / len(calls)


def _methods(name: str, n: int, k: int, count: int):
    """(method name, bytes per call, {M: [callables]}) for one linear shape, built lazily."""
    import torch

    from octavo.quantization.kernels import triton_fp8 as f8
    from octavo.quantization.kernels import triton_gemv as g
    from octavo.quantization.kernels import triton_w4a16 as w4

    gen = torch.Generator(device=DEVICE).manual_seed(0)
    ws = [torch.randn(n, k, device=DEVICE, generator=gen, dtype=torch.bfloat16) for _ in range(count)]
    xs = {m: torch.randn(m, k, device=DEVICE, generator=gen, dtype=torch.bfloat16) for m in BATCHES}
    sms = g.num_sms(torch.device(DEVICE))
    yield "cublas", n * k * 2, {m: [lambda w=w, x=xs[m]: torch.nn.functional.linear(x, w) for w in ws] for m in BATCHES}
    picks = {}
    for m in BATCHES:
        picks[m], _ = g.time_against_cublas(ws[0], m, sms)
    auto = {m: [(lambda w=w, x=xs[m], c=picks[m]: g.launch(x, w, n, k, c, out_dtype=x.dtype, dot_dtype=x.dtype))
                if picks[m] else (lambda w=w, x=xs[m]: torch.nn.functional.linear(x, w)) for w in ws] for m in BATCHES}
    yield "gemv_auto", n * k * 2, auto, {m: (c.describe() if c else "cublas") for m, c in picks.items()}
    for m in BATCHES:
        for c in g.candidates(n, k, m, sms):
            calls = [lambda w=w, x=xs[m], c=c: g.launch(x, w, n, k, c, out_dtype=x.dtype, dot_dtype=x.dtype) for w in ws]
            yield f"gemv:{c.describe()}", n * k * 2, {m: calls}
    # FP8: per-channel scales from each row's amax; the same bf16 weights, quantized.
    fp8 = []
    for w in ws:
        s = (w.float().abs().amax(1) / f8.FP8_MAX).clamp_min(1e-12)
        fp8.append((w.float() / s[:, None]).to(torch.float8_e4m3fn))
        fp8[-1] = (fp8[-1], s)
    del ws
    packed = [f8.prepack_fp8(q, s) for q, s in fp8]
    yield "fp8_gemv", n * k + 4 * n, {m: [lambda p=p, x=xs[m]: f8.fp8_linear(x, p) for p in packed] for m in BATCHES}
    tuned = [f8.Fp8Packed(p.weight, p.scale, p.scale_mode, p.scale_row, dict(p.configs)) for p in packed]
    f8.tune_fp8(tuned[0])  # octavo's load-time choice (rotating copies, CUDA graph), shared by all
    for p in tuned[1:]:
        p.configs = dict(tuned[0].configs)
    picks8 = {m: (c.describe() if c else "scaled_mm") for m, c in tuned[0].configs.items()}
    yield "fp8_auto", n * k + 4 * n, {m: [lambda p=p, x=xs[m]: f8.fp8_linear(x, p) for p in tuned] for m in BATCHES}, picks8
    del tuned
    mm = {m: [lambda p=p, x=xs[m]: f8._gemm(*f8.quantize_rows(x), p, None, x.dtype) for p in packed] for m in BATCHES}
    yield "fp8_scaled_mm", n * k + 4 * n, mm
    blocks = [f8.prepack_fp8(q, torch.full((-(-n // 128), -(-k // 128)), 0.01, device=DEVICE)) for q, _ in fp8]
    del packed, fp8
    nb = 4 * (-(-n // 128)) * (-(-k // 128))
    yield "fp8_gemv_block", n * k + nb, {m: [lambda p=p, x=xs[m]: f8.fp8_linear(x, p) for p in blocks] for m in BATCHES}
    del blocks
    w4s = []
    for _ in range(count):
        q = torch.randint(0, 16, (n, k), device=DEVICE, dtype=torch.uint8, generator=gen)
        sc = torch.rand(n, k // 128, device=DEVICE, generator=gen) * 0.01
        z = torch.randint(0, 16, (n, k // 128), device=DEVICE, dtype=torch.uint8, generator=gen)
        w4s.append(w4.prepack_w4a16(q, sc, z, 128))
        del q
    calls = {m: [lambda p=p, x=xs[m]: w4.w4a16_linear(x, p) for p in w4s] for m in BATCHES}
    yield "w4a16_gemv", n * k // 2 + 8 * n * (k // 128), calls
    # M = 1 with FMA tiles inside one 128-wide group (one scale and zero per row and tile)
    in_group = g.GemvConfig(32, 128, g.pick_split(n, k, 32, 128, sms))
    for p in w4s:
        p.configs = {**p.configs, 1: in_group}
    yield "w4a16_gemv_in_group", n * k // 2 + 8 * n * (k // 128), {1: [lambda p=p, x=xs[1]: w4.w4a16_linear(x, p) for p in w4s]}


def cmd_linears(args) -> dict:
    import torch

    bw = copy_bandwidth()
    log(f"copy bandwidth {bw / 1e9:.0f} GB/s")
    r: dict = {"bench": "linears", "device": torch.cuda.get_device_name(), "bandwidth_Bps": bw,
               "torch": torch.__version__, "linears": {}}
    only = [x for x in (getattr(args, "only", "") or "").split(",") if x]
    for name, (n, k, count) in LINEARS.items():
        if only and name not in only:
            continue
        calls_per_graph = count if count > 1 else 4
        rows = r["linears"][name] = {"N": n, "K": k, "methods": {}}
        for item in _methods(name, n, k, count):
            method, nbytes, per_m = item[:3]
            if len(item) > 3:
                rows["auto_choice" if method == "gemv_auto" else f"{method}_choice"] = item[3]
            for m, calls in per_m.items():
                calls = calls * (calls_per_graph // len(calls))
                try:
                    t = graph_seconds(calls)
                except Exception as e:  # keep the other numbers
                    log(f"{name} {method} M={m}: {e!r}")
                    rows["methods"].setdefault(method, {})[m] = {"error": repr(e)[:300]}
                    continue
                rows["methods"].setdefault(method, {})[m] = {
                    "s": t, "bytes": nbytes, "bw_fraction": nbytes / t / bw,
                }
            torch.cuda.empty_cache()
        _ratios(rows)
        result(r)  # cumulative: a timeout later still leaves every finished linear
        log(name, json.dumps({meth: {m: round(v.get("s", float("nan")) * 1e6, 1) for m, v in d.items()}
                              for meth, d in rows["methods"].items()}))
    r["per_token"] = _per_token(r)
    result(r)
    return r


def _ratios(rows: dict) -> None:
    """vs_cublas for every method; ``gemv_best``: the fastest candidate tiling per M."""
    meths = rows["methods"]
    best = {}
    for meth, per_m in meths.items():
        for m, v in per_m.items():
            base = meths["cublas"].get(m, {}).get("s")
            if "s" in v and base:
                v["vs_cublas"] = v["s"] / base
            if meth.startswith("gemv:") and "s" in v and (m not in best or v["s"] < best[m][1]["s"]):
                best[m] = (meth, v)
    rows["gemv_best"] = {m: {"tiles": meth, **v} for m, (meth, v) in best.items()}


def _per_token(r: dict) -> dict:
    """All linears of one decode token (32 layers + LM head) per method and M, vs roofline."""
    out = {}
    bf16_bytes = sum(2 * n * k * (LAYERS if c > 1 else 1) for n, k, c in LINEARS.values())
    roof = bf16_bytes / r["bandwidth_Bps"]
    methods = ["cublas", "gemv_auto", "fp8_gemv", "fp8_auto", "fp8_scaled_mm", "fp8_gemv_block", "w4a16_gemv", "w4a16_gemv_in_group"]
    for meth in methods:
        for m in BATCHES:
            total = 0.0
            for name, (_, _, c) in LINEARS.items():
                v = r["linears"].get(name, {}).get("methods", {}).get(meth, {}).get(m, {})
                if "s" not in v:
                    total = float("nan")
                    break
                total += v["s"] * (LAYERS if c > 1 else 1)
            out[f"{meth}_M{m}"] = {"s": total, "vs_bf16_roofline": total / roof}
    out["bf16_roofline_s"] = roof
    return out


def cmd_decode(args) -> dict:
    import bench_cuda as bc

    from octavo import LLM
    from octavo.models import fused_ops
    from octavo.worker.cuda_graph import GraphRunner

    r: dict = {"bench": "decode", "shape": args.shape, "bandwidth_Bps": copy_bandwidth()}
    model_dir = bc.write_model_dir(args.shape, Path(args.model_root))
    vocab = bc.SHAPES[args.shape]["vocab_size"]
    t0 = time.perf_counter()
    llm = LLM(str(model_dir), load_format="dummy", dtype="bfloat16", max_model_len=1024, max_num_seqs=8,
              max_num_batched_tokens=2048, enable_prefix_caching=False, gpu_memory_utilization=0.85,
              async_scheduling=True)
    r["startup_s"] = time.perf_counter() - t0
    runner = llm.llm_engine.core.runner
    model = runner.model
    r["weight_bytes"] = runner.model_bytes()
    r["embedding_bytes"] = model.model.embed_tokens.weight.numel() * model.model.embed_tokens.weight.element_size()
    r["gemv_choices"] = {
        f"{mod.weight.shape[0]}x{mod.weight.shape[1]}": {m: (c.describe() if c else "cublas")
                                                         for m, c in mod.__dict__["_octavo_gemv"].items()}
        for mod in model.modules() if "_octavo_gemv" in mod.__dict__
    }
    log("choices", json.dumps(r["gemv_choices"]))
    if runner.graph_runner is None:
        r["error"] = "no CUDA graphs captured"
        result(r)
        return r
    bc._timed_generate(llm, bc.random_prompts(1, bc.PROMPT_LEN, vocab, 98), 8)
    graphs = {True: runner.graph_runner}
    fused_ops.GEMV_ENABLED = False
    graphs[False] = GraphRunner(runner, list(graphs[True].sizes))
    graphs[False].capture()
    fused_ops.GEMV_ENABLED = True
    _decode_modes(llm, runner, graphs, vocab, r, args.reps)
    _rooflines(r, runner)
    result(r)
    return r


def cmd_profile(args) -> dict:
    """Kernels of one batch-1 decode step (graph replay + logits + argmax) under torch.profiler:
    per kernel name the count and device time per step, their sum against the step's wall time
    (the rest is launch gaps and idle); then the split-KV merge in / after the attention launch
    (``_split_reduce_ab``)."""
    import bench_cuda as bc
    import torch

    from octavo import LLM

    model_dir = bc.write_model_dir(args.shape, Path(args.model_root))
    vocab = bc.SHAPES[args.shape]["vocab_size"]
    llm = LLM(str(model_dir), load_format="dummy", dtype="bfloat16", max_model_len=1024, max_num_seqs=8,
              max_num_batched_tokens=2048, enable_prefix_caching=False, gpu_memory_utilization=0.85,
              async_scheduling=True)
    bc._timed_generate(llm, bc.random_prompts(1, bc.PROMPT_LEN, vocab, 98), 8)
    runner = llm.llm_engine.core.runner
    r: dict = {"bench": "profile", "shape": args.shape, "bandwidth_Bps": copy_bandwidth()}
    r["weight_bytes"] = runner.model_bytes()
    emb = runner.model.model.embed_tokens.weight
    r["embedding_bytes"] = emb.numel() * emb.element_size()
    r["device_step_b1_gemv_on_s"] = bc._device_step_time(llm, iters=50)
    _rooflines(r, runner)
    steps = 20
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        bc._device_step_time(llm, iters=steps)
    table = bc.kernel_table(prof, steps + 5)
    r["kernels_per_step"] = sum(k["per_step"] for k in table)
    r["kernel_us_per_step"] = sum(k["us_per_step"] for k in table)
    r["kernels"] = table[:40]
    log(f"step {r['device_step_b1_gemv_on_s'] * 1e6:.0f} us; kernels {r['kernels_per_step']:.0f}/step "
        f"summing {r['kernel_us_per_step']:.0f} us")
    for k in r["kernels"]:
        log(f"{k['us_per_step']:9.1f} us  x{k['per_step']:5.1f}  {k['name']}")
    result(r)  # partial: the engine's own step survives a timeout below
    r.update(_split_reduce_ab(llm, runner, steps, args.reps))
    result(r)
    return r


def _split_reduce_ab(llm, runner, steps: int, reps: int) -> dict:
    """The batch-1 step with the split-KV merge in the attention launch (``fused``) and as a
    second launch (``separate``, the default), each in a freshly captured size-1 graph of
    the same engine: device step in interleaved rounds of 100 steps, then kernel by kernel."""
    import bench_cuda as bc
    import torch

    from octavo.attention.ops import paged_attention as pa
    from octavo.worker.cuda_graph import GraphRunner

    graphs, default = {}, pa.FUSED_SPLIT_REDUCE
    for name, fused in (("separate", False), ("fused", True)):
        pa.FUSED_SPLIT_REDUCE = fused
        graphs[name] = GraphRunner(runner, [1])
        graphs[name].capture()
    pa.FUSED_SPLIT_REDUCE = default
    samples: dict = {name: [] for name in graphs}
    for _ in range(reps + 2):
        for name, gr in graphs.items():
            samples[name].append(bc._device_step_time(llm, iters=100, gr=gr))
    r: dict = {}
    for name, gr in graphs.items():
        r[f"device_step_b1_split_reduce_{name}_s"] = t = statistics.median(samples[name])
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            bc._device_step_time(llm, iters=steps, gr=gr)
        table = bc.kernel_table(prof, steps + 5)
        r[f"profile_split_reduce_{name}"] = {"kernels_per_step": sum(k["per_step"] for k in table),
                                             "kernels": table[:40]}
        log(f"split-KV merge {name}: device step {t * 1e6:.0f} us; "
            f"kernels {r[f'profile_split_reduce_{name}']['kernels_per_step']:.0f}/step")
        for k in table[:12]:
            log(f"{k['us_per_step']:9.1f} us  x{k['per_step']:5.1f}  {k['name']}")
    return r


def _use(runner, graphs, on: bool) -> None:
    from octavo.models import fused_ops

    fused_ops.GEMV_ENABLED = on
    runner.graph_runner = graphs[on]


def _decode_modes(llm, runner, graphs, vocab, r, reps) -> None:
    import bench_cuda as bc

    from octavo import SamplingParams

    for on in (True, False):
        _use(runner, graphs, on)
        key = "gemv_on" if on else "gemv_off"
        r[f"device_step_b1_{key}_s"] = bc._device_step_time(llm, iters=50, gr=graphs[on])
        log(f"{key}: device step {r[f'device_step_b1_{key}_s'] * 1e3:.3f} ms")
    _rooflines(r, runner)
    result(r)
    samples: dict = {True: [], False: []}
    for rep in range(reps):
        for on in (True, False):
            _use(runner, graphs, on)
            t, _ = bc._decode_step_time(llm, 1, vocab, 1000 + 10 * rep + on, bc.OUTPUT_LEN, reps=1)
            samples[on].append(t)
            log(f"rep {rep} gemv={on}: TPOT {t * 1e3:.3f} ms")
    for on in (True, False):
        key = "gemv_on" if on else "gemv_off"
        r[f"tpot_b1_{key}_s"] = statistics.median(samples[on])
        r[f"tpot_b1_{key}_samples"] = samples[on]
    prompts = [{"prompt_token_ids": p} for p in bc.random_prompts(4, 64, vocab, 55)]
    sp = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True, detokenize=False)
    toks = {}
    for on in (True, False):
        _use(runner, graphs, on)
        toks[on] = [o.outputs[0].token_ids for o in llm.generate(prompts, sp, use_tqdm=False)]
    same = sum(a == b for x, y in zip(toks[True], toks[False], strict=True) for a, b in zip(x, y, strict=True))
    r["greedy_token_agreement"] = same / sum(len(x) for x in toks[True])
    _use(runner, graphs, True)


def _rooflines(r: dict, runner) -> None:
    mc = runner.config.model_config
    hf = mc.hf_config
    kv_per_token = 2 * hf.num_hidden_layers * hf.num_key_value_heads * mc.head_size * 2
    bw = r["bandwidth_Bps"]
    streamed = r["weight_bytes"] - r["embedding_bytes"]
    ctx_step = 512 + 256 - 1  # the device step's context (bench_cuda._device_step_time)
    ctx_tpot = 512 + 128  # mean context of a 256-token generate after a 512-token prompt
    r["roofline_streamed_step_s"] = (streamed + kv_per_token * ctx_step) / bw
    r["roofline_streamed_tpot_s"] = (streamed + kv_per_token * ctx_tpot) / bw
    r["roofline_all_weights_s"] = r["weight_bytes"] / bw
    for on in ("gemv_on", "gemv_off"):  # whatever has been measured so far
        if f"device_step_b1_{on}_s" in r:
            r[f"device_step_{on}_vs_streamed_roofline"] = r[f"device_step_b1_{on}_s"] / r["roofline_streamed_step_s"]
        if f"tpot_b1_{on}_s" in r:
            r[f"tpot_{on}_vs_streamed_roofline"] = r[f"tpot_b1_{on}_s"] / r["roofline_streamed_tpot_s"]
            r[f"tpot_{on}_vs_all_weights_roofline"] = r[f"tpot_b1_{on}_s"] / r["roofline_all_weights_s"]
    r["context_tokens_device_step"] = ctx_step
    log(json.dumps({k: v for k, v in r.items() if "roofline" in k or k.startswith("tpot_b1_gemv_o")}))


def _last_result(stdout: str) -> dict | None:
    found = None
    for line in stdout.splitlines():
        if line.startswith("RESULT "):
            found = json.loads(line[7:])
    return found


def _text(b) -> str:
    return b.decode(errors="replace") if isinstance(b, bytes) else (b or "")


def _sub(argv: list[str], timeout: float, logf) -> dict | None:
    """Run one subcommand in its own process; its last (cumulative) RESULT, even on timeout."""
    cmd = [sys.executable, str(Path(__file__).resolve()), *argv]
    log("+", " ".join(cmd))
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        out, err = _text(e.stdout), _text(e.stderr)
        logf.write(f"=== {argv[0]}: TIMEOUT after {timeout}s\n{out}\n{err}\n")
        logf.flush()
        res = _last_result(out) or {}
        res["error"] = f"timeout after {timeout}s (partial results)"
        return res
    logf.write(f"=== {argv[0]} rc={p.returncode}\n{p.stdout}\n{p.stderr}\n")
    logf.flush()
    res = _last_result(p.stdout)
    if res is None or p.returncode:
        res = res or {}
        res.update(error=f"rc={p.returncode}", stderr_tail=p.stderr[-2000:])
    return res


def cmd_all(args) -> dict:
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    res = {}
    with open(out / "bench_gemv.log", "w") as logf:
        res["linears"] = _sub(["linears", "--only", args.only], args.linears_timeout, logf)
        (out / "bench_gemv.json").write_text(json.dumps(res, indent=1))
        res["decode"] = _sub(["decode", "--shape", args.shape, "--reps", str(args.reps)], args.decode_timeout, logf)
    (out / "bench_gemv.json").write_text(json.dumps(res, indent=1))
    summarize(res)
    return res


def summarize(res: dict) -> None:
    lin = res.get("linears") or {}
    if "linears" in lin:
        print(f"copy bandwidth {lin['bandwidth_Bps'] / 1e9:.0f} GB/s ({lin.get('device')})")
        for name, rows in lin["linears"].items():
            for m in map(str, BATCHES):
                parts = []
                for meth in ("cublas", "gemv_auto", "fp8_gemv", "fp8_auto", "fp8_scaled_mm", "w4a16_gemv",
                             "w4a16_gemv_in_group"):
                    v = rows["methods"].get(meth, {}).get(m, {})
                    if "s" in v:
                        parts.append(f"{meth} {v['s'] * 1e6:.1f}us ({v['bw_fraction']:.0%} bw)")
                best = rows.get("gemv_best", {}).get(m)
                if best:
                    parts.append(f"best {best['tiles']} {best['s'] * 1e6:.1f}us")
                for key in ("auto_choice", "fp8_auto_choice"):
                    if m in rows.get(key, {}):
                        parts.append(f"{key} {rows[key][m]}")
                print(f"{name:8s} M={m}: " + ", ".join(parts))
        for key, v in lin.get("per_token", {}).items():
            if isinstance(v, dict):
                print(f"per token {key}: {v['s'] * 1e3:.3f} ms = {v['vs_bf16_roofline']:.2f}x bf16 roofline")
    dec = res.get("decode") or {}
    keys = [k for k in dec if "roofline" in k or k.startswith(("tpot_b1_gemv", "device_step_b1")) or k == "greedy_token_agreement"]
    for k in keys:
        if not k.endswith("samples"):
            print(f"decode {k}: {dec[k]}")
    for part in ("linears", "decode"):
        if isinstance(res.get(part), dict) and "error" in res[part]:
            print(f"{part}: ERROR {res[part]['error']}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    lin = sub.add_parser("linears")
    lin.add_argument("--only", default="", help="comma-separated linears to run (default: all), e.g. o,down")
    for name in ("decode", "all", "profile"):
        p = sub.add_parser(name)
        p.add_argument("--shape", default="llama8b")
        p.add_argument("--model-root", default=os.path.join(os.environ.get("TMPDIR", "/tmp"), "octavo_bench_models"))
        p.add_argument("--reps", type=int, default=3)
        if name == "all":
            p.add_argument("--out-dir", default=".")
            p.add_argument("--only", default="", help="linears to run (see linears --only)")
            p.add_argument("--linears-timeout", type=float, default=170)
            p.add_argument("--decode-timeout", type=float, default=170)
    args = ap.parse_args()
    {"linears": cmd_linears, "decode": cmd_decode, "all": cmd_all, "profile": cmd_profile}[args.cmd](args)


if __name__ == "__main__":
    main()
