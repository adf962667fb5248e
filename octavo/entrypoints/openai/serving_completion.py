"""``POST /v1/completions``: one or many prompts (text or token ids), ``n`` samples each,
streamed as Server-Sent Events or answered in one body. Choice ``i * n + j`` is sample ``j``
of prompt ``i``, as in OpenAI's API."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from octavo.engine.async_llm import RequestStream
from octavo.engine.output_processor import OutputKind
from octavo.engine.processor import PromptType
from octavo.entrypoints.openai.errors import OpenAIError, sse_error
from octavo.entrypoints.openai.http_utils import (
    ClientDisconnected,
    SSEResponse,
    run_until_disconnect,
)
from octavo.entrypoints.openai.protocol import (
    MAX_PROMPTS,
    CompletionChoice,
    CompletionRequest,
    CompletionResponse,
    UsageInfo,
    random_id,
)
from octavo.entrypoints.openai.serving_engine import OpenAIServing, merge_streams
from octavo.outputs import RequestOutput


class OpenAIServingCompletion(OpenAIServing):
    def _prompts(self, req: CompletionRequest) -> list[PromptType]:
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
        prompts: list[PromptType] = []
        for item in items:
            if isinstance(item, str):
                prompts.append(self.tokenize_text(item, req.add_special_tokens))
            else:
                prompts.append({"prompt_token_ids": list(item)})
        return prompts

    async def create_completion(self, req: CompletionRequest, raw: Request) -> Response:
        self.check_model(req.model)
        if req.suffix:
            raise OpenAIError("suffix is not supported", param="suffix")
        n = req.n or 1
        if req.best_of is not None and req.best_of != n:
            raise OpenAIError("best_of must equal n (octavo returns every sample)", param="best_of")
        if req.echo and req.logprobs is not None:
            raise OpenAIError("echo together with logprobs is not supported", param="echo")
        prompts = self._prompts(req)
        if len(prompts) * n > MAX_PROMPTS:
            raise OpenAIError(
                f"n ({n}) x number of prompts ({len(prompts)}) must be <= {MAX_PROMPTS}", param="n"
            )
        params = self.sampling_params(req, req.max_tokens, req.logprobs)
        request_id = req.request_id or random_id("cmpl")
        kind = OutputKind.DELTA if req.stream else OutputKind.FINAL_ONLY
        streams = await self.submit(request_id, prompts, params, req, kind)
        created = int(time.time())
        if req.stream:
            return SSEResponse(self._stream(req, request_id, created, streams))
        try:
            outs = await run_until_disconnect(raw, self.final_outputs(streams))
        except ClientDisconnected:
            return Response(status_code=499)
        return JSONResponse(self._response(req, request_id, created, outs).model_dump(mode="json"))

    def _prompt_text(self, out: RequestOutput) -> str:
        return out.prompt if out.prompt is not None else self.tokenizer.decode(out.prompt_token_ids)

    def _response(
        self, req: CompletionRequest, request_id: str, created: int, outs: list[RequestOutput]
    ) -> CompletionResponse:
        n = req.n or 1
        choices = []
        prompt_tokens = completion_tokens = 0
        for i, out in enumerate(outs):
            prompt_tokens += len(out.prompt_token_ids)
            prefix = self._prompt_text(out) if req.echo else ""
            for c in out.outputs:
                completion_tokens += len(c.token_ids)
                lps = None
                if req.logprobs is not None and c.logprobs is not None:
                    lps = self.completion_logprobs(c.token_ids, c.logprobs, req.logprobs, 0)
                choices.append(
                    CompletionChoice(
                        index=i * n + c.index, text=prefix + c.text, logprobs=lps,
                        finish_reason=c.finish_reason, stop_reason=c.stop_reason,
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

    async def _stream(
        self, req: CompletionRequest, request_id: str, created: int, streams: list[RequestStream]
    ) -> AsyncIterator[str]:
        n = req.n or 1
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        num = req.logprobs
        offsets: dict[int, int] = {}
        done: set[int] = set()
        prompt_tokens: dict[int, int] = {}
        completion_tokens = 0
        base = {"id": request_id, "object": "text_completion", "created": created, "model": self.served_model_name}
        try:
            async for i, out in merge_streams(streams):
                if i not in prompt_tokens:
                    prompt_tokens[i] = len(out.prompt_token_ids)
                for c in out.outputs:
                    idx = i * n + c.index
                    if idx in done or not (c.text or c.token_ids or c.finish_reason):
                        continue
                    text = c.text
                    if req.echo and idx not in offsets:
                        text = self._prompt_text(out) + text
                    offsets.setdefault(idx, 0)
                    lps = None
                    if num is not None and c.logprobs is not None:
                        lps = self.completion_logprobs(c.token_ids, c.logprobs, num, offsets[idx]).model_dump()
                    offsets[idx] += len(text)
                    completion_tokens += len(c.token_ids)
                    if not text and lps is None and not c.finish_reason:
                        continue
                    choice = {
                        "index": idx, "text": text, "logprobs": lps,
                        "finish_reason": c.finish_reason, "stop_reason": c.stop_reason,
                    }
                    if c.finish_reason:
                        done.add(idx)
                    yield f"data: {json.dumps({**base, 'choices': [choice]})}\n\n"
            if include_usage:
                p = sum(prompt_tokens.values())
                usage = {"prompt_tokens": p, "completion_tokens": completion_tokens,
                         "total_tokens": p + completion_tokens}
                yield f"data: {json.dumps({**base, 'choices': [], 'usage': usage})}\n\n"
        except Exception as e:
            yield sse_error(e)
        finally:
            for s in streams:
                s.abort()
        yield "data: [DONE]\n\n"
