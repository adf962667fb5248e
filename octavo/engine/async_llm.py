"""``AsyncLLM``: the asyncio front of the engine, used by the OpenAI server.

It lives in the API process: the input ``Processor`` tokenizes and validates, an engine core
client (``core_client``) carries requests to the engine core (its own process, or a thread
with ``OCTAVO_ENGINE_INPROC=1``), and one output task turns the core's token ids into
``RequestOutput``s (``OutputProcessor``, incremental detokenization, stop strings) and hands
them to each request's queue. Validation errors raise ``ValueError`` before anything is
scheduled; an engine that dies fails every request in flight with ``EngineDeadError``.

Usage::

    engine = await AsyncLLM.from_engine_args(EngineArgs(model=...))
    stream = await engine.add_request("id-1", "Hello", SamplingParams(max_tokens=8))
    async for out in stream:      # DELTA outputs by default
        ...
    await engine.shutdown()
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from typing import Protocol

from octavo.config import OctavoConfig
from octavo.core.outputs import EngineCoreOutput, SchedulerStats
from octavo.engine.arg_utils import EngineArgs
from octavo.engine.core_client import (
    DEFAULT_ENGINE_TIMEOUT_S,
    EngineCoreClient,
    EngineDeadError,
    make_client,
)
from octavo.engine.output_buffer import ClientStalledError, OutputBuffer
from octavo.engine.output_processor import OutputKind, OutputProcessor
from octavo.engine.processor import Processor, PromptType
from octavo.engine.tokenizer import load_tokenizer
from octavo.outputs import RequestOutput
from octavo.sampling_params import SamplingParams

logger = logging.getLogger(__name__)

__all__ = ["AsyncLLM", "ClientStalledError", "EngineDeadError", "RequestStream", "ShuttingDownError", "StatLogger"]

DEFAULT_MAX_UNSENT_TOKENS = 4096
DEFAULT_STALLED_STREAM_TIMEOUT_S = 30.0


class ShuttingDownError(RuntimeError):
    """The server is stopping; requests still in flight are aborted with this."""


class StatLogger(Protocol):
    """What ``AsyncLLM`` reports (``octavo.metrics.ServerMetrics`` implements it)."""

    def record_scheduler_stats(self, stats: SchedulerStats) -> None: ...
    def record_first_token(
        self, ttft_s: float, num_prompt_tokens: int, queue_s: float | None = None, prefill_s: float | None = None
    ) -> None: ...
    def record_tokens(self, num_tokens: int, inter_token_s: float | None) -> None: ...
    def record_finished(
        self,
        finish_reason: str | None,
        e2e_s: float,
        decode_s: float | None = None,
        inference_s: float | None = None,
        num_generation_tokens: int | None = None,
    ) -> None: ...


class _Tracked:
    __slots__ = ("queue", "arrival", "first_token_time", "num_prompt_tokens", "child_last", "scheduled",
                 "num_generated", "stall_timer")

    def __init__(self, num_prompt_tokens: int, child_ids: list[str], queue: OutputBuffer) -> None:
        self.queue = queue
        self.arrival = time.monotonic()
        self.first_token_time: float | None = None
        self.num_prompt_tokens = num_prompt_tokens
        self.child_last: dict[str, float | None] = dict.fromkeys(child_ids)
        self.scheduled: float | None = None  # when the engine first scheduled it
        self.num_generated = 0
        self.stall_timer: asyncio.TimerHandle | None = None  # aborts a paused request at its timeout

    def finished_times(self, now: float) -> dict[str, float | None]:
        """Decode and inference time (vLLM's definitions) for ``record_finished``."""
        first, sched = self.first_token_time, self.scheduled
        return {
            "decode_s": None if first is None else now - first,
            "inference_s": None if sched is None else now - sched,
            "num_generation_tokens": self.num_generated,
        }


class RequestStream:
    """Async iterator over one request's outputs; leaving it early aborts the request."""

    def __init__(self, engine: AsyncLLM, request_id: str, queue: OutputBuffer) -> None:
        self.engine = engine
        self.request_id = request_id
        self._queue = queue
        self.finished = False

    def __aiter__(self) -> AsyncIterator[RequestOutput]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[RequestOutput]:
        try:
            while not self.finished:
                try:
                    item = await self._queue.get()
                except asyncio.CancelledError:
                    raise  # the consumer went away: the finally below aborts the request
                except BaseException:
                    self.finished = True  # the engine side failed it (and already forgot it)
                    raise
                if item.finished:
                    self.finished = True
                yield item
        finally:
            self.abort()

    def abort(self) -> None:
        """Stop the request in the engine (frees its blocks); no-op once it finished."""
        if not self.finished:
            self.finished = True
            self.engine.abort(self.request_id)


class AsyncLLM:
    def __init__(
        self,
        config: OctavoConfig,
        client: EngineCoreClient,
        tokenizer,
        stat_logger: StatLogger | None = None,
        max_unsent_tokens: int = DEFAULT_MAX_UNSENT_TOKENS,
        stalled_stream_timeout_s: float = DEFAULT_STALLED_STREAM_TIMEOUT_S,
    ) -> None:
        """``max_unsent_tokens``/``stalled_stream_timeout_s``: backpressure. A request whose
        consumer leaves more than ``max_unsent_tokens`` generated tokens untaken is paused in
        the engine (not scheduled, no new tokens; its blocks kept unless others need them) and
        resumed when the consumer takes its output; if it stays over the bound for longer than
        ``stalled_stream_timeout_s`` it is aborted (its stream raises ``ClientStalledError``).
        Its outputs wait merged in one ``OutputBuffer``."""
        if max_unsent_tokens < 1:
            raise ValueError(f"max_unsent_tokens must be >= 1; got {max_unsent_tokens}")
        if not stalled_stream_timeout_s > 0:
            raise ValueError(f"stalled_stream_timeout_s must be > 0; got {stalled_stream_timeout_s}")
        self.max_unsent_tokens = max_unsent_tokens
        self.stalled_stream_timeout_s = stalled_stream_timeout_s
        self.config = config
        self.model_config = config.model_config
        self.tokenizer = tokenizer
        self.client = client
        self.stat_logger = stat_logger
        self.processor = Processor(config, tokenizer)
        self.output_processor = OutputProcessor(tokenizer)
        self.requests: dict[str, _Tracked] = {}
        self.last_stats: SchedulerStats | None = None
        self._output_task: asyncio.Task | None = None

    @classmethod
    async def from_engine_args(
        cls,
        engine_args: EngineArgs,
        inproc: bool | None = None,
        stat_logger: StatLogger | None = None,
        config: OctavoConfig | None = None,
        engine_timeout_s: float = DEFAULT_ENGINE_TIMEOUT_S,
        **backpressure: float,
    ) -> AsyncLLM:
        """Start the engine core (a process unless ``inproc``) and wait until it is ready.

        ``config`` is ``engine_args.create_engine_config()`` when the caller already built it;
        ``engine_timeout_s`` is how long the engine may go without a heartbeat, or spend in one
        step, before it is declared dead; ``backpressure``: ``max_unsent_tokens`` and
        ``stalled_stream_timeout_s`` (see ``__init__``).
        """
        if config is None:
            config = engine_args.create_engine_config()
        tokenizer = load_tokenizer(config.model_config.tokenizer)
        client = make_client(config, engine_args, inproc, engine_timeout_s)
        await client.start()
        try:
            engine = cls(config, client, tokenizer, stat_logger, **backpressure)
        except BaseException:
            await client.shutdown(timeout_s=1.0)
            raise
        engine.processor.kv_cache_tokens = client.engine_info.get("kv_cache_tokens")
        engine._output_task = asyncio.create_task(engine._output_loop(), name="octavo-output-handler")
        return engine

    # -- health ---------------------------------------------------------------------------
    @property
    def is_dead(self) -> bool:
        return self.client.is_dead

    @property
    def dead_reason(self) -> str | None:
        return self.client.dead_reason

    async def wait_dead(self) -> str:
        """Return (the reason) once the engine has died or hung."""
        await self.client.dead_event.wait()
        return self.client.dead_reason or "engine dead"

    def check_health(self) -> None:
        if self.client.is_dead:
            raise EngineDeadError(self.client.dead_reason)

    @property
    def engine_pid(self) -> int | None:
        return self.client.engine_info.get("pid")

    # -- requests -------------------------------------------------------------------------
    async def add_request(
        self,
        request_id: str,
        prompt: PromptType,
        params: SamplingParams,
        priority: int = 0,
        cache_salt: str | None = None,
        output_kind: OutputKind = OutputKind.DELTA,
    ) -> RequestStream:
        """Validate and submit; raises ``ValueError`` (bad input) or ``EngineDeadError``."""
        self.check_health()
        if request_id in self.requests:
            raise ValueError(f"request id {request_id!r} is already in use")
        text, ids, reqs = self.processor.make_requests(
            request_id, prompt, params, None, priority, cache_salt
        )
        self.output_processor.add_request(request_id, text, ids, reqs, output_kind)
        tracked = _Tracked(len(ids), [r.request_id for r in reqs], OutputBuffer(output_kind, self.max_unsent_tokens))
        self.requests[request_id] = tracked
        try:
            self.client.add_requests(reqs)
        except BaseException:
            self.abort(request_id)
            raise
        return RequestStream(self, request_id, tracked.queue)

    async def generate(
        self,
        prompt: PromptType,
        params: SamplingParams,
        request_id: str,
        priority: int = 0,
        cache_salt: str | None = None,
        output_kind: OutputKind = OutputKind.DELTA,
    ) -> AsyncIterator[RequestOutput]:
        """vLLM-style: an async generator of outputs (validation errors raise on first use)."""
        stream = await self.add_request(request_id, prompt, params, priority, cache_salt, output_kind)
        async for out in stream:
            yield out

    def abort(self, request_id: str) -> None:
        """Forget a request here and abort its samples in the engine core."""
        self.requests.pop(request_id, None)
        self.client.abort_requests(self.output_processor.abort(request_id))

    def _fail(self, request_id: str, exc: BaseException) -> None:
        tracked = self.requests.get(request_id)
        self.abort(request_id)
        if tracked is not None:
            tracked.queue.put_error(exc)

    def _fail_all(self, exc: BaseException) -> None:
        for rid in list(self.requests):
            self._fail(rid, exc)

    def abort_all(self, reason: str = "the server is shutting down") -> int:
        """Abort every request in flight; their streams raise ``ShuttingDownError``."""
        n = len(self.requests)
        self._fail_all(ShuttingDownError(reason))
        return n

    # -- outputs --------------------------------------------------------------------------
    async def _output_loop(self) -> None:
        while True:
            try:
                outputs, stats = await self.client.get_output()
            except EngineDeadError as e:
                self._fail_all(e)
                return
            try:
                self._process(outputs, stats)
            except Exception as e:  # a bug while processing: fail what is in flight, keep serving
                logger.exception("output processing failed")
                self._fail_all(RuntimeError(f"output processing failed: {e!r}"))

    def _process(self, outputs: list[EngineCoreOutput], stats: SchedulerStats | None) -> None:
        now = time.monotonic()
        sl = self.stat_logger
        op = self.output_processor
        live: list[EngineCoreOutput] = []
        for o in outputs:
            parent = op.child_to_parent.get(o.request_id)
            tracked = self.requests.get(parent) if parent is not None else None
            if tracked is None:
                continue  # aborted (or stopped by a stop string) while the engine stepped
            if o.error is not None:
                self._fail(parent, ValueError(o.error))
                continue
            if o.scheduled_time is not None and tracked.scheduled is None:
                tracked.scheduled = o.scheduled_time
            if o.new_token_ids:
                tracked.num_generated += len(o.new_token_ids)
                if tracked.first_token_time is None:
                    tracked.first_token_time = now
                    if sl is not None:
                        sched = tracked.scheduled
                        sl.record_first_token(
                            now - tracked.arrival, tracked.num_prompt_tokens,
                            queue_s=None if sched is None else sched - tracked.arrival,
                            prefill_s=None if sched is None else now - sched,
                        )
                last = tracked.child_last.get(o.request_id)
                tracked.child_last[o.request_id] = now
                if sl is not None:
                    itl = None if last is None else (now - last) / len(o.new_token_ids)
                    sl.record_tokens(len(o.new_token_ids), itl)
            live.append(o)
        if live:
            request_outputs, to_abort = op.process_outputs(live)
            if to_abort:
                self.client.abort_requests(to_abort)
            for ro in request_outputs:
                tracked = self.requests.get(ro.request_id)
                if tracked is None:
                    continue
                tracked.queue.put(ro)
                if tracked.queue.stalled_since is not None and not ro.finished:
                    if self._check_stalled(ro.request_id, now):
                        continue
                if ro.finished:
                    del self.requests[ro.request_id]
                    if sl is not None:
                        reason = ro.outputs[0].finish_reason if ro.outputs else None
                        sl.record_finished(reason, now - tracked.arrival, **tracked.finished_times(now))
        if stats is not None:
            self.last_stats = stats
            if sl is not None:
                sl.record_scheduler_stats(stats)

    # -- backpressure -----------------------------------------------------------------------
    def _check_stalled(self, request_id: str, now: float | None = None) -> bool:
        """For a request whose client left too much output untaken: pause it in the engine
        (it stops producing tokens; resumed when the client takes its output) and arm a timer;
        abort it once it has stayed stalled past the timeout. True when it was aborted."""
        tracked = self.requests.get(request_id)
        q = tracked.queue if tracked is not None else None
        if q is None or q.stalled_since is None:
            return False
        now = time.monotonic() if now is None else now
        left = q.stalled_since + self.stalled_stream_timeout_s - now
        if left < 0:
            logger.warning("request %s: its client took no output for %.0fs with %d tokens unsent; "
                           "aborting it", request_id, now - q.stalled_since, q.unsent_tokens)
            self._fail(request_id, ClientStalledError(
                f"the client did not read its stream: more than {self.max_unsent_tokens} tokens were "
                f"unsent for {self.stalled_stream_timeout_s:g}s, so the request was aborted"))
            if self.stat_logger is not None:
                self.stat_logger.record_finished("abort", now - tracked.arrival, **tracked.finished_times(now))
            return True
        if not q.paused:
            q.paused = True
            q.on_resume = lambda: self._resume(request_id)
            self.client.pause_requests(list(tracked.child_last))
            tracked.stall_timer = asyncio.get_running_loop().call_later(
                left + 0.01, self._check_stalled, request_id)
        return False

    def _resume(self, request_id: str) -> None:
        tracked = self.requests.get(request_id)
        if tracked is None:
            return
        if tracked.stall_timer is not None:
            tracked.stall_timer.cancel()
            tracked.stall_timer = None
        self.client.resume_requests(list(tracked.child_last))

    # -- lifecycle ------------------------------------------------------------------------
    async def shutdown(self, timeout_s: float = 5.0) -> None:
        """Abort what is in flight and stop the engine core."""
        self.abort_all()
        if self._output_task is not None:
            self._output_task.cancel()
        await self.client.shutdown(timeout_s)
