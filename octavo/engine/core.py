"""The engine core: one scheduler, one model runner, one ``step``.

``step`` = schedule -> execute -> update. It knows token ids only (no text); the input and
output processors around it tokenize and detokenize. The same object runs in-process for the
offline ``LLM`` class and inside the engine process when serving.

With async scheduling one step stays in flight between calls: ``step`` schedules and launches
step N+1, then waits for step N and returns its outputs, so the host's scheduling, input
preparation and output handling overlap the device's work instead of leaving it idle. Steps
are not overlapped while a running request samples from its own generated tokens
(penalties, bad words, a structured-output grammar): those wait for the previous step,
exactly as without async.

Speculative decoding (``speculative_config``): before each step is scheduled the proposer
drafts tokens for every running request that is decoding (``Request.spec_token_ids``); the
step verifies them. A draft model's or EAGLE head's drafts stay on the device: the scheduler
gets placeholders (it needs only their number), and the host schedules and stages the
verifying step while the draft passes still run (``octavo.spec_decode.device_drafts``). That
is also what lets them run with async scheduling: step N+1 is scheduled while step N runs,
with placeholders for drafts proposed from step N's outcome, which the runner fills in when it
stages step N+1 (after waiting for step N's accepted tokens, not for its draft passes); the
scheduler counts step N's drafts as accepted until its result lands (``Scheduler``). The
n-gram proposer reads the previous step's tokens on the host, so with it async scheduling is
turned off (logged; refused when asked for explicitly).

Requests with a structured-output grammar are drafted for too. Their drafts come to the host
(the runner reads a grammar row's device drafts back), and the engine keeps the longest prefix
the grammar accepts (``StructuredOutputRequest.validate_drafts``): a masked position can never
sample a refused token, so a refused draft and those after it could never be accepted. The
step's bitmask then has one row per verified position, row ``i`` the grammar's state after
drafts ``0..i-1`` (``StructuredOutputManager.grammar_bitmask``), and the sampler masks the
target's logits at every position before verification, the bonus token's too; the matcher
then advances by the accepted drafts and the sampled token. So output is the same as without
speculation, greedy or seeded. With ``--reasoning-parser`` the look-ahead follows the
reasoning state through the drafts: positions inside the reasoning section are not masked,
those after its end marker are, even within one step's drafts.
"""

from __future__ import annotations

import logging
import time

from octavo.config import OctavoConfig
from octavo.core.kv_cache_manager import KVCacheManager
from octavo.core.outputs import EngineCoreOutput, SchedulerStats
from octavo.core.request import Request, RequestStatus
from octavo.core.scheduler import Scheduler
from octavo.core.scheduler_output import SchedulerOutput
from octavo.spec_decode.device_drafts import DEVICE_DRAFT
from octavo.spec_decode.proposer import make_proposer
from octavo.utils.gc import freeze_startup_heap, thaw_heap

logger = logging.getLogger(__name__)


class EngineCore:
    def __init__(self, config: OctavoConfig) -> None:
        from octavo.executor import create_executor
        from octavo.platforms import current_platform

        t0 = time.perf_counter()
        self.config = config
        platform = current_platform
        self.executor = create_executor(config)
        num_blocks = self.executor.determine_num_blocks()
        self.executor.initialize_kv_cache(num_blocks)
        cc, sc = config.cache_config, config.scheduler_config
        self.scheduler = Scheduler(
            KVCacheManager(
                num_blocks, cc.block_size, cc.enable_prefix_caching, cc.prefix_caching_hash_algo,
                group_windows=cc.group_windows, max_chunk_tokens=sc.max_num_batched_tokens,
            ),
            max_num_batched_tokens=sc.max_num_batched_tokens,
            max_num_seqs=sc.max_num_seqs,
            max_model_len=sc.max_model_len,
            policy=sc.policy,
            long_prefill_token_threshold=sc.long_prefill_token_threshold,
            enable_chunked_prefill=sc.enable_chunked_prefill,
            kv_key_fn=_kv_key_fn(config),
        )
        self.structured_outputs = _make_structured_output_manager(config)
        self.async_scheduling = sc.async_scheduling and self.executor.supports_async_scheduling
        self.proposer = make_proposer(config.speculative_config, self.executor)
        if self.async_scheduling and self.proposer is not None and not self.proposer.supports_async_scheduling:
            logger.info("speculative decoding: async scheduling turned off (n-gram drafts need the previous "
                        "step's tokens on the host)")
            self.async_scheduling = False
        self._inflight: tuple | None = None  # (SchedulerOutput, handle) launched, not resulted
        freeze_startup_heap()
        self.startup_seconds = time.perf_counter() - t0
        mc = config.model_config
        logger.info(
            "platform %s | attention %s | graphs %s | async scheduling %s | dtype %s | KV cache %s%d "
            "blocks x %d = %d tokens | weights %.1f MiB | ready in %.2fs",
            platform.name,
            self.executor.attn_backend_name,
            self.executor.worker_infos[0].get("graphs", "none") if self.executor.worker_infos else "none",
            "on" if self.async_scheduling else "off",
            str(mc.dtype).removeprefix("torch."),
            "" if cc.kv_cache_dtype == "auto" else f"{cc.kv_cache_dtype} ",
            num_blocks,
            cc.block_size,
            (num_blocks - 1) * cc.block_size,
            self.executor.model_bytes / 2**20,
            self.startup_seconds,
        )
        for rank, info in enumerate(self.executor.worker_infos):
            if info.get("moe"):
                logger.info("rank %d: %s", rank, info["moe"])
            if info.get("quantization"):
                logger.info("rank %d: quantization %s: %s", rank, mc.quantization, info["quantization"])

    @property
    def runner(self):
        """The in-process model runner (single-device executor only)."""
        return self.executor.runner

    def shutdown(self) -> None:
        self.structured_outputs.shutdown()
        self.executor.shutdown()
        thaw_heap()

    def add_request(self, request: Request) -> None:
        self.scheduler.add_request(request)
        self.structured_outputs.attach(request)

    def abort_requests(self, request_ids: list[str]) -> None:
        self.scheduler.finish_requests(request_ids, RequestStatus.FINISHED_ABORTED)

    def pause_requests(self, request_ids: list[str]) -> None:
        """Not scheduled until resumed; a running one keeps its blocks (see ``Scheduler``)."""
        self.scheduler.pause_requests(request_ids)

    def resume_requests(self, request_ids: list[str]) -> None:
        self.scheduler.resume_requests(request_ids)

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_requests() or self._inflight is not None

    def has_work(self) -> bool:
        """A step would do something: a step in flight, or a request that is not paused."""
        return self.scheduler.has_schedulable_requests() or self._inflight is not None

    def step(self) -> list[EngineCoreOutput]:
        failed = self._finish_failed_grammars()
        if self.async_scheduling or self._inflight is not None:
            return failed + self._step_async()
        if not self.scheduler.has_unfinished_requests():
            return failed
        so = self._schedule()
        runner_out = self.executor.execute_model(so)
        outputs = self.scheduler.update_from_output(so, runner_out)
        if self.proposer is not None:
            self._propose_drafts()
        return failed + outputs

    def _propose_drafts(self) -> None:
        """Draft tokens for every running request that decodes next step. A grammar-constrained
        request keeps the longest prefix of its drafts that its grammar accepts (the rest could
        never be accepted); the step then masks each verified position with its own row.
        A request still holding unverified drafts was not scheduled since they were proposed
        (paused, or out of budget): its context is unchanged, so are its drafts."""
        sched = self.scheduler
        if sched.kv_key_fn is not None:  # length-dependent RoPE: the scheduler drafts nothing
            return
        reqs, rooms = [], []
        for req in sched.running:
            # with a step in flight its tokens count as known (placeholders, all drafts accepted)
            known = req.num_tokens + req.num_output_placeholders
            if req.num_computed_tokens != known - 1 or req.spec_token_ids:
                continue
            room = sched.max_seq_len - known
            if req.max_tokens is not None:
                room = min(room, req.max_tokens - req.num_output_tokens - req.num_output_placeholders - 1)
            if room > 0:
                reqs.append(req)
                rooms.append(room)
        for req, drafts in zip(reqs, self.proposer.propose_batch(reqs, rooms), strict=True):
            sor = req.structured_output_request
            if sor is not None and drafts:
                if drafts[0] == DEVICE_DRAFT:
                    raise RuntimeError(f"request {req.request_id!r} has a structured-output grammar but its "
                                       "drafts stayed on the device; the runner must read them back")
                drafts = sor.validate_drafts(drafts)
            req.spec_token_ids = drafts

    def _schedule(self) -> SchedulerOutput:
        """``Scheduler.schedule`` plus the grammar bitmask of the structured requests that sample."""
        so = self.scheduler.schedule()
        if so.total_num_scheduled_tokens:
            self.structured_outputs.grammar_bitmask(so)
        else:  # only requests waiting for their grammar: do not spin
            self.structured_outputs.wait_for_compile()
        return so

    def _finish_failed_grammars(self) -> list[EngineCoreOutput]:
        outs = []
        for req, error in self.structured_outputs.poll():
            self.scheduler.finish_requests(req.request_id, RequestStatus.FINISHED_ABORTED)
            outs.append(EngineCoreOutput(req.request_id, [], finish_reason="abort",
                                         error=f"structured_outputs: the grammar failed to compile: {error}"))
        return outs

    def _can_overlap(self) -> bool:
        return not any(r.needs_output_history for r in self.scheduler.running)

    def _step_async(self) -> list[EngineCoreOutput]:
        prev, self._inflight = self._inflight, None
        overlap = prev is None or (self.async_scheduling and self._can_overlap())
        if self.scheduler.has_unfinished_requests() and overlap:
            if self.proposer is not None:
                self._propose_drafts()
            so = self._schedule()
            if so.total_num_scheduled_tokens:
                self._inflight = (so, self.executor.execute_model_async(so))
            else:  # nothing to compute (every request waits on the step in flight): bookkeeping only
                self.executor.execute_model(so)
        if prev is None:
            return []
        so_prev, handle = prev
        return self.scheduler.update_from_output(so_prev, handle.result())

    def stats(self) -> SchedulerStats:
        return self.scheduler.make_stats()


def _make_structured_output_manager(config: OctavoConfig):
    from octavo.structured_output.manager import StructuredOutputManager

    mc = config.model_config

    def load_tokenizer():
        from octavo.engine.tokenizer import load_tokenizer as load

        return load(mc.tokenizer)

    eos = getattr(mc.hf_config, "eos_token_id", None)
    stop_ids = [e for e in (eos if isinstance(eos, list) else [eos]) if e is not None]
    so = config.structured_outputs_config
    return StructuredOutputManager(load_tokenizer, mc.vocab_size, stop_ids, so.backend, so.reasoning_parser)


def _kv_key_fn(config: OctavoConfig):
    """The scheduler's ``kv_key_fn``: None unless the model's RoPE depends on the length."""
    from octavo.models.length_rope import length_rope

    mc = config.model_config
    lr = length_rope(mc.hf_config, mc.max_model_len)
    if lr is None:
        return None
    return lambda req: lr.kv_key(req.num_prompt_tokens, req.num_tokens + req.num_output_placeholders)
