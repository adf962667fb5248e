"""Continuous batching under one token budget per step (vLLM V1's rule, no phases).

Each request has ``num_computed_tokens`` and a target ``num_tokens`` (prompt + outputs). A step
hands out ``max_num_batched_tokens`` so that computed catches up with target:

1. Running requests first, in admission order (a decode is 1 token, an unfinished prompt its
   next chunk, at most ``long_prefill_token_threshold`` tokens when that is set). When a
   running request cannot get blocks, the lowest-priority running request (``fcfs``: the last
   admitted; ``priority``: the largest ``(priority, arrival_time)``) is preempted by
   recompute: it loses all its blocks, ``num_computed_tokens = 0``, and it goes back to the
   front of ``waiting``. If the victim is the request itself, the pass over running stops.
2. Waiting requests, only in steps that preempted nothing: prefix-cache lookup, then a chunk.
   The pass stops at the first request that cannot get blocks (head-of-line), except that
   children of an ``n > 1`` request are *held back* (skipped, keeping their place) while a
   sibling is still computing the shared prompt: once it is done they are admitted and hit
   the prefix cache for every full prompt block, so the prompt is computed once, not ``n``
   times.

Async scheduling (the engine schedules step N+1 while step N runs): a step that samples for a
request adds an output *placeholder*; the next step may compute that token before its value
is known (the runner feeds it from the device), so the target is ``num_tokens +
num_output_placeholders``. A request whose placeholders already reach ``max_tokens`` or the
longest sequence is not scheduled again; one that stops on a token only known later (EOS, a
stop token) computes one token too many, which ``update_from_output`` drops. Preemption and
finishing clear placeholders. Without async scheduling a placeholder lives from ``schedule``
to ``update_from_output`` of the same step and changes nothing.

Speculative decoding: a running request whose known tokens are all computed but the last may
carry draft tokens (``spec_token_ids``, set by the engine's proposer). It is scheduled for
``1 + k`` tokens (the last known token and ``k`` drafts, fewer drafts when the budget or the
longest sequence is short) and its KV slots for all of them are allocated; the runner verifies
the drafts in the same forward and returns the accepted drafts plus one token.
``update_from_output`` then rolls ``num_computed_tokens`` back by the rejected drafts: their
KV slots hold garbage that the next step overwrites (the blocks stay with the request, which
needs them next step; they are freed with it). Only known tokens are ever hashed into the
prefix cache, so a block is cached only once every token in it is accepted.
Models whose RoPE depends on the sequence length (a ``kv_key_fn``) are not drafted for: a
verify chunk could cross the length at which their rotation switches.

Speculative decoding with async scheduling: a verifying step adds ``1 + k`` placeholders, as
if every draft were accepted, so the next step is scheduled for the request's next token and
its next drafts before the accepted count is known (KV slots allocated for that best case;
``max_tokens`` and the longest sequence are checked against it). When the result lands the
placeholders go, ``num_computed_tokens`` is rolled back by the rejected drafts (this happens
after the next step was scheduled: the two updates add up), and the runner, which waits for
the accepted count before it stages the next step, corrects that step's computed count by the
same amount (``ModelRunner``).

Paused requests (``pause_requests``: their consumer stopped reading) are skipped in both
passes, keeping their place and, when running, their blocks; when blocks run out a paused
request is preempted before any other. ``resume_requests`` makes them schedulable again.

Invariants:
- a request is in exactly one of ``running`` / ``waiting`` until it finishes; ``requests``
  holds exactly the unfinished ones;
- a request with a structured-output grammar is admitted only once the grammar is compiled,
  and its matcher accepts every output token in ``update_from_output``;
- only running requests hold blocks; a finished, aborted or preempted request holds none;
- no request ever needs more KV than the pool has: prompts that cannot fit are rejected in
  ``add_request``, and generation stops with ``length`` at ``min(max_model_len, pool
  tokens)``. The request the policy ranks first among the running ones is never a victim
  unless it is alone, and alone it always fits, so some request always makes progress
  (no preemption livelock; the property test drains random workloads to check this).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from octavo.core.kv_cache_manager import KVCacheManager
from octavo.core.outputs import EngineCoreOutput, SchedulerStats
from octavo.core.request import Request, RequestStatus
from octavo.core.request_queue import create_request_queue
from octavo.core.scheduler_output import (
    CachedRequestData,
    ModelRunnerOutput,
    NewRequestData,
    SchedulerOutput,
)

logger = logging.getLogger(__name__)



@dataclass
class _StepPlan:
    """What one ``schedule`` call has handed out so far."""

    budget: int
    num_scheduled: dict[str, int] = field(default_factory=dict)
    # Running requests scheduled this step -> their newly allocated block ids per KV cache
    # group (insertion order = scheduling order); admitted requests are not in it (they go
    # out in full).
    new_block_ids: dict[str, list[list[int]]] = field(default_factory=dict)
    preempted: list[Request] = field(default_factory=list)
    admitted: list[Request] = field(default_factory=list)
    spec_tokens: dict[str, list[int]] = field(default_factory=dict)

    def schedule(self, req_id: str, n: int, new_block_ids: list[list[int]] | None) -> None:
        self.num_scheduled[req_id] = n
        if new_block_ids is not None:
            self.new_block_ids[req_id] = new_block_ids
        self.budget -= n

    def unschedule(self, req_id: str) -> None:
        """Undo this step's scheduling of a request that is being preempted."""
        if req_id in self.num_scheduled:
            self.budget += self.num_scheduled.pop(req_id)
            self.new_block_ids.pop(req_id, None)
            self.spec_tokens.pop(req_id, None)

class Scheduler:
    def __init__(
        self,
        kv_cache_manager: KVCacheManager,
        max_num_batched_tokens: int,
        max_num_seqs: int,
        max_model_len: int,
        policy: str = "fcfs",
        long_prefill_token_threshold: int = 0,
        enable_chunked_prefill: bool = True,
        kv_key_fn: Callable[[Request], int | None] | None = None,
    ) -> None:
        """``kv_key_fn(req)``: what besides its tokens determines the KV a request computes now
        (its ``kv_key``); None when the tokens alone do."""
        self.kv_cache_manager = kv_cache_manager
        self.kv_key_fn = kv_key_fn
        self.block_size = kv_cache_manager.block_size
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_num_seqs = max_num_seqs
        self.max_model_len = max_model_len
        self.policy = policy
        self.long_prefill_token_threshold = long_prefill_token_threshold
        self.enable_chunked_prefill = enable_chunked_prefill
        # Longest sequence (prompt + outputs) a request may reach: the context, or the pool.
        self.max_seq_len = min(max_model_len, kv_cache_manager.max_num_tokens)
        if self.max_seq_len < max_model_len:
            logger.warning(
                "the KV cache holds %d tokens, fewer than max_model_len %d: sequences stop "
                "with finish_reason 'length' at %d tokens",
                kv_cache_manager.max_num_tokens,
                max_model_len,
                self.max_seq_len,
            )

        self.requests: dict[str, Request] = {}
        self.num_paused = 0  # unfinished requests with ``paused`` set
        self.waiting = create_request_queue(policy)
        self.running: list[Request] = []
        # Unfinished children of each n > 1 request, by parent id (only with prefix caching).
        self.siblings: dict[str, list[Request]] = {}
        # Ids the runner must forget at the next step.
        self._finished_req_ids: set[str] = set()
        self.num_preemptions = 0
        self._arrival_seq = 0
        self.spec_stats = SpecDecodingCounters()

    # -- queue management -----------------------------------------------------------------
    def add_request(self, request: Request) -> None:
        """Queue a request; ``ValueError`` if its id is taken or its prompt can never fit."""
        if request.request_id in self.requests:
            raise ValueError(f"request id {request.request_id!r} is already in use")
        cap = self.kv_cache_manager.max_num_tokens
        if request.num_tokens >= cap:
            raise ValueError(
                f"the prompt has {request.num_tokens} tokens but the KV cache holds only {cap} "
                f"({self.kv_cache_manager.num_usable_blocks} blocks of {self.block_size}); it "
                "can never fit (the prompt must be shorter than that to leave room for output)"
            )
        self._arrival_seq += 1
        request.arrival_seq = self._arrival_seq
        self.requests[request.request_id] = request
        self.waiting.add(request)
        if request.parent_request_id is not None and self.kv_cache_manager.enable_caching:
            self.siblings.setdefault(request.parent_request_id, []).append(request)

    def finish_requests(self, request_ids: str | Iterable[str], status: RequestStatus) -> None:
        """Finish (abort, or stop from outside, e.g. a stop string) wherever they are."""
        assert RequestStatus.is_finished(status)
        if isinstance(request_ids, str):
            request_ids = (request_ids,)
        for rid in request_ids:
            req = self.requests.get(rid)
            if req is None or req.is_finished():
                continue
            if req.status == RequestStatus.RUNNING:
                self.running.remove(req)
            else:
                self.waiting.remove(req)
            req.status = status
            self._free_request(req)

    def _free_request(self, req: Request) -> None:
        if req.paused:
            req.paused = False
            self.num_paused -= 1
        self.kv_cache_manager.free(req)
        self._finished_req_ids.add(req.request_id)
        del self.requests[req.request_id]
        group = self.siblings.get(req.parent_request_id) if req.parent_request_id else None
        if group is not None:
            group.remove(req)
            if not group:
                del self.siblings[req.parent_request_id]

    def has_unfinished_requests(self) -> bool:
        return bool(self.running) or len(self.waiting) > 0

    def has_schedulable_requests(self) -> bool:
        """Some unfinished request is not paused (an engine with none has nothing to step)."""
        return len(self.requests) > self.num_paused

    def pause_requests(self, request_ids: Iterable[str]) -> None:
        """Stop scheduling these (unknown or finished ids are ignored)."""
        for rid in request_ids:
            req = self.requests.get(rid)
            if req is not None and not req.paused:
                req.paused = True
                self.num_paused += 1

    def resume_requests(self, request_ids: Iterable[str]) -> None:
        for rid in request_ids:
            req = self.requests.get(rid)
            if req is not None and req.paused:
                req.paused = False
                self.num_paused -= 1

    def get_num_unfinished_requests(self) -> int:
        return len(self.running) + len(self.waiting)

    def reset_prefix_cache(self) -> bool:
        """Forget the prefix cache; refused (False) while any request holds blocks."""
        return self.kv_cache_manager.reset_prefix_cache()

    # -- one step -------------------------------------------------------------------------
    def _pick_victim(self) -> Request:
        if self.num_paused:  # its consumer is not reading: its blocks are the cheapest to give up
            paused = [r for r in self.running if r.paused]
            if paused:
                return paused[-1]
        if self.policy == "priority":
            return max(self.running, key=lambda r: (r.priority, r.arrival_time, r.arrival_seq))
        return self.running[-1]

    def _preempt(self, req: Request, count: bool = True) -> None:
        self.running.remove(req)
        self.kv_cache_manager.free(req)
        req.status = RequestStatus.PREEMPTED
        req.num_computed_tokens = 0
        req.num_output_placeholders = 0
        req.spec_token_ids = []
        if count:
            req.num_preemptions += 1
            self.num_preemptions += 1
        self.waiting.prepend(req)

    def _kv_key_changed(self, req: Request) -> bool:
        return self.kv_key_fn is not None and self.kv_key_fn(req) != req.kv_key

    def _set_kv_key(self, req: Request) -> None:
        """Before admission: the key of the KV the request computes (its hashes follow it)."""
        if self._kv_key_changed(req):
            req.kv_key = self.kv_key_fn(req)
            req.block_hashes = []

    def _at_length_limit(self, req: Request) -> bool:
        """The tokens in flight already reach ``max_tokens`` or the longest sequence."""
        pending = req.num_output_placeholders
        return (req.max_tokens is not None and req.num_output_tokens + pending >= req.max_tokens) or (
            req.num_tokens + pending >= self.max_seq_len
        )

    def _clip(self, n: int, budget: int) -> int:
        if self.long_prefill_token_threshold > 0:
            n = min(n, self.long_prefill_token_threshold)
        return min(n, budget)

    def _held_back(self, req: Request, held_groups: dict[str, bool]) -> bool:
        """True while a running sibling of ``req`` has not yet computed the shareable prompt.

        The shareable part is the full blocks a prefix-cache lookup can hit (the block with
        the last prompt token is always recomputed), so siblings admitted after it is
        computed each compute only the partial tail. ``req`` is waiting, so it is never one of
        the running siblings. ``held_groups`` caches the answer per sibling group for one
        step (siblings share the prompt, so the shareable length too): each group is scanned
        once per step, not once per waiting sibling (n = 20000 would be quadratic);
        ``_schedule_waiting`` updates it as it admits siblings.
        """
        parent = req.parent_request_id
        group = self.siblings.get(parent) if parent else None
        if not group or req.sampling_params.prompt_logprobs is not None:
            return False
        if parent not in held_groups:
            shareable = self._shareable(req)
            held_groups[parent] = any(
                s.status == RequestStatus.RUNNING and s.num_computed_tokens < shareable for s in group
            )
        return held_groups[parent]

    def _shareable(self, req: Request) -> int:
        return (req.num_prompt_tokens - 1) // self.block_size * self.block_size

    @staticmethod
    def _waiting_for_grammar(req: Request) -> bool:
        """Its structured-output grammar is still compiling (vLLM's WAITING_FOR_FSM): skipped,
        keeping its place in the queue."""
        sor = req.structured_output_request
        return sor is not None and not sor.is_ready()

    def schedule(self) -> SchedulerOutput:
        """One step's plan under the token budget (the module docstring gives the rules)."""
        plan = _StepPlan(budget=self.max_num_batched_tokens)
        self._schedule_running(plan)
        if not plan.preempted:  # waiting requests only in steps that preempted nothing
            self._schedule_waiting(plan)
        out = self._make_output(plan)
        self._finished_req_ids = set()
        self._advance(plan.num_scheduled, plan.spec_tokens)
        return out

    def _schedule_running(self, plan: _StepPlan) -> None:
        """Running requests in order; preempt by recompute when one cannot get blocks."""
        kv = self.kv_cache_manager
        kv_key_fn = self.kv_key_fn  # None unless the model's RoPE depends on the length
        i = 0
        while i < len(self.running) and plan.budget > 0:
            req = self.running[i]
            n = self._clip(req.num_tokens + req.num_output_placeholders - req.num_computed_tokens, plan.budget)
            if n <= 0 or req.paused or (req.num_output_placeholders and self._at_length_limit(req)):
                i += 1
                continue
            if kv_key_fn is not None and kv_key_fn(req) != req.kv_key:
                # Its KV no longer matches the model's rule (longrope switching for the whole
                # sequence): recompute it, once the tokens in flight are known.
                if not req.num_output_placeholders:
                    self._preempt(req, count=False)
                    plan.preempted.append(req)
                else:
                    i += 1
                continue
            drafts = self._drafts(req, plan.budget) if req.spec_token_ids else None
            if drafts:
                n += len(drafts)
            new_blocks = kv.allocate_slots(req, n)
            while new_blocks is None:
                victim = self._pick_victim()
                if self.running.index(victim) < i:
                    i -= 1
                plan.unschedule(victim.request_id)
                self._preempt(victim)
                plan.preempted.append(victim)
                if victim is req:
                    return  # the pass over running stops at a request that preempted itself
                new_blocks = kv.allocate_slots(req, n)
            plan.schedule(req.request_id, n, [[b.block_id for b in blocks] for blocks in new_blocks])
            if drafts:
                plan.spec_tokens[req.request_id] = drafts
            i += 1

    def _drafts(self, req: Request, budget: int) -> list[int]:
        """The drafts ``req`` verifies this step (consumed: cleared on the request): only for a
        request computing just its last known token, within the budget and the longest
        sequence (the last draft's position stays below ``max_seq_len``)."""
        drafts, req.spec_token_ids = req.spec_token_ids, []
        if not drafts or req.num_computed_tokens + 1 != req.num_tokens + req.num_output_placeholders:
            return []
        if self.kv_key_fn is not None:  # length-dependent RoPE: drafts could cross its switch
            return []
        room = min(budget - 1, self.max_seq_len - req.num_tokens - req.num_output_placeholders)
        return drafts[: max(room, 0)]

    def _schedule_waiting(self, plan: _StepPlan) -> None:
        """Admit waiting requests head-first: prefix-cache lookup, then a chunk."""
        kv = self.kv_cache_manager
        held: list[Request] = []
        held_groups: dict[str, bool] = {}
        while len(self.waiting) > 0 and plan.budget > 0 and len(self.running) < self.max_num_seqs:
            req = self.waiting.peek()
            if req.paused or self._held_back(req, held_groups) or self._waiting_for_grammar(req):
                held.append(self.waiting.pop())
                continue
            self._set_kv_key(req)
            hits, num_hit = kv.get_computed_blocks(req)
            n = req.num_tokens - num_hit
            if self.enable_chunked_prefill:
                n = self._clip(n, plan.budget)
            elif n > plan.budget:
                break  # without chunked prefill a prompt is scheduled whole
            if kv.allocate_slots(req, n, hits, num_hit) is None:
                break
            self.waiting.pop()
            kv.record_prefix_cache_query(req, num_hit)
            req.status = RequestStatus.RUNNING
            if req.scheduled_time is None:
                req.scheduled_time = time.monotonic()
            req.num_computed_tokens = num_hit
            req.num_cached_tokens = num_hit
            if req.parent_request_id in held_groups and num_hit < self._shareable(req):
                held_groups[req.parent_request_id] = True
            self.running.append(req)
            plan.admitted.append(req)
            plan.schedule(req.request_id, n, None)
        for req in reversed(held):
            self.waiting.prepend(req)

    def _make_output(self, plan: _StepPlan) -> SchedulerOutput:
        """New requests in full, running ones as deltas (before the step's state update)."""
        kv = self.kv_cache_manager
        new_reqs = [
            NewRequestData(
                req_id=r.request_id,
                prompt_token_ids=r.prompt_token_ids,
                output_token_ids=list(r.output_token_ids),
                sampling_params=r.sampling_params,
                block_ids=kv.get_block_ids(r.request_id),
                num_computed_tokens=r.num_computed_tokens,
                eos_token_id=r.eos_token_id,
            )
            for r in plan.admitted
        ]
        cached_reqs = [
            CachedRequestData(
                req_id=rid,
                new_block_ids=block_ids,
                num_computed_tokens=self.requests[rid].num_computed_tokens,
            )
            for rid, block_ids in plan.new_block_ids.items()
        ]
        return SchedulerOutput(
            scheduled_new_reqs=new_reqs,
            scheduled_cached_reqs=cached_reqs,
            num_scheduled_tokens=plan.num_scheduled,
            total_num_scheduled_tokens=sum(plan.num_scheduled.values()),
            finished_req_ids=self._finished_req_ids,
            preempted_req_ids={r.request_id for r in plan.preempted},
            scheduled_spec_decode_tokens=plan.spec_tokens,
            scheduled_requests={rid: self.requests[rid] for rid in plan.num_scheduled},
        )

    def _advance(self, num_scheduled: dict[str, int], spec_tokens: dict[str, list[int]]) -> None:
        """The step's state update: computed counts move on (drafts included, until the
        rejected ones are rolled back); a step that reaches the end of the known tokens
        samples the next one (output placeholders until their values are in: one, plus one
        per draft it verifies, as if all were accepted)."""
        requests = self.requests
        for rid, n in num_scheduled.items():
            req = requests[rid]
            req.num_computed_tokens += n
            num_drafts = len(spec_tokens.get(rid, ())) if spec_tokens else 0
            if req.num_computed_tokens - num_drafts == req.num_tokens + req.num_output_placeholders:
                req.num_output_placeholders += 1 + num_drafts  # as if every draft is accepted

    # -- after the model ran --------------------------------------------------------------
    def _check_stop(self, req: Request) -> bool:
        params = req.sampling_params
        if req.num_output_tokens >= params.min_tokens:
            last = req.output_token_ids[-1]
            if not params.ignore_eos and last == req.eos_token_id:
                req.status = RequestStatus.FINISHED_STOPPED
                return True
            if last in params.stop_token_ids:
                req.status = RequestStatus.FINISHED_STOPPED
                req.stop_reason = last
                return True
        if (req.max_tokens is not None and req.num_output_tokens >= req.max_tokens) or (
            req.num_tokens >= self.max_seq_len
        ):
            req.status = RequestStatus.FINISHED_LENGTH_CAPPED
            return True
        return False

    @staticmethod
    def _new_prompt_logprobs(req: Request, chunk) -> list | None:
        """The part of a runner's prompt-logprobs chunk not reported before (recompute-safe)."""
        if chunk is None:
            return None
        start, entries = chunk
        skip = max(0, req.next_prompt_logprob_pos - start)
        new = entries[skip:]
        if not new:
            return None
        req.next_prompt_logprob_pos = start + len(entries)
        return new

    def update_from_output(
        self, scheduler_output: SchedulerOutput, runner_output: ModelRunnerOutput
    ) -> list[EngineCoreOutput]:
        outputs: list[EngineCoreOutput] = []
        logprobs = runner_output.logprobs
        prompt_lps = runner_output.prompt_logprobs or {}
        scheduled = scheduler_output.scheduled_requests
        spec = scheduler_output.scheduled_spec_decode_tokens  # empty unless drafts were verified
        for idx, (rid, token_ids) in enumerate(
            zip(runner_output.req_ids, runner_output.sampled_token_ids, strict=True)
        ):
            req = self.requests.get(rid)
            if req is None or req.status != RequestStatus.RUNNING:
                continue  # finished or preempted while the step ran
            if scheduled and scheduled.get(rid) is not req:
                continue  # the id now names a newer request (the old one ended meanwhile)
            drafts = spec.get(rid) if spec else None
            if token_ids and req.num_output_placeholders:
                req.num_output_placeholders -= 1 + len(drafts or ())
            if drafts:
                self._roll_back_rejected(req, len(drafts), len(token_ids))
            plp = self._new_prompt_logprobs(req, prompt_lps.get(rid)) if prompt_lps else None
            if not token_ids:
                if plp:
                    outputs.append(EngineCoreOutput(rid, [], prompt_logprobs=plp))
                continue
            new_ids: list[int] = []
            for t in token_ids:
                req.append_output_token_ids(t)
                new_ids.append(t)
                if self._check_stop(req):
                    break
            if req.structured_output_request is not None:
                req.structured_output_request.accept_tokens(new_ids)
            lps = logprobs[idx][: len(new_ids)] if logprobs and logprobs[idx] else None
            finished = req.is_finished()
            outputs.append(
                EngineCoreOutput(
                    request_id=rid,
                    new_token_ids=new_ids,
                    finish_reason=req.get_finish_reason() if finished else None,
                    stop_reason=req.stop_reason,
                    new_logprobs=lps,
                    prompt_logprobs=plp,
                    num_cached_tokens=req.num_cached_tokens,
                    # on the first output only: when the request left the queue
                    scheduled_time=req.scheduled_time if req.num_output_tokens == len(new_ids) else None,
                )
            )
            if finished:
                self.running.remove(req)
                self._free_request(req)
        return outputs

    def _roll_back_rejected(self, req: Request, num_drafts: int, num_sampled: int) -> None:
        """``num_sampled`` = accepted drafts + 1: the rejected drafts' KV is not the request's."""
        num_accepted = max(num_sampled - 1, 0)
        req.num_computed_tokens -= num_drafts - num_accepted
        self.spec_stats.record(num_drafts, num_accepted)

    def make_stats(self) -> SchedulerStats:
        """A snapshot for metrics; prefix-cache counters are cumulative, in tokens."""
        kv = self.kv_cache_manager
        return SchedulerStats(
            num_running_reqs=len(self.running),
            num_waiting_reqs=len(self.waiting),
            kv_cache_usage=kv.usage,
            prefix_cache_queries=kv.prefix_cache_queries,
            prefix_cache_hits=kv.prefix_cache_hits,
            num_preemptions=self.num_preemptions,
            **self.spec_stats.as_stats_fields(),
        )


@dataclass
class SpecDecodingCounters:
    """Cumulative speculative-decoding counts (vLLM's ``spec_decode`` metrics)."""

    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_pos: list[int] = field(default_factory=list)

    def record(self, num_drafts: int, num_accepted: int) -> None:
        self.num_drafts += 1
        self.num_draft_tokens += num_drafts
        self.num_accepted_tokens += num_accepted
        if len(self.accepted_per_pos) < num_drafts:
            self.accepted_per_pos.extend([0] * (num_drafts - len(self.accepted_per_pos)))
        for i in range(num_accepted):  # at most k per verified request
            self.accepted_per_pos[i] += 1

    def as_stats_fields(self) -> dict:
        return {
            "spec_num_drafts": self.num_drafts,
            "spec_num_draft_tokens": self.num_draft_tokens,
            "spec_num_accepted_tokens": self.num_accepted_tokens,
            "spec_num_accepted_tokens_per_pos": list(self.accepted_per_pos),
        }
