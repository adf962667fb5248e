"""Shared reporting: environment capture, percentiles, tables, ``--output-json``, ``--compare``.

Every report is one JSON object::

    {"benchmark": "throughput" | "latency" | "serve",
     "config": {every flag},
     "environment": {octavo/torch/transformers versions, platform, attention backend, CPU/GPU},
     "results": {"octavo": {...}, "hf": {...}} (or {"serve": {...}} / {"sweep": [...]}),
     "ratios": {"octavo_vs_hf": {metric: octavo / hf}}}   # only when both ran

``--compare baseline.json`` flattens both reports to dotted numeric keys and prints
baseline, current and current / baseline for every key they share.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform as _py_platform
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np


def percentiles(values: Sequence[float], prefix: str, scale: float = 1.0) -> dict[str, float]:
    """mean / median / p90 / p99 / min / max of ``values`` times ``scale``, keys ``{prefix}_*``."""
    if len(values) == 0:
        return {}
    a = np.asarray(values, dtype=np.float64) * scale
    return {
        f"mean_{prefix}": float(a.mean()),
        f"median_{prefix}": float(np.median(a)),
        f"p90_{prefix}": float(np.percentile(a, 90)),
        f"p99_{prefix}": float(np.percentile(a, 99)),
        f"min_{prefix}": float(a.min()),
        f"max_{prefix}": float(a.max()),
        f"std_{prefix}": float(a.std()),
    }


def _git_commit() -> str | None:
    root = Path(__file__).resolve().parents[2]
    if not (root / ".git").exists():
        return None
    try:
        out = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--short", "HEAD"],
            capture_output=True, text=True, timeout=5,
        )
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def cpu_name() -> str:
    from octavo.platforms.cpu import CpuPlatform

    return CpuPlatform.get_device_name()


def collect_environment(extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """Versions and hardware, for every report. ``extra`` adds engine facts (attention backend)."""
    import torch

    from octavo import __version__

    env: dict[str, Any] = {
        "octavo_version": __version__,
        "git_commit": _git_commit(),
        "python": _py_platform.python_version(),
        "os": _py_platform.platform(),
        "torch_version": torch.__version__,
        "torch_num_threads": torch.get_num_threads(),
        "cpu": cpu_name(),
        "cpu_count": os.cpu_count(),
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    try:
        import transformers

        env["transformers_version"] = transformers.__version__
    except ImportError:  # pragma: no cover - transformers is a core dependency
        pass
    try:
        env["cpu_capability"] = torch.backends.cpu.get_cpu_capability()
    except Exception:  # noqa: BLE001 - older torch
        pass
    try:
        from octavo.platforms import current_platform

        env["platform"] = current_platform.name
        env["device"] = current_platform.get_device_name()
        if not current_platform.device_is_host():
            env["gpu"] = env["device"]
            env["gpu_count"] = current_platform.device_count()
    except Exception as e:  # noqa: BLE001 - a report must still be written
        env["platform"] = f"unresolved: {e}"
    if hasattr(os, "getloadavg"):
        env["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    for key in ("OMP_NUM_THREADS", "OCTAVO_CPU_KVCACHE_SPACE", "OCTAVO_ATTENTION_BACKEND",
                "OCTAVO_CPU_THREADS_BIND", "OCTAVO_PLATFORM"):
        if key in os.environ:
            env[key] = os.environ[key]
    if extra:
        env.update(extra)
    return env


def engine_facts(llm_engine: Any) -> dict[str, Any]:
    """What the engine chose: attention backend, dtype, block size, KV cache size."""
    facts: dict[str, Any] = {}
    try:
        core = llm_engine.core
        cfg = llm_engine.config
        facts["attention_backend"] = core.runner.attn_backend.name
        facts["dtype"] = str(cfg.model_config.dtype).removeprefix("torch.")
        facts["block_size"] = cfg.cache_config.block_size
        facts["num_kv_blocks"] = int(core.runner.num_blocks)
        facts["max_num_seqs"] = cfg.scheduler_config.max_num_seqs
        facts["max_num_batched_tokens"] = cfg.scheduler_config.max_num_batched_tokens
        facts["enforce_eager"] = cfg.enforce_eager
        facts["model"] = cfg.model_config.model
        facts["model_weights_mib"] = round(core.runner.model_bytes() / 2**20, 1)
        if cfg.model_config.quantization is not None:
            kernels = core.runner.quant_kernels
            facts["quantization"] = cfg.model_config.quantization
            facts["quantization_kernels"] = kernels.summary() if kernels is not None else ""
    except Exception as e:  # noqa: BLE001
        facts["engine_facts_error"] = repr(e)
    return facts


def spec_decode_summary(before: Any, after: Any) -> dict[str, Any]:
    """Speculative decoding between two ``SchedulerStats`` snapshots (vLLM's spec_decode
    counters): drafts (verifications), draft and accepted tokens, the acceptance rate, the
    mean acceptance length (tokens per verifying step: 1 + accepted / drafts) and the
    acceptance rate of each draft position. Empty when nothing was drafted."""
    drafts = after.spec_num_drafts - before.spec_num_drafts
    if drafts <= 0:
        return {}
    tokens = after.spec_num_draft_tokens - before.spec_num_draft_tokens
    accepted = after.spec_num_accepted_tokens - before.spec_num_accepted_tokens
    old = list(before.spec_num_accepted_tokens_per_pos)
    per_pos = [v - (old[i] if i < len(old) else 0) for i, v in enumerate(after.spec_num_accepted_tokens_per_pos)]
    out: dict[str, Any] = {
        "spec_decode_num_drafts": drafts,
        "spec_decode_num_draft_tokens": tokens,
        "spec_decode_num_accepted_tokens": accepted,
        "spec_decode_acceptance_rate": accepted / tokens if tokens else 0.0,
        "spec_decode_mean_acceptance_length": 1.0 + accepted / drafts,
    }
    for i, v in enumerate(per_pos):
        out[f"spec_decode_acceptance_rate_pos{i}"] = v / drafts
    return out


def jsonable(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else str(obj)
    if isinstance(obj, (np.floating, np.integer)):
        return jsonable(obj.item())
    if isinstance(obj, Path):
        return str(obj)
    if obj is None or isinstance(obj, (str, int, bool)):
        return obj
    return str(obj)


def config_of(args: argparse.Namespace) -> dict[str, Any]:
    return jsonable({k: v for k, v in vars(args).items() if k != "func" and not callable(v)})


def make_report(benchmark: str, args: argparse.Namespace, results: dict[str, Any],
                environment: dict[str, Any]) -> dict[str, Any]:
    report: dict[str, Any] = {
        "benchmark": benchmark,
        "config": config_of(args),
        "environment": environment,
        "results": results,
    }
    ratios = ratio_table(results)
    if ratios:
        report["ratios"] = ratios
    return jsonable(report)


def ratio_table(results: dict[str, Any]) -> dict[str, dict[str, float]]:
    """``{"octavo_vs_hf": {metric: octavo / hf}}`` over the summary metrics both backends have."""
    if "octavo" not in results or "hf" not in results:
        return {}
    a, b = results["octavo"].get("summary", {}), results["hf"].get("summary", {})
    out = {}
    for k, v in a.items():
        w = b.get(k)
        if isinstance(v, (int, float)) and isinstance(w, (int, float)) and w:
            out[k] = v / w
    return {"octavo_vs_hf": out}


def write_json(report: dict[str, Any], path: str | None) -> None:
    if not path:
        return
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        json.dump(report, f, indent=2)
        f.write("\n")
    print(f"wrote {path}")


def flatten(obj: Any, prefix: str = "") -> dict[str, float]:
    """Dotted keys for every finite number under ``results`` and ``ratios`` (lists by index,
    except per-run and per-request lists, which are skipped)."""
    out: dict[str, float] = {}
    if isinstance(obj, dict):
        for k, v in obj.items():
            if k in ("runs", "requests", "config", "environment"):
                continue
            out.update(flatten(v, f"{prefix}{k}."))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            key = v.get("label", i) if isinstance(v, dict) else i
            out.update(flatten(v, f"{prefix}{key}."))
    elif isinstance(obj, (int, float)) and not isinstance(obj, bool) and math.isfinite(obj):
        out[prefix.rstrip(".")] = float(obj)
    return out


def compare(baseline: dict[str, Any], current: dict[str, Any]) -> list[tuple[str, float, float, float | None]]:
    """``(metric, baseline, current, current / baseline)`` for every shared numeric metric."""
    if baseline.get("benchmark") != current.get("benchmark"):
        print(
            f"warning: comparing a {baseline.get('benchmark')!r} report with a "
            f"{current.get('benchmark')!r} one",
            file=sys.stderr,
        )
    skip = {"output_json", "compare", "disable_tqdm"}
    bc, cc = baseline.get("config", {}), current.get("config", {})
    differ = sorted(k for k in set(bc) | set(cc) if k not in skip and bc.get(k) != cc.get(k))
    if differ:
        print("note: the runs differ in " + ", ".join(f"{k} ({bc.get(k)!r} -> {cc.get(k)!r})" for k in differ),
              file=sys.stderr)
    b = flatten({"results": baseline.get("results", {}), "ratios": baseline.get("ratios", {})})
    c = flatten({"results": current.get("results", {}), "ratios": current.get("ratios", {})})
    rows = []
    for k in c:
        if k in b:
            rows.append((k, b[k], c[k], c[k] / b[k] if b[k] else None))
    return rows


def print_compare(baseline_path: str, current: dict[str, Any]) -> list[tuple[str, float, float, float | None]]:
    with open(baseline_path) as f:
        baseline = json.load(f)
    rows = compare(baseline, current)
    print()
    print(f"Comparison with {baseline_path} (ratio = current / baseline)")
    print_table(
        ["metric", "baseline", "current", "ratio"],
        [[k, _fmt(b), _fmt(c), "-" if r is None else f"{r:.3f}x"] for k, b, c, r in rows],
    )
    return rows


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        if v == 0 or 1e-3 <= abs(v) < 1e6:
            return f"{v:.4g}" if abs(v) < 1 else f"{v:,.2f}"
        return f"{v:.3e}"
    return str(v)


def print_table(header: list[str], rows: Iterable[list[Any]]) -> None:
    rows = [[_fmt(c) for c in r] for r in rows]
    widths = [max(len(str(h)), *(len(r[i]) for r in rows)) if rows else len(str(h))
              for i, h in enumerate(header)]
    line = "  ".join(str(h).ljust(w) for h, w in zip(header, widths, strict=True))
    print(line)
    print("-" * len(line))
    for r in rows:
        print("  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                        for i, (c, w) in enumerate(zip(r, widths, strict=True))))


def print_summary(title: str, results: dict[str, Any], ratios: dict[str, Any] | None = None) -> None:
    """One column per backend, one row per summary metric, plus the octavo/hf ratio column."""
    backends = [b for b in results if isinstance(results[b], dict) and "summary" in results[b]]
    if not backends:
        return
    keys: list[str] = []
    for b in backends:
        for k in results[b]["summary"]:
            if k not in keys:
                keys.append(k)
    rat = (ratios or {}).get("octavo_vs_hf", {})
    header = ["metric", *backends] + (["octavo / hf"] if rat else [])
    rows = []
    for k in keys:
        row = [k] + [results[b]["summary"].get(k, "-") for b in backends]
        if rat:
            row.append(f"{rat[k]:.2f}x" if k in rat else "-")
        rows.append(row)
    print()
    print(f"=== {title} ===")
    print_table(header, rows)


def add_report_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--output-json", default=None, help="write every number, the configuration and the environment here")
    parser.add_argument("--compare", default=None, metavar="BASELINE_JSON", help="print side-by-side ratios against an earlier --output-json")
    parser.add_argument("--disable-tqdm", action="store_true", help="no progress bars")


def finish(report: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    write_json(report, getattr(args, "output_json", None))
    if getattr(args, "compare", None):
        print_compare(args.compare, report)
    return report


def report_run(benchmark: str, args: argparse.Namespace, results: dict[str, Any],
               env_extra: dict[str, Any] | None, title: str, paired_label: str) -> dict[str, Any]:
    """Build the report, print its summary (and the paired octavo/hf ratios when both ran),
    write ``--output-json`` and print ``--compare``."""
    report = make_report(benchmark, args, results, collect_environment(env_extra))
    ratios = report.get("ratios")
    paired = results.get("paired")
    if paired and paired.get("median") is not None and ratios:
        # The table's ratio for the paired metric is the same number the footer gives: the
        # median of per-repeat ratios (runs of one repeat ran back to back), not a ratio of
        # medians taken over different repeats, which noise can pull apart.
        summary = report["results"].get("octavo", {}).get("summary", {})
        key = next((k for k in (f"median_{paired['metric']}", paired["metric"]) if k in summary), paired["metric"])
        ratios = {**ratios, "octavo_vs_hf": {**ratios.get("octavo_vs_hf", {}), key: paired["median"]}}
    print_summary(title, report["results"], ratios)
    if paired:
        per = ", ".join(f"{x:.2f}x" for x in paired["per_repeat"])
        print(f"{paired_label}: {per} (median {paired['median']:.2f}x, the table's ratio for it)")
    return finish(report, args)
