"""Pieces shared by the offline benchmarks: backend selection, engine and tokenizer setup."""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

BACKENDS = ("octavo", "hf")


def parse_backends(value: str) -> list[str]:
    """``octavo``, ``hf``, ``octavo,hf`` (or ``all``): which backends run, in this order."""
    if value == "all":
        return list(BACKENDS)
    names = [v.strip() for v in value.split(",") if v.strip()]
    bad = [n for n in names if n not in BACKENDS]
    if bad or not names:
        raise ValueError(f"--backend must be octavo, hf, octavo,hf or all; got {value!r}")
    return list(dict.fromkeys(names))


def add_backend_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--backend", default="octavo",
        help="octavo (default), hf (HF transformers generate, static batching), or octavo,hf "
             "to run both on the same workload in one process and report octavo / hf ratios",
    )
    parser.add_argument(
        "--hf-batch-size", type=int, default=None,
        help="static batch size for --backend hf (default: all prompts in one batch)",
    )
    parser.add_argument(
        "--threads", type=int, default=None,
        help="compute threads for both backends (default: torch's choice; octavo: one per core). "
             "Unless OCTAVO_CPU_THREADS_BIND is set, octavo's threads are pinned to the first N cores",
    )
    parser.add_argument(
        "--repeats", type=int, default=1,
        help="timed repeats per backend (backends alternate within each repeat; the summary is "
             "the median, so a noisy machine disturbs both sides alike)",
    )


def setup_run(args: argparse.Namespace) -> dict[str, Any]:
    """Apply ``--threads``; returns facts about the machine at the start of the run."""
    import os

    import torch

    if args.threads is not None:
        if args.threads < 1:
            raise ValueError(f"--threads must be >= 1; got {args.threads}")
        torch.set_num_threads(args.threads)
        if "OCTAVO_CPU_THREADS_BIND" not in os.environ:
            # the engine sizes its team from this (default auto: every core), so say N here
            from octavo.platforms.cpu_threads import plan_cpus

            cores = plan_cpus("auto")
            spec = ",".join(map(str, cores[: args.threads])) if args.threads <= len(cores) else "none"
            os.environ["OCTAVO_CPU_THREADS_BIND"] = spec
    facts: dict[str, Any] = {"torch_num_threads": torch.get_num_threads(),
                             "cpu_threads_bind": os.environ.get("OCTAVO_CPU_THREADS_BIND", "auto")}
    if hasattr(os, "getloadavg"):
        facts["loadavg_at_start"] = [round(x, 2) for x in os.getloadavg()]
    return facts


def engine_config(args: argparse.Namespace):
    """The resolved ``OctavoConfig`` for the engine flags (cheap: reads config.json only)."""
    from octavo.engine.arg_utils import EngineArgs

    return EngineArgs.from_cli_args(args).create_engine_config()


def load_tokenizer(config) -> Any:
    from octavo.engine.tokenizer import load_tokenizer as load

    return load(config.model_config.tokenizer)


def make_llm(args: argparse.Namespace) -> tuple[Any, float]:
    """``(LLM, startup seconds)``: weights, KV cache allocation and everything else."""
    import dataclasses

    from octavo.engine.arg_utils import EngineArgs
    from octavo.entrypoints.llm import LLM

    eargs = EngineArgs.from_cli_args(args)
    t0 = time.perf_counter()
    llm = LLM(**dataclasses.asdict(eargs))
    return llm, time.perf_counter() - t0


def load_engines(
    args: argparse.Namespace, backends: list[str], mc: Any, runs_key: str
) -> tuple[Any, Any, dict[str, Any], dict[str, Any]]:
    """Build the octavo engine and/or the HF model the run compares.

    Returns ``(llm, hf_model, results, env_extra)``: ``results[backend]`` starts with load and
    startup times and an empty ``runs_key`` list; ``env_extra`` holds engine facts for the report.
    """
    from octavo.benchmarks import report as rep

    results: dict[str, Any] = {}
    env_extra: dict[str, Any] = setup_run(args)
    llm = hf_model = None
    if "octavo" in backends:
        llm, startup = make_llm(args)
        env_extra.update(rep.engine_facts(llm.llm_engine))
        load_s = llm.llm_engine.core.executor.load_seconds
        results["octavo"] = {"summary": {"model_load_s": load_s, "startup_s": startup}, runs_key: []}
    if "hf" in backends:
        from octavo.benchmarks.hf_backend import load_hf_model

        hf_model, load_s = load_hf_model(mc.model, mc.dtype, mc.load_format, mc.seed)
        env_extra["hf_attn_implementation"] = getattr(hf_model.config, "_attn_implementation", None)
        results["hf"] = {"summary": {"model_load_s": load_s, "startup_s": load_s}, runs_key: []}
    return llm, hf_model, results, env_extra


def median_run(runs: list[dict[str, Any]], key: str) -> dict[str, Any]:
    """The run with the median ``key`` (the lower median for an even count): one real run, so
    its numbers stay consistent with each other."""
    ordered = sorted(runs, key=lambda r: r[key])
    return ordered[(len(ordered) - 1) // 2]


def paired_ratios(a_runs: list[dict[str, Any]], b_runs: list[dict[str, Any]], key: str) -> dict[str, Any]:
    """Per-repeat ``a / b`` of ``key`` (runs of one repeat ran back to back) and their median."""
    per = [a[key] / b[key] for a, b in zip(a_runs, b_runs, strict=True) if b[key]]
    return {"metric": key, "per_repeat": per, "median": float(statistics.median(per)) if per else None}
