#!/usr/bin/env python3
"""Per-step Python overhead of the whole engine on CPU: cProfile over one offline workload.

Builds an ``LLM`` on ``--model`` (default: the model shipped in the package), warms it up, then
runs ``--num-prompts`` random prompts of ``--input-len`` tokens with ``--output-len`` greedy
output tokens (the ``octavo bench throughput`` workload) under cProfile. Prints the process
CPU time per output token, the number of engine steps, Python function calls per step, and the
functions with the most self time and the most calls per step. Only the public ``LLM`` API is
used, so the same script profiles any checkout (point ``PYTHONPATH`` at it)::

    PYTHONPATH=. python benchmarks/profile_engine_step.py --num-prompts 256 --output-len 32
    PYTHONPATH=. python benchmarks/profile_engine_step.py --num-prompts 1 --output-len 256  # batch-1 TPOT
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import random
import resource
import time


def build(args: argparse.Namespace):
    import torch

    from octavo import LLM

    torch.set_num_threads(args.threads)
    kwargs = {"seed": 0}
    if args.model:
        kwargs["model"] = args.model
    return LLM(**kwargs)


def workload(n: int, input_len: int, output_len: int, vocab: int, seed: int):
    from octavo import SamplingParams

    rng = random.Random(seed)
    prompts = [{"prompt_token_ids": [rng.randrange(10, vocab - 10) for _ in range(input_len)]} for _ in range(n)]
    params = SamplingParams(temperature=0.0, max_tokens=output_len, min_tokens=output_len, ignore_eos=True)
    return prompts, params


def count_steps(llm) -> list[int]:
    """Wraps the engine's ``step`` so calls are counted (a list holding the count)."""
    engine = llm.llm_engine
    counter = [0]
    inner = engine.step

    def step(*a, **kw):
        counter[0] += 1
        return inner(*a, **kw)

    engine.step = step
    return counter


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default=None)
    p.add_argument("--num-prompts", type=int, default=256)
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=32)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--top", type=int, default=30)
    p.add_argument("--no-profile", action="store_true", help="time only (CPU s per output token)")
    p.add_argument("--dump", default=None, help="write the cProfile stats here (pstats format)")
    args = p.parse_args()

    llm = build(args)
    vocab = len(llm.get_tokenizer())
    warm, wp = workload(args.num_prompts, args.input_len, 4, vocab, seed=1)
    llm.generate(warm, wp, use_tqdm=False)
    prompts, params = workload(args.num_prompts, args.input_len, args.output_len, vocab, seed=2)
    steps = count_steps(llm)
    prof = None if args.no_profile else cProfile.Profile()
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    c0, t0 = time.process_time(), time.perf_counter()
    if prof is not None:
        prof.enable()
    outs = llm.generate(prompts, params, use_tqdm=False)
    if prof is not None:
        prof.disable()
    cpu, wall = time.process_time() - c0, time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    n_out = sum(len(c.token_ids) for o in outs for c in o.outputs)
    n_steps = max(steps[0], 1)
    print(f"output tokens {n_out}  steps {n_steps}  wall {wall:.2f}s  cpu {cpu:.2f}s  "
          f"cpu ms/output token {1e3 * cpu / n_out:.3f}  wall ms/step {1e3 * wall / n_steps:.3f}  "
          f"sys {r1.ru_stime - r0.ru_stime:.2f}s  minor faults {r1.ru_minflt - r0.ru_minflt}")
    if prof is None:
        return
    st = pstats.Stats(prof)
    if args.dump:
        st.dump_stats(args.dump)
    total_calls = sum(v[1] for v in st.stats.values())
    print(f"python function calls per step: {total_calls / n_steps:.0f}")
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(args.top)
    print(buf.getvalue())
    rows = sorted(st.stats.items(), key=lambda kv: -kv[1][1])[: args.top]
    print("most calls per step:")
    for (fname, line, func), (_cc, nc, tt, _ct, _callers) in rows:
        print(f"  {nc / n_steps:9.1f}  {tt:7.3f}s  {func}  {fname.split('octavo/')[-1]}:{line}")


if __name__ == "__main__":
    main()
