"""Flags of ``octavo serve`` (kept free of FastAPI imports so ``octavo --help`` stays fast)."""

from __future__ import annotations

import argparse

DEFAULT_MAX_REQUEST_BYTES = 16 * 1024 * 1024
DEFAULT_ENGINE_TIMEOUT_S = 60.0  # same as octavo.engine.core_client (not imported: keeps --help fast)


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
    parser.add_argument("--body-read-timeout", type=float, default=30.0,
                        help="seconds a request body may go without data (e.g. shorter than its "
                             "Content-Length) before the server answers 408 and closes the connection")
    parser.add_argument("--shutdown-timeout", type=float, default=10.0,
                        help="seconds to let requests in flight finish after SIGTERM/SIGINT")
    parser.add_argument("--engine-timeout", type=float, default=DEFAULT_ENGINE_TIMEOUT_S,
                        help="seconds the engine may go without a heartbeat, or spend in one step, before it "
                             "is declared dead: /health and engine routes answer 503, requests in flight fail")
    parser.add_argument("--keep-alive-on-engine-death", action="store_true",
                        help="keep answering 503 after the engine died instead of exiting with code 1 "
                             "after a short grace period (the default lets a restart policy restart the server)")
    parser.add_argument("--max-unsent-tokens", type=int, default=4096,
                        help="backpressure: generated tokens a streaming request may hold unsent while its "
                             "client does not read; past that the request is paused (no new tokens) until "
                             "the client reads")
    parser.add_argument("--stalled-stream-timeout", type=float, default=30.0,
                        help="seconds a request may stay paused over --max-unsent-tokens before it is aborted")
    parser.add_argument("--uvicorn-log-level", default="warning",
                        choices=["critical", "error", "warning", "info", "debug", "trace"],
                        help="uvicorn's own log level (default: %(default)s)")
    add_engine_args(parser, model_positional=True)
