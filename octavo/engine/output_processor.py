"""Output processing: detokenize, apply stop strings, group ``n`` samples into RequestOutputs.

Keeps one ``RequestState`` per user request (the parent) and one ``IncrementalDetokenizer`` per
sample. Returns request ids that stop strings finished, so the caller aborts them in the core.
"""

from __future__ import annotations

import enum
import math
import time

from octavo.core.outputs import EngineCoreOutput
from octavo.engine.detokenizer import IncrementalDetokenizer
from octavo.outputs import CompletionOutput, Logprob, RequestOutput
from octavo.sampling_params import SamplingParams


class OutputKind(enum.Enum):
    CUMULATIVE = 0  # every output carries the whole text so far
    DELTA = 1  # only what is new since the last output
    FINAL_ONLY = 2  # one output, when finished


class _Sample:
    def __init__(self, index: int, tokenizer, params: SamplingParams, final_only: bool = False) -> None:
        self.index = index
        self.detok = IncrementalDetokenizer(tokenizer, params, final_only)
        self.params = params
        self.finish_reason: str | None = None
        self.stop_reason: int | str | None = None
        self.logprobs: list[dict[int, Logprob]] | None = [] if params.logprobs is not None else None
        self.cumulative_logprob: float | None = 0.0 if params.logprobs is not None else None
        self._sent_tokens = 0


class RequestState:
    def __init__(self, request_id, prompt, prompt_token_ids, child_ids, tokenizer, child_params, kind):
        self.request_id = request_id
        self.prompt = prompt
        self.prompt_token_ids = prompt_token_ids
        self.kind = kind
        final_only = kind == OutputKind.FINAL_ONLY
        self.samples = {cid: _Sample(i, tokenizer, p, final_only)
                        for i, (cid, p) in enumerate(zip(child_ids, child_params, strict=True))}
        self.arrival = time.monotonic()
        self.first_token_time: float | None = None
        self.num_cached_tokens = 0
        # [None] (position 0) + one dict per prompt position, growing as chunks arrive.
        wants = child_params[0].prompt_logprobs is not None
        self.prompt_logprobs: list[dict[int, Logprob] | None] | None = [None] if wants else None

    @property
    def finished(self) -> bool:
        return all(s.finish_reason is not None for s in self.samples.values())


class OutputProcessor:
    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.states: dict[str, RequestState] = {}
        self.child_to_parent: dict[str, str] = {}

    def add_request(self, request_id, prompt, prompt_token_ids, requests, kind=OutputKind.CUMULATIVE) -> None:
        state = RequestState(
            request_id, prompt, prompt_token_ids, [r.request_id for r in requests],
            self.tokenizer, [r.sampling_params for r in requests], kind,
        )
        self.states[request_id] = state
        for r in requests:
            self.child_to_parent[r.request_id] = request_id

    def child_ids(self, request_id: str) -> list[str]:
        state = self.states.get(request_id)
        return list(state.samples) if state else []

    def has_unfinished(self) -> bool:
        return bool(self.states)

    def abort(self, request_id: str) -> list[str]:
        """Forget a user request; returns its sample ids to abort in the core."""
        state = self.states.pop(request_id, None)
        if state is None:
            return []
        for cid in state.samples:
            self.child_to_parent.pop(cid, None)
        return list(state.samples)

    def process_outputs(self, outputs: list[EngineCoreOutput]) -> tuple[list[RequestOutput], list[str]]:
        touched: dict[str, RequestState] = {}
        to_abort: list[str] = []
        now = time.monotonic()
        for o in outputs:
            parent = self.child_to_parent.get(o.request_id)
            if parent is None:
                continue
            state = self.states[parent]
            sample = state.samples[o.request_id]
            if o.new_token_ids and state.first_token_time is None:
                state.first_token_time = now
            state.num_cached_tokens = max(state.num_cached_tokens, o.num_cached_tokens)
            if o.prompt_logprobs and state.prompt_logprobs is not None:
                state.prompt_logprobs.extend(
                    {t: Logprob(lp, r, self._decode_one(t)) for t, (lp, r) in d.items()}
                    for d in o.prompt_logprobs
                )
            stop_str = sample.detok.update(o.new_token_ids)
            if o.new_logprobs and sample.logprobs is not None:
                for tok, d in zip(o.new_token_ids, o.new_logprobs, strict=False):
                    sample.logprobs.append({t: Logprob(lp, r, self._decode_one(t)) for t, (lp, r) in d.items()})
                    if tok in d:
                        sample.cumulative_logprob += d[tok][0]
            if o.finish_reason is not None:
                sample.finish_reason = o.finish_reason
                sample.stop_reason = o.stop_reason
            if stop_str is not None:
                if sample.finish_reason is None:
                    to_abort.append(o.request_id)
                sample.finish_reason = "stop"
                sample.stop_reason = stop_str
            if sample.finish_reason is not None:
                sample.detok.finish(stopped_by_string=isinstance(sample.stop_reason, str))
            touched[parent] = state
        results = []
        for rid, state in touched.items():
            finished = state.finished
            out = self._make_output(state, finished)
            if out is not None:
                results.append(out)
            if finished:
                self.abort(rid)
        return results, to_abort

    def _decode_one(self, token_id: int) -> str:
        return self.tokenizer.decode([token_id])

    def _make_output(self, state: RequestState, finished: bool) -> RequestOutput | None:
        if state.kind == OutputKind.FINAL_ONLY and not finished:
            return None
        delta = state.kind == OutputKind.DELTA
        prompt_logprobs = state.prompt_logprobs
        if delta and prompt_logprobs is not None:
            # Stream each prompt position once; None when nothing new arrived.
            # What was streamed is dropped: a long stream keeps no history it never sends again.
            state.prompt_logprobs = []
            prompt_logprobs = prompt_logprobs or None
        completions = []
        for s in state.samples.values():
            done = s.finish_reason is not None
            if delta:
                text = s.detok.get_delta(done)
                token_ids = s.detok.token_ids[s._sent_tokens :]
                lps = s.logprobs
                if s.logprobs is not None:
                    s.logprobs = []
                s._sent_tokens = len(s.detok.token_ids)
            else:
                text, token_ids, lps = s.detok.get_text(done), list(s.detok.token_ids), s.logprobs
            cum = s.cumulative_logprob
            completions.append(
                CompletionOutput(
                    index=s.index,
                    text=text,
                    token_ids=token_ids,
                    cumulative_logprob=None if cum is None or math.isnan(cum) else cum,
                    logprobs=lps,
                    finish_reason=s.finish_reason,
                    stop_reason=s.stop_reason,
                )
            )
        metrics = {"arrival_time": state.arrival}
        if state.first_token_time is not None:
            metrics["first_token_time"] = state.first_token_time
        return RequestOutput(
            request_id=state.request_id,
            prompt=state.prompt,
            prompt_token_ids=state.prompt_token_ids,
            outputs=completions,
            finished=finished,
            prompt_logprobs=prompt_logprobs,
            num_cached_tokens=state.num_cached_tokens,
            metrics=metrics,
        )
