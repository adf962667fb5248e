"""Helpers to drive the scheduler without a model: fake runner outputs."""

from __future__ import annotations

from octavo.core.kv_cache_manager import KVCacheManager
from octavo.core.request import Request
from octavo.core.scheduler import Scheduler
from octavo.core.scheduler_output import ModelRunnerOutput, SchedulerOutput
from octavo.sampling_params import SamplingParams

EOS = 0


def make_request(rid: str, prompt_len: int, max_tokens: int = 8, priority: int = 0,
                 arrival: float | None = None, start_token: int = 100, **kw) -> Request:
    params = SamplingParams(max_tokens=max_tokens, **kw)
    prompt = [start_token + i for i in range(prompt_len)]
    return Request(rid, prompt, params, EOS, arrival_time=arrival, priority=priority)


def make_scheduler(num_blocks: int = 64, block_size: int = 4, budget: int = 32, max_seqs: int = 8,
                   max_model_len: int = 256, caching: bool = True, **kw) -> Scheduler:
    kv = KVCacheManager(num_blocks, block_size, enable_caching=caching)
    return Scheduler(kv, budget, max_seqs, max_model_len, **kw)


def fake_output(so: SchedulerOutput, sched: Scheduler, token: int = 7) -> ModelRunnerOutput:
    """Sample ``token`` for every request whose known tokens are all computed after the step."""
    req_ids, sampled = [], []
    for rid in so.num_scheduled_tokens:
        req = sched.requests[rid]
        req_ids.append(rid)
        sampled.append([token] if req.num_computed_tokens == req.num_tokens else [])
    return ModelRunnerOutput(req_ids, sampled)


def step(sched: Scheduler, token: int = 7):
    so = sched.schedule()
    outs = sched.update_from_output(so, fake_output(so, sched, token))
    return so, outs
