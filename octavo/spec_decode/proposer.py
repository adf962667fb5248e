"""The proposer the engine core calls after each step, whatever the method.

Every proposer answers ``propose_batch(requests, max_tokens) -> drafts`` (at most
``min(num_speculative_tokens, max_tokens[i])`` drafts for ``requests[i]``, maybe none). The
n-gram proposer runs on the host, in the engine process; the draft model and the EAGLE head
run where the target runs, so their proposer here only asks the executor's workers.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from octavo.config import SpeculativeConfig
from octavo.core.request import Request

logger = logging.getLogger(__name__)


class DraftModelProposer:
    """``draft_model`` / ``eagle``: the workers' ``DraftModel`` or ``EagleDrafter`` drafts
    greedily (see ``draft_model`` and ``eagle``). Its drafts stay on the device, so it may be
    asked for the drafts of step N+1 while step N runs (async scheduling)."""

    supports_async_scheduling = True

    def __init__(self, config: SpeculativeConfig, executor) -> None:
        self.k = config.num_speculative_tokens
        self.executor = executor

    def propose_batch(self, requests: Sequence[Request], max_tokens: Sequence[int]) -> list[list[int]]:
        if not requests:
            return []
        want = {r.request_id: min(self.k, m) for r, m in zip(requests, max_tokens, strict=True)}
        drafts = self.executor.propose_drafts(want)
        return [drafts[r.request_id] for r in requests]


def make_proposer(config: SpeculativeConfig | None, executor):
    """The proposer of ``config`` (None when speculative decoding is off)."""
    if config is None:
        return None
    if config.uses_drafter:
        what = "draft model" if config.method == "draft_model" else "EAGLE head"
        logger.info("speculative decoding: %s %s, %d draft tokens", what, config.model,
                    config.num_speculative_tokens)
        return DraftModelProposer(config, executor)
    from octavo.spec_decode.ngram_proposer import NgramProposer

    logger.info("speculative decoding: %s, %d draft tokens, n-gram %d..%d", config.method,
                config.num_speculative_tokens, config.prompt_lookup_min, config.prompt_lookup_max)
    return NgramProposer(config)
