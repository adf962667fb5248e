"""``POST /v1/chat/completions``: messages rendered with the tokenizer's chat template (or the
server's ``--chat-template``), ``n`` samples, streamed as ``chat.completion.chunk`` events or
answered in one body. Text content only; tools as described in ``tool_calls.py``."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from octavo.engine.async_llm import AsyncLLM, RequestStream
from octavo.engine.output_processor import OutputKind
from octavo.entrypoints.openai.errors import OpenAIError
from octavo.entrypoints.openai.http_utils import (
    ClientDisconnected,
    SSEResponse,
    run_until_disconnect,
)
from octavo.entrypoints.openai.protocol import (
    ChatChoice,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatLogprobs,
    ChatMessage,
    ChatResponseMessage,
    UsageInfo,
)
from octavo.entrypoints.openai.reasoning import ReasoningParser
from octavo.entrypoints.openai.serving_engine import OpenAIServing, PrepPool, sse_events
from octavo.entrypoints.openai.tool_calls import ToolCallPlan, ToolServerConfig, template_messages
from octavo.outputs import CompletionOutput, RequestOutput


def load_chat_template(value: str | None) -> str | None:
    """``--chat-template``: a file holding a Jinja template, or the template itself."""
    if value is None:
        return None
    import os

    if os.path.isfile(value):
        with open(value, encoding="utf-8") as f:
            return f.read()
    if "{" in value:
        return value
    raise ValueError(f"--chat-template (chat_template): {value!r} is neither a file nor a Jinja template")


class OpenAIServingChat(OpenAIServing):
    def __init__(
        self,
        engine: AsyncLLM,
        served_model_name: str | Sequence[str],
        chat_template: str | None = None,
        pool: PrepPool | None = None,
        tool_config: ToolServerConfig | None = None,
    ) -> None:
        super().__init__(engine, served_model_name, pool)
        self.chat_template = chat_template
        self.tool_config = tool_config or ToolServerConfig()
        name = engine.config.structured_outputs_config.reasoning_parser
        self.reasoning = ReasoningParser(name) if name else None

    def _conversation(self, messages: list[ChatMessage]) -> list[dict[str, Any]]:
        conv = []
        n_chars = 0
        for m in messages:
            content = m.content
            if isinstance(content, list):
                content = "\n".join(part.text for part in content)
            n_chars += len(content or "")
            d = {k: v for k, v in m.model_dump(exclude_none=True).items() if k != "content"}
            d["content"] = content if content is not None else ""
            conv.append(d)
        self.check_prompt_chars(n_chars, "messages")
        return template_messages(conv)

    def render(
        self,
        messages: list[ChatMessage],
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        add_special_tokens: bool = False,
        chat_template_kwargs: dict[str, Any] | None = None,
        tools: list[dict[str, Any]] | None = None,
    ) -> dict[str, Any]:
        """Messages -> ``{"prompt": text, "prompt_token_ids": ids}``; template errors are 400s.

        Blocking (template + tokenizer): call through ``self.pool``. The messages' characters
        are bounded (``max_prompt_chars``) before the template runs.
        """
        if add_generation_prompt and continue_final_message:
            raise OpenAIError(
                "add_generation_prompt and continue_final_message cannot both be true",
                param="continue_final_message",
            )
        template = self.chat_template or getattr(self.tokenizer, "chat_template", None)
        if not template:
            raise OpenAIError("the model has no chat template (start the server with --chat-template)")
        conversation = self._conversation(messages)
        kwargs = dict(chat_template_kwargs or {})
        for reserved in ("messages", "conversation", "tokenize", "chat_template", "add_generation_prompt",
                         "continue_final_message", "return_dict"):
            kwargs.pop(reserved, None)
        try:
            text = self.tokenizer.apply_chat_template(
                conversation,
                chat_template=template,
                tokenize=False,
                add_generation_prompt=add_generation_prompt,
                continue_final_message=continue_final_message,
                tools=tools,
                **kwargs,
            )
        except OpenAIError:
            raise
        except Exception as e:  # jinja2 TemplateError, ValueError from transformers, ...
            raise OpenAIError(f"cannot apply the chat template: {e}", param="messages") from None
        if not isinstance(text, str):
            raise OpenAIError("the chat template did not render to text", param="messages")
        return self.tokenize_text(text, add_special_tokens)

    async def create_chat_completion(self, req: ChatCompletionRequest, raw: Request) -> Response:
        self.check_model(req.model)
        self.check_engine()
        plan = ToolCallPlan(req, self.tool_config)
        if req.top_logprobs and not req.logprobs:
            raise OpenAIError("top_logprobs requires logprobs to be true", param="top_logprobs")
        max_tokens = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
        logprobs = (req.top_logprobs or 0) if req.logprobs else None
        params = self.sampling_params(req, max_tokens, logprobs)
        params.structured_outputs = plan.constraint(params.structured_outputs)
        prompt = await self.pool.run(
            self.render, req.messages, req.add_generation_prompt, req.continue_final_message,
            req.add_special_tokens, req.chat_template_kwargs, plan.template_tools,
        )
        await self.prepare_params(params)
        request_id, headers = self.new_request_id("chatcmpl", req.request_id, raw)
        kind = OutputKind.DELTA if req.stream else OutputKind.FINAL_ONLY
        streams = await self.submit(request_id, [prompt], params, req, kind)
        created = int(time.time())
        if req.stream:
            return SSEResponse(self._stream(req, request_id, created, streams, plan), headers=headers)
        try:
            (out,) = await run_until_disconnect(raw, self.final_outputs(streams))
        except ClientDisconnected:
            return Response(status_code=499)
        resp = await self.pool.run(self._response, req, request_id, created, out, logprobs, plan)
        return JSONResponse(resp.model_dump(mode="json"), headers=headers)

    def _response(
        self, req: ChatCompletionRequest, request_id: str, created: int, out: RequestOutput,
        logprobs: int | None, plan: ToolCallPlan,
    ) -> ChatCompletionResponse:
        """Blocking (decodes logprob tokens): runs in the pool."""
        choices = []
        completion_tokens = 0
        for c in out.outputs:
            completion_tokens += len(c.token_ids)
            lps = None
            if logprobs is not None and c.logprobs is not None:
                lps = ChatLogprobs(content=self.chat_logprobs(c.token_ids, c.logprobs, logprobs))
            reasoning, text = self.reasoning.extract(c.text) if self.reasoning else (None, c.text)
            content, tool_calls, finish_reason = plan.message(text or "", c.finish_reason)
            message = ChatResponseMessage(content=(content or None) if reasoning else content,
                                          reasoning_content=reasoning, tool_calls=tool_calls)
            choices.append(
                ChatChoice(
                    index=c.index, message=message,
                    logprobs=lps, finish_reason=finish_reason, stop_reason=c.stop_reason,
                )
            )
        prompt_tokens = len(out.prompt_token_ids)
        return ChatCompletionResponse(
            id=request_id, created=created, model=self.served_model_name, choices=choices,
            usage=UsageInfo(
                prompt_tokens=prompt_tokens, completion_tokens=completion_tokens,
                total_tokens=prompt_tokens + completion_tokens,
            ),
            prompt_logprobs=self.prompt_logprobs_json(out.prompt_logprobs) if req.prompt_logprobs is not None else None,
        )

    def _stream(
        self, req: ChatCompletionRequest, request_id: str, created: int, streams: list[RequestStream],
        plan: ToolCallPlan,
    ) -> AsyncIterator[str]:
        n = req.n or 1
        num = (req.top_logprobs or 0) if req.logprobs else None
        opts = req.stream_options

        tool_streams = [plan.streamer() for _ in range(n)]
        reasoning_streams = [self.reasoning.streamer() if self.reasoning else None for _ in range(n)]

        def render(i: int, idx: int, out: RequestOutput, c: CompletionOutput) -> dict[str, Any] | None:
            lps = None
            if num is not None and c.logprobs:
                lps = {"content": [x.model_dump() for x in self.chat_logprobs(c.token_ids, c.logprobs, num)]}
            ts, rs = tool_streams[c.index], reasoning_streams[c.index]
            final = bool(c.finish_reason)
            thought, text = rs.feed(c.text, final) if rs is not None else ("", c.text)
            text, calls = ts.feed(text, final)
            if not thought and not text and not calls and lps is None and not c.finish_reason:
                return None
            delta: dict[str, Any] = {"content": text} if text else {}
            if thought:
                delta["reasoning_content"] = thought
            if calls:
                delta["tool_calls"] = calls
            return {"index": idx, "delta": delta, "logprobs": lps,
                    "finish_reason": plan.finish_reason(c.finish_reason, ts.num_calls > 0),
                    "stop_reason": c.stop_reason}

        base = {"id": request_id, "object": "chat.completion.chunk", "created": created,
                "model": self.served_model_name}
        prelude = [
            {"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
            for i in range(n)
        ]
        return sse_events(
            streams, base, n, render, prelude=prelude,
            include_usage=bool(opts and opts.include_usage),
            continuous_usage=bool(opts and opts.continuous_usage_stats),
        )
