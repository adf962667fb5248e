"""``POST /v1/completions``: one or many prompts (text or token ids), ``n`` samples each,
streamed as Server-Sent Events or answered in one body. Choice ``i * n + j`` is sample ``j``
of prompt ``i``, as in OpenAI's API. ``echo`` prepends the prompt; with ``logprobs`` the
prompt's tokens get logprobs too (the first ``None``), as vLLM does; ``prompt_logprobs`` are
returned per choice in vLLM's shape."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from octavo.engine.async_llm import RequestStream
from octavo.engine.output_processor import OutputKind
from octavo.engine.processor import PromptType
from octavo.entrypoints.openai.errors import OpenAIError
from octavo.entrypoints.openai.http_utils import (
    ClientDisconnected,
    SSEResponse,
    run_until_disconnect,
)
from octavo.entrypoints.openai.protocol import (
    MAX_PROMPTS,
    CompletionChoice,
    CompletionLogprobs,
    CompletionRequest,
    CompletionResponse,
    UsageInfo,
)
from octavo.entrypoints.openai.serving_engine import OpenAIServing, sse_events
from octavo.outputs import CompletionOutput, RequestOutput


class OpenAIServingCompletion(OpenAIServing):
    def _items(self, req: CompletionRequest) -> list[Any]:
        p = req.prompt
        if isinstance(p, str):
            items: list[Any] = [p]
        elif not p:
            raise OpenAIError("prompt must not be empty", param="prompt")
        elif isinstance(p[0], int):
            items = [p]
        else:
            items = list(p)
        if len(items) > MAX_PROMPTS:
            raise OpenAIError(f"at most {MAX_PROMPTS} prompts per request; got {len(items)}", param="prompt")
        for item in items:
            if isinstance(item, str):
                self.check_prompt_chars(len(item))
        return items

    def _tokenize_all(self, items: list[Any], add_special_tokens: bool) -> list[PromptType]:
        """Blocking (runs in the pool)."""
        return [
            self.tokenize_text(item, add_special_tokens) if isinstance(item, str) else {"prompt_token_ids": list(item)}
            for item in items
        ]

    async def create_completion(self, req: CompletionRequest, raw: Request) -> Response:
        self.check_model(req.model)
        self.check_engine()
        if req.suffix:
            raise OpenAIError("suffix is not supported", param="suffix")
        n = req.n or 1
        if req.best_of is not None and req.best_of != n:
            raise OpenAIError("best_of must equal n (octavo returns every sample)", param="best_of")
        items = self._items(req)
        if len(items) * n > MAX_PROMPTS:
            raise OpenAIError(
                f"n ({n}) x number of prompts ({len(items)}) must be <= {MAX_PROMPTS}", param="n"
            )
        params = self.sampling_params(req, req.max_tokens, req.logprobs)
        if req.echo and req.logprobs is not None:
            # the prompt's own logprobs come from the engine's prompt logprobs
            params.prompt_logprobs = max(params.prompt_logprobs or 0, req.logprobs)
        prompts = await self.pool.run(self._tokenize_all, items, req.add_special_tokens)
        await self.prepare_params(params)
        request_id, headers = self.new_request_id("cmpl", req.request_id, raw)
        kind = OutputKind.DELTA if req.stream else OutputKind.FINAL_ONLY
        streams = await self.submit(request_id, prompts, params, req, kind)
        created = int(time.time())
        if req.stream:
            return SSEResponse(self._stream(req, request_id, created, streams), headers=headers)
        try:
            outs = await run_until_disconnect(raw, self.final_outputs(streams))
        except ClientDisconnected:
            return Response(status_code=499)
        resp = await self.pool.run(self._response, req, request_id, created, outs)
        return JSONResponse(resp.model_dump(mode="json"), headers=headers)

    def _prompt_text(self, out: RequestOutput) -> str:
        return out.prompt if out.prompt is not None else self.decode(out.prompt_token_ids)

    def _logprobs(
        self, req: CompletionRequest, out: RequestOutput, c: CompletionOutput, echo_prompt: bool, offset: int
    ) -> CompletionLogprobs | None:
        """Logprobs of one choice (or delta); with ``echo_prompt`` the prompt's tokens first."""
        if req.logprobs is None:
            return None
        ids: list[int] = []
        lps: list[Any] = []
        if echo_prompt:
            ids += out.prompt_token_ids
            plp = out.prompt_logprobs or []
            lps += list(plp) + [None] * (len(out.prompt_token_ids) - len(plp))
        ids += c.token_ids
        lps += list(c.logprobs or [])
        return self.completion_logprobs(ids, lps, req.logprobs, offset)

    def _response(
        self, req: CompletionRequest, request_id: str, created: int, outs: list[RequestOutput]
    ) -> CompletionResponse:
        """Blocking (decodes): runs in the pool."""
        n = req.n or 1
        choices = []
        prompt_tokens = completion_tokens = 0
        for i, out in enumerate(outs):
            prompt_tokens += len(out.prompt_token_ids)
            prefix = self._prompt_text(out) if req.echo else ""
            plp = self.prompt_logprobs_json(out.prompt_logprobs) if req.prompt_logprobs is not None else None
            for c in out.outputs:
                completion_tokens += len(c.token_ids)
                choices.append(
                    CompletionChoice(
                        index=i * n + c.index, text=prefix + c.text,
                        logprobs=self._logprobs(req, out, c, bool(req.echo), 0),
                        finish_reason=c.finish_reason, stop_reason=c.stop_reason, prompt_logprobs=plp,
                    )
                )
        choices.sort(key=lambda c: c.index)
        return CompletionResponse(
            id=request_id, created=created, model=self.served_model_name, choices=choices,
            usage=UsageInfo(
                prompt_tokens=prompt_tokens, completion_tokens=completion_tokens,
                total_tokens=prompt_tokens + completion_tokens,
            ),
        )

    def _stream(
        self, req: CompletionRequest, request_id: str, created: int, streams: list[RequestStream]
    ) -> AsyncIterator[str]:
        offsets: dict[int, int] = {}
        opts = req.stream_options

        def render(i: int, idx: int, out: RequestOutput, c: CompletionOutput) -> dict[str, Any] | None:
            first = idx not in offsets
            echo = bool(req.echo) and first
            text = (self._prompt_text(out) + c.text) if echo else c.text
            offset = offsets.setdefault(idx, 0)
            lps = self._logprobs(req, out, c, echo, offset)
            offsets[idx] = offset + len(text)
            if not text and lps is None and not c.finish_reason:
                return None
            choice = {"index": idx, "text": text, "logprobs": lps.model_dump() if lps is not None else None,
                      "finish_reason": c.finish_reason, "stop_reason": c.stop_reason}
            if first and req.prompt_logprobs is not None:
                choice["prompt_logprobs"] = self.prompt_logprobs_json(out.prompt_logprobs)
            return choice

        base = {"id": request_id, "object": "text_completion", "created": created, "model": self.served_model_name}
        return sse_events(
            streams, base, req.n or 1, render,
            include_usage=bool(opts and opts.include_usage),
            continuous_usage=bool(opts and opts.continuous_usage_stats),
        )
