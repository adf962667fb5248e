"""What one scheduling step hands to the model runner.

New requests (first admission, or re-admission after preemption) travel in full; requests
that were already running travel as deltas (new block ids). Block ids come per KV cache group
(``core/kv_cache_groups.py``): one list for most models, one per attention type for models that
mix full and sliding-window layers. ``num_scheduled_tokens`` keeps
the batch order: the runner lays requests out in that order.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from octavo.sampling_params import SamplingParams


@dataclass
class NewRequestData:
    req_id: str
    prompt_token_ids: list[int]
    # Output tokens generated before a preemption (empty for a first admission).
    output_token_ids: list[int]
    sampling_params: SamplingParams
    block_ids: list[list[int]]  # per KV cache group
    num_computed_tokens: int
    # The model's EOS id (None if it has none); min_tokens forbids it unless ignore_eos.
    eos_token_id: int | None = None


@dataclass
class CachedRequestData:
    req_id: str
    new_block_ids: list[list[int]]  # per KV cache group
    num_computed_tokens: int


@dataclass
class SchedulerOutput:
    scheduled_new_reqs: list[NewRequestData]
    scheduled_cached_reqs: list[CachedRequestData]
    num_scheduled_tokens: dict[str, int]
    total_num_scheduled_tokens: int
    # Requests the runner should forget (finished, aborted or preempted since the last step).
    finished_req_ids: set[str] = field(default_factory=set)
    preempted_req_ids: set[str] = field(default_factory=set)
    # Structured outputs: the requests that sample under a grammar in this step, and one packed
    # int32 bitmask row each, in that order (bit t % 32 of word t // 32 set = token t allowed).
    structured_output_request_ids: list[str] = field(default_factory=list)
    grammar_bitmask: Any = None  # np.ndarray [len(ids), ceil(vocab / 32)] int32 (a list on the wire)
    # Speculative decoding: the draft tokens each verifying request computes this step, after
    # its known tokens (``num_scheduled_tokens`` counts them); requests without drafts absent.
    scheduled_spec_decode_tokens: dict[str, list[int]] = field(default_factory=dict)
    # Engine side only, never serialized (``wire=False``): the Request object each scheduled id
    # named, so a late result is never applied to a newer request that reuses the id.
    scheduled_requests: dict = field(
        default_factory=dict, repr=False, compare=False, metadata={"wire": False}
    )


@dataclass
class ModelRunnerOutput:
    """Sampled tokens (one list per sampling request; empty for partial prefills)."""

    req_ids: list[str]
    sampled_token_ids: list[list[int]]
    # Per request: per sampled token, a dict {token_id: (logprob, rank)} or None.
    logprobs: list[list[dict[int, tuple[float, int]]] | None] | None = None
    # Per request that asked for prompt logprobs and had prompt positions in this step:
    # (first prompt position covered, one {token_id: (logprob, rank)} per position from it).
    # Positions start at 1 (position 0 has no logprob); a recomputed request (after
    # preemption) may repeat positions already sent, which the scheduler drops.
    prompt_logprobs: dict[str, tuple[int, list[dict[int, tuple[float, int]]]]] | None = None
