"""Synchronous engine: input processor -> engine core -> output processor, in one process."""

from __future__ import annotations

import logging

from octavo.config import OctavoConfig
from octavo.core.outputs import SchedulerStats
from octavo.core.request import RequestStatus
from octavo.engine.arg_utils import EngineArgs
from octavo.engine.core import EngineCore
from octavo.engine.output_processor import OutputKind, OutputProcessor
from octavo.engine.processor import Processor, PromptType
from octavo.engine.tokenizer import load_tokenizer
from octavo.outputs import RequestOutput
from octavo.sampling_params import SamplingParams

logger = logging.getLogger(__name__)


class LLMEngine:
    def __init__(self, config: OctavoConfig) -> None:
        self.config = config
        self.tokenizer = load_tokenizer(config.model_config.tokenizer)
        self.processor = Processor(config, self.tokenizer)
        self.core = EngineCore(config)
        self.processor.kv_cache_tokens = self.core.scheduler.kv_cache_manager.max_num_tokens
        self.output_processor = OutputProcessor(self.tokenizer)

    @classmethod
    def from_engine_args(cls, args: EngineArgs) -> LLMEngine:
        return cls(args.create_engine_config())

    def add_request(
        self,
        request_id: str,
        prompt: PromptType,
        params: SamplingParams,
        arrival_time: float | None = None,
        priority: int = 0,
        cache_salt: str | None = None,
        output_kind: OutputKind = OutputKind.CUMULATIVE,
    ) -> None:
        if request_id in self.output_processor.states:
            raise ValueError(f"request id {request_id!r} is already in use")
        text, ids, reqs = self.processor.make_requests(
            request_id, prompt, params, arrival_time, priority, cache_salt
        )
        added = []
        try:
            for r in reqs:
                self.core.add_request(r)
                added.append(r.request_id)
        except ValueError:
            self.core.abort_requests(added)
            raise
        self.output_processor.add_request(request_id, text, ids, reqs, output_kind)

    def abort_request(self, request_ids: str | list[str]) -> None:
        """Abort user requests (all their samples) wherever they are; unknown ids are ignored.

        Every block they held is released at once; nothing more is returned for them.
        """
        if isinstance(request_ids, str):
            request_ids = [request_ids]
        for rid in request_ids:
            self.core.abort_requests(self.output_processor.abort(rid))

    def has_unfinished_requests(self) -> bool:
        # The core may still hold a step in flight (async scheduling) for finished requests.
        return self.output_processor.has_unfinished() or self.core.has_unfinished_requests()

    def get_num_unfinished_requests(self) -> int:
        return len(self.output_processor.states)

    def get_stats(self) -> SchedulerStats:
        """Scheduler counters: running/waiting, KV usage, prefix-cache queries/hits, preemptions."""
        return self.core.stats()

    def reset_prefix_cache(self) -> bool:
        """Forget the prefix cache; False (nothing done) while any request holds blocks."""
        return self.core.scheduler.reset_prefix_cache()

    def step(self) -> list[RequestOutput]:
        core_outputs = self.core.step()
        for o in core_outputs:
            if o.error is not None:  # finished as "abort"; say why
                logger.error("request %s failed: %s", o.request_id, o.error)
        outputs, to_abort = self.output_processor.process_outputs(core_outputs)
        if to_abort:
            self.core.scheduler.finish_requests(to_abort, RequestStatus.FINISHED_STOPPED)
        return outputs
