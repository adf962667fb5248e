#!/usr/bin/env python3
"""Host time of the engine's bookkeeping per step at a batch of N decoding requests, model skipped.

Builds ``octavo.LLM`` on ``--model`` (default: the model shipped in the package), adds
``--num-requests`` requests of ``--input-len`` random prompt tokens and ``--output-len`` output
tokens (as ``LLM.generate`` does: outputs returned when finished), then drives the engine's own
objects step by step with the model replaced by random sampled tokens: ``Scheduler.schedule``,
``Scheduler.update_from_output`` and ``OutputProcessor.process_outputs`` (detokenization
included). Prints the milliseconds per step of each, best and median pass of ``--passes``.
This is the part of a step's host time that grows with the batch; on a GPU it runs while the
device computes, and a step is host-bound once it takes longer than the device's share::

    python benchmarks/host_step_bench.py --num-requests 128 --output-len 200 --passes 7
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time


def one_pass(llm, tag: str, args, rng: random.Random) -> dict[str, float]:
    from octavo import SamplingParams
    from octavo.core.scheduler_output import ModelRunnerOutput
    from octavo.engine.output_processor import OutputKind

    engine = llm.llm_engine
    sched, outputs = engine.core.scheduler, engine.output_processor
    vocab = engine.processor.vocab_size
    params = SamplingParams(max_tokens=args.output_len, ignore_eos=True, temperature=0.0)
    for i in range(args.num_requests):
        prompt = {"prompt_token_ids": [rng.randrange(1, vocab) for _ in range(args.input_len)]}
        engine.add_request(f"{tag}-{i}", prompt, params, output_kind=OutputKind.FINAL_ONLY)
    spent = {"schedule": 0.0, "update": 0.0, "outputs": 0.0}
    steps = 0
    while sched.has_unfinished_requests():
        t0 = time.perf_counter()
        so = sched.schedule()
        t1 = time.perf_counter()
        ids = list(so.num_scheduled_tokens)
        sampled = ModelRunnerOutput(ids, [[rng.randrange(1, vocab)] for _ in ids])
        t2 = time.perf_counter()
        core_out = sched.update_from_output(so, sampled)
        t3 = time.perf_counter()
        outputs.process_outputs(core_out)
        t4 = time.perf_counter()
        spent["schedule"] += t1 - t0
        spent["update"] += t3 - t2
        spent["outputs"] += t4 - t3
        steps += 1
    per_step = {k: 1e3 * v / steps for k, v in spent.items()}
    per_step["total"] = sum(per_step.values())
    return per_step


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="default: the model shipped in the package")
    ap.add_argument("--num-requests", type=int, default=128)
    ap.add_argument("--input-len", type=int, default=32)
    ap.add_argument("--output-len", type=int, default=200)
    ap.add_argument("--passes", type=int, default=7)
    ap.add_argument("--json-out")
    args = ap.parse_args()

    from octavo import LLM

    kwargs = {"seed": 0, "max_model_len": args.input_len + args.output_len + 16}
    if args.model:
        kwargs["model"] = args.model
    llm = LLM(**kwargs)
    rng = random.Random(0)
    one_pass(llm, "warm", args, rng)
    passes = [one_pass(llm, f"p{i}", args, rng) for i in range(args.passes)]
    best = min(passes, key=lambda p: p["total"])
    report = {"num_requests": args.num_requests, "ms_per_step_best": {k: round(v, 3) for k, v in best.items()},
              "ms_per_step_median_total": round(statistics.median(p["total"] for p in passes), 3)}
    print(json.dumps(report, indent=1))
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
