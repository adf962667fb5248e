"""The ``octavo`` command: ``generate``, ``info``, ``bench``, ``serve``."""

from __future__ import annotations

import argparse
import sys


def _cmd_generate(args: argparse.Namespace) -> int:
    from octavo.engine.arg_utils import EngineArgs
    from octavo.entrypoints.llm import LLM
    from octavo.sampling_params import SamplingParams

    eargs = EngineArgs.from_cli_args(args)
    llm = LLM(**{k: v for k, v in vars(eargs).items()})
    params = SamplingParams(
        max_tokens=args.max_tokens,
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        seed=args.sampling_seed,
        ignore_eos=args.ignore_eos,
        n=args.n,
    )
    outs = llm.generate(args.prompt, params, use_tqdm=False)
    for out in outs:
        for c in out.outputs:
            if len(out.outputs) > 1:
                print(f"--- sample {c.index} ({c.finish_reason}) ---")
            print(out.prompt + c.text)
    return 0


def _cmd_info(args: argparse.Namespace) -> int:
    from octavo.entrypoints.info import collect_info, models_table

    if args.models:
        print("\n".join(models_table()))
        return 0
    for key, value in collect_info(args.model, args.tensor_parallel_size, args.enable_expert_parallel).items():
        print(f"{key:<20} {value}")
    return 0


def _cmd_bench(args: argparse.Namespace) -> int:
    import importlib

    module = importlib.import_module(f"octavo.benchmarks.{args.bench_command}")
    return module.main(args)


def _add_bench_parser(sub) -> None:
    from octavo.benchmarks import latency, serve, throughput

    bench = sub.add_parser("bench", help="benchmark throughput, latency or a running server")
    bsub = bench.add_subparsers(dest="bench_command", required=True)
    for name, module, text in (
        ("throughput", throughput, "offline throughput (requests/s, tokens/s)"),
        ("latency", latency, "time to first token, time per output token, end-to-end latency"),
        ("serve", serve, "load-test an OpenAI-compatible server (Poisson arrivals, streaming)"),
    ):
        p = bsub.add_parser(name, help=text, description=module.__doc__,
                            formatter_class=argparse.RawDescriptionHelpFormatter)
        module.add_cli_args(p)
        p.set_defaults(func=_cmd_bench)


def _cmd_serve(args: argparse.Namespace) -> int:
    from octavo.entrypoints.openai.api_server import cmd_serve

    return cmd_serve(args)


def _add_serve_parser(sub) -> None:
    from octavo.entrypoints.openai.cli_args import add_serve_args

    serve = sub.add_parser("serve", help="serve a model over an OpenAI-compatible HTTP API")
    add_serve_args(serve)
    serve.set_defaults(func=_cmd_serve)


def build_parser() -> argparse.ArgumentParser:
    from octavo import __version__
    from octavo.engine.arg_utils import EngineArgs

    parser = argparse.ArgumentParser(prog="octavo", description="octavo LLM inference engine")
    parser.add_argument("--version", action="version", version=f"octavo {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    gen = sub.add_parser("generate", help="generate text offline for one or more prompts")
    gen.add_argument("prompt", nargs="+", help="prompt text (several prompts run as one batch)")
    gen.add_argument("--max-tokens", type=int, default=64)
    gen.add_argument("--temperature", type=float, default=0.0)
    gen.add_argument("--top-p", type=float, default=1.0)
    gen.add_argument("--top-k", type=int, default=0)
    gen.add_argument("--n", type=int, default=1)
    gen.add_argument("--sampling-seed", type=int, default=None, help="per-request sampling seed")
    gen.add_argument("--ignore-eos", action="store_true")
    EngineArgs.add_cli_args(gen)
    gen.set_defaults(func=_cmd_generate)

    info = sub.add_parser("info", help="print version, platform and every choice it made")
    info.add_argument("--model", default=None)
    info.add_argument("--models", action="store_true",
                      help="list the supported architectures with their features, and the MoE flags")
    info.add_argument("--tensor-parallel-size", "-tp", type=int, default=1)
    info.add_argument("--enable-expert-parallel", action="store_true")
    info.set_defaults(func=_cmd_info)

    _add_bench_parser(sub)
    _add_serve_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    from octavo.logger import configure_logging

    configure_logging()
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
