"""CUDA benchmarks, every number next to a baseline measured in the same run.

    python benchmarks/bench_cuda.py all --out results.json          # everything below
    python benchmarks/bench_cuda.py bandwidth                        # device-to-device copy
    python benchmarks/bench_cuda.py kernels                          # attention kernels
    python benchmarks/bench_cuda.py octavo --shape llama8b           # latency, graphs, throughput
    python benchmarks/bench_cuda.py hf-generate --shape llama8b      # HF generate, batch 128
    python benchmarks/bench_cuda.py hf-generate-batch --shape llama8b
    python benchmarks/bench_cuda.py async --shape llama8b            # batch 1, async scheduling on/off

Models are Llama-3.1-8B and Qwen2.5-0.5B *shapes*: ``config.json`` files written here (no
download) with random weights (octavo ``load_format="dummy"``, HF ``from_config``), bf16.
Each engine runs in its own process (``all`` orchestrates them with timeouts) so one's memory
never shrinks another's. Each subcommand prints one JSON line prefixed ``RESULT``.

- roofline: weight bytes / measured copy bandwidth (bytes read + written per second);
- batch-1 TPOT: (wall time of a 256-token generate - wall time of a 1-token generate) / 255,
  both on fresh random 512-token prompts, median of 3, graphs on, then off;
- throughput: 128 requests x (512 random prompt tokens, 256 output tokens, ignore_eos), timed on
  a second pass (the first compiles the kernels its shapes use);
- graphs on/off: decode time per step at batch 1 and 32 (graphs toggled on the same engine);
- async: batch-1 TPOT with async scheduling on and off, interleaved on one engine (median of
  3 each), the copy bandwidth measured in the same process, and greedy tokens of both modes
  compared (``--shape tiny`` dry-runs it on a CPU).
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

SHAPES = {
    "llama8b": {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "vocab_size": 128256,
        "max_position_embeddings": 131072,
        "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0,
        "rope_scaling": {
            "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 8192,
        },
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "attention_bias": False,
        "mlp_bias": False,
        "bos_token_id": 128000,
        "eos_token_id": 128001,
        "torch_dtype": "bfloat16",
    },
    "qwen05b": {
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        "hidden_size": 896,
        "intermediate_size": 4864,
        "num_hidden_layers": 24,
        "num_attention_heads": 14,
        "num_key_value_heads": 2,
        "vocab_size": 151936,
        "max_position_embeddings": 32768,
        "max_window_layers": 21,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "hidden_act": "silu",
        "tie_word_embeddings": True,
        "use_sliding_window": False,
        "sliding_window": 32768,
        "bos_token_id": 151643,
        "eos_token_id": 151643,
        "torch_dtype": "bfloat16",
    },
}

SHAPES["tiny"] = {**SHAPES["llama8b"], "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
                  "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 512,
                  "torch_dtype": "float32"}
# Llama-3.2-1B's shape (the Llama 3 vocabulary: a draft model for llama8b).
SHAPES["llama1b"] = {**SHAPES["llama8b"], "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16,
                     "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64, "tie_word_embeddings": True,
                     "rope_scaling": {**SHAPES["llama8b"]["rope_scaling"], "factor": 32.0}}
SHAPES["tiny_draft"] = {**SHAPES["tiny"], "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
                        "num_attention_heads": 2, "num_key_value_heads": 1}

PROMPT_LEN, OUTPUT_LEN, NUM_REQS = 512, 256, 128


def _sync() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def result(d: dict) -> None:
    print("RESULT " + json.dumps(d), flush=True)


def write_model_dir(shape: str, root: Path) -> Path:
    """config.json for the shape plus a tiny tokenizer (outputs are never detokenized)."""
    d = root / shape
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps(SHAPES[shape], indent=1))
    if not (d / "tokenizer.json").exists():
        from tokenizers import Tokenizer, models
        from transformers import PreTrainedTokenizerFast

        tok = Tokenizer(models.WordLevel({"<unk>": 0, "a": 1}, unk_token="<unk>"))
        PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", eos_token="<unk>").save_pretrained(d)
    return d


def random_prompts(n: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    import numpy as np

    rng = np.random.default_rng(seed)
    return rng.integers(10, vocab - 10, size=(n, length)).tolist()


# -- bandwidth ----------------------------------------------------------------------------
def copy_bandwidth_s() -> tuple[int, float]:
    """(bytes moved, median seconds) of a device-to-device copy of 4 GiB (far past the 60 MB
    L2), median of 10 after 3 warm-ups; the buffers are freed before returning."""
    import torch

    n = 4 << 30
    src = torch.empty(n, dtype=torch.uint8, device="cuda").random_(0, 255)
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    times = []
    for _ in range(10):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        dst.copy_(src)
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / 1e3)
    del src, dst
    torch.cuda.empty_cache()
    return 2 * n, statistics.median(times)


def cmd_bandwidth(args) -> dict:
    moved, t = copy_bandwidth_s()
    r = {"bench": "bandwidth", "bytes_moved": moved, "median_s": t, "bandwidth_Bps": moved / t}
    result(r)
    return r


# -- attention kernels --------------------------------------------------------------------
def cmd_kernels(args) -> dict:
    import torch
    import triton

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from octavo.attention.ops.paged_attention import alloc_workspace, paged_attention
    from tests.attention.paged_cases import make_batch

    rows = []
    for label, seqs, kv_heads in (
        ("decode b1 ctx768", [(767, 1)], 8),
        ("decode b1 ctx768 4 KV heads", [(767, 1)], 4),
        ("decode b1 ctx8k", [(8191, 1)], 8),
        ("decode b32 ctx768", [(767, 1)] * 32, 8),
        ("decode b128 ctx768", [(767, 1)] * 128, 8),
        ("prefill 512", [(0, 512)], 8),
        ("prefill 8x512 + 64 decodes", [(0, 512)] * 8 + [(700, 1)] * 64, 8),
    ):
        q, k, v, cache, md = make_batch(seqs, num_heads=32, num_kv_heads=kv_heads, head_size=128,
                                        block_size=16, dtype=torch.bfloat16, device="cuda",
                                        extra_blocks=0)
        out = torch.empty_like(q)
        kv_bytes = sum(c + n for c, n in seqs) * kv_heads * 128 * 2 * 2
        decode = md.max_query_len == 1
        # split-KV: the merge in the attention launch (fused) or a second launch
        variants = [(1, False)] + ([(s, f) for s in (4, 8, 16, 32) for f in (False, True)] if decode else [])
        for segs, fused in variants:
            for tile in (32, 64):
                ws = alloc_workspace(q.shape[0], 32, 128, segs, "cuda") if segs > 1 else None

                def fn(segs=segs, tile=tile, ws=ws, q=q, cache=cache, md=md, out=out, fused=fused):
                    paged_attention(q, cache, out, md.query_start_loc, md.seq_lens, md.block_table,
                                    md.num_reqs, md.max_query_len, 128**-0.5, segs, ws, tile=tile,
                                    fused_reduce=fused)

                fn()  # compile outside the graph
                ms = triton.testing.do_bench_cudagraph(fn, rep=50, return_mode="median")
                rows.append({"case": label, "segments": segs, "fused_merge": fused, "tile": tile,
                             "us": ms * 1e3, "kv_GBps": kv_bytes / (ms / 1e3) / 1e9})
                log(f"{label:28s} seg={segs:2d}{' fused' if fused else '      '} tile={tile} {ms * 1e3:8.1f} us  "
                    f"{kv_bytes / (ms / 1e3) / 1e9:7.0f} GB/s of KV")
    r = {"bench": "kernels", "rows": rows}
    result(r)
    return r


# -- octavo -------------------------------------------------------------------------------
def _timed_generate(llm, prompts, max_tokens):
    from octavo import SamplingParams

    sp = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, detokenize=False)
    _sync()
    t0 = time.perf_counter()
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], sp, use_tqdm=False)
    t = time.perf_counter() - t0
    n = sum(len(o.outputs[0].token_ids) for o in outs)
    return t, n


def _decode_step_time(llm, batch, vocab, seed, out_tokens, reps=3):
    """Seconds per decode step at ``batch``: (T(out_tokens) - T(1)) / (out_tokens - 1)."""
    samples = []
    for r in range(reps):
        p1 = random_prompts(batch, PROMPT_LEN, vocab, seed + 2 * r)
        p2 = random_prompts(batch, PROMPT_LEN, vocab, seed + 2 * r + 1)
        t_long, _ = _timed_generate(llm, p1, out_tokens)
        t_one, _ = _timed_generate(llm, p2, 1)
        samples.append((t_long - t_one) / (out_tokens - 1))
    return statistics.median(samples), samples


def kernel_table(prof, steps_seen: int) -> list[dict]:
    """Per kernel name: launches and device microseconds per step, largest first."""
    import torch

    kernels: dict = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            k = kernels.setdefault(e.name[:90], [0, 0.0])
            k[0] += 1
            k[1] += e.device_time_total if hasattr(e, "device_time_total") else e.cuda_time_total
    rows = sorted(kernels.items(), key=lambda kv: -kv[1][1])
    return [{"name": n, "per_step": c / steps_seen, "us_per_step": t / steps_seen} for n, (c, t) in rows]


def _device_step_time(llm, iters=50, gr=None) -> float | None:
    """Pure device time of one batch-1 decode step: graph replay + logits + argmax."""
    import torch

    runner = llm.llm_engine.core.runner
    gr = gr or runner.graph_runner
    if gr is None:
        return None
    graph, out, _ = gr.graphs[(1, 1)]
    # A valid one-row decode over a 767-token context in blocks 1.. (no KV write).
    buf = runner.step_buffers
    ctx = PROMPT_LEN + OUTPUT_LEN - 1
    buf.fill_dummy(1)
    buf.sl[0] = ctx
    nblk = -(-ctx // runner.block_size)
    buf.bt[:nblk].copy_(torch.arange(1, nblk + 1, dtype=torch.int32, device="cuda"))
    buf.pos[0] = ctx - 1

    def step():
        graph.replay()
        with torch.inference_mode():
            runner.model.compute_logits(out[:1]).argmax(-1)

    for _ in range(5):
        step()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(iters):
        step()
    b.record()
    b.synchronize()
    return a.elapsed_time(b) / 1e3 / iters


def _variants(llm) -> dict:
    """Batch-1 device step with one knob changed, each in a freshly captured size-1 graph.

    Each is timed as ``_device_step_time``: one decode row over a 767-token context.
    """
    from octavo.attention.backends import triton_paged
    from octavo.models import fused_ops
    from octavo.worker.cuda_graph import GraphRunner

    runner = llm.llm_engine.core.runner
    res = {}

    def measure(name):
        gr = GraphRunner(runner, [1])
        gr.capture()
        res[name] = _device_step_time(llm, gr=gr)
        log(f"variant {name}: device step {res[name] * 1e3:.3f} ms")

    measure("default")
    fused_ops.ENABLED = False
    measure("unfused_norm_silu_rope")
    fused_ops.ENABLED = True
    old = triton_paged.SPLIT_MIN_SEQ_LEN
    triton_paged.SPLIT_MIN_SEQ_LEN = 1 << 30
    measure("no_split_kv")
    triton_paged.SPLIT_MIN_SEQ_LEN = old
    return res


def cmd_octavo(args) -> dict:
    import torch

    from octavo import LLM

    root = Path(args.model_root)
    model_dir = write_model_dir(args.shape, root)
    vocab = SHAPES[args.shape]["vocab_size"]
    t0 = time.perf_counter()
    llm = LLM(
        str(model_dir), load_format="dummy", dtype="bfloat16", max_model_len=1024,
        max_num_seqs=NUM_REQS, max_num_batched_tokens=8192, enable_prefix_caching=False,
        gpu_memory_utilization=0.85, enforce_eager=args.enforce_eager,
    )
    startup = time.perf_counter() - t0
    runner = llm.llm_engine.core.runner
    r = {"bench": "octavo", "shape": args.shape, "startup_s": startup,
         "load_s": runner.load_seconds, "weight_bytes": runner.model_bytes(),
         "attention": runner.attn_backend.name,
         "kv_cache_tokens": (runner.num_blocks - 1) * runner.block_size,
         "graphs": runner.graph_runner is not None}
    log("startup", r)
    # Warm up every kernel shape we will time (prefill chunks, decodes at all batch sizes).
    _timed_generate(llm, random_prompts(NUM_REQS, PROMPT_LEN, vocab, 99), 4)
    _timed_generate(llm, random_prompts(1, PROMPT_LEN, vocab, 98), 4)

    def phase(name, fn):
        try:
            fn()
        except Exception as e:  # keep the other numbers
            import traceback

            traceback.print_exc()
            r.setdefault("errors", {})[name] = repr(e)

    def batch1():
        tpot, samples = _decode_step_time(llm, 1, vocab, 1000, OUTPUT_LEN)
        r.update(tpot_b1_s=tpot, tpot_b1_samples=samples)
        log(f"batch-1 TPOT {tpot * 1e3:.3f} ms (samples {[round(s * 1e3, 3) for s in samples]})")

    def device_step():
        r["device_step_b1_s"] = _device_step_time(llm)
        log(f"batch-1 device step {r['device_step_b1_s']}")

    def throughput():
        # A first pass of the same shape (other prompts) compiles the Triton kernels its
        # prefill chunks and batch sizes use; the second is timed (as `octavo bench
        # throughput` warms up).
        warm, _ = _timed_generate(llm, random_prompts(NUM_REQS, PROMPT_LEN, vocab, 8), OUTPUT_LEN)
        prompts = random_prompts(NUM_REQS, PROMPT_LEN, vocab, 7)
        t, n = _timed_generate(llm, prompts, OUTPUT_LEN)
        r.update(throughput_s=t, throughput_tokens=n, throughput_tok_per_s=n / t, throughput_warmup_s=warm)
        log(f"throughput {n} tokens in {t:.2f}s = {n / t:.0f} tok/s (first pass {warm:.2f}s)")
        if args.bound:
            r["throughput_bound"] = throughput_bound(runner, r["weight_bytes"])
            log("bound", json.dumps(r["throughput_bound"]))

    def graphs_on_off():
        step32, _ = _decode_step_time(llm, 32, vocab, 2000, 64)
        r.update(step_b32_s=step32)
        if runner.graph_runner is None:
            return
        runner.graph_runner.enabled = False
        try:
            eager1, _ = _decode_step_time(llm, 1, vocab, 3000, 128)
            eager32, _ = _decode_step_time(llm, 32, vocab, 4000, 64)
        finally:
            runner.graph_runner.enabled = True
        graph1, _ = _decode_step_time(llm, 1, vocab, 5000, 128)
        r.update(eager_step_b1_s=eager1, eager_step_b32_s=eager32, graph_step_b1_s=graph1,
                 graph_speedup_b1=eager1 / graph1, graph_speedup_b32=eager32 / step32)
        log(f"graphs on/off: b1 {graph1 * 1e3:.3f} vs {eager1 * 1e3:.3f} ms, "
            f"b32 {step32 * 1e3:.3f} vs {eager32 * 1e3:.3f} ms")

    def variants():
        if runner.graph_runner is not None:
            r["device_step_variants_b1_s"] = _variants(llm)

    phases = {"batch1": batch1, "device_step": device_step, "throughput": throughput,
              "graphs_on_off": graphs_on_off, "variants": variants}
    for name in args.phases.split(","):
        phase(name, phases[name])
    r["max_memory_allocated"] = torch.cuda.max_memory_allocated()
    result(r)
    return r


def matmul_peak_flops() -> float:
    """bf16 dense matmul FLOP/s: 8192^3, median of 10 after warm-up."""
    import torch

    a = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")
    b = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")
    for _ in range(3):
        a @ b
    times = []
    for _ in range(10):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        a @ b
        e1.record()
        e1.synchronize()
        times.append(e0.elapsed_time(e1) / 1e3)
    return 2 * 8192**3 / statistics.median(times)


def throughput_bound(runner, weight_bytes: int) -> dict:
    """The NUM_REQS x (PROMPT_LEN in / OUTPUT_LEN out) workload's lower bound on time from this
    run's measured matmul peak and copy bandwidth: prefill = its matmul FLOPs (2 x non-embedding
    parameters per token, plus QK^T and PV over the causal prompt) / peak; each decode step =
    max(its FLOPs / peak, (streamed weights + the batch's KV cache read) / bandwidth)."""
    mc = runner.config.model_config
    hf = mc.hf_config
    emb = hf.vocab_size * hf.hidden_size * 2
    params = (weight_bytes - emb) / 2  # bf16; the LM head stays (it runs for every token)
    layers, heads, d = hf.num_hidden_layers, hf.num_attention_heads, mc.head_size
    kv_tok = 2 * layers * hf.num_key_value_heads * d * 2
    peak, (moved, copy_s) = matmul_peak_flops(), copy_bandwidth_s()
    bw = moved / copy_s
    attn_prefill = 2 * 2 * layers * heads * d * PROMPT_LEN * (PROMPT_LEN + 1) / 2  # QK^T + PV, causal
    prefill_s = NUM_REQS * (2 * params * PROMPT_LEN + attn_prefill) / peak
    decode_s = 0.0
    for i in range(OUTPUT_LEN):
        ctx = PROMPT_LEN + i
        flops = NUM_REQS * (2 * params + 2 * 2 * layers * heads * d * ctx)
        decode_s += max(flops / peak, (weight_bytes - emb + NUM_REQS * ctx * kv_tok) / bw)
    tokens = NUM_REQS * OUTPUT_LEN
    return {"matmul_peak_tflops": peak / 1e12, "copy_bandwidth_tbps": bw / 1e12, "prefill_s": prefill_s,
            "decode_s": decode_s, "bound_tok_per_s": tokens / (prefill_s + decode_s),
            "target_90pct_tok_per_s": 0.9 * tokens / (prefill_s + decode_s)}


def cmd_async(args) -> dict:
    """Batch-1 decode with async scheduling on vs off on one engine, against the roofline."""
    import torch

    from octavo import LLM, SamplingParams

    r: dict = {"bench": "async", "shape": args.shape}
    if torch.cuda.is_available():
        r["bandwidth_Bps"] = cmd_bandwidth(args)["bandwidth_Bps"]
        torch.cuda.empty_cache()
    model_dir = write_model_dir(args.shape, Path(args.model_root))
    vocab = SHAPES[args.shape]["vocab_size"]
    llm = LLM(str(model_dir), load_format="dummy", dtype="bfloat16" if torch.cuda.is_available() else "float32",
              max_model_len=1024, max_num_seqs=4, max_num_batched_tokens=2048, enable_prefix_caching=False,
              gpu_memory_utilization=0.85, enforce_eager=args.enforce_eager, async_scheduling=True)
    core = llm.llm_engine.core
    runner = core.runner
    r.update(weight_bytes=runner.model_bytes(), graphs=runner.graph_runner is not None)

    def mode(on: bool) -> None:
        assert core._inflight is None, "a step is still in flight"
        core.async_scheduling = on

    _timed_generate(llm, random_prompts(1, PROMPT_LEN, vocab, 98), 8)  # warm-up (compiles)
    mode(False)
    _timed_generate(llm, random_prompts(1, PROMPT_LEN, vocab, 97), 8)
    samples: dict[str, list[float]] = {"async": [], "sync": []}
    for rep in range(args.reps):
        for on in (True, False):
            mode(on)
            t, _ = _decode_step_time(llm, 1, vocab, 1000 + 10 * rep + on, args.output_len, reps=1)
            samples["async" if on else "sync"].append(t)
            log(f"rep {rep} async={on}: TPOT {t * 1e3:.3f} ms")
    for k, v in samples.items():
        r[f"tpot_b1_{k}_s"] = statistics.median(v)
        r[f"tpot_b1_{k}_samples"] = v
    if "bandwidth_Bps" in r:
        roof = r["weight_bytes"] / r["bandwidth_Bps"]
        r["roofline_s"] = roof
        for k in samples:
            r[f"tpot_b1_{k}_vs_roofline"] = r[f"tpot_b1_{k}_s"] / roof
    # Same greedy tokens in both modes (4 requests, mixed lengths, one stop token).
    prompts = [{"prompt_token_ids": p} for p in random_prompts(4, 64, vocab, 55)]
    params = [SamplingParams(temperature=0.0, max_tokens=m, ignore_eos=True, detokenize=False) for m in (40, 7, 33, 21)]
    toks = {}
    for on in (True, False):
        mode(on)
        toks[on] = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
    r["async_tokens_identical"] = toks[True] == toks[False]
    log(json.dumps(r))
    result(r)
    return r


# -- HuggingFace baselines ----------------------------------------------------------------
def _hf_model(shape: str, root: Path, attn: str | None = None):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    d = write_model_dir(shape, root)
    cfg = AutoConfig.from_pretrained(d)
    kw = {"attn_implementation": attn} if attn else {}
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16, **kw)
    if next(model.parameters()).device.type != "cuda":
        model = model.to("cuda")
    return model.eval()


def cmd_hf_generate(args) -> dict:
    import torch

    model = _hf_model(args.shape, Path(args.model_root))
    vocab = SHAPES[args.shape]["vocab_size"]
    kw = dict(do_sample=False, pad_token_id=0)
    with torch.no_grad():
        warm = torch.tensor(random_prompts(4, 32, vocab, 1), device="cuda")
        model.generate(warm, attention_mask=torch.ones_like(warm), max_new_tokens=4, **kw)
        ids = torch.tensor(random_prompts(NUM_REQS, PROMPT_LEN, vocab, 7), device="cuda")
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=OUTPUT_LEN,
                             min_new_tokens=OUTPUT_LEN, **kw)
        torch.cuda.synchronize()
        t = time.perf_counter() - t0
    n = (out.shape[1] - PROMPT_LEN) * out.shape[0]
    r = {"bench": "hf_generate", "shape": args.shape, "batch": NUM_REQS, "seconds": t,
         "tokens": n, "tok_per_s": n / t}
    result(r)
    return r


def cmd_hf_generate_batch(args) -> dict:
    import torch
    from transformers import GenerationConfig

    try:
        model = _hf_model(args.shape, Path(args.model_root), attn="sdpa_paged")
    except Exception as e:  # older/newer naming
        log("sdpa_paged unavailable:", e)
        model = _hf_model(args.shape, Path(args.model_root))
    vocab = SHAPES[args.shape]["vocab_size"]
    gc = GenerationConfig(max_new_tokens=OUTPUT_LEN, min_new_tokens=OUTPUT_LEN, do_sample=False,
                          eos_token_id=None, pad_token_id=0)
    with torch.no_grad():
        model.generate_batch(inputs=random_prompts(4, 32, vocab, 1),
                             generation_config=GenerationConfig(max_new_tokens=4, do_sample=False,
                                                                eos_token_id=None, pad_token_id=0))
        prompts = random_prompts(NUM_REQS, PROMPT_LEN, vocab, 7)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        outs = model.generate_batch(inputs=prompts, generation_config=gc)
        torch.cuda.synchronize()
        t = time.perf_counter() - t0
    n = sum(len(o.generated_tokens) for o in outs.values())
    r = {"bench": "hf_generate_batch", "shape": args.shape, "seconds": t, "tokens": n,
         "tok_per_s": n / t}
    result(r)
    return r


# -- orchestration ------------------------------------------------------------------------
def _sub(argv: list[str], timeout: float, logf) -> dict | None:
    cmd = [sys.executable, __file__, *argv]
    log("$", " ".join(cmd))
    t0 = time.perf_counter()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        logf.write(f"$ {' '.join(cmd)}\nTIMEOUT after {timeout}s\n{e.stdout or ''}{e.stderr or ''}\n")
        log(f"  timed out after {timeout:.0f}s")
        return {"timeout_s": timeout}
    logf.write(f"$ {' '.join(cmd)}\n{p.stdout}\n{p.stderr}\n")
    logf.flush()
    for line in p.stdout.splitlines():
        if line.startswith("RESULT "):
            log(f"  done in {time.perf_counter() - t0:.0f}s")
            return json.loads(line[7:])
    log(f"  failed (rc {p.returncode}): {p.stderr[-2000:]}")
    return None


def cmd_all(args) -> dict:
    out_dir = Path(args.out).parent
    out_dir.mkdir(parents=True, exist_ok=True)
    root = ["--model-root", args.model_root]
    res: dict = {}
    with open(out_dir / "bench_cuda.log", "a") as logf:
        res["bandwidth"] = _sub(["bandwidth"], 120, logf)
        for shape in args.shapes.split(","):
            res[f"octavo_{shape}"] = _sub(["octavo", "--shape", shape, *root], args.timeout, logf)
            if not args.skip_hf:
                res[f"hf_generate_{shape}"] = _sub(["hf-generate", "--shape", shape, *root], args.timeout, logf)
                res[f"hf_generate_batch_{shape}"] = _sub(
                    ["hf-generate-batch", "--shape", shape, *root], args.hf_batch_timeout, logf)
            Path(args.out).write_text(json.dumps(res, indent=1))
    summarize(res)
    return res


def summarize(res: dict) -> None:
    bw = (res.get("bandwidth") or {}).get("bandwidth_Bps")
    lines = []
    if bw:
        lines.append(f"copy bandwidth (read+write): {bw / 1e12:.2f} TB/s")
    for key, o in res.items():
        if not key.startswith("octavo_") or not o or "tpot_b1_s" not in o:
            continue
        shape = key.removeprefix("octavo_")
        wb = o["weight_bytes"]
        line = f"[{shape}] weights {wb / 1e9:.2f} GB; batch-1 TPOT {o['tpot_b1_s'] * 1e3:.3f} ms"
        if bw:
            roof = wb / bw
            line += f" vs roofline {roof * 1e3:.3f} ms = {o['tpot_b1_s'] / roof:.2f}x"
            if o.get("device_step_b1_s"):
                line += f" (device step {o['device_step_b1_s'] * 1e3:.3f} ms = {o['device_step_b1_s'] / roof:.2f}x)"
        lines.append(line)
        if "graph_speedup_b1" in o:
            lines.append(f"[{shape}] graphs on/off speedup: batch 1 {o['graph_speedup_b1']:.2f}x, "
                         f"batch 32 {o['graph_speedup_b32']:.2f}x")
        tput = o.get("throughput_tok_per_s")
        if tput:
            line = f"[{shape}] throughput 128x(512/256): {tput:.0f} tok/s"
            for base in ("hf_generate", "hf_generate_batch"):
                b = res.get(f"{base}_{shape}") or {}
                if b.get("tok_per_s"):
                    line += f"; {base} {b['tok_per_s']:.0f} tok/s -> {tput / b['tok_per_s']:.1f}x"
                elif b.get("timeout_s"):
                    lim = NUM_REQS * OUTPUT_LEN / b["timeout_s"]
                    line += f"; {base} timed out at {b['timeout_s']:.0f}s (< {lim:.0f} tok/s -> > {tput / lim:.1f}x)"
            lines.append(line)
    print("\n".join(lines), flush=True)


def cmd_summary(args) -> dict:
    """Rebuild the summary table from logs holding ``RESULT`` lines (one run per file)."""
    res: dict = {}
    for path in args.logs:
        for line in Path(path).read_text().splitlines():
            if line.startswith("RESULT "):
                d = json.loads(line[7:])
                key = d["bench"] + (f"_{d['shape']}" if "shape" in d else "")
                res[key] = d
    summarize(res)
    if args.out:
        Path(args.out).write_text(json.dumps(res, indent=1))
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("summary")
    p.add_argument("logs", nargs="+")
    p.add_argument("--out", default=None)
    for name in ("bandwidth", "kernels", "octavo", "hf-generate", "hf-generate-batch", "all", "async"):
        p = sub.add_parser(name)
        p.add_argument("--shape", default="llama8b", choices=sorted(SHAPES))
        p.add_argument("--model-root", default=os.path.join(tempfile.gettempdir(), "octavo_bench_models"))
        p.add_argument("--enforce-eager", action="store_true")
        if name == "all":
            p.add_argument("--shapes", default="llama8b,qwen05b")
            p.add_argument("--out", default="bench_cuda.json")
            p.add_argument("--timeout", type=float, default=300)
            p.add_argument("--hf-batch-timeout", type=float, default=150)
            p.add_argument("--skip-hf", action="store_true")
        if name == "octavo":
            p.add_argument("--phases", default="batch1,device_step,throughput,graphs_on_off,variants",
                           help="comma-separated subset, in order")
            p.add_argument("--bound", action="store_true",
                           help="with the throughput phase: its bound from measured matmul peak and bandwidth")
        if name == "async":
            p.add_argument("--reps", type=int, default=3)
            p.add_argument("--output-len", type=int, default=OUTPUT_LEN)
    args = ap.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    if args.cmd in ("octavo", "async"):
        from octavo.logger import configure_logging

        configure_logging()  # the startup lines: memory profile, graph capture, KV tokens
    fn = {"bandwidth": cmd_bandwidth, "kernels": cmd_kernels, "octavo": cmd_octavo,
          "hf-generate": cmd_hf_generate, "hf-generate-batch": cmd_hf_generate_batch,
          "all": cmd_all, "summary": cmd_summary, "async": cmd_async}[args.cmd]
    fn(args)


if __name__ == "__main__":
    main()
