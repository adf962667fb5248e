"""The ``octavo`` command: ``generate``, ``info``, ``bench``, ``serve``, ``export``.

Building the parser imports no torch (``octavo --help`` answers at once): engine flags come
from ``engine_cli``, which reads ``EngineArgs`` from source. Every command checks its flags
and the machine (``preflight``) before an engine starts; a usage error is one ``error:`` line
and exit code 2, a missing optional extra is one line naming the ``pip install`` and exit 1.
"""

from __future__ import annotations

import argparse
import sys

from octavo.entrypoints import preflight
from octavo.entrypoints.engine_cli import add_engine_args, resolve_model_arg
from octavo.utils.extras import MissingExtraError, require_extra


def _require_executor_extra(args: argparse.Namespace) -> None:
    if getattr(args, "distributed_executor_backend", "mp") == "ray":
        require_extra("ray", "--distributed-executor-backend ray")


def _cmd_generate(args: argparse.Namespace) -> int:
    _require_executor_extra(args)
    preflight.check_prompts(args.prompt)
    preflight.check_sampling(args)
    preflight.check_parallel(args.tensor_parallel_size)
    preflight.warn_ignored(args)
    from octavo.engine.arg_utils import EngineArgs
    from octavo.entrypoints.llm import LLM
    from octavo.sampling_params import SamplingParams

    llm = LLM(**vars(EngineArgs.from_cli_args(args)))
    # Exactly LLM.generate's defaults (the model's generation_config.json), then the flags given.
    defaults = llm.llm_engine.config.model_config.sampling_defaults
    params = SamplingParams(
        **{**defaults, **preflight.sampling_overrides(args)},
        max_tokens=args.max_tokens, seed=args.sampling_seed, ignore_eos=args.ignore_eos, n=args.n,
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
    for key, value in collect_info(
        args.model, args.tensor_parallel_size, args.enable_expert_parallel, args.quantization
    ).items():
        print(f"{key:<20} {value}")
    return 0


def _cmd_bench(args: argparse.Namespace) -> int:
    import importlib

    if args.bench_command == "serve":
        require_extra("bench", "`octavo bench serve`", ("httpx",))
        if args.sweep_rates:
            require_extra("bench", "`octavo bench serve --sweep-rates` (its plot)", ("matplotlib",))
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
    require_extra("serve", "`octavo serve`")
    _require_executor_extra(args)
    from octavo import envs

    args.api_key = preflight.check_api_key(args, envs.OCTAVO_API_KEY)
    preflight.check_port_free(args.host, args.port)
    preflight.check_parallel(args.tensor_parallel_size)
    preflight.warn_ignored(args)
    from octavo.entrypoints.openai.api_server import cmd_serve

    return cmd_serve(args)


def _add_serve_parser(sub) -> None:
    from octavo.entrypoints.openai.cli_args import add_serve_args

    serve = sub.add_parser("serve", help="serve a model over an OpenAI-compatible HTTP API")
    add_serve_args(serve)
    serve.set_defaults(func=_cmd_serve)


def _add_generate_parser(sub) -> None:
    gen = sub.add_parser("generate", help="generate text offline for one or more prompts")
    gen.add_argument("prompt", nargs="+", help="prompt text (several prompts run as one batch)")
    gen.add_argument("--max-tokens", type=int, default=64, help="most new tokens per output (default: %(default)s)")
    unset = "default: the model's generation_config.json, else"
    gen.add_argument("--temperature", type=float, default=None, help=f"0 is greedy ({unset} 1.0)")
    gen.add_argument("--top-p", type=float, default=None, help=f"nucleus sampling mass in (0, 1] ({unset} 1.0)")
    gen.add_argument("--top-k", type=int, default=None, help=f"keep the k most likely tokens, 0 = all ({unset} 0)")
    gen.add_argument("--min-p", type=float, default=None, help=f"drop tokens below min_p x the top probability ({unset} 0)")
    gen.add_argument("--repetition-penalty", type=float, default=None, help=f"> 1 discourages repeats ({unset} 1.0)")
    gen.add_argument("--n", type=int, default=1, help="outputs per prompt")
    gen.add_argument("--sampling-seed", type=int, default=None, help="per-request sampling seed")
    gen.add_argument("--ignore-eos", action="store_true", help="keep generating past the end-of-sequence token")
    add_engine_args(gen)
    gen.set_defaults(func=_cmd_generate)


def build_parser() -> argparse.ArgumentParser:
    from octavo import __version__

    parser = argparse.ArgumentParser(prog="octavo", description="octavo LLM inference engine")
    parser.add_argument("--version", action="version", version=f"octavo {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    _add_generate_parser(sub)
    info = sub.add_parser("info", help="print version, platform and every choice it made")
    info.add_argument("--model", default=None, help="also resolve the model's dtype, context and attention backend")
    info.add_argument("--models", action="store_true", help="list the supported architectures with their features, and the MoE flags")
    info.add_argument("--tensor-parallel-size", "-tp", type=int, default=1, help="show the per-rank placement for this tensor-parallel size")
    info.add_argument("--enable-expert-parallel", action="store_true", help="show the expert-parallel placement of a MoE model")
    info.add_argument("--quantization", "-q", default=None, help="show the quantization method and kernels for --model with this method")
    info.set_defaults(func=_cmd_info)
    _add_bench_parser(sub)
    _add_serve_parser(sub)
    from octavo.entrypoints.export_cli import add_export_parser

    add_export_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    from octavo.logger import configure_logging

    configure_logging()
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        resolve_model_arg(args)
        return args.func(args)
    except MissingExtraError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
