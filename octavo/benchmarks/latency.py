"""``octavo bench latency``: time to first token, time per output token and end-to-end latency.

Each iteration submits one batch of ``--batch-size`` random prompts of exactly ``--input-len``
tokens (fresh ids every iteration, so the prefix cache never hits), asks for exactly
``--output-len`` tokens (greedy, ``ignore_eos``) and drives the engine's own ``step`` loop,
stamping every request's tokens as the step that produced them returns:

- TTFT: first token of a request minus the batch's submission time
- TPOT: (last token - first token) / (output tokens - 1), per request
- ITL: the gaps between consecutive tokens of a request
- end-to-end: submission to the last token of the batch

``--num-iters-warmup`` iterations run first and are not counted. ``--backend hf`` stamps
HF ``generate`` the same way (a logits processor records when each step's logits are ready).
"""

from __future__ import annotations

import argparse
import itertools
import logging
import time
from typing import Any

from octavo.benchmarks import report as rep
from octavo.benchmarks.common import (
    add_backend_args,
    engine_config,
    load_engines,
    load_tokenizer,
    paired_ratios,
    parse_backends,
)
from octavo.benchmarks.datasets import SampleRequest, random_requests, special_ids
from octavo.benchmarks.structured import KEY as STRUCTURED
from octavo.benchmarks.structured import add_structured_output_arg, check_args, constrain

logger = logging.getLogger(__name__)

_ids = itertools.count()


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    from octavo.entrypoints.engine_cli import add_engine_args

    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--input-len", type=int, default=32)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--num-iters-warmup", type=int, default=2)
    parser.add_argument("--num-iters", type=int, default=10)
    add_backend_args(parser)
    add_structured_output_arg(parser)
    rep.add_report_args(parser)
    add_engine_args(parser)


def octavo_iteration(
    engine: Any, requests: list[SampleRequest], output_len: int, structured: bool = False
) -> dict[str, Any]:
    """One batch through ``LLMEngine.step``; per-request token timestamps."""
    from octavo.engine.output_processor import OutputKind
    from octavo.sampling_params import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=output_len, min_tokens=output_len, ignore_eos=True)
    if structured:
        params = constrain(params)
    stamps: dict[str, list[float]] = {}
    t0, cpu0 = time.perf_counter(), time.process_time()
    for r in requests:
        rid = f"latency-{next(_ids)}"
        stamps[rid] = []
        engine.add_request(rid, {"prompt_token_ids": r.prompt}, params, output_kind=OutputKind.DELTA)
    while engine.has_unfinished_requests():
        outs = engine.step()
        now = time.perf_counter()
        for o in outs:
            n = sum(len(c.token_ids) for c in o.outputs)
            stamps[o.request_id].extend([now] * n)
    e2e = time.perf_counter() - t0
    cpu = time.process_time() - cpu0
    ttft, tpot, itl = [], [], []
    for ts in stamps.values():
        ttft.append(ts[0] - t0)
        if len(ts) > 1:
            tpot.append((ts[-1] - ts[0]) / (len(ts) - 1))
            itl.extend(b - a for a, b in zip(ts, ts[1:], strict=False))
    return {"e2e_s": e2e, "ttft_s": ttft, "tpot_s": tpot, "itl_s": itl,
            "mean_tpot_s": sum(tpot) / len(tpot) if tpot else 0.0,
            # This process's CPU time (all threads) per output token: robust to other load
            # on the machine, which wall times are not.
            "cpu_s_per_token": cpu / max(1, sum(len(ts) for ts in stamps.values())),
            "output_tokens": sum(len(ts) for ts in stamps.values())}


def hf_iteration(model: Any, tokenizer: Any, requests: list[SampleRequest], output_len: int) -> dict[str, Any]:
    from octavo.benchmarks.hf_backend import hf_latency_iteration

    r = hf_latency_iteration(model, tokenizer, requests, output_len)
    n = len(requests)
    return {"e2e_s": r["e2e_s"], "ttft_s": [r["ttft_s"]] * n,
            "tpot_s": [r["tpot_s"]] * n if r["tpot_s"] is not None else [],
            "itl_s": r["itl_s"], "output_tokens": r["output_tokens"]}


def summarize(iters: list[dict[str, Any]]) -> dict[str, float | int]:
    ttft = [x for it in iters for x in it["ttft_s"]]
    tpot = [x for it in iters for x in it["tpot_s"]]
    itl = [x for it in iters for x in it["itl_s"]]
    e2e = [it["e2e_s"] for it in iters]
    s: dict[str, float | int] = {}
    s.update(rep.percentiles(ttft, "ttft_ms", 1e3))
    s.update(rep.percentiles(tpot, "tpot_ms", 1e3))
    s.update(rep.percentiles(itl, "itl_ms", 1e3))
    s.update(rep.percentiles(e2e, "e2e_s"))
    s["output_tok_per_s"] = sum(it["output_tokens"] for it in iters) / sum(e2e)
    s["output_tokens_per_iter"] = int(iters[-1]["output_tokens"])
    return {k: v for k, v in s.items() if not k.startswith(("min_", "max_", "std_"))}


def run(args: argparse.Namespace) -> dict[str, Any]:
    backends = parse_backends(args.backend)
    for name in ("batch_size", "input_len", "output_len", "num_iters"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1; got {getattr(args, name)}")
    if args.num_iters_warmup < 0:
        raise ValueError(f"--num-iters-warmup must be >= 0; got {args.num_iters_warmup}")
    config = engine_config(args)
    mc = config.model_config
    if args.input_len + args.output_len > mc.max_model_len:
        raise ValueError(f"--input-len + --output-len must be <= max_model_len ({mc.max_model_len})")
    tokenizer = load_tokenizer(config)
    vocab, special = len(tokenizer), special_ids(tokenizer)

    structured = check_args(args, backends)
    llm, hf_model, results, env_extra = load_engines(args, backends, mc, "iterations")
    if structured:  # the same engine, constrained, right after each unconstrained iteration
        backends = [*backends, STRUCTURED]
        results[STRUCTURED] = {"summary": {}, "iterations": []}

    def one(b: str, reqs: list[SampleRequest]) -> dict[str, Any]:
        if b in ("octavo", STRUCTURED):
            return octavo_iteration(llm.llm_engine, reqs, args.output_len, structured=b == STRUCTURED)
        return hf_iteration(hf_model, tokenizer, reqs, args.output_len)

    from tqdm.auto import tqdm

    total = args.num_iters_warmup + args.num_iters
    bar = tqdm(total=total * len(backends), desc="latency iterations", disable=args.disable_tqdm,
               dynamic_ncols=True)
    stats_before = None
    for it in range(total):
        if it == args.num_iters_warmup and llm is not None:
            stats_before = llm.llm_engine.get_stats()
        reqs = random_requests(args.batch_size, args.input_len, args.output_len, vocab,
                               seed=args.seed + 1 + it, exclude_ids=special)
        for b in backends:
            out = one(b, reqs)
            bar.update(1)
            if it < args.num_iters_warmup:
                continue
            expected = args.batch_size * args.output_len
            if out["output_tokens"] != expected:
                logger.warning("%s produced %d output tokens, expected %d", b, out["output_tokens"], expected)
            results[b]["iterations"].append(out)
    bar.close()

    if stats_before is not None:  # acceptance over the counted iterations (all backends' octavo runs)
        results["octavo"]["summary"].update(rep.spec_decode_summary(stats_before, llm.llm_engine.get_stats()))
    for b in backends:
        res = results[b]
        res["summary"] = {**summarize(res["iterations"]), **res["summary"]}
        res["iterations"] = [
            {"e2e_s": it["e2e_s"], "ttft_s": it["ttft_s"], "tpot_s": it["tpot_s"],
             "mean_tpot_s": it.get("mean_tpot_s"), "cpu_s_per_token": it.get("cpu_s_per_token"),
             "output_tokens": it["output_tokens"]}
            for it in res["iterations"]
        ]
        res["runs"] = res.pop("iterations")

    label = "octavo / hf end-to-end latency per iteration"
    if structured:  # constrained and unconstrained iterations ran back to back on the same prompts
        runs = (results[STRUCTURED]["runs"], results["octavo"]["runs"])
        results["paired"] = paired_ratios(*runs, "mean_tpot_s")
        results["paired_cpu"] = paired_ratios(*runs, "cpu_s_per_token")
        label = f"{STRUCTURED} / octavo time per output token"
    elif len(backends) == 2:
        # Iterations of both backends ran back to back on the same prompts: pair them.
        results["paired"] = paired_ratios(results["octavo"]["runs"], results["hf"]["runs"], "e2e_s")
    if structured:
        per = ", ".join(f"{x:.2f}x" for x in results["paired_cpu"]["per_repeat"])
        print(f"{STRUCTURED} / octavo CPU time per output token: {per} (median {results['paired_cpu']['median']:.2f}x)")
    return rep.report_run(
        "latency", args, results, env_extra,
        f"latency: batch {args.batch_size}, {args.input_len} in + {args.output_len} out, "
        f"{args.num_iters} iterations after {args.num_iters_warmup} warm-up, model {mc.model}",
        label,
    )


def main(args: argparse.Namespace) -> int:
    run(args)
    return 0
