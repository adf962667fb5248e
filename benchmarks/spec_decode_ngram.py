#!/usr/bin/env python3
"""Speculative decoding on the CPU, a code-editing workload: batch-1 time per output token
with speculation (n-gram, or a draft model) vs without, interleaved in one run.

Workload: the prompt is a small Python file followed by a comment asking for the same file
with one small change and the start of that file; the output (greedy, ``ignore_eos``,
``--output-len`` tokens) is the model's rewrite. The model is octavo's shipped one (8 MB,
trained on Python): too small to carry the edit out, its greedy output repeats its own recent
lines rather than the prompt's, and prompt lookup drafts from those repeats (1.6-2.7 tokens per
step). A model that copies the file would do better: on the exact rewrite, prompt lookup with
k = 4 proposes 4.9 tokens per step.
With ``--method draft_model`` the draft is ``--draft-model``, or by default a layer-skip
draft of the target (its first ``--draft-layers`` layers, ``benchmarks/layer_skip_draft.py``).

Both engines live in this process; each round runs one batch-1 request on each (the order
alternates per round) and records its time per output token (TPOT: the spread of the
request's token timestamps over ``output_len - 1``) and this process's CPU time per output
token. The report gives medians, per-round ratios spec / no-spec and their median, the
acceptance counts, the machine's load average and CPU/ISA, and checks that both engines
produced the same tokens (greedy output is identical with speculation on).

Example:
  python benchmarks/spec_decode_ngram.py --rounds 7 --num-speculative-tokens 4 --json-out spec.json
  python benchmarks/spec_decode_ngram.py --method draft_model --draft-layers 1 --num-speculative-tokens 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics

FILE = '''import time


class RetryPolicy:
    """Retry a callable with exponential backoff."""

    def __init__(self, attempts=3, delay=0.1, factor=2.0):
        self.attempts = attempts
        self.delay = delay
        self.factor = factor

    def delays(self):
        delay = self.delay
        for _ in range(self.attempts - 1):
            yield delay
            delay *= self.factor

    def call(self, func, *args, **kwargs):
        last_error = None
        for delay in [0.0, *self.delays()]:
            if delay:
                time.sleep(delay)
            try:
                return func(*args, **kwargs)
            except OSError as error:
                last_error = error
        raise last_error


def fetch(path):
    with open(path) as f:
        return f.read()


def read_config(path, policy=None):
    policy = policy or RetryPolicy()
    text = policy.call(fetch, path)
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)
'''

INSTRUCTION = "\n\n# The same module, with the default number of attempts raised from 3 to 5:\n\n"


def code_edit_prompt() -> str:
    return "# retry.py\n\n" + FILE + INSTRUCTION + "import time\n"


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help="default: the shipped model")
    p.add_argument("--method", choices=("ngram", "draft_model"), default="ngram")
    p.add_argument("--draft-model", default=None, help="draft_model: default a layer-skip draft of --model")
    p.add_argument("--draft-layers", type=int, default=1, help="layers of the default layer-skip draft")
    p.add_argument("--num-speculative-tokens", type=int, default=4)
    p.add_argument("--prompt-lookup-min", type=int, default=1)
    p.add_argument("--prompt-lookup-max", type=int, default=5)
    p.add_argument("--output-len", type=int, default=256)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--dtype", default="auto", help="default: the checkpoint's (what octavo generate uses)")
    p.add_argument("--json-out", default=None)
    return p.parse_args()


def one_request(llm, prompt_ids: list[int], output_len: int) -> dict:
    from octavo.benchmarks.datasets import SampleRequest
    from octavo.benchmarks.latency import octavo_iteration

    out = octavo_iteration(llm.llm_engine, [SampleRequest(prompt_ids, len(prompt_ids), output_len)], output_len)
    return {"tpot_s": out["mean_tpot_s"], "cpu_s_per_token": out["cpu_s_per_token"]}


def tokens_of(llm, prompt_ids: list[int], output_len: int) -> list[int]:
    from octavo import SamplingParams

    sp = SamplingParams(temperature=0, max_tokens=output_len, ignore_eos=True)
    return list(llm.generate({"prompt_token_ids": prompt_ids}, sp, use_tqdm=False)[0].outputs[0].token_ids)


def speculative_config(args: argparse.Namespace) -> dict:
    if args.method == "ngram":
        return {"method": "ngram", "num_speculative_tokens": args.num_speculative_tokens,
                "prompt_lookup_min": args.prompt_lookup_min, "prompt_lookup_max": args.prompt_lookup_max}
    draft = args.draft_model
    if draft is None:
        import tempfile

        from benchmarks.layer_skip_draft import write_layer_skip_draft
        from octavo.engine.model_files import resolve_model_path

        out = tempfile.mkdtemp(prefix="octavo-layer-skip-draft-")
        draft = write_layer_skip_draft(resolve_model_path(args.model), args.draft_layers, out)
    return {"method": "draft_model", "model": draft, "num_speculative_tokens": args.num_speculative_tokens}


def main() -> int:
    args = parse_args()
    from octavo import LLM
    from octavo.benchmarks.report import spec_decode_summary
    from octavo.cpu_isa import cpu_name, describe

    spec_cfg = speculative_config(args)
    kw = {"model": args.model} if args.model else {}
    engines = {"base": LLM(dtype=args.dtype, enable_prefix_caching=False, **kw),
               "spec": LLM(dtype=args.dtype, enable_prefix_caching=False, speculative_config=spec_cfg, **kw)}
    prompt_ids = engines["base"].get_tokenizer().encode(code_edit_prompt())
    same = tokens_of(engines["base"], prompt_ids, args.output_len) == tokens_of(engines["spec"], prompt_ids, args.output_len)
    rows: dict[str, list[dict]] = {"base": [], "spec": []}
    load_before = os.getloadavg()
    stats0 = None
    for r in range(args.warmup + args.rounds):
        if r == args.warmup:
            stats0 = engines["spec"].llm_engine.get_stats()
        order = ("base", "spec") if r % 2 == 0 else ("spec", "base")
        for name in order:
            res = one_request(engines[name], prompt_ids, args.output_len)
            if r >= args.warmup:
                rows[name].append(res)
    load_after = os.getloadavg()
    acc = spec_decode_summary(stats0, engines["spec"].llm_engine.get_stats())
    ratios = [s["tpot_s"] / b["tpot_s"] for b, s in zip(rows["base"], rows["spec"], strict=True)]
    cpu_ratios = [s["cpu_s_per_token"] / b["cpu_s_per_token"] for b, s in zip(rows["base"], rows["spec"], strict=True)]
    report = {
        "machine": {"cpu": cpu_name(), "isa": describe(), "cores": os.cpu_count(),
                    "loadavg_before": load_before, "loadavg_after": load_after},
        "config": {**vars(args), "prompt_tokens": len(prompt_ids), "speculative_config": spec_cfg},
        "greedy_identical": same,
        "median_tpot_ms": {k: 1e3 * statistics.median(x["tpot_s"] for x in v) for k, v in rows.items()},
        "tpot_ratio_spec_vs_base_per_round": ratios,
        "median_tpot_ratio_spec_vs_base": statistics.median(ratios),
        "median_cpu_per_token_ratio_spec_vs_base": statistics.median(cpu_ratios),
        "spec_decode": acc,
    }
    print(json.dumps(report, indent=2))
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(report, f, indent=2)
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
