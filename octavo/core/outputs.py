"""What the engine core reports per request per step (before detokenization)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class EngineCoreOutput:
    request_id: str
    new_token_ids: list[int]
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    # Per new token: {token_id: (logprob, rank)} including the sampled token, or None.
    new_logprobs: list[dict[int, tuple[float, int]]] | None = None
    prompt_logprobs: list[dict[int, tuple[float, int]] | None] | None = None
    num_cached_tokens: int = 0
    error: str | None = None
    # Monotonic time the scheduler first admitted the request (set on its first output only;
    # a timestamp, so not part of equality).
    scheduled_time: float | None = field(default=None, compare=False)

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class SchedulerStats:
    num_running_reqs: int = 0
    num_waiting_reqs: int = 0
    kv_cache_usage: float = 0.0
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    num_preemptions: int = 0
    # Speculative decoding, cumulative since start (vLLM's spec_decode counters): verifying
    # steps of one request, draft tokens verified, drafts accepted, and accepted per position.
    spec_num_drafts: int = 0
    spec_num_draft_tokens: int = 0
    spec_num_accepted_tokens: int = 0
    spec_num_accepted_tokens_per_pos: list[int] = field(default_factory=list)
