#!/usr/bin/env python3
"""octavo and llama.cpp side by side, batch 1, on the same checkpoint and thread count.

Stages (``--stages``, default all of them, each safe to re-run):

- ``model``: a HF checkpoint with SmolLM2-135M's shape and random bf16 weights from a fixed
  seed (``tools/make_smol_config.py --random-weights``), unless ``--model`` names one.
- ``fetch``: ``pip download`` the ``llama-cpp-python`` sdist from the package index (it vendors
  llama.cpp) and unpack it.
- ``build``: CMake + Ninja, ``-DGGML_NATIVE=ON``, only ``llama-bench`` and ``llama-completion``
  (the latter prints ggml's ``system_info``: the ISA paths llama.cpp uses on this machine).
- ``convert``: ``convert_hf_to_gguf.py`` from that tree to a ``--outtype`` GGUF (bf16 default).
  A tokenizer trained from scratch has a BPE pre-tokenizer hash the converter does not know; the
  local copy maps an unknown hash to ``gpt-2`` (byte-level BPE with the GPT-2 split regex).
- ``bench``: ``--rounds`` interleaved rounds of ``llama-bench`` (pp = ``--input-len`` prompt
  tokens; tg = ``--output-len`` tokens after a ``--input-len`` context: ``-d``) and
  ``octavo bench latency`` (batch 1, same lengths, ``--threads``), then per-round ratios and
  their medians: octavo TPOT / llama.cpp time per generated token, octavo TTFT / llama.cpp
  prompt time. The load average before each round is recorded: other work on the machine
  moves every figure, the same-round ratio much less.

Example (about 4 minutes of both cores for the build, once)::

    python benchmarks/bench_llamacpp.py --work ~/.cache/octavo-llamacpp --threads 2 --rounds 3 \\
        --json-out llamacpp_vs_octavo.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tarfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LCP_VERSION = "0.3.36"  # llama-cpp-python; vendors llama.cpp 0c1e57098
PATCH_OLD = 'raise NotImplementedError("BPE pre-tokenizer was not recognized - update get_vocab_base_pre()")'
PATCH_NEW = 'res = "gpt-2"  # octavo bench patch: unknown byte-level BPE pre-tokenizer -> GPT-2 split'


def sh(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    print("+", " ".join(map(str, cmd)), flush=True)
    return subprocess.run(list(map(str, cmd)), check=True, **kw)


def stage_model(args) -> None:
    if (Path(args.model) / "config.json").exists():
        return
    sh([sys.executable, ROOT / "tools" / "make_smol_config.py", "--out", args.model, "--random-weights"])


def src_dir(args) -> Path:
    return Path(args.work) / f"llama_cpp_python-{args.lcp_version}" / "vendor" / "llama.cpp"


def stage_fetch(args) -> None:
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    sdist = work / f"llama_cpp_python-{args.lcp_version}.tar.gz"
    if not sdist.exists():
        sh([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
            f"llama-cpp-python=={args.lcp_version}", "-d", work])
    if not (src_dir(args) / "CMakeLists.txt").exists():
        with tarfile.open(sdist) as tf:
            tf.extractall(work, filter="data")


def stage_build(args) -> None:
    build = Path(args.work) / "build"
    sh(["cmake", "-S", src_dir(args), "-B", build, "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release",
        "-DGGML_NATIVE=ON", "-DGGML_CUDA=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_SERVER=OFF",
        "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_CURL=OFF", "-DLLAMA_OPENSSL=OFF"], stdout=subprocess.DEVNULL)
    sh(["cmake", "--build", build, "--config", "Release", f"-j{args.jobs}",
        "--target", "llama-bench", "llama-completion"])


def gguf_path(args) -> Path:
    return Path(args.work) / f"{Path(args.model).name}-{args.outtype}.gguf"


def stage_convert(args) -> None:
    src = src_dir(args)
    base = src / "conversion" / "base.py"
    target = base if base.exists() else src / "convert_hf_to_gguf.py"
    text = target.read_text()
    if PATCH_NEW not in text and PATCH_OLD in text:
        target.write_text(text.replace(PATCH_OLD, PATCH_NEW))
    env = {**os.environ, "PYTHONPATH": str(src / "gguf-py")}
    sh([sys.executable, src / "convert_hf_to_gguf.py", args.model, "--outtype", args.outtype,
        "--outfile", gguf_path(args)], env=env, cwd=src)


def llama_bench(args) -> dict[str, float]:
    binary = Path(args.work) / "build" / "bin" / "llama-bench"
    out = {}
    for label, extra in (("pp", ["-p", args.input_len, "-n", 0]),
                         ("tg", ["-p", 0, "-n", args.output_len, "-d", args.input_len])):
        r = sh([binary, "-m", gguf_path(args), "-t", args.threads, "-r", args.llama_reps, "-o", "json", *extra],
               capture_output=True, text=True)
        row = json.loads(r.stdout)[0]
        n = args.input_len if label == "pp" else args.output_len
        out[f"{label}_ms"] = row["avg_ns"] / 1e6  # the whole test: n tokens
        out[f"{label}_ms_per_token"] = row["avg_ns"] / 1e6 / n
    return out


def octavo_latency(args, path: Path) -> dict[str, float]:
    sh([sys.executable, "-m", "octavo.entrypoints.cli", "bench", "latency", "--model", args.model,
        "--batch-size", 1, "--input-len", args.input_len, "--output-len", args.output_len,
        "--threads", args.threads, "--num-iters-warmup", 1, "--num-iters", args.octavo_iters,
        "--max-model-len", args.input_len + args.output_len, "--max-num-seqs", 1,
        "--disable-tqdm", "--output-json", path, *args.octavo_args],
       env={**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"},
       stdout=subprocess.DEVNULL)
    s = json.loads(path.read_text())["results"]["octavo"]["summary"]
    return {"ttft_ms": s["median_ttft_ms"], "tpot_ms": s["median_tpot_ms"]}


def system_info(args) -> str:
    binary = Path(args.work) / "build" / "bin" / "llama-completion"
    r = subprocess.run([str(binary), "-m", str(gguf_path(args)), "-t", str(args.threads), "-p", "hello",
                        "-n", "4", "--temp", "0", "-no-cnv", "--no-warmup"],
                       capture_output=True, text=True, stdin=subprocess.DEVNULL)
    return next((ln.strip() for ln in (r.stdout + r.stderr).splitlines() if "system_info" in ln), "")


def stage_bench(args) -> dict:
    rounds = []
    for i in range(args.rounds):
        load = os.getloadavg()[0]
        lc = llama_bench(args)
        oc = octavo_latency(args, Path(args.work) / f"octavo-latency-r{i}.json")
        r = {"round": i, "load_avg_1m": load, "llamacpp": lc, "octavo": oc,
             "tpot_ratio": oc["tpot_ms"] / lc["tg_ms_per_token"], "ttft_ratio": oc["ttft_ms"] / lc["pp_ms"]}
        rounds.append(r)
        print(f"round {i} (load {load:.1f}): octavo TPOT {oc['tpot_ms']:.2f} ms vs llama.cpp "
              f"{lc['tg_ms_per_token']:.2f} ms/token ({r['tpot_ratio']:.2f}x); TTFT {oc['ttft_ms']:.1f} ms vs "
              f"prompt {lc['pp_ms']:.1f} ms ({r['ttft_ratio']:.2f}x)", flush=True)
    report = {
        "model": args.model, "gguf": str(gguf_path(args)), "threads": args.threads,
        "input_len": args.input_len, "output_len": args.output_len, "llamacpp_version": args.lcp_version,
        "system_info": system_info(args), "rounds": rounds,
        "median_tpot_ratio": statistics.median(r["tpot_ratio"] for r in rounds),
        "median_ttft_ratio": statistics.median(r["ttft_ratio"] for r in rounds),
    }
    print(f"median ratios (octavo / llama.cpp {args.outtype}): TPOT {report['median_tpot_ratio']:.2f}x, "
          f"TTFT {report['median_ttft_ratio']:.2f}x; {report['system_info']}")
    return report


STAGES = {"model": stage_model, "fetch": stage_fetch, "build": stage_build, "convert": stage_convert}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work", default=str(Path.home() / ".cache" / "octavo-llamacpp"),
                   help="sdist, build tree, GGUF and logs (outside any repository)")
    p.add_argument("--model", default=None, help="HF checkpoint folder (default: <work>/smol-135m, made here)")
    p.add_argument("--stages", default="model,fetch,build,convert,bench")
    p.add_argument("--lcp-version", default=LCP_VERSION)
    p.add_argument("--outtype", default="bf16", choices=["bf16", "f16", "f32", "q8_0"])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--jobs", type=int, default=2, help="parallel compile jobs")
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--llama-reps", type=int, default=3, help="llama-bench -r")
    p.add_argument("--octavo-iters", type=int, default=3)
    p.add_argument("--octavo-args", nargs=argparse.REMAINDER, default=[],
                   help="extra `octavo bench latency` flags (last on the command line)")
    p.add_argument("--json-out", default=None)
    args = p.parse_args()
    args.model = args.model or str(Path(args.work) / "smol-135m")
    stages = args.stages.split(",")
    unknown = set(stages) - {*STAGES, "bench"}
    if unknown:
        p.error(f"unknown stages {sorted(unknown)}; known: {', '.join([*STAGES, 'bench'])}")
    t0 = time.perf_counter()
    for s in stages:
        if s in STAGES:
            STAGES[s](args)
            print(f"stage {s} done at {time.perf_counter() - t0:.0f}s", flush=True)
    if "bench" in stages:
        report = stage_bench(args)
        if args.json_out:
            Path(args.json_out).write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
