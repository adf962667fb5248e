"""The OpenAI-compatible HTTP server (FastAPI + uvicorn): ``octavo serve``.

Routes: ``POST /v1/completions``, ``POST /v1/chat/completions``, ``GET /v1/models``,
``POST /tokenize``, ``POST /detokenize``, ``GET /health`` (503 once the engine is dead),
``GET /metrics`` (Prometheus), ``GET /version``, OpenAPI docs at ``/docs``.

``run_server`` starts the engine core first (its own process unless ``OCTAVO_ENGINE_INPROC=1``),
then uvicorn. On SIGTERM/SIGINT uvicorn stops accepting connections and waits up to
``--shutdown-timeout`` seconds for responses in flight (then cancels them, which aborts their
requests); then the engine process is stopped and the command exits 0.

When the engine dies or hangs (``--engine-timeout``), requests in flight fail at once, every
route that needs the engine answers 503 (code ``engine_dead``), and after
``ENGINE_DEATH_GRACE_S`` the server stops and the command exits 1, so that a restart policy
restarts it; ``--keep-alive-on-engine-death`` keeps it answering 503 instead (vLLM's flags).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from collections.abc import Sequence
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import Response

from octavo import __version__, envs
from octavo.engine.async_llm import AsyncLLM
from octavo.engine.core_client import EngineStartupError
from octavo.entrypoints.openai.cli_args import DEFAULT_MAX_REQUEST_BYTES
from octavo.entrypoints.openai.errors import OpenAIError, engine_dead_error, install_error_handlers
from octavo.entrypoints.openai.http_utils import (
    APIKeyMiddleware,
    BodySizeLimitMiddleware,
    FastJSONRoute,
)
from octavo.entrypoints.openai.openapi import served_openapi
from octavo.entrypoints.openai.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    DetokenizeResponse,
    ErrorResponse,
    ModelCard,
    ModelList,
    TokenizeChatRequest,
    TokenizeCompletionRequest,
    TokenizeResponse,
    VersionResponse,
)
from octavo.entrypoints.openai.serving_chat import OpenAIServingChat, load_chat_template
from octavo.entrypoints.openai.serving_completion import OpenAIServingCompletion
from octavo.entrypoints.openai.serving_engine import PrepPool
from octavo.entrypoints.openai.tool_calls import ToolServerConfig
from octavo.metrics import CONTENT_TYPE_LATEST, ServerMetrics

logger = logging.getLogger(__name__)

ENGINE_DEATH_GRACE_S = 2.0  # lets the failed requests' answers go out before the server stops

_ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorResponse} for code in (400, 401, 404, 413, 500, 503)
}


def build_app(
    engine: AsyncLLM,
    served_model_name: str | Sequence[str] | None = None,
    *,
    api_key: str | None = None,
    chat_template: str | None = None,
    tool_config: ToolServerConfig | None = None,
    metrics: ServerMetrics | None = None,
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
    body_read_timeout_s: float = 30.0,
) -> FastAPI:
    name = served_model_name or engine.model_config.served_model_name
    names = [name] if isinstance(name, str) else list(name)
    app = FastAPI(
        title="octavo",
        version=__version__,
        summary="OpenAI-compatible API of the octavo inference engine",
        responses=_ERRORS,
    )
    app.router.route_class = FastJSONRoute
    install_error_handlers(app)
    pool = PrepPool()
    completions = OpenAIServingCompletion(engine, names, pool)
    chat = OpenAIServingChat(engine, names, chat_template, pool, tool_config)
    app.state.engine = engine
    app.state.metrics = metrics
    app.state.pool = pool
    mc = engine.model_config
    served_openapi(app, mc.vocab_size, mc.max_model_len, completions.max_prompt_chars, list(names))

    @app.post("/v1/completions", tags=["OpenAI"])
    async def create_completion(request: CompletionRequest, raw_request: Request) -> Response:
        return await completions.create_completion(request, raw_request)

    @app.post("/v1/chat/completions", tags=["OpenAI"])
    async def create_chat_completion(request: ChatCompletionRequest, raw_request: Request) -> Response:
        return await chat.create_chat_completion(request, raw_request)

    @app.get("/v1/models", tags=["OpenAI"])
    async def list_models() -> ModelList:
        completions.check_engine()
        mc = engine.model_config
        return ModelList(data=[ModelCard(id=n, root=mc.model, max_model_len=mc.max_model_len) for n in names])

    @app.post("/tokenize", tags=["utilities"])
    async def tokenize(request: TokenizeCompletionRequest | TokenizeChatRequest) -> TokenizeResponse:
        completions.check_model(request.model)
        completions.check_engine()
        if isinstance(request, TokenizeChatRequest):
            prompt = await pool.run(
                chat.render, request.messages, request.add_generation_prompt, request.continue_final_message,
                request.add_special_tokens, request.chat_template_kwargs,
                [t.model_dump(exclude_none=True) for t in request.tools or []] or None,
            )
        else:
            completions.check_prompt_chars(len(request.prompt))
            prompt = await pool.run(completions.tokenize_text, request.prompt, request.add_special_tokens)
        ids = prompt["prompt_token_ids"]
        return TokenizeResponse(count=len(ids), max_model_len=engine.model_config.max_model_len, tokens=ids)

    @app.post("/detokenize", tags=["utilities"])
    async def detokenize(request: DetokenizeRequest) -> DetokenizeResponse:
        completions.check_model(request.model)
        completions.check_engine()
        vocab = engine.model_config.vocab_size
        for t in request.tokens:
            if t >= vocab:
                raise OpenAIError(f"tokens contains token id {t} outside [0, {vocab})", param="tokens")
        return DetokenizeResponse(prompt=await pool.run(completions.decode, request.tokens))

    @app.get("/health", tags=["utilities"], response_class=Response,
             responses={200: {"description": "the engine is alive", "content": None},
                        503: {"model": ErrorResponse, "description": "the engine is dead or hung"}})
    async def health() -> Response:
        if engine.is_dead:
            return engine_dead_error(engine.dead_reason).response()
        return Response(status_code=200)

    @app.get("/metrics", tags=["utilities"], response_class=Response)
    async def prometheus_metrics() -> Response:
        body = metrics.render() if metrics is not None else b""
        return Response(body, media_type=CONTENT_TYPE_LATEST)

    @app.get("/version", tags=["utilities"])
    async def version() -> VersionResponse:
        return VersionResponse(version=__version__)

    app.add_middleware(BodySizeLimitMiddleware, max_bytes=max_request_bytes, timeout_s=body_read_timeout_s)
    if api_key:
        app.add_middleware(APIKeyMiddleware, api_key=api_key)
    return app


# -- CLI (flags in cli_args.py) ----------------------------------------------------------------
class _Server(uvicorn.Server):
    """uvicorn's server, plus: requests still running ``timeout_s`` after the shutdown began are
    aborted in the engine, so their clients get a 503 (or an error event) instead of a cut."""

    def __init__(self, config: uvicorn.Config, engine: AsyncLLM, timeout_s: float) -> None:
        super().__init__(config)
        self.engine = engine
        self.timeout_s = timeout_s

    async def _abort_late(self) -> None:
        await asyncio.sleep(self.timeout_s)
        n = self.engine.abort_all()
        if n:
            logger.warning("shutdown: aborted %d request(s) still running after %.1fs", n, self.timeout_s)

    async def shutdown(self, sockets: Any = None) -> None:
        task = asyncio.create_task(self._abort_late())
        try:
            await super().shutdown(sockets)
        finally:
            task.cancel()


async def run_server(args: argparse.Namespace) -> int:
    from octavo.engine.arg_utils import EngineArgs

    engine_args = EngineArgs.from_cli_args(args)
    chat_template = load_chat_template(args.chat_template)
    tool_config = ToolServerConfig(args.enable_auto_tool_choice, args.tool_call_parser)
    if args.max_request_bytes < 1:
        raise ValueError(f"--max-request-bytes must be >= 1; got {args.max_request_bytes}")
    if args.max_unsent_tokens < 1:
        raise ValueError(f"--max-unsent-tokens must be >= 1; got {args.max_unsent_tokens}")
    if not args.stalled_stream_timeout > 0:
        raise ValueError(f"--stalled-stream-timeout must be > 0 seconds; got {args.stalled_stream_timeout}")
    if not args.body_read_timeout > 0:
        raise ValueError(f"--body-read-timeout must be > 0 seconds; got {args.body_read_timeout}")
    if not args.engine_timeout > 0:
        raise ValueError(f"--engine-timeout must be > 0 seconds; got {args.engine_timeout}")
    if not 0 <= args.port <= 65535:
        raise ValueError(f"--port must be in [0, 65535]; got {args.port}")
    config = engine_args.create_engine_config()  # fail fast on a bad flag, before any process starts
    served = config.model_config.served_model_name
    metrics = ServerMetrics(served)
    engine = await AsyncLLM.from_engine_args(
        engine_args, stat_logger=metrics, config=config, engine_timeout_s=args.engine_timeout,
        max_unsent_tokens=args.max_unsent_tokens, stalled_stream_timeout_s=args.stalled_stream_timeout,
    )
    try:
        app = build_app(
            engine, engine_args.served_model_names() or served, api_key=args.api_key or envs.OCTAVO_API_KEY,
            chat_template=chat_template, tool_config=tool_config, metrics=metrics,
            max_request_bytes=args.max_request_bytes, body_read_timeout_s=args.body_read_timeout,
        )
        uv_config = uvicorn.Config(
            app, host=args.host, port=args.port, log_level=args.uvicorn_log_level,
            timeout_graceful_shutdown=args.shutdown_timeout + 5.0, lifespan="off", access_log=False,
        )
        server = _Server(uv_config, engine, args.shutdown_timeout)
        # uvicorn re-raises the signal that stopped it once it is done; answer it with a no-op
        # so that we get to stop the engine and exit 0.
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: None)
        logger.info("serving %r on http://%s:%d (engine pid %s)", served, args.host, args.port, engine.engine_pid)
        watcher = asyncio.create_task(_exit_on_engine_death(server, engine, args.keep_alive_on_engine_death))
        await server.serve()
        watcher.cancel()
        if not server.started:
            return 1
    finally:
        await engine.shutdown()
    if engine.is_dead and not args.keep_alive_on_engine_death:
        logger.error("server stopped because the engine is dead: %s", engine.dead_reason)
        return 1
    logger.info("server stopped")
    return 0


async def _exit_on_engine_death(server: uvicorn.Server, engine: AsyncLLM, keep_alive: bool) -> None:
    reason = await engine.wait_dead()
    if keep_alive:
        logger.error("the engine is dead (%s); --keep-alive-on-engine-death: answering 503", reason)
        return
    logger.error("the engine is dead (%s); stopping the server in %.0fs", reason, ENGINE_DEATH_GRACE_S)
    await asyncio.sleep(ENGINE_DEATH_GRACE_S)
    server.should_exit = True


def cmd_serve(args: argparse.Namespace) -> int:
    """``octavo serve``: runs until SIGTERM/SIGINT, then exits the process.

    Once the server and the engine have stopped cleanly the process leaves with ``os._exit``:
    the interpreter's teardown of torch and friends adds seconds on a busy host and there is
    nothing left to clean up.
    """
    try:
        code = asyncio.run(run_server(args))
    except KeyboardInterrupt:
        code = 0
    except EngineStartupError as e:
        print(f"error: {e}", file=sys.stderr)
        code = 1
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
