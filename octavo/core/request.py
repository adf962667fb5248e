"""A request as the scheduler sees it: token ids, progress and status.

Invariant: ``all_token_ids == prompt_token_ids + output_token_ids`` and
``0 <= num_computed_tokens <= num_tokens``. ``num_computed_tokens`` counts tokens whose KV is
computed *or scheduled to be computed in the step in flight* (it advances at schedule time).
"""

from __future__ import annotations

import enum
import time

from octavo.sampling_params import SamplingParams


class RequestStatus(enum.IntEnum):
    WAITING = 0
    RUNNING = 1
    PREEMPTED = 2
    # Everything from here on is finished.
    FINISHED_STOPPED = 3
    FINISHED_LENGTH_CAPPED = 4
    FINISHED_ABORTED = 5

    @staticmethod
    def is_finished(status: RequestStatus) -> bool:
        return status >= RequestStatus.FINISHED_STOPPED

    @staticmethod
    def finish_reason(status: RequestStatus) -> str | None:
        return _FINISH_REASON.get(status)


_FINISH_REASON = {
    RequestStatus.FINISHED_STOPPED: "stop",
    RequestStatus.FINISHED_LENGTH_CAPPED: "length",
    RequestStatus.FINISHED_ABORTED: "abort",
}


class Request:
    """One sequence to generate. Parallel sampling (``n > 1``) makes one Request per child.

    Children of one ``n > 1`` request carry the user's request id in ``parent_request_id``;
    the scheduler uses it to compute their shared prompt once (see ``Scheduler``).
    """

    def __init__(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        sampling_params: SamplingParams,
        eos_token_id: int | None,
        arrival_time: float | None = None,
        priority: int = 0,
        cache_salt: str | None = None,
        parent_request_id: str | None = None,
    ) -> None:
        self.request_id = request_id
        self.prompt_token_ids = list(prompt_token_ids)
        self.sampling_params = sampling_params
        self.eos_token_id = eos_token_id
        self.arrival_time = time.monotonic() if arrival_time is None else arrival_time
        self.priority = priority
        self.cache_salt = cache_salt
        self.parent_request_id = parent_request_id

        self.status = RequestStatus.WAITING
        self.stop_reason: int | str | None = None
        self.output_token_ids: list[int] = []
        self.all_token_ids: list[int] = list(self.prompt_token_ids)
        self.num_computed_tokens = 0
        # Tokens sampled by steps still in flight (async scheduling): scheduled as inputs of the
        # next step before their values are known; 0 whenever no step is in flight.
        self.num_output_placeholders = 0
        # Speculative decoding: draft tokens proposed to follow all_token_ids, verified by the
        # next step that schedules this request (then cleared; never part of all_token_ids).
        self.spec_token_ids: list[int] = []
        # Sampling reads this request's own output tokens (fixed at creation; checked per step).
        self.needs_output_history = sampling_params.needs_output_history
        # Number of prompt tokens served from the prefix cache at the last admission.
        self.num_cached_tokens = 0
        self.num_preemptions = 0
        # When the scheduler first admitted it (monotonic; for queue/prefill time metrics).
        self.scheduled_time: float | None = None
        # Order of arrival at the scheduler (set by it): the last tiebreak between requests of
        # equal priority and arrival time, e.g. the children of one n > 1 request.
        self.arrival_seq = 0
        # Chained hashes of the full blocks of all_token_ids, filled by the KV cache manager.
        self.block_hashes: list = []
        # What besides the tokens determined the KV this request holds or will compute (set by
        # the scheduler at admission from the model's rule, e.g. length-dependent RoPE; None:
        # the tokens alone). An extra key of the prefix-cache hash of block 0.
        self.kv_key: int | None = None
        # Next prompt position whose logprobs have not been reported (prompt_logprobs only).
        self.next_prompt_logprob_pos = 1
        # Set by the engine when sampling_params.structured_outputs is: the grammar state
        # (octavo.structured_output.request.StructuredOutputRequest; core only calls
        # is_ready() and accept_tokens() on it).
        self.structured_output_request = None
        # Paused by its consumer (a client that stopped reading): never scheduled while set;
        # a running one keeps its blocks unless preempted (paused requests are preempted first).
        self.paused = False
        max_tokens = sampling_params.max_tokens
        self.max_tokens: int | None = max_tokens

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    def append_output_token_ids(self, token_ids: int | list[int]) -> None:
        if isinstance(token_ids, int):
            token_ids = [token_ids]
        self.output_token_ids.extend(token_ids)
        self.all_token_ids.extend(token_ids)

    def is_finished(self) -> bool:
        return RequestStatus.is_finished(self.status)

    def get_finish_reason(self) -> str | None:
        return RequestStatus.finish_reason(self.status)

    def __repr__(self) -> str:
        return (
            f"Request({self.request_id!r}, status={self.status.name}, "
            f"tokens={self.num_tokens}, computed={self.num_computed_tokens})"
        )
