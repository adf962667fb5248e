"""Flags of ``octavo serve`` (kept free of FastAPI imports so ``octavo --help`` stays fast)."""

from __future__ import annotations

import argparse

DEFAULT_MAX_REQUEST_BYTES = 16 * 1024 * 1024


def add_serve_args(parser: argparse.ArgumentParser) -> None:
    from octavo.entrypoints.engine_cli import add_engine_args

    parser.add_argument("model", nargs="?", default=None,
                        help="model folder or cached Hub id (default: the model shipped with octavo); "
                        "--model MODEL works too")
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to listen on (default loopback; use 0.0.0.0 to listen everywhere)")
    parser.add_argument("--port", type=int, default=8000, help="TCP port to listen on (default: %(default)s)")
    parser.add_argument("--api-key", default=None,
                        help="require 'Authorization: Bearer KEY' on /v1 routes (default: $OCTAVO_API_KEY); "
                        "an empty value is an error")
    parser.add_argument("--chat-template", default=None,
                        help="Jinja chat template (a file, or the template itself) replacing the tokenizer's")
    parser.add_argument("--enable-auto-tool-choice", action="store_true",
                        help='let the model decide when to call tools (tool_choice "auto"); needs --tool-call-parser')
    parser.add_argument("--tool-call-parser", default=None,
                        choices=["hermes", "llama3_json", "mistral", "pythonic", "qwen3_coder", "qwen3_xml"],
                        help="how tool calls are written in the model's output (for tool_choice \"auto\")")
    parser.add_argument("--max-request-bytes", type=int, default=DEFAULT_MAX_REQUEST_BYTES,
                        help="largest accepted request body; larger ones get 413")
    parser.add_argument("--shutdown-timeout", type=float, default=10.0,
                        help="seconds to let requests in flight finish after SIGTERM/SIGINT")
    parser.add_argument("--uvicorn-log-level", default="warning",
                        choices=["critical", "error", "warning", "info", "debug", "trace"],
                        help="uvicorn's own log level (default: %(default)s)")
    add_engine_args(parser, model_positional=True)
