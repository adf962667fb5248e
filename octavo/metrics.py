"""Prometheus metrics of the server (prometheus-client), under vLLM's names (``vllm:...``,
so that a vLLM Grafana dashboard works unchanged; labels ``model_name`` and ``engine``) and
the same series again under ``octavo:...`` (label ``model_name``).

Gauges mirror the scheduler's last stats snapshot (running / waiting requests, KV cache usage,
prefix cache hit rate); counters count tokens, preemptions, prefix-cache queries/hits,
speculative decoding (``spec_decode_num_drafts``, ``_num_draft_tokens``,
``_num_accepted_tokens``, ``_num_accepted_tokens_per_pos`` by ``position``, as vLLM) and
finished requests by reason; histograms hold time to first token, inter-token latency,
end-to-end latency, and per request the time queued, in prefill, in decode and in inference
(prefill + decode), the prompt and generation token counts. Each ``ServerMetrics`` owns its
registry, so several servers (or tests) in one process never collide.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST as CONTENT_TYPE_LATEST
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from octavo.core.outputs import SchedulerStats

_LATENCY_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
    1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
_REQUEST_TIME_BUCKETS = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
    120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip
_TOKEN_BUCKETS = tuple(float(b * 10**e) for e in range(0, 6) for b in (1, 2, 5))


class _Series:
    """One value recorded under both names (``vllm:`` with model_name+engine, ``octavo:``)."""

    def __init__(self, *children: Any) -> None:
        self.children = children

    def __getattr__(self, method: str) -> Callable[..., None]:
        def call(*args: Any) -> None:
            for c in self.children:
                getattr(c, method)(*args)

        return call


class ServerMetrics:
    """Records what ``AsyncLLM`` reports; ``render()`` is the ``/metrics`` body."""

    ENGINE = "0"  # vLLM's engine index label (one engine core per server here)

    def __init__(self, model_name: str, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self.model_name = model_name
        self._last: dict[str, int] = {"queries": 0, "hits": 0, "preemptions": 0, "drafts": 0,
                                      "draft_tokens": 0, "accepted": 0}
        self._last_per_pos: list[int] = []
        g, c, h = self._gauge, self._counter, self._hist
        self.num_running = g("num_requests_running", "Requests in the running batch.")
        self.num_waiting = g("num_requests_waiting", "Requests waiting to be scheduled.")
        self.kv_cache_usage = g("kv_cache_usage_perc", "Fraction of KV cache blocks in use (0-1).")
        self.prefix_hit_rate = g("prefix_cache_hit_rate", "Prefix cache hits / queries (in tokens) since start.")
        self.prefix_queries = c("prefix_cache_queries", "Prompt tokens looked up in the prefix cache.")
        self.prefix_hits = c("prefix_cache_hits", "Prompt tokens found in the prefix cache.")
        self.preemptions = c("num_preemptions", "Requests preempted (recomputed later).")
        self.spec_drafts = c("spec_decode_num_drafts", "Speculative decoding: verifications (one per request per step).")
        self.spec_draft_tokens = c("spec_decode_num_draft_tokens", "Speculative decoding: draft tokens verified.")
        self.spec_accepted = c("spec_decode_num_accepted_tokens", "Speculative decoding: draft tokens accepted.")
        self._spec_per_pos = [
            Counter("vllm:spec_decode_num_accepted_tokens_per_pos", "Accepted draft tokens by draft position.",
                    ["model_name", "engine", "position"], registry=self.registry),
            Counter("octavo:spec_decode_num_accepted_tokens_per_pos", "Accepted draft tokens by draft position.",
                    ["model_name", "position"], registry=self.registry),
        ]
        self.prompt_tokens = c("prompt_tokens", "Prompt tokens processed (counted at the first token).")
        self.generation_tokens = c("generation_tokens", "Tokens generated.")
        self.ttft = h("time_to_first_token_seconds", "Time from arrival to the first generated token.")
        self.itl = h("inter_token_latency_seconds", "Time between consecutive tokens of one sequence.")
        self.e2e = h("e2e_request_latency_seconds", "Time from arrival to the last token.", _REQUEST_TIME_BUCKETS)
        self.queue_time = h("request_queue_time_seconds", "Time a request waited before it was first scheduled.",
                            _REQUEST_TIME_BUCKETS)
        self.prefill_time = h("request_prefill_time_seconds", "Time from first scheduled to the first token.",
                              _REQUEST_TIME_BUCKETS)
        self.decode_time = h("request_decode_time_seconds", "Time from the first token to the last.",
                             _REQUEST_TIME_BUCKETS)
        self.inference_time = h("request_inference_time_seconds", "Time from first scheduled to the last token.",
                                _REQUEST_TIME_BUCKETS)
        self.request_prompt_tokens = h("request_prompt_tokens", "Prompt tokens per request.", _TOKEN_BUCKETS)
        self.request_generation_tokens = h("request_generation_tokens", "Generated tokens per request.",
                                           _TOKEN_BUCKETS)
        self._success = [
            Counter("vllm:request_success", "Finished requests by finish reason.",
                    ["model_name", "engine", "finished_reason"], registry=self.registry),
            Counter("octavo:request_success", "Finished requests by finish reason.",
                    ["model_name", "finished_reason"], registry=self.registry),
        ]

    # -- metric construction -------------------------------------------------------------------
    def _both(self, cls: type, name: str, doc: str, **kw: Any) -> _Series:
        reg, m = self.registry, self.model_name
        v = cls(f"vllm:{name}", doc, ["model_name", "engine"], registry=reg, **kw).labels(m, self.ENGINE)
        o = cls(f"octavo:{name}", doc, ["model_name"], registry=reg, **kw).labels(m)
        return _Series(v, o)

    def _gauge(self, name: str, doc: str) -> _Series:
        return self._both(Gauge, name, doc)

    def _counter(self, name: str, doc: str) -> _Series:
        return self._both(Counter, name, doc)

    def _hist(self, name: str, doc: str, buckets: tuple[float, ...] = _LATENCY_BUCKETS) -> _Series:
        return self._both(Histogram, name, doc, buckets=buckets)

    # -- from the engine core's stats snapshots --------------------------------------------------
    def record_scheduler_stats(self, stats: SchedulerStats) -> None:
        self.num_running.set(stats.num_running_reqs)
        self.num_waiting.set(stats.num_waiting_reqs)
        self.kv_cache_usage.set(stats.kv_cache_usage)
        for key, value, counter in (
            ("queries", stats.prefix_cache_queries, self.prefix_queries),
            ("hits", stats.prefix_cache_hits, self.prefix_hits),
            ("preemptions", stats.num_preemptions, self.preemptions),
            ("drafts", stats.spec_num_drafts, self.spec_drafts),
            ("draft_tokens", stats.spec_num_draft_tokens, self.spec_draft_tokens),
            ("accepted", stats.spec_num_accepted_tokens, self.spec_accepted),
        ):
            if value > self._last[key]:
                counter.inc(value - self._last[key])
                self._last[key] = value
        self._record_accepted_per_pos(stats.spec_num_accepted_tokens_per_pos)
        q = stats.prefix_cache_queries
        self.prefix_hit_rate.set(stats.prefix_cache_hits / q if q else 0.0)

    def _record_accepted_per_pos(self, per_pos: list[int]) -> None:
        last = self._last_per_pos
        last.extend([0] * (len(per_pos) - len(last)))
        for pos, value in enumerate(per_pos):  # at most num_speculative_tokens positions
            if value > last[pos]:
                self._spec_per_pos[0].labels(self.model_name, self.ENGINE, str(pos)).inc(value - last[pos])
                self._spec_per_pos[1].labels(self.model_name, str(pos)).inc(value - last[pos])
                last[pos] = value

    # -- from per-request bookkeeping in AsyncLLM ------------------------------------------------
    def record_first_token(
        self, ttft_s: float, num_prompt_tokens: int, queue_s: float | None = None, prefill_s: float | None = None
    ) -> None:
        self.ttft.observe(ttft_s)
        self.prompt_tokens.inc(num_prompt_tokens)
        self.request_prompt_tokens.observe(num_prompt_tokens)
        if queue_s is not None:
            self.queue_time.observe(max(queue_s, 0.0))
        if prefill_s is not None:
            self.prefill_time.observe(max(prefill_s, 0.0))

    def record_tokens(self, num_tokens: int, inter_token_s: float | None) -> None:
        self.generation_tokens.inc(num_tokens)
        if inter_token_s is not None:
            self.itl.observe(inter_token_s)

    def record_finished(
        self,
        finish_reason: str | None,
        e2e_s: float,
        decode_s: float | None = None,
        inference_s: float | None = None,
        num_generation_tokens: int | None = None,
    ) -> None:
        self.e2e.observe(e2e_s)
        reason = finish_reason or "unknown"
        self._success[0].labels(self.model_name, self.ENGINE, reason).inc()
        self._success[1].labels(self.model_name, reason).inc()
        if decode_s is not None:
            self.decode_time.observe(max(decode_s, 0.0))
        if inference_s is not None:
            self.inference_time.observe(max(inference_s, 0.0))
        if num_generation_tokens is not None:
            self.request_generation_tokens.observe(num_generation_tokens)

    def render(self) -> bytes:
        return generate_latest(self.registry)
