#!/usr/bin/env python3
"""octavo and llama.cpp side by side, batch 1, on the same checkpoint and thread count.

Stages (``--stages``, default all of them, each safe to re-run):

- ``model``: a HF checkpoint with SmolLM2-135M's shape and random bf16 weights from a fixed
  seed (``tools/make_smol_config.py --random-weights``), unless ``--model`` names one.
- ``fetch``: ``pip download`` the ``llama-cpp-python`` sdist from the package index (it vendors
  llama.cpp) and unpack it.
- ``build``: CMake + Ninja, ``-DGGML_NATIVE=ON``, only ``llama-bench``, ``llama-quantize`` and
  ``llama-completion`` (the latter prints ggml's ``system_info``: the ISA paths llama.cpp uses on
  this machine). On an AMX CPU, ggml's AMX kernels crash (SIGILL) when built with GCC 12 (its
  ``_tile_loadconfig`` loses the tile configuration); the local copy names the whole operand.
- ``convert``: one GGUF per ``--types`` entry. ``bf16`` / ``f16`` / ``q8_0`` come straight from
  ``convert_hf_to_gguf.py`` of that tree; ``q4_0`` (and other k-less types) from ``llama-quantize``
  of the bf16 GGUF. A tokenizer trained from scratch has a BPE pre-tokenizer hash the converter
  does not know; the local copy maps an unknown hash to ``gpt-2`` (byte-level BPE with the GPT-2
  split regex).
- ``octavo-int4``: for ``q4_0``, octavo's counterpart: a ``compressed-tensors`` W4A16 copy of the
  checkpoint (symmetric, groups of 32 like ``q4_0``; the tied embedding / lm_head stays bf16).
- ``bench``: ``--rounds`` interleaved rounds; in each, per type, ``llama-bench`` (pp =
  ``--input-len`` prompt tokens; tg = ``--output-len`` tokens after a ``--input-len`` context:
  ``-d``) then ``octavo bench latency`` of the counterpart (batch 1, same lengths,
  ``--threads``): bf16 -> the bf16 checkpoint, q8_0 -> ``--quantization int8`` (online
  weight-only, per channel), q4_0 -> the W4A16 copy; with ``--octavo-a8`` the q8_0 / q4_0
  counterparts run a second time with int8 activations (``OCTAVO_CPU_INT8_ACTIVATIONS=1``: the
  numerics llama.cpp's q8_0 / q4_0 use); with ``--octavo-int8-lm-head`` once more with the output
  projection in INT8 too (``OCTAVO_CPU_INT8_LM_HEAD=1``: llama.cpp's q8_0 / q4_0 files quantize
  it, q8_0 / q6_K). Per-round ratios and their medians:
  octavo TPOT / llama.cpp time per generated token, octavo TTFT / llama.cpp prompt time. The load
  average before each measurement is recorded: other work on the machine moves every figure, the
  same-round ratio much less. ggml's ``system_info`` line and the CPU's flags go in the report.

Example (about 4 minutes of both cores for the build, once)::

    python benchmarks/bench_llamacpp.py --work ~/.cache/octavo-llamacpp --threads 2 --rounds 3 \\
        --types bf16,q8_0,q4_0 --json-out llamacpp_vs_octavo.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tarfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LCP_VERSION = "0.3.36"  # llama-cpp-python; vendors llama.cpp 0c1e57098
# (old, new) edits of the sdist's converter (conversion/base.py): an unknown byte-level BPE
# pre-tokenizer is GPT-2's split; the sentencepiece import waits until a tokenizer.model exists
# (a byte-level BPE checkpoint then falls through to the HF / GPT-2 vocab without that package).
SP_IMPORT = "        from sentencepiece import SentencePieceProcessor\n"
SP_CHECK = ("        if not tokenizer_path.is_file():\n"
            "            raise FileNotFoundError(f\"File not found: {tokenizer_path}\")\n")
# GCC 12's _tile_loadconfig tells the compiler it reads only 8 bytes of the 64-byte tile config,
# so the stores of the rows / column widths are dropped and ggml's AMX kernels (q8_0, q4_0 batches)
# die with SIGILL on the first tile instruction. The asm below names the whole config.
AMX_PATCH = ("ggml/src/ggml-cpu/amx/mmq.cpp", "    _tile_loadconfig(&tc);\n",
             '    __asm__ volatile("ldtilecfg %0" :: "m"(tc));  // octavo bench patch: GCC 12 drops tc\n')
CONVERTER_PATCHES = (
    ('raise NotImplementedError("BPE pre-tokenizer was not recognized - update get_vocab_base_pre()")',
     'res = "gpt-2"  # octavo bench patch: unknown byte-level BPE pre-tokenizer -> GPT-2 split'),
    (SP_IMPORT + "\n        tokenizer_path = self.dir_model / 'tokenizer.model'\n\n" + SP_CHECK,
     "        tokenizer_path = self.dir_model / 'tokenizer.model'\n\n" + SP_CHECK + SP_IMPORT),
)
CONVERTER_TYPES = ("bf16", "f16", "f32", "q8_0")  # convert_hf_to_gguf.py --outtype; others: llama-quantize
INT4_GROUP = 32  # q4_0's block


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


def patch_file(path: Path, old: str, new: str) -> None:
    """Replace ``old`` by ``new`` once in ``path`` (idempotent); exit naming the file if neither is there."""
    text = path.read_text()
    if new in text:
        return
    if old not in text:
        raise SystemExit(f"{path}: source changed, patch site not found:\n{old}")
    path.write_text(text.replace(old, new, 1))


def stage_build(args) -> None:
    build = Path(args.work) / "build"
    rel, old, new = AMX_PATCH
    patch_file(src_dir(args) / rel, old, new)
    sh(["cmake", "-S", src_dir(args), "-B", build, "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release",
        "-DGGML_NATIVE=ON", "-DGGML_CUDA=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_SERVER=OFF",
        "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_CURL=OFF", "-DLLAMA_OPENSSL=OFF"], stdout=subprocess.DEVNULL)
    sh(["cmake", "--build", build, "--config", "Release", f"-j{args.jobs}",
        "--target", "llama-bench", "llama-quantize", "llama-completion"])


def gguf_path(args, gtype: str) -> Path:
    return Path(args.work) / f"{Path(args.model).name}-{gtype}.gguf"


def int4_model(args) -> Path:
    return Path(args.work) / f"{Path(args.model).name}-w4a16-g{INT4_GROUP}"


def stage_convert(args) -> None:
    src = src_dir(args)
    base = src / "conversion" / "base.py"
    target = base if base.exists() else src / "convert_hf_to_gguf.py"
    for old, new in CONVERTER_PATCHES:
        patch_file(target, old, new)
    env = {**os.environ, "PYTHONPATH": str(src / "gguf-py")}
    # the converter's types first: the others are llama-quantize'd from the bf16 GGUF
    needed = [t for t in args.types if t in CONVERTER_TYPES]
    if any(t not in CONVERTER_TYPES for t in args.types) and "bf16" not in needed:
        needed.append("bf16")
    for t in needed:
        if not gguf_path(args, t).exists():
            sh([sys.executable, src / "convert_hf_to_gguf.py", args.model, "--outtype", t,
                "--outfile", gguf_path(args, t)], env=env, cwd=src)
    quantize = Path(args.work) / "build" / "bin" / "llama-quantize"
    for t in args.types:
        if t not in CONVERTER_TYPES and not gguf_path(args, t).exists():
            sh([quantize, gguf_path(args, "bf16"), gguf_path(args, t), t.upper(), args.threads])


def stage_octavo_int4(args) -> None:
    """The W4A16 (g32, symmetric) compressed-tensors copy octavo runs against q4_0."""
    if "q4_0" not in args.types or (int4_model(args) / "config.json").exists():
        return
    sys.path.insert(0, str(ROOT))
    from tests.quantization.writers import ct_weight_only  # the on-disk layout the tests check

    tmp = int4_model(args).with_name(int4_model(args).name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    ct_weight_only(args.model, tmp, bits=4, group=INT4_GROUP, sym=True)
    tmp.rename(int4_model(args))


def llama_bench(args, gtype: str) -> dict[str, float]:
    binary = Path(args.work) / "build" / "bin" / "llama-bench"
    out = {}
    for label, extra in (("pp", ["-p", args.input_len, "-n", 0]),
                         ("tg", ["-p", 0, "-n", args.output_len, "-d", args.input_len])):
        r = sh([binary, "-m", gguf_path(args, gtype), "-t", args.threads, "-r", args.llama_reps, "-o", "json",
                *extra, *args.llama_args], capture_output=True, text=True)
        row = json.loads(r.stdout)[0]
        n = args.input_len if label == "pp" else args.output_len
        out[f"{label}_ms"] = row["avg_ns"] / 1e6  # the whole test: n tokens
        out[f"{label}_ms_per_token"] = row["avg_ns"] / 1e6 / n
    return out


def octavo_counterpart(args, gtype: str) -> tuple[str, list[str]]:
    """(model folder, extra flags) of the octavo run compared with llama.cpp's ``gtype``."""
    if gtype in ("bf16", "f16", "f32"):
        return args.model, ["--dtype", {"bf16": "bfloat16", "f16": "float16", "f32": "float32"}[gtype]]
    if gtype == "q8_0":
        return args.model, ["--dtype", "bfloat16", "--quantization", "int8"]
    if gtype == "q4_0":
        return str(int4_model(args)), ["--dtype", "bfloat16"]
    raise ValueError(f"no octavo counterpart for llama.cpp type {gtype!r}")


def octavo_latency(args, gtype: str, path: Path, a8: bool = False, lm8: bool = False) -> dict[str, float]:
    """octavo's medians; ``a8``: with OCTAVO_CPU_INT8_ACTIVATIONS=1 (int8 activations, like q8_0 / q4_0);
    ``lm8``: with OCTAVO_CPU_INT8_LM_HEAD=1 (the output projection in INT8, like their files)."""
    model, flags = octavo_counterpart(args, gtype)
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           "OCTAVO_CPU_INT8_ACTIVATIONS": "1" if a8 else "0", "OCTAVO_CPU_INT8_LM_HEAD": "1" if lm8 else "0"}
    sh([sys.executable, "-m", "octavo.entrypoints.cli", "bench", "latency", "--model", model,
        "--batch-size", 1, "--input-len", args.input_len, "--output-len", args.output_len,
        "--threads", args.threads, "--num-iters-warmup", 1, "--num-iters", args.octavo_iters,
        "--max-model-len", args.input_len + args.output_len, "--max-num-seqs", 1,
        "--disable-tqdm", "--output-json", path, *flags, *args.octavo_args],
       env=env, stdout=subprocess.DEVNULL)
    s = json.loads(path.read_text())["results"]["octavo"]["summary"]
    return {"ttft_ms": s["median_ttft_ms"], "tpot_ms": s["median_tpot_ms"]}


def cpu_flags() -> str:
    """The CPU model and feature flags (``lscpu``, else /proc/cpuinfo), for the report."""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        rows = dict(ln.split(":", 1) for ln in out.splitlines() if ":" in ln)
        return f"{rows.get('Model name', '').strip()}; flags: {rows.get('Flags', '').strip()}"
    except (OSError, subprocess.CalledProcessError):
        return platform.processor()


def system_info(args) -> str:
    binary = Path(args.work) / "build" / "bin" / "llama-completion"
    r = subprocess.run([str(binary), "-m", str(gguf_path(args, args.types[0])), "-t", str(args.threads),
                        "-p", "hello",
                        "-n", "4", "--temp", "0", "-no-cnv", "--no-warmup"],
                       capture_output=True, text=True, stdin=subprocess.DEVNULL)
    return next((ln.strip() for ln in (r.stdout + r.stderr).splitlines() if "system_info" in ln), "")


def bench_round(args, i: int) -> dict:
    """One round: per type, llama.cpp then octavo's counterpart, back to back."""
    per = {}
    for t in args.types:
        load = os.getloadavg()[0]
        lc = llama_bench(args, t)
        oc = octavo_latency(args, t, Path(args.work) / f"octavo-latency-{t}-r{i}.json")
        per[t] = {"load_avg_1m": load, "llamacpp": lc, "octavo": oc,
                  "tpot_ratio": oc["tpot_ms"] / lc["tg_ms_per_token"], "ttft_ratio": oc["ttft_ms"] / lc["pp_ms"]}
        print(f"round {i} {t} (load {load:.1f}): octavo TPOT {oc['tpot_ms']:.2f} ms vs llama.cpp "
              f"{lc['tg_ms_per_token']:.2f} ms/token ({per[t]['tpot_ratio']:.2f}x); TTFT {oc['ttft_ms']:.1f} ms "
              f"vs prompt {lc['pp_ms']:.1f} ms ({per[t]['ttft_ratio']:.2f}x)", flush=True)
        if args.octavo_a8 and t in ("q8_0", "q4_0"):
            o8 = octavo_latency(args, t, Path(args.work) / f"octavo-latency-{t}-a8-r{i}.json", a8=True)
            per[t].update(octavo_a8=o8, tpot_ratio_a8=o8["tpot_ms"] / lc["tg_ms_per_token"],
                          ttft_ratio_a8=o8["ttft_ms"] / lc["pp_ms"])
            print(f"round {i} {t} int8 activations: octavo TPOT {o8['tpot_ms']:.2f} ms "
                  f"({per[t]['tpot_ratio_a8']:.2f}x); TTFT {o8['ttft_ms']:.1f} ms ({per[t]['ttft_ratio_a8']:.2f}x)",
                  flush=True)
        if args.octavo_int8_lm_head and t in ("q8_0", "q4_0"):
            ol = octavo_latency(args, t, Path(args.work) / f"octavo-latency-{t}-lm8-r{i}.json", lm8=True)
            per[t].update(octavo_lm8=ol, tpot_ratio_lm8=ol["tpot_ms"] / lc["tg_ms_per_token"],
                          ttft_ratio_lm8=ol["ttft_ms"] / lc["pp_ms"])
            print(f"round {i} {t} INT8 lm_head: octavo TPOT {ol['tpot_ms']:.2f} ms "
                  f"({per[t]['tpot_ratio_lm8']:.2f}x); TTFT {ol['ttft_ms']:.1f} ms ({per[t]['ttft_ratio_lm8']:.2f}x)",
                  flush=True)
    return {"round": i, "types": per}


def summary(rounds: list[dict], t: str) -> dict[str, float]:
    rs = [r["types"][t] for r in rounds]

    def med(f) -> float:
        return statistics.median(f(r) for r in rs)

    extra = {}
    for v in ("a8", "lm8"):
        if f"octavo_{v}" in rs[0]:
            extra |= {f"octavo_{v}_tpot_ms": med(lambda r, v=v: r[f"octavo_{v}"]["tpot_ms"]),
                      f"median_tpot_ratio_{v}": med(lambda r, v=v: r[f"tpot_ratio_{v}"]),
                      f"median_ttft_ratio_{v}": med(lambda r, v=v: r[f"ttft_ratio_{v}"])}
    return extra | {
        "octavo_tpot_ms": med(lambda r: r["octavo"]["tpot_ms"]),
        "llamacpp_tg_ms_per_token": med(lambda r: r["llamacpp"]["tg_ms_per_token"]),
        "median_tpot_ratio": med(lambda r: r["tpot_ratio"]),
        "octavo_ttft_ms": med(lambda r: r["octavo"]["ttft_ms"]),
        "llamacpp_pp_ms": med(lambda r: r["llamacpp"]["pp_ms"]),
        "median_ttft_ratio": med(lambda r: r["ttft_ratio"]),
        "load_avg_1m": med(lambda r: r["load_avg_1m"]),
    }


def stage_bench(args) -> dict:
    info = system_info(args)
    rounds = [bench_round(args, i) for i in range(args.rounds)]
    report = {
        "model": args.model, "ggufs": {t: str(gguf_path(args, t)) for t in args.types}, "threads": args.threads,
        "input_len": args.input_len, "output_len": args.output_len, "llamacpp_version": args.lcp_version,
        "system_info": info, "cpu": cpu_flags(), "rounds": rounds,
        "summary": {t: summary(rounds, t) for t in args.types},
    }
    print(f"llama.cpp {info}")
    print(f"{'type':>6} {'octavo TPOT':>12} {'llama.cpp':>10} {'ratio':>6} {'octavo TTFT':>12} {'llama.cpp pp':>13} "
          f"{'ratio':>6} (medians over {args.rounds} rounds)")
    for t, m in report["summary"].items():
        print(f"{t:>6} {m['octavo_tpot_ms']:10.2f}ms {m['llamacpp_tg_ms_per_token']:8.2f}ms "
              f"{m['median_tpot_ratio']:5.2f}x {m['octavo_ttft_ms']:10.1f}ms {m['llamacpp_pp_ms']:11.1f}ms "
              f"{m['median_ttft_ratio']:5.2f}x")
        for v, env in (("a8", "OCTAVO_CPU_INT8_ACTIVATIONS"), ("lm8", "OCTAVO_CPU_INT8_LM_HEAD")):
            if f"median_tpot_ratio_{v}" in m:
                print(f"{t + '+' + v:>8} {m[f'octavo_{v}_tpot_ms']:8.2f}ms {'':>10} {m[f'median_tpot_ratio_{v}']:5.2f}x "
                      f"{'':>12} {'':>13} {m[f'median_ttft_ratio_{v}']:5.2f}x  ({env}=1)")
    return report


STAGES = {"model": stage_model, "fetch": stage_fetch, "build": stage_build, "convert": stage_convert,
          "octavo-int4": stage_octavo_int4}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work", default=str(Path.home() / ".cache" / "octavo-llamacpp"),
                   help="sdist, build tree, GGUF and logs (outside any repository)")
    p.add_argument("--model", default=None, help="HF checkpoint folder (default: <work>/smol-135m, made here)")
    p.add_argument("--stages", default="model,fetch,build,convert,octavo-int4,bench")
    p.add_argument("--lcp-version", default=LCP_VERSION)
    p.add_argument("--types", default="bf16,q8_0,q4_0",
                   help="llama.cpp GGUF types, each against its octavo counterpart (bf16 f16 f32 q8_0 q4_0)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--jobs", type=int, default=2, help="parallel compile jobs")
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--llama-reps", type=int, default=3, help="llama-bench -r")
    p.add_argument("--llama-args", nargs="*", default=[],
                   help="extra llama-bench flags, e.g. --poll 0 (its threads sleep instead of spinning "
                        "while they wait: on a machine shared with other work, spinning threads starve)")
    p.add_argument("--octavo-iters", type=int, default=3)
    p.add_argument("--octavo-args", nargs=argparse.REMAINDER, default=[],
                   help="extra `octavo bench latency` flags (last on the command line)")
    p.add_argument("--octavo-a8", action="store_true",
                   help="q8_0 / q4_0: also run octavo with OCTAVO_CPU_INT8_ACTIVATIONS=1 (int8 activations, "
                        "llama.cpp's numerics) in the same round")
    p.add_argument("--octavo-int8-lm-head", action="store_true",
                   help="q8_0 / q4_0: also run octavo with OCTAVO_CPU_INT8_LM_HEAD=1 (the output projection in "
                        "INT8, as llama.cpp's files have it) in the same round")
    p.add_argument("--json-out", default=None)
    args = p.parse_args()
    args.model = args.model or str(Path(args.work) / "smol-135m")
    args.types = args.types.split(",")
    bad = [t for t in args.types if t not in ("bf16", "f16", "f32", "q8_0", "q4_0")]
    if bad:
        p.error(f"--types: no octavo counterpart for {bad}; known: bf16, f16, f32, q8_0, q4_0")
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
