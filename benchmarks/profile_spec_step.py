#!/usr/bin/env python3
"""Where a batch-1 engine step spends its host time, speculation (n-gram) on vs off.

Runs the code-editing request of ``spec_decode_ngram.py`` (greedy, ``--output-len`` tokens) on
two engines in this process, ``--rounds`` times each (interleaved), with the step's phases
wrapped by wall-clock timers: scheduling, the runner's state update / input preparation /
attention metadata / forward / logits / sampling metadata / sampler / draft layout and
verification / result, the scheduler's update, the n-gram proposal and the output processing.
Prints, per engine, microseconds per decode step for each phase (phases nest: ``runner``
contains the runner's parts; the prefill step is not counted) and the median of one call (robust
to the odd garbage collection or preemption landing in a phase), the steps per request, and a
speculative step's and a speculative token's cost against a plain one.

Example:
  python benchmarks/profile_spec_step.py --num-speculative-tokens 4 --rounds 3
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import statistics
import sys
import time
from collections import defaultdict

# (label, where: an attribute path from the LLMEngine or "module:Class", method name)
INSTANCE_PHASES = [
    ("step", "", "step"),
    ("schedule", "core", "_schedule"),
    ("runner", "core.executor", "execute_model"),
    ("update_states", "core.runner", "_update_states"),
    ("prepare_inputs", "core.runner", "_prepare_inputs"),
    ("attn_metadata", "core.runner", "build_attn_metadata"),
    ("forward", "core.runner.model", "forward"),
    ("sample", "core.runner", "_sample"),
    ("logits", "core.runner.model", "compute_logits"),
    ("sampling_md", "core.runner.input_batch", "make_sampling_metadata"),
    ("sampler", "core.runner.sampler", "forward"),
    ("update_from_output", "core.scheduler", "update_from_output"),
    ("propose", "core", "_propose_drafts"),
    ("output_processor", "output_processor", "process_outputs"),
]
# Module-level functions and class methods, patched once; charged to the engine running.
GLOBAL_PHASES = [
    ("draft_layout", "octavo.worker.model_runner:ModelRunner", "_draft_layout"),
    ("verify", "octavo.worker.model_runner", "verify_one_hot_drafts"),
    ("result", "octavo.worker.step_handle:StepHandle", "result"),
]


class Timers:
    """Accumulated seconds per (engine, phase) while ``engine`` is set."""

    def __init__(self) -> None:
        self.engine: str | None = None
        self.totals: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
        self.calls: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))

    def wrap(self, label: str, inner, engine: str | None = None):
        def timed(*a, **kw):
            t0 = time.perf_counter()
            try:
                return inner(*a, **kw)
            finally:
                who = engine or self.engine
                if who is not None and self.engine is not None:
                    dt = time.perf_counter() - t0
                    self.totals[who][label] += dt
                    self.calls[who][label].append(dt)

        return timed


def instrument(timers: Timers, name: str | None, engine, phases=INSTANCE_PHASES) -> None:
    """Wrap each ``(label, attribute path from engine, method)`` of ``phases`` that the engine
    has (a missing part of a path skips the phase); ``name``: the engine charged, None: whichever
    ``timers.engine`` names at the time."""
    for label, path, attr in phases:
        owner = engine
        for part in filter(None, path.split(".")):
            owner = getattr(owner, part, None)
        if owner is not None and hasattr(owner, attr):
            setattr(owner, attr, timers.wrap(label, getattr(owner, attr), name))


def instrument_globals(timers: Timers) -> None:
    for label, where, attr in GLOBAL_PHASES:
        mod, _, cls = where.partition(":")
        owner = importlib.import_module(mod)
        if cls:
            owner = getattr(owner, cls)
        inner = owner.__dict__[attr] if cls else getattr(owner, attr)
        if isinstance(inner, staticmethod):
            setattr(owner, attr, staticmethod(timers.wrap(label, inner.__func__)))
        else:
            setattr(owner, attr, timers.wrap(label, inner))


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--num-speculative-tokens", type=int, default=4)
    p.add_argument("--prompt-lookup-min", type=int, default=1)
    p.add_argument("--prompt-lookup-max", type=int, default=5)
    p.add_argument("--output-len", type=int, default=256)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--dtype", default="auto")
    p.add_argument("--json-out", default=None)
    return p.parse_args()


def main() -> int:
    args = parse_args()
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from spec_decode_ngram import code_edit_prompt

    from octavo import LLM, SamplingParams

    spec = {"method": "ngram", "num_speculative_tokens": args.num_speculative_tokens,
            "prompt_lookup_min": args.prompt_lookup_min, "prompt_lookup_max": args.prompt_lookup_max}
    llms = {"base": LLM(dtype=args.dtype, enable_prefix_caching=False),
            "spec": LLM(dtype=args.dtype, enable_prefix_caching=False, speculative_config=spec)}
    ids = llms["base"].get_tokenizer().encode(code_edit_prompt())
    sp = SamplingParams(temperature=0, max_tokens=args.output_len, ignore_eos=True)
    for llm in llms.values():  # warm-up, not timed
        llm.generate({"prompt_token_ids": ids}, sp, use_tqdm=False)
    timers = Timers()
    instrument_globals(timers)
    for name, llm in llms.items():
        instrument(timers, name, llm.llm_engine)
    steps = dict.fromkeys(llms, 0)
    for r in range(args.rounds):
        for name in ("base", "spec") if r % 2 == 0 else ("spec", "base"):
            eng = llms[name].llm_engine
            eng.add_request(f"p{r}", {"prompt_token_ids": ids}, sp)
            eng.step()  # the prefill: not timed
            timers.engine = name
            while eng.has_unfinished_requests():
                eng.step()
                steps[name] += 1
            timers.engine = None
    report: dict = {"config": vars(args), "steps_per_request": {k: v / args.rounds for k, v in steps.items()}}
    labels = [p[0] for p in INSTANCE_PHASES + GLOBAL_PHASES]
    report["us_per_step"] = {
        label: {k: round(1e6 * timers.totals[k].get(label, 0.0) / steps[k], 1) for k in llms} for label in labels
    }
    report["median_us_per_call"] = {
        label: {k: round(1e6 * statistics.median(timers.calls[k][label]), 1) if timers.calls[k][label] else 0.0
                for k in llms} for label in labels
    }
    step = report["us_per_step"]["step"]
    report["spec_step_vs_base_step"] = round(step["spec"] / step["base"], 3)
    report["spec_token_vs_base_token"] = round(step["spec"] * steps["spec"] / (step["base"] * steps["base"]), 3)
    width = max(map(len, labels))
    print(f"{'us per decode step':{width}}  {'base':>8}  {'spec':>8}   median us per call: {'base':>8}  {'spec':>8}")
    for label, v in report["us_per_step"].items():
        m = report["median_us_per_call"][label]
        print(f"{label:{width}}  {v['base']:8.1f}  {v['spec']:8.1f}   {'':20}{m['base']:8.1f}  {m['spec']:8.1f}")
    print(json.dumps({k: report[k] for k in ("steps_per_request", "spec_step_vs_base_step",
                                             "spec_token_vs_base_token")}))
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(report, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
