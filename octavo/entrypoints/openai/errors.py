"""Every error the server answers is in OpenAI's shape:
``{"error": {"message": ..., "type": ..., "param": ..., "code": ...}}``.

``OpenAIError`` is raised by the serving code; the handlers installed by
``install_error_handlers`` turn it, request validation errors (422 in FastAPI, 400 here),
Starlette's HTTP errors (404 unknown route, 405, ...), ``ValueError`` from the input processor
(400), ``EngineDeadError`` (503, code ``engine_dead``) and anything unexpected (500) into that
shape. Errors never reach the engine loop.
"""

from __future__ import annotations

import json
import logging
from http import HTTPStatus
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from octavo.engine.async_llm import ClientStalledError, ShuttingDownError
from octavo.engine.core_client import EngineDeadError

logger = logging.getLogger(__name__)

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    408: "timeout_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    429: "rate_limit_error",
    500: "internal_error",
    503: "service_unavailable",
}


class OpenAIError(Exception):
    def __init__(
        self,
        message: str,
        status: int = 400,
        param: str | None = None,
        code: str | None = None,
        err_type: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.param = param
        self.code = code
        self.err_type = err_type or _TYPES.get(status, "invalid_request_error" if status < 500 else "internal_error")

    def body(self) -> dict[str, Any]:
        return {
            "error": {"message": self.message, "type": self.err_type, "param": self.param, "code": self.code}
        }

    def response(self, headers: dict[str, str] | None = None) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=headers)


def engine_dead_error(e: BaseException | str | None = None) -> OpenAIError:
    """503: the engine died or hung; nothing that needs it can be served (vLLM's status)."""
    detail = f": {e}" if e is not None and str(e) else ""
    return OpenAIError(f"the engine is dead{detail}", 503, code="engine_dead")


def param_from_message(msg: str) -> str | None:
    """``SamplingParams`` and the processor start their messages with the field name."""
    import dataclasses

    from octavo.sampling_params import SamplingParams

    first = msg.split(" ", 1)[0].rstrip(":,")
    if first.startswith("structured_outputs."):
        return first
    names = {f.name for f in dataclasses.fields(SamplingParams)} | {"prompt", "messages"}
    return first if first in names else None


def to_openai_error(exc: BaseException) -> OpenAIError:
    """Map any exception the serving code may see to an OpenAIError."""
    if isinstance(exc, OpenAIError):
        return exc
    if isinstance(exc, EngineDeadError):
        return engine_dead_error(exc)
    if isinstance(exc, ClientStalledError):
        return OpenAIError(str(exc), 408, code="client_stalled")
    if isinstance(exc, ShuttingDownError):
        return OpenAIError(str(exc), 503, code="server_shutting_down")
    if isinstance(exc, ValueError):
        msg = str(exc)
        return OpenAIError(msg, 400, param=param_from_message(msg))
    logger.error("internal error", exc_info=exc)
    return OpenAIError(f"internal error: {type(exc).__name__}", 500, code="internal_error")


def sse_error(exc: BaseException) -> str:
    """An error inside a started stream: one ``data:`` event with the error body."""
    return f"data: {json.dumps(to_openai_error(exc).body())}\n\n"


def _unsupported_fields(errors: list[dict[str, Any]]) -> tuple[str, str] | None:
    """Fields the request models forbid (pydantic ``extra_forbidden``): named, all of them."""
    names = [".".join(str(p) for p in e.get("loc", ()) if p != "body" and not str(p)[:1].isupper())
             for e in errors if e.get("type") == "extra_forbidden"]
    if not names:
        return None
    listed = ", ".join(repr(n) for n in names)
    noun = "field" if len(names) == 1 else "fields"
    return f"unsupported request {noun} {listed}: octavo does not implement {'it' if len(names) == 1 else 'them'}", names[0]


def _closest_member(errors: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A body that is a union of models (``/tokenize``) fails every member; the member whose
    fields the body has is the one the client meant (a prompt with a lone surrogate is a bad
    completion-style body, not a chat body with an unknown field ``prompt``)."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for e in errors:
        loc = [str(p) for p in e.get("loc", ()) if p != "body"]
        groups.setdefault(loc[0] if loc and loc[0][:1].isupper() else "", []).append(e)
    if len(groups) < 2 or "" in groups:
        return errors
    # the member whose fields the body has (fewest missing / unknown fields), then fewest errors
    def shape_errors(group: list[dict[str, Any]]) -> tuple[int, int]:
        return sum(e.get("type") in ("missing", "extra_forbidden") for e in group), len(group)

    return min(groups.values(), key=shape_errors)


def _validation_message(errors: list[dict[str, Any]]) -> tuple[str, str | None]:
    if not errors:
        return "invalid request", None
    errors = _closest_member(errors)
    unsupported = _unsupported_fields(errors)
    if unsupported is not None:
        return unsupported
    # A union field (prompt: str | list[...]) reports one error per member; the member whose
    # type matched says what is wrong (too long, lone surrogate, ...), the others only "not a str".
    e = next((x for x in errors if not str(x.get("type", "")).endswith(("_type", "missing"))), errors[0])
    loc = [str(p) for p in e.get("loc", ()) if p != "body" and not str(p)[:1].isupper()]  # no model names
    if e.get("type") == "json_invalid":
        return f"the request body is not valid JSON: {e.get('ctx', {}).get('error', e.get('msg'))}", None
    if e.get("type") == "model_attributes_type" or (not loc and e.get("type") in ("dict_type", "model_type")):
        return "the request body must be a JSON object", None
    # Union members (prompt: str | list[...]) make pydantic report one error per member.
    param = ".".join(p for p in loc if not (p in ("str", "int") or "[" in p or p[:1].isupper())) or None
    msg = e.get("msg", "invalid value")
    if e.get("type") == "string_unicode":  # pydantic's own refusal of a lone surrogate
        msg = "contains a lone surrogate (or other text that is not valid Unicode); text must be valid Unicode"
    extra = f" (and {len(errors) - 1} more problems)" if len(errors) > 1 else ""
    return (f"{param}: {msg}" if param else msg) + extra, param


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(OpenAIError)
    async def _openai(_: Request, exc: OpenAIError) -> JSONResponse:
        return exc.response()

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        message, param = _validation_message(list(exc.errors()))
        return OpenAIError(message, 400, param=param).response()

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        try:
            phrase = HTTPStatus(exc.status_code).phrase
        except ValueError:
            phrase = "error"
        message = exc.detail if isinstance(exc.detail, str) else phrase
        return OpenAIError(message, exc.status_code).response(headers=getattr(exc, "headers", None))

    @app.exception_handler(EngineDeadError)
    async def _dead(_: Request, exc: EngineDeadError) -> JSONResponse:
        return engine_dead_error(exc).response()

    @app.exception_handler(ShuttingDownError)
    async def _shutting_down(_: Request, exc: ShuttingDownError) -> JSONResponse:
        return to_openai_error(exc).response()

    @app.exception_handler(ValueError)
    async def _value(_: Request, exc: ValueError) -> JSONResponse:
        return to_openai_error(exc).response()

    @app.exception_handler(Exception)
    async def _internal(_: Request, exc: Exception) -> JSONResponse:
        return to_openai_error(exc).response()
