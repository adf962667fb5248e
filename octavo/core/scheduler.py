"""Continuous batching under one token budget per step (vLLM V1's rule, no phases).

Each request has ``num_computed_tokens`` and a target ``num_tokens`` (prompt + outputs). A step
hands out ``max_num_batched_tokens`` so that computed catches up with target: running requests
first (a decode is 1 token, an unfinished prompt its next chunk), then waiting ones (prefix
cache lookup, then a chunk). When a running request cannot get blocks, the lowest-priority
running request is preempted by recompute: it loses all blocks and goes back to ``waiting``.
Waiting requests are admitted only in steps that preempted nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from octavo.core.kv_cache_manager import KVCacheManager, cdiv
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
    ) -> None:
        self.kv_cache_manager = kv_cache_manager
        self.block_size = kv_cache_manager.block_size
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_num_seqs = max_num_seqs
        self.max_model_len = max_model_len
        self.policy = policy
        self.long_prefill_token_threshold = long_prefill_token_threshold
        self.enable_chunked_prefill = enable_chunked_prefill

        self.requests: dict[str, Request] = {}
        self.waiting = create_request_queue(policy)
        self.running: list[Request] = []
        # Ids the runner must forget at the next step.
        self._finished_req_ids: set[str] = set()
        self.num_preemptions = 0

    # -- queue management -----------------------------------------------------------------
    def add_request(self, request: Request) -> None:
        if request.request_id in self.requests:
            raise ValueError(f"request id {request.request_id!r} is already in use")
        need = cdiv(request.num_tokens + 1, self.block_size)
        if need > self.kv_cache_manager.num_usable_blocks:
            raise ValueError(
                f"prompt of {request.num_tokens} tokens needs {need} KV cache blocks but the "
                f"cache has only {self.kv_cache_manager.num_usable_blocks}; it can never fit"
            )
        self.requests[request.request_id] = request
        self.waiting.add(request)

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
        self.kv_cache_manager.free(req)
        self._finished_req_ids.add(req.request_id)
        del self.requests[req.request_id]

    def has_unfinished_requests(self) -> bool:
        return bool(self.running) or len(self.waiting) > 0

    def get_num_unfinished_requests(self) -> int:
        return len(self.running) + len(self.waiting)

    # -- one step -------------------------------------------------------------------------
    def _pick_victim(self) -> Request:
        if self.policy == "priority":
            return max(self.running, key=lambda r: (r.priority, r.arrival_time))
        return self.running[-1]

    def _preempt(self, req: Request) -> None:
        self.running.remove(req)
        self.kv_cache_manager.free(req)
        req.status = RequestStatus.PREEMPTED
        req.num_computed_tokens = 0
        req.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.prepend(req)

    def _clip(self, n: int, budget: int) -> int:
        if self.long_prefill_token_threshold > 0:
            n = min(n, self.long_prefill_token_threshold)
        return min(n, budget)

    def schedule(self) -> SchedulerOutput:
        budget = self.max_num_batched_tokens
        num_scheduled: dict[str, int] = {}
        new_block_ids: dict[str, list[int]] = {}
        preempted: list[Request] = []

        # 1) running requests, in order.
        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            n = self._clip(req.num_tokens - req.num_computed_tokens, budget)
            if n <= 0:
                i += 1
                continue
            new_blocks = None
            while True:
                new_blocks = self.kv_cache_manager.allocate_slots(req, n)
                if new_blocks is not None:
                    break
                victim = self._pick_victim()
                victim_index = self.running.index(victim)
                if victim.request_id in num_scheduled:
                    # Undo this step's scheduling of the victim.
                    budget += num_scheduled.pop(victim.request_id)
                    new_block_ids.pop(victim.request_id, None)
                self._preempt(victim)
                preempted.append(victim)
                if victim_index < i:
                    i -= 1
                if victim is req:
                    break
            if new_blocks is None:
                break
            num_scheduled[req.request_id] = n
            new_block_ids[req.request_id] = [b.block_id for b in new_blocks]
            budget -= n
            i += 1

        # 2) waiting requests, only when nothing was preempted.
        admitted: list[Request] = []
        if not preempted:
            while len(self.waiting) > 0 and budget > 0 and len(self.running) < self.max_num_seqs:
                req = self.waiting.peek()
                hits, num_hit = self.kv_cache_manager.get_computed_blocks(req)
                n = req.num_tokens - num_hit
                if not self.enable_chunked_prefill and self._clip(n, n) > budget:
                    break
                n = self._clip(n, budget)
                new_blocks = self.kv_cache_manager.allocate_slots(req, n, hits, num_hit)
                if new_blocks is None:
                    break
                self.waiting.pop()
                req.status = RequestStatus.RUNNING
                req.num_computed_tokens = num_hit
                req.num_cached_tokens = num_hit
                self.running.append(req)
                admitted.append(req)
                num_scheduled[req.request_id] = n
                budget -= n

        admitted_ids = {r.request_id for r in admitted}
        new_reqs = [
            NewRequestData(
                req_id=r.request_id,
                prompt_token_ids=r.prompt_token_ids,
                output_token_ids=list(r.output_token_ids),
                sampling_params=r.sampling_params,
                block_ids=self.kv_cache_manager.get_block_ids(r.request_id),
                num_computed_tokens=r.num_computed_tokens,
            )
            for r in admitted
        ]
        cached_reqs = [
            CachedRequestData(
                req_id=rid,
                new_block_ids=new_block_ids[rid],
                num_computed_tokens=self.requests[rid].num_computed_tokens,
            )
            for rid in num_scheduled
            if rid not in admitted_ids
        ]
        out = SchedulerOutput(
            scheduled_new_reqs=new_reqs,
            scheduled_cached_reqs=cached_reqs,
            num_scheduled_tokens=num_scheduled,
            total_num_scheduled_tokens=sum(num_scheduled.values()),
            finished_req_ids=self._finished_req_ids,
            preempted_req_ids={r.request_id for r in preempted},
        )
        self._finished_req_ids = set()
        for rid, n in num_scheduled.items():
            self.requests[rid].num_computed_tokens += n
        return out

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
            req.num_tokens >= self.max_model_len
        ):
            req.status = RequestStatus.FINISHED_LENGTH_CAPPED
            return True
        return False

    def update_from_output(
        self, scheduler_output: SchedulerOutput, runner_output: ModelRunnerOutput
    ) -> list[EngineCoreOutput]:
        outputs: list[EngineCoreOutput] = []
        logprobs = runner_output.logprobs
        prompt_lps = runner_output.prompt_logprobs or {}
        for idx, (rid, token_ids) in enumerate(
            zip(runner_output.req_ids, runner_output.sampled_token_ids, strict=True)
        ):
            req = self.requests.get(rid)
            if req is None or req.status != RequestStatus.RUNNING:
                continue  # finished or preempted while the step ran
            plp = prompt_lps.get(rid)
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
                )
            )
            if finished:
                self.running.remove(req)
                self._free_request(req)
        return outputs

    def make_stats(self) -> SchedulerStats:
        kv = self.kv_cache_manager
        return SchedulerStats(
            num_running_reqs=len(self.running),
            num_waiting_reqs=len(self.waiting),
            kv_cache_usage=kv.usage,
            prefix_cache_queries=kv.prefix_cache_queries,
            prefix_cache_hits=kv.prefix_cache_hits,
            num_preemptions=self.num_preemptions,
        )
