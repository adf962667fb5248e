"""``octavo bench throughput``: offline throughput of the whole engine.

All requests are submitted at once (``LLM.generate``); greedy, ``ignore_eos`` and
``min_tokens = max_tokens`` so every request produces exactly its output length. Model load
and engine startup are timed separately and excluded from the throughput numbers. A warm-up
generate runs before timing. With ``--backend octavo,hf`` the same requests also go through
HF transformers ``generate`` in the same process and the report carries octavo / hf ratios.
"""

from __future__ import annotations

import argparse
import logging
import time
from typing import Any

from octavo.benchmarks import report as rep
from octavo.benchmarks.common import (
    add_backend_args,
    engine_config,
    load_engines,
    load_tokenizer,
    median_run,
    paired_ratios,
    parse_backends,
)
from octavo.benchmarks.datasets import SampleRequest, get_requests, random_requests, special_ids
from octavo.benchmarks.structured import KEY as STRUCTURED
from octavo.benchmarks.structured import add_structured_output_arg, check_args, constrain

logger = logging.getLogger(__name__)

SUMMARY_KEYS = [
    "requests_per_s", "input_tok_per_s", "output_tok_per_s", "total_tok_per_s", "wall_s",
]


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    from octavo.entrypoints.engine_cli import add_engine_args

    parser.add_argument("--dataset", default="random",
                        help="random (token ids of exact lengths), sharegpt (the small synthetic "
                             "file that ships), or a path to a ShareGPT-format JSON file")
    parser.add_argument("--input-len", type=int, default=128, help="prompt tokens per request (random)")
    parser.add_argument("--output-len", type=int, default=None,
                        help="output tokens per request (random: default 128; ShareGPT: default "
                             "the reference completion's length)")
    parser.add_argument("--num-prompts", type=int, default=32)
    add_backend_args(parser)
    add_structured_output_arg(parser)
    rep.add_report_args(parser)
    add_engine_args(parser)


def _sampling_params(n: int) -> Any:
    from octavo.sampling_params import SamplingParams

    return SamplingParams(temperature=0.0, max_tokens=n, min_tokens=n, ignore_eos=True)


def _octavo_prompt(r: SampleRequest) -> Any:
    return {"prompt_token_ids": r.prompt} if isinstance(r.prompt, list) else r.prompt


def run_octavo_once(
    llm: Any, requests: list[SampleRequest], use_tqdm: bool, structured: bool = False
) -> dict[str, Any]:
    prompts = [_octavo_prompt(r) for r in requests]
    params = [_sampling_params(r.expected_output_len) for r in requests]
    if structured:
        params = [constrain(p) for p in params]
    t0 = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=use_tqdm)
    wall = time.perf_counter() - t0
    return {
        "wall_s": wall,
        "prompt_tokens": sum(len(o.prompt_token_ids) for o in outs),
        "output_tokens": sum(len(c.token_ids) for o in outs for c in o.outputs),
    }


def _rates(run: dict[str, Any], n: int) -> dict[str, Any]:
    wall = run["wall_s"]
    run["num_requests"] = n
    run["requests_per_s"] = n / wall
    run["input_tok_per_s"] = run["prompt_tokens"] / wall
    run["output_tok_per_s"] = run["output_tokens"] / wall
    run["total_tok_per_s"] = (run["prompt_tokens"] + run["output_tokens"]) / wall
    return run


def run(args: argparse.Namespace) -> dict[str, Any]:
    backends = parse_backends(args.backend)
    if args.repeats < 1:
        raise ValueError(f"--repeats must be >= 1; got {args.repeats}")
    config = engine_config(args)
    mc = config.model_config
    tokenizer = load_tokenizer(config)
    use_tqdm = not args.disable_tqdm

    def workload(r: int) -> list[SampleRequest]:
        # A fresh sample per repeat, so the prefix cache never turns a repeat into a replay.
        return get_requests(args.dataset, tokenizer, args.num_prompts, args.input_len,
                            args.output_len, seed=args.seed + 1 + r, max_model_len=mc.max_model_len)

    structured = check_args(args, backends)
    llm, hf_model, results, env_extra = load_engines(args, backends, mc, "runs")
    if structured:  # the same engine, constrained, right after each unconstrained repeat
        backends = [*backends, STRUCTURED]
        results[STRUCTURED] = {"summary": {}, "runs": []}
    if "hf" in results:
        results["hf"]["batch_size"] = args.hf_batch_size or args.num_prompts

    # Warm-up, different ids: for octavo the workload's whole shape (its output length too), so
    # every kernel specialisation the timed run reaches -- attention over its longest contexts
    # included -- is compiled before timing (Triton compiles one the first time it is needed);
    # for HF a few output tokens.
    warm_len = args.input_len if args.dataset == "random" else 32
    warm_in = min(warm_len, mc.max_model_len - 4)
    warm_out = max(4, min(args.output_len, mc.max_model_len - warm_in)) if args.dataset == "random" else 4
    for b in backends:
        t0 = time.perf_counter()
        if b in ("octavo", STRUCTURED):
            warm = random_requests(args.num_prompts, warm_in, warm_out, len(tokenizer),
                                   seed=10_000 + args.seed, exclude_ids=special_ids(tokenizer))
            run_octavo_once(llm, warm, use_tqdm=False, structured=b == STRUCTURED)
        else:
            from octavo.benchmarks.hf_backend import hf_throughput

            warm = random_requests(args.num_prompts, warm_in, 4, len(tokenizer),
                                   seed=10_000 + args.seed, exclude_ids=special_ids(tokenizer))
            hf_throughput(hf_model, tokenizer, warm, disable_tqdm=True)
        results[b]["warmup_s"] = time.perf_counter() - t0

    stats_before = llm.llm_engine.get_stats() if llm is not None else None
    for r in range(args.repeats):
        reqs = workload(r)
        expected = sum(x.expected_output_len for x in reqs)
        for b in backends:
            if b in ("octavo", STRUCTURED):
                one = run_octavo_once(llm, reqs, use_tqdm, structured=b == STRUCTURED)
            else:
                from octavo.benchmarks.hf_backend import hf_throughput

                one = hf_throughput(hf_model, tokenizer, reqs, args.hf_batch_size, not use_tqdm)
            one = _rates(one, len(reqs))
            one["repeat"] = r
            one["expected_output_tokens"] = expected
            if one["output_tokens"] != expected:
                logger.warning("%s produced %d output tokens, expected %d", b, one["output_tokens"], expected)
            results[b]["runs"].append(one)

    if stats_before is not None:  # speculative decoding acceptance over every repeat
        results["octavo"]["summary"].update(rep.spec_decode_summary(stats_before, llm.llm_engine.get_stats()))
    for b in backends:
        res = results[b]
        med = median_run(res["runs"], "output_tok_per_s")
        summary = {k: float(med[k]) for k in SUMMARY_KEYS}
        # Counts stay ints (printed "8", not "8.00").
        summary["num_requests"] = int(med["num_requests"])
        summary["total_input_tokens"] = int(med["prompt_tokens"])
        summary["total_output_tokens"] = int(med["output_tokens"])
        summary.update(res["summary"])  # load and startup times, measured before the runs
        res["summary"] = summary

    label = "octavo / hf output tok/s per repeat"
    if structured:  # time per output token = 1 / output tok/s
        results["paired"] = paired_ratios(results["octavo"]["runs"], results[STRUCTURED]["runs"], "output_tok_per_s")
        label = f"{STRUCTURED} / octavo time per output token (octavo / {STRUCTURED} output tok/s)"
    elif len(backends) == 2:
        results["paired"] = paired_ratios(results["octavo"]["runs"], results["hf"]["runs"], "output_tok_per_s")
    return rep.report_run(
        "throughput", args, results, env_extra,
        f"throughput: {args.num_prompts} requests, dataset {args.dataset}, model {mc.model}",
        label,
    )


def main(args: argparse.Namespace) -> int:
    run(args)
    return 0
