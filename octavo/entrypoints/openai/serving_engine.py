"""What completions and chat share: model check, sampling params from a request, logprob
formatting, submitting several sub-requests at once, merging their streams."""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator, Sequence
from typing import Any

from octavo.engine.async_llm import AsyncLLM, RequestStream
from octavo.engine.output_processor import OutputKind
from octavo.engine.processor import PromptType
from octavo.entrypoints.openai.errors import OpenAIError, param_from_message
from octavo.entrypoints.openai.protocol import (
    INT64_MAX,
    ChatTokenLogprob,
    CompletionLogprobs,
    SamplingFields,
    TopLogprob,
)
from octavo.entrypoints.openai.structured_outputs import structured_outputs_from_request
from octavo.outputs import Logprob, RequestOutput
from octavo.sampling_params import SamplingParams

LOGPROB_FLOOR = -9999.0  # what a masked token (-inf) reports, as in vLLM (JSON has no -inf)


def _finite(x: float) -> float:
    return x if math.isfinite(x) else LOGPROB_FLOOR


class OpenAIServing:
    def __init__(self, engine: AsyncLLM, served_model_name: str | Sequence[str]) -> None:
        self.engine = engine
        # Every name a request may use (vLLM's several --served-model-name); responses carry the first.
        names = (served_model_name,) if isinstance(served_model_name, str) else tuple(served_model_name)
        self.served_model_names: tuple[str, ...] = names
        self.served_model_name = names[0]
        self.tokenizer = engine.tokenizer
        self.max_model_len = engine.model_config.max_model_len
        self.vocab_size = engine.model_config.vocab_size
        # The model's generation_config.json defaults, for the fields a request leaves unset.
        self.defaults = engine.model_config.sampling_defaults

    # -- checks -----------------------------------------------------------------------------
    def check_model(self, model: str | None) -> None:
        if model is not None and model not in self.served_model_names:
            served = ", ".join(repr(n) for n in self.served_model_names)
            raise OpenAIError(
                f"the model {model!r} does not exist; this server serves {served}",
                404, param="model", code="model_not_found",
            )

    def sampling_params(
        self,
        req: SamplingFields,
        max_tokens: int | None,
        logprobs: int | None,
    ) -> SamplingParams:
        logit_bias = None
        if req.logit_bias:
            logit_bias = {}
            for k, v in req.logit_bias.items():
                try:
                    tid = int(k)
                except ValueError:
                    raise OpenAIError(f"logit_bias keys must be token ids, got {k!r}", param="logit_bias") from None
                if not 0 <= tid < self.vocab_size:
                    raise OpenAIError(
                        f"logit_bias contains token id {tid} outside [0, {self.vocab_size})", param="logit_bias"
                    )
                logit_bias[tid] = v
        if req.priority != 0 and self.engine.config.scheduler_config.policy != "priority":
            raise OpenAIError(
                "priority is set but the server schedules first-come-first-served "
                "(start it with --scheduling-policy priority)", param="priority",
            )
        d = self.defaults

        def pick(value, name: str, neutral):
            return value if value is not None else d.get(name, neutral)

        top_k = pick(req.top_k, "top_k", 0)
        if top_k > self.vocab_size:
            top_k = 0  # keeping more tokens than the vocabulary has is no top-k at all
        if max_tokens is not None and max_tokens > INT64_MAX:
            max_tokens = INT64_MAX
        kwargs: dict[str, Any] = dict(
            n=req.n if req.n is not None else 1,
            temperature=pick(req.temperature, "temperature", 1.0),
            top_p=pick(req.top_p, "top_p", 1.0),
            top_k=top_k,
            min_p=pick(req.min_p, "min_p", 0.0),
            presence_penalty=req.presence_penalty or 0.0,
            frequency_penalty=req.frequency_penalty or 0.0,
            repetition_penalty=pick(req.repetition_penalty, "repetition_penalty", 1.0),
            seed=req.seed,
            max_tokens=max_tokens,
            min_tokens=req.min_tokens,
            stop=req.stop,
            stop_token_ids=req.stop_token_ids,
            include_stop_str_in_output=req.include_stop_str_in_output,
            ignore_eos=req.ignore_eos,
            logprobs=logprobs,
            prompt_logprobs=req.prompt_logprobs,
            logit_bias=logit_bias,
            allowed_token_ids=req.allowed_token_ids,
            bad_words=req.bad_words,
            skip_special_tokens=req.skip_special_tokens,
            spaces_between_special_tokens=req.spaces_between_special_tokens,
            structured_outputs=structured_outputs_from_request(req),
        )
        try:
            return SamplingParams(**kwargs)
        except (ValueError, TypeError) as e:
            raise OpenAIError(str(e), param=param_from_message(str(e))) from None

    def tokenize_text(self, text: str, add_special_tokens: bool) -> dict[str, Any]:
        return {"prompt": text, "prompt_token_ids": self.tokenizer.encode(text, add_special_tokens=add_special_tokens)}

    # -- submission ---------------------------------------------------------------------------
    async def submit(
        self,
        request_id: str,
        prompts: Sequence[PromptType],
        params: SamplingParams,
        req: SamplingFields,
        output_kind: OutputKind,
    ) -> list[RequestStream]:
        """Validate and add every prompt; on any failure abort what was added and re-raise."""
        streams: list[RequestStream] = []
        try:
            for i, prompt in enumerate(prompts):
                rid = request_id if len(prompts) == 1 else f"{request_id}-{i}"
                streams.append(
                    await self.engine.add_request(
                        rid, prompt, params.clone(), priority=req.priority, cache_salt=req.cache_salt,
                        output_kind=output_kind,
                    )
                )
        except BaseException as e:
            for s in streams:
                s.abort()
            if isinstance(e, ValueError):
                msg = str(e)
                if len(prompts) > 1:
                    msg = f"prompt {len(streams)}: {msg}"
                raise OpenAIError(msg, param=param_from_message(msg)) from None
            raise
        return streams

    @staticmethod
    async def final_outputs(streams: Sequence[RequestStream]) -> list[RequestOutput]:
        async def last(stream: RequestStream) -> RequestOutput:
            last_out = None
            async for out in stream:
                last_out = out
            assert last_out is not None
            return last_out

        try:
            return list(await asyncio.gather(*(last(s) for s in streams)))
        finally:
            for s in streams:
                s.abort()

    # -- logprobs -----------------------------------------------------------------------------
    def _token_str(self, token_id: int, lp: Logprob | None) -> str:
        if lp is not None and lp.decoded_token is not None:
            return lp.decoded_token
        return self.tokenizer.decode([token_id])

    def _top(self, d: dict[int, Logprob], num: int) -> list[tuple[int, Logprob]]:
        ranked = sorted(d.items(), key=lambda kv: (kv[1].rank if kv[1].rank is not None else 1 << 30))
        return [(t, lp) for t, lp in ranked if lp.rank is not None and lp.rank <= num][:num]

    def completion_logprobs(
        self,
        token_ids: Sequence[int],
        logprobs: Sequence[dict[int, Logprob]],
        num: int,
        text_offset: int,
    ) -> CompletionLogprobs:
        out = CompletionLogprobs()
        for tid, d in zip(token_ids, logprobs, strict=False):
            lp = d.get(tid)
            token = self._token_str(tid, lp)
            out.tokens.append(token)
            out.token_logprobs.append(_finite(lp.logprob) if lp is not None else None)
            top = {self._token_str(t, x): _finite(x.logprob) for t, x in self._top(d, num)}
            if num > 0 and lp is not None:
                top.setdefault(token, _finite(lp.logprob))
            out.top_logprobs.append(top)
            out.text_offset.append(text_offset)
            text_offset += len(token)
        return out

    def chat_logprobs(
        self,
        token_ids: Sequence[int],
        logprobs: Sequence[dict[int, Logprob]],
        num: int,
    ) -> list[ChatTokenLogprob]:
        content = []
        for tid, d in zip(token_ids, logprobs, strict=False):
            lp = d.get(tid)
            token = self._token_str(tid, lp)
            content.append(
                ChatTokenLogprob(
                    token=token,
                    logprob=_finite(lp.logprob) if lp is not None else LOGPROB_FLOOR,
                    bytes=list(token.encode("utf-8", errors="replace")),
                    top_logprobs=[
                        TopLogprob(token=s, logprob=_finite(x.logprob), bytes=list(s.encode("utf-8", errors="replace")))
                        for t, x in self._top(d, num)
                        for s in (self._token_str(t, x),)
                    ],
                )
            )
        return content


async def merge_streams(streams: Sequence[RequestStream]) -> AsyncIterator[tuple[int, RequestOutput]]:
    """Outputs of several streams as they come, tagged with the stream's index."""
    if len(streams) == 1:
        async for out in streams[0]:
            yield 0, out
        return
    queue: asyncio.Queue = asyncio.Queue()
    done = object()

    async def pump(i: int, stream: RequestStream) -> None:
        try:
            async for out in stream:
                queue.put_nowait((i, out))
        except Exception as e:
            queue.put_nowait((i, e))
        finally:
            queue.put_nowait((i, done))

    tasks = [asyncio.create_task(pump(i, s)) for i, s in enumerate(streams)]
    try:
        remaining = len(tasks)
        while remaining:
            i, item = await queue.get()
            if item is done:
                remaining -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield i, item
    finally:
        for t in tasks:
            t.cancel()
        for s in streams:
            s.abort()
