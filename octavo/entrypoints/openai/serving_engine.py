"""What completions and chat share: model check, request preparation off the event loop,
sampling params from a request, request ids, logprob formatting, submitting several
sub-requests at once, merging their streams, and the one Server-Sent-Events generator both
endpoints stream through.

Invariants:
- nothing whose cost grows with the request's size runs on the event loop: tokenisation,
  chat templates, bad-words preparation and large detokenisation go through ``PrepPool``
  (a bounded thread pool; the tokenizers release the GIL), and every size is bounded first
  (``max_prompt_chars`` here, list bounds in ``protocol.py``), each refusal a 400 naming the limit;
- engine request ids are octavo's own (``cmpl-<random>-<index>``); a caller's ``request_id``
  or ``X-Request-Id`` is only echoed back and logged, so no caller can collide with another.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import math
import os
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar
from urllib.parse import quote

from starlette.requests import Request

from octavo.engine.async_llm import AsyncLLM, RequestStream
from octavo.engine.output_processor import OutputKind
from octavo.engine.processor import PromptType
from octavo.entrypoints.openai.errors import OpenAIError, param_from_message, sse_error
from octavo.entrypoints.openai.protocol import (
    INT64_MAX,
    MAX_ID_CHARS,
    ChatTokenLogprob,
    CompletionLogprobs,
    SamplingFields,
    TopLogprob,
    random_id,
)
from octavo.entrypoints.openai.structured_outputs import structured_outputs_from_request
from octavo.outputs import Logprob, RequestOutput
from octavo.sampling_params import SamplingParams

logger = logging.getLogger(__name__)

LOGPROB_FLOOR = -9999.0  # what a masked token (-inf) reports, as in vLLM (JSON has no -inf)
T = TypeVar("T")
_HEADER_SAFE = "".join(chr(c) for c in range(0x21, 0x7F) if chr(c) != "%")  # printable ASCII stays


def _finite(x: float) -> float:
    return x if math.isfinite(x) else LOGPROB_FLOOR


class PrepPool:
    """A bounded thread pool for request preparation (tokenise, render, detokenise).

    Work submitted here never blocks the event loop; at most ``max_workers`` requests are
    prepared at once and the rest queue in order of arrival.
    """

    def __init__(self, max_workers: int | None = None) -> None:
        workers = max_workers or min(4, os.cpu_count() or 1)
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="octavo-prep")

    async def run(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, functools.partial(fn, *args, **kwargs))

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def max_token_chars(tokenizer) -> int:
    """Characters of the longest vocabulary entry: no token decodes to more (a raw byte-level
    or sentencepiece token string is at least as long as its decoded text)."""
    try:
        return max((len(t) for t in tokenizer.get_vocab()), default=1) or 1
    except Exception:  # a tokenizer without get_vocab: a generous fixed bound
        return 64


class OpenAIServing:
    def __init__(
        self, engine: AsyncLLM, served_model_name: str | Sequence[str], pool: PrepPool | None = None
    ) -> None:
        self.engine = engine
        # Every name a request may use (vLLM's several --served-model-name); responses carry the first.
        names = (served_model_name,) if isinstance(served_model_name, str) else tuple(served_model_name)
        self.served_model_names: tuple[str, ...] = names
        self.served_model_name = names[0]
        self.tokenizer = engine.tokenizer
        self.max_model_len = engine.model_config.max_model_len
        self.vocab_size = engine.model_config.vocab_size
        self.pool = pool if pool is not None else PrepPool()
        # A prompt with more characters than this can never fit in max_model_len tokens (x2 for
        # normalisers that drop characters), so it is refused before any tokenisation.
        self.max_prompt_chars = 2 * self.max_model_len * max_token_chars(self.tokenizer)
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

    def check_engine(self) -> None:
        """503 (OpenAI-shaped) once the engine is dead: nothing that needs it can be served."""
        if self.engine.is_dead:
            from octavo.entrypoints.openai.errors import engine_dead_error

            raise engine_dead_error(self.engine.dead_reason)

    def check_prompt_chars(self, n_chars: int, param: str = "prompt") -> None:
        if n_chars > self.max_prompt_chars:
            raise OpenAIError(
                f"{param} has {n_chars} characters, over the limit of {self.max_prompt_chars} "
                f"(max_prompt_chars: max_model_len {self.max_model_len} x the longest token's "
                "characters x 2); it cannot fit in the context",
                param=param, code="prompt_too_long",
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

    async def prepare_params(self, params: SamplingParams) -> SamplingParams:
        """Bad words -> token sequences, in the pool (one tokenisation per word and variant)."""
        if params.bad_words:
            params._bad_words_token_ids = await self.pool.run(
                self.engine.processor.bad_words_token_ids, params.bad_words
            )
        return params

    def tokenize_text(self, text: str, add_special_tokens: bool) -> dict[str, Any]:
        """Blocking: call through ``self.pool``."""
        self.check_prompt_chars(len(text))
        return {"prompt": text, "prompt_token_ids": self.tokenizer.encode(text, add_special_tokens=add_special_tokens)}

    def decode(self, token_ids: Sequence[int]) -> str:
        """Blocking for long inputs: call through ``self.pool``."""
        return self.tokenizer.decode(list(token_ids))

    # -- submission ---------------------------------------------------------------------------
    @staticmethod
    def new_request_id(prefix: str, body_id: str | None, raw: Request) -> tuple[str, dict[str, str]]:
        """Octavo's own id for the engine, and the response headers that echo the caller's id
        (``request_id`` in the body, else the ``X-Request-Id`` header; octavo's id when neither).
        The caller's id is logged next to octavo's and is never a key of anything."""
        rid = random_id(prefix)
        caller = body_id if body_id is not None else raw.headers.get("x-request-id")
        if caller is not None:
            logger.info("request %s: caller's request id %r", rid, caller)
            caller = quote(caller[:MAX_ID_CHARS], safe=_HEADER_SAFE)
        return rid, {"X-Request-Id": caller if caller is not None else rid}

    async def submit(
        self,
        request_id: str,
        prompts: Sequence[PromptType],
        params: SamplingParams,
        req: SamplingFields,
        output_kind: OutputKind,
    ) -> list[RequestStream]:
        """Validate and add every prompt as ``<request_id>-<index>``; on any failure abort what
        was added and re-raise."""
        streams: list[RequestStream] = []
        try:
            for i, prompt in enumerate(prompts):
                streams.append(
                    await self.engine.add_request(
                        f"{request_id}-{i}", prompt, params.clone(), priority=req.priority,
                        cache_salt=req.cache_salt, output_kind=output_kind,
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
        logprobs: Sequence[dict[int, Logprob] | None],
        num: int,
        text_offset: int,
    ) -> CompletionLogprobs:
        """OpenAI's completion logprobs; a position without logprobs (the first prompt token
        when prompt logprobs are echoed) reports ``None``, as vLLM does."""
        out = CompletionLogprobs()
        for pos, tid in enumerate(token_ids):
            d = logprobs[pos] if pos < len(logprobs) else None
            lp = d.get(tid) if d else None
            token = self._token_str(tid, lp)
            out.tokens.append(token)
            out.text_offset.append(text_offset)
            text_offset += len(token)
            if d is None:
                out.token_logprobs.append(None)
                out.top_logprobs.append(None)
                continue
            out.token_logprobs.append(_finite(lp.logprob) if lp is not None else None)
            top = {self._token_str(t, x): _finite(x.logprob) for t, x in self._top(d, num)}
            if num > 0 and lp is not None:
                top.setdefault(token, _finite(lp.logprob))
            out.top_logprobs.append(top)
        return out

    @staticmethod
    def prompt_logprobs_json(
        plp: Sequence[dict[int, Logprob] | None] | None,
    ) -> list[dict[str, dict[str, Any]] | None] | None:
        """vLLM's ``prompt_logprobs``: per prompt position ``None`` (the first) or
        ``{token_id: {"logprob", "rank", "decoded_token"}}``."""
        if plp is None:
            return None
        return [
            None if d is None else {
                str(t): {"logprob": _finite(x.logprob), "rank": x.rank, "decoded_token": x.decoded_token}
                for t, x in d.items()
            }
            for d in plp
        ]

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


def usage_dict(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


ChoiceRenderer = Callable[[int, int, RequestOutput, Any], "dict[str, Any] | None"]


async def sse_events(
    streams: Sequence[RequestStream],
    base: dict[str, Any],
    n: int,
    render: ChoiceRenderer,
    *,
    include_usage: bool,
    continuous_usage: bool,
    prelude: list[dict[str, Any]] | None = None,
) -> AsyncIterator[str]:
    """The Server-Sent Events of a streamed completion or chat completion.

    ``render(prompt_index, choice_index, output, sample)`` turns one sample's delta into the
    endpoint's choice dict (or ``None`` to send nothing); ``output.prompt_logprobs`` holds every
    prompt logprob received so far. Choice ``i * n + j`` is sample ``j``
    of prompt ``i``. With ``continuous_usage`` every event carries the usage so far (that
    choice's completion tokens, as vLLM counts them); with ``include_usage`` a last event
    carries the totals. An error after the stream began is one error event; ``[DONE]`` ends
    every stream. Leaving early (client gone) aborts every sample.
    """
    prompt_tokens: dict[int, int] = {}
    sample_tokens: dict[int, int] = {}
    prompt_lps: dict[int, list] = {}  # prompt logprobs arrive in pieces before the first token
    done: set[int] = set()

    def event(choices: list[dict[str, Any]], usage: dict[str, int] | None = None) -> str:
        body = {**base, "choices": choices}
        if usage is not None:
            body["usage"] = usage
        return f"data: {json.dumps(body)}\n\n"

    try:
        if prelude:
            yield event(prelude, usage_dict(0, 0) if continuous_usage else None)
        async for i, out in merge_streams(streams):
            prompt_tokens.setdefault(i, len(out.prompt_token_ids))
            if out.prompt_logprobs:
                prompt_lps.setdefault(i, []).extend(out.prompt_logprobs)
            out.prompt_logprobs = prompt_lps.get(i)
            for c in out.outputs:
                idx = i * n + c.index
                if idx in done or not (c.text or c.token_ids or c.finish_reason):
                    continue
                sample_tokens[idx] = sample_tokens.get(idx, 0) + len(c.token_ids)
                choice = render(i, idx, out, c)
                if choice is None:
                    continue
                if c.finish_reason:
                    done.add(idx)
                usage = usage_dict(prompt_tokens[i], sample_tokens[idx]) if continuous_usage else None
                yield event([choice], usage)
        if include_usage:
            yield event([], usage_dict(sum(prompt_tokens.values()), sum(sample_tokens.values())))
    except Exception as e:
        yield sse_error(e)
    finally:
        for s in streams:
            s.abort()
    yield "data: [DONE]\n\n"


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
