#!/usr/bin/env python3
"""Cost of a speculative step vs a plain decode step, batch 1, same engine, same run.

The models are *shapes* with random weights (``benchmarks/bench_cuda.py`` writes the configs;
``load_format="dummy"``). One request decodes, alternating in blocks of steps between two
proposers, and each ``EngineCore.step`` is timed with a device synchronize:

- n-gram engine (default): ``k`` random drafts per step (so nearly all are rejected: this
  measures the verify step's cost, not acceptance) vs none;
- ``--draft-shape`` (e.g. ``llama1b``): a ``draft_model`` engine whose draft has that shape;
  the real draft-model proposer (its ``k`` draft passes after every step, then the verify of
  its ``k`` drafts; random weights, so nothing is accepted: the overhead of speculation when
  it buys nothing) vs none (plain decode steps, the draft idle);
- ``--eagle``: an ``eagle`` engine with a one-layer EAGLE head of the target's shape (random
  weights: nothing accepted); speculative steps run the head over each step's tokens and its
  ``k`` draft passes, plain steps leave the head idle; ``--eagle3``: the same with an EAGLE-3
  head (the target also keeps three layers' hidden states; a draft vocabulary of 32000).

Each block of ``--steps`` steps is timed as a whole (a device synchronize before and after),
one sample of the mean step time: a step's queued draft passes overlap the next step's host
work (drafts stay on the device), which a synchronize per step would undo.

Reported: median step time of each mode, their ratio, the acceptance observed, and the
speedup the engine would deliver at acceptance rates 50% and 80% from these two numbers
(expected tokens per speculative step ``sum(a^i, i=0..k)`` over the cost ratio).

  python benchmarks/spec_decode_verify_cost.py --shape llama8b --k 4                        # H200
  python benchmarks/spec_decode_verify_cost.py --shape llama8b --draft-shape llama1b --k 4  # H200
  python benchmarks/spec_decode_verify_cost.py --shape llama8b --eagle --k 4                # H200
  python benchmarks/spec_decode_verify_cost.py --shape llama8b --eagle3 --k 4               # H200
  python benchmarks/spec_decode_verify_cost.py --shape tiny --draft-shape tiny_draft --k 4  # CPU dry run
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


class _FixedDrafts:
    """``k`` random drafts per request (0: none, a plain decode step)."""

    def __init__(self, k: int, vocab: int) -> None:
        import numpy as np

        self.k, self.rng, self.vocab = k, np.random.default_rng(0), vocab

    def propose_batch(self, requests, max_tokens) -> list[list[int]]:
        return [self.rng.integers(3, self.vocab, size=min(self.k, m)).tolist() for m in max_tokens]


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--shape", default="tiny")
    p.add_argument("--draft-shape", default=None, help="a draft_model engine with a draft of this shape")
    p.add_argument("--eagle", action="store_true", help="an eagle engine with a one-layer head of the target's shape")
    p.add_argument("--eagle3", action="store_true", help="an eagle3 engine with a one-layer EAGLE-3 head")
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--steps", type=int, default=40, help="timed steps per mode per block")
    p.add_argument("--blocks", type=int, default=5, help="blocks per mode (one timing each)")
    p.add_argument("--enforce-eager", action="store_true")
    p.add_argument("--no-async", action="store_true",
                   help="synchronous scheduling (draft model and EAGLE engines default to async scheduling on a GPU)")
    p.add_argument("--max-num-seqs", type=int, default=8, help="batch 1 is measured: few graphs to capture")
    p.add_argument("--host-drafts", action="store_true",
                   help="draft model / EAGLE: read the drafts back to the host after each proposal "
                        "(the path before drafts stayed on the device), for a same-build A/B")
    p.add_argument("--no-in-step", action="store_true",
                   help="draft model: propose after each step's read-back (drafts still kept on the device) "
                        "instead of queueing the draft's passes inside the step")
    p.add_argument("--profile", default=None, metavar="DIR",
                   help="after timing: host time per phase of each mode, and a torch.profiler trace and "
                        "kernel/op tables of a few steps of each mode, written to DIR")
    return p.parse_args()


def make_engine(args: argparse.Namespace, root: Path):
    from bench_cuda import write_model_dir

    from octavo import LLM

    model = write_model_dir(args.shape, root)
    if args.eagle or args.eagle3:
        method = "eagle3" if args.eagle3 else "eagle"
        spec = {"method": method, "model": str(write_eagle_head(args.shape, root, args.eagle3)),
                "num_speculative_tokens": args.k}
    elif args.draft_shape:
        spec = {"method": "draft_model", "model": str(write_model_dir(args.draft_shape, root)),
                "num_speculative_tokens": args.k}
    else:
        spec = {"method": "ngram", "num_speculative_tokens": args.k}
    return LLM(str(model), load_format="dummy", speculative_config=spec, max_model_len=4096,
               dtype="float32" if args.shape == "tiny" else "bfloat16", enforce_eager=args.enforce_eager,
               max_num_seqs=args.max_num_seqs, async_scheduling=False if args.no_async else None)


def write_eagle_head(shape: str, root: Path, eagle3: bool = False) -> Path:
    """config.json of a one-layer EAGLE (EAGLE-3) head of ``shape`` (weights: dummy, like the target's)."""
    from bench_cuda import SHAPES

    d = root / f"eagle{'3' if eagle3 else ''}-{shape}"
    d.mkdir(parents=True, exist_ok=True)
    cfg = {**SHAPES[shape], "num_hidden_layers": 1, "architectures": ["EagleLlamaForCausalLM"]}
    if eagle3:
        layers = SHAPES[shape]["num_hidden_layers"]
        ids = [2, layers // 2, layers - 3] if layers >= 6 else [0, 1, 2]
        cfg.update(architectures=["Eagle3LlamaForCausalLM"], draft_vocab_size=min(32000, cfg["vocab_size"]),
                   eagle_config={"eagle_aux_hidden_state_layer_ids": ids})
    (d / "config.json").write_text(json.dumps(cfg, indent=1))
    return d


def _head_active(llm, active: bool, in_step: bool = True) -> None:
    """Plain mode leaves the drafter idle: an eagle engine's head makes no pass over the step's
    tokens, a draft model queues no passes inside the step (``in_step``: whether the speculating
    mode does)."""
    runner = llm.llm_engine.core.runner
    if runner.drafter is None:
        return
    if hasattr(runner.drafter, "absorb"):
        runner.eagle = runner.drafter if active else None
    else:
        runner.drafter.in_step.enabled = active and in_step


def time_modes(llm, proposers: dict, args: argparse.Namespace, vocab: int) -> tuple[dict, dict]:
    """(step times per mode, speculative counters of the timed steps per mode). A mode named
    ``*_eager_verify`` runs its verify steps eagerly (the captured verify graphs set aside)."""
    from octavo import SamplingParams
    from octavo.platforms import current_platform

    core, engine = llm.llm_engine.core, llm.llm_engine
    gr = core.runner.graph_runner
    plans = {m: (gr.plan if not m.endswith("_eager_verify") else {1: gr.plan[1]}) if gr else None for m in proposers}
    total = 2 * args.blocks * (args.steps + 1) + 16
    engine.add_request("r", {"prompt_token_ids": [3 + i % (vocab - 3) for i in range(512)]},
                       SamplingParams(temperature=0, max_tokens=total * (args.k + 1), ignore_eos=True))
    times: dict[str, list[float]] = {m: [] for m in proposers}
    counts = {m: [0, 0] for m in proposers}  # draft tokens, accepted
    core.proposer = proposers["plain"]
    for _ in range(8):  # prefill and warm-up
        engine.step()
    for _ in range(args.blocks):
        for mode, proposer in proposers.items():
            core.proposer = proposer
            if gr is not None:
                gr.plan = plans[mode]
            _head_active(llm, mode != "plain", not args.no_in_step)
            engine.step()  # the first step of a block verifies the previous block's drafts
            s0 = engine.get_stats()
            # One timing per block: work a step leaves queued (device drafts) overlaps the next
            # step's host work, as it does in serving; a synchronize per step would forbid that.
            current_platform.synchronize()
            t0 = time.perf_counter()
            for _ in range(args.steps):
                engine.step()
            current_platform.synchronize()
            times[mode].append((time.perf_counter() - t0) / args.steps)
            s1 = engine.get_stats()
            counts[mode][0] += s1.spec_num_draft_tokens - s0.spec_num_draft_tokens
            counts[mode][1] += s1.spec_num_accepted_tokens - s0.spec_num_accepted_tokens
    return times, counts


# Host phases of a step (label, attribute path from the LLMEngine, method); the draft's are
# skipped where the engine has no such part. Phases nest (``propose`` holds the draft's).
PHASES = [
    ("step", "", "step"),
    ("schedule", "core", "_schedule"),
    ("execute_model", "core.executor", "execute_model"),
    ("prepare_inputs", "core.runner", "_prepare_inputs"),
    ("sample", "core.runner", "_sample"),
    ("update_from_output", "core.scheduler", "update_from_output"),
    ("propose", "core", "_propose_drafts"),
    ("draft_catch_up", "core.runner.drafter", "_catch_up"),
    ("draft_block_table", "core.runner.drafter", "_block_table"),
    ("draft_forward", "core.runner.drafter", "_forward"),
    ("draft_stage", "core.runner.drafter.step_buffers", "stage"),
    ("draft_replay", "core.runner.drafter.graph_runner", "replay"),
    ("draft_logits", "core.runner.drafter.model", "compute_logits"),
    ("target_replay", "core.runner.graph_runner", "replay"),
]


def profile_modes(llm, modes: dict, args: argparse.Namespace, out: Path) -> None:
    """Per mode: host microseconds per step of each phase (no added synchronization), then a
    torch.profiler trace of a few steps with its kernel and host-op tables."""
    from profile_spec_step import Timers, instrument
    from torch.profiler import ProfilerActivity, profile

    from octavo.platforms import current_platform

    out.mkdir(parents=True, exist_ok=True)
    engine, core = llm.llm_engine, llm.llm_engine.core
    timers = Timers()
    instrument(timers, None, engine, PHASES)
    report = {}
    for mode, proposer in modes.items():
        core.proposer = proposer
        _head_active(llm, mode != "plain", not args.no_in_step)
        for _ in range(2):
            engine.step()
        current_platform.synchronize()
        timers.engine = mode
        for _ in range(args.steps):
            engine.step()
        current_platform.synchronize()
        timers.engine = None
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(8):
                engine.step()
            current_platform.synchronize()
        prof.export_chrome_trace(str(out / f"trace_{mode}.json"))
        (out / f"ops_{mode}.txt").write_text(
            prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=40) + "\n"
            + prof.key_averages().table(sort_by="self_device_time_total", row_limit=25))
        report[mode] = {label: round(1e6 * statistics.median(v), 1) for label, v in timers.calls[mode].items()}
        report[mode] = {k: (report[mode][k], round(1e6 * timers.totals[mode][k] / args.steps, 1)) for k in report[mode]}
    print("PROFILE " + json.dumps(report))
    (out / "phases.json").write_text(json.dumps(report, indent=1))


def main() -> int:
    args = parse_args()
    args.no_async = args.no_async or args.host_drafts  # steps scheduled ahead need device drafts
    from bench_cuda import SHAPES

    from octavo.platforms import current_platform

    llm = make_engine(args, Path(tempfile.mkdtemp()))
    drafter = llm.llm_engine.core.runner.drafter
    if args.host_drafts:
        llm.llm_engine.core.runner.device_drafts = None
    vocab = SHAPES[args.shape]["vocab_size"]
    spec_mode = "eagle3" if args.eagle3 else "eagle" if args.eagle else "draft" if args.draft_shape else "verify"
    real = args.draft_shape or args.eagle or args.eagle3
    speculating = llm.llm_engine.core.proposer if real else _FixedDrafts(args.k, vocab)
    modes = {"plain": _FixedDrafts(0, vocab), spec_mode: speculating}
    if llm.llm_engine.core.runner.graph_runner is not None:  # same run: verify steps without graphs
        modes[f"{spec_mode}_eager_verify"] = speculating
    gr = llm.llm_engine.core.runner.graph_runner
    full_plan = gr.plan if gr is not None else None
    times, counts = time_modes(llm, modes, args, vocab)
    if args.profile:
        if gr is not None:
            gr.plan = full_plan
        profile_modes(llm, {m: p for m, p in modes.items() if not m.endswith("_eager_verify")}, args,
                      Path(args.profile))
    plain_s, spec_s = statistics.median(times["plain"]), statistics.median(times[spec_mode])
    ratio = spec_s / plain_s
    speedup = {f"acceptance_{int(a * 100)}": sum(a**i for i in range(args.k + 1)) / ratio for a in (0.5, 0.8)}
    drafted, accepted = counts[spec_mode]
    print("RESULT " + json.dumps({
        "shape": args.shape, "draft_shape": args.draft_shape, "host_drafts": args.host_drafts,
        "in_step_launches": getattr(getattr(drafter, "in_step", None), "launches", None), "eagle": args.eagle, "eagle3": args.eagle3, "k": args.k, "device": current_platform.name,
        "async_scheduling": llm.llm_engine.core.async_scheduling,
        "target_graphs": llm.llm_engine.core.runner.graph_runner is not None,
        "draft_graphs": getattr(llm.llm_engine.core.runner.drafter, "graph_runner", None) is not None,
        "median_plain_step_ms": 1e3 * plain_s, f"median_{spec_mode}_step_ms": 1e3 * spec_s,
        f"{spec_mode}_over_plain": ratio,
        **({f"{spec_mode}_eager_verify_over_plain": statistics.median(times[f"{spec_mode}_eager_verify"]) / plain_s}
           if f"{spec_mode}_eager_verify" in times else {}),
        "verify_replays": getattr(llm.llm_engine.core.runner.graph_runner, "verify_replays", None),
        "timed_draft_tokens": drafted, "timed_accepted_tokens": accepted,
        "acceptance_rate": accepted / drafted if drafted else None,
        "speedup_at": speedup, "stats": str(llm.llm_engine.get_stats()),
    }))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
