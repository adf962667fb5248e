"""What one request has produced but its consumer has not taken yet: at most one merged
``RequestOutput``, so a consumer that stops reading (an HTTP client that never reads its
stream) costs a bounded amount of memory.

Invariants:
- the buffer holds at most one ``RequestOutput`` and at most one exception; DELTA outputs are
  merged (texts, token ids, logprobs and prompt logprobs concatenated per sample), other kinds
  replace the pending one (each already carries everything);
- ``unsent_tokens`` counts the generated tokens in the pending output; ``stalled_since`` is
  the time it last went over ``max_unsent_tokens`` (``None`` while at or under it). The owner
  (``AsyncLLM``) then pauses the request in the engine (``paused``) and aborts it if it stays
  stalled for longer than its timeout;
- taking the pending output clears ``paused`` and calls ``on_resume`` (the owner resumes the
  request in the engine).
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable

from octavo.engine.output_processor import OutputKind
from octavo.outputs import CompletionOutput, RequestOutput


class ClientStalledError(RuntimeError):
    """The consumer of a request did not take its outputs in time; the request was aborted."""


def _merge_sample(old: CompletionOutput, new: CompletionOutput) -> CompletionOutput:
    lps = None
    if old.logprobs is not None or new.logprobs is not None:
        lps = list(old.logprobs or []) + list(new.logprobs or [])
    return dataclasses.replace(
        new, text=old.text + new.text, token_ids=list(old.token_ids) + list(new.token_ids), logprobs=lps
    )


def merge_delta(old: RequestOutput, new: RequestOutput) -> RequestOutput:
    """One DELTA output equal to ``old`` followed by ``new``."""
    by_index = {c.index: c for c in old.outputs}
    samples = [_merge_sample(by_index.pop(c.index), c) if c.index in by_index else c for c in new.outputs]
    samples += by_index.values()  # samples with nothing new in ``new``
    samples.sort(key=lambda c: c.index)
    plp = new.prompt_logprobs
    if old.prompt_logprobs:
        plp = list(old.prompt_logprobs) + list(new.prompt_logprobs or [])
    return dataclasses.replace(new, outputs=samples, prompt_logprobs=plp)


class OutputBuffer:
    def __init__(self, kind: OutputKind, max_unsent_tokens: int) -> None:
        self.kind = kind
        self.max_unsent_tokens = max_unsent_tokens
        self._pending: RequestOutput | None = None
        self._error: BaseException | None = None
        self._ready = asyncio.Event()
        self.unsent_tokens = 0
        self.stalled_since: float | None = None
        self.paused = False
        self.on_resume: Callable[[], None] | None = None

    def put(self, out: RequestOutput) -> None:
        if self._pending is not None and self.kind == OutputKind.DELTA:
            out = merge_delta(self._pending, out)
            self.unsent_tokens += sum(len(c.token_ids) for c in out.outputs) - self.unsent_tokens
        else:
            self.unsent_tokens = sum(len(c.token_ids) for c in out.outputs)
        self._pending = out
        if self.unsent_tokens > self.max_unsent_tokens:
            if self.stalled_since is None:
                self.stalled_since = time.monotonic()
        else:
            self.stalled_since = None
        self._ready.set()

    def put_error(self, exc: BaseException) -> None:
        """Ends the stream with ``exc`` once what is pending was taken (a stalled consumer
        gets the error at once: its pending output is dropped)."""
        self._error = exc
        if isinstance(exc, ClientStalledError):
            self._pending = None
            self.unsent_tokens = 0
        self._ready.set()

    async def get(self) -> RequestOutput:
        """The pending output (or the error, raised); waits until there is one."""
        while self._pending is None and self._error is None:
            self._ready.clear()
            await self._ready.wait()
        if self._pending is not None:
            out, self._pending = self._pending, None
            self.unsent_tokens = 0
            self.stalled_since = None
            if self.paused:
                self.paused = False
                if self.on_resume is not None:
                    self.on_resume()
            return out
        raise self._error
