"""Prometheus metrics of the server (prometheus-client), vLLM-style names under ``octavo:``.

Gauges mirror the scheduler's last stats snapshot (running / waiting requests, KV cache usage,
prefix cache hit rate); counters count tokens, preemptions and finished requests; histograms
hold time to first token, inter-token latency and end-to-end latency. Each ``ServerMetrics``
owns its registry, so several servers (or tests) in one process never collide.
"""

from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST as CONTENT_TYPE_LATEST
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from octavo.core.outputs import SchedulerStats

_LATENCY_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
    1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip


class ServerMetrics:
    """Records what ``AsyncLLM`` reports; ``render()`` is the ``/metrics`` body."""

    def __init__(self, model_name: str, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        reg, lbl, m = self.registry, ["model_name"], model_name

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(name, doc, lbl, registry=reg).labels(m)

        def counter(name: str, doc: str) -> Counter:
            return Counter(name, doc, lbl, registry=reg).labels(m)

        def hist(name: str, doc: str) -> Histogram:
            return Histogram(name, doc, lbl, buckets=_LATENCY_BUCKETS, registry=reg).labels(m)

        self.num_running = gauge("octavo:num_requests_running", "Requests in the running batch.")
        self.num_waiting = gauge("octavo:num_requests_waiting", "Requests waiting to be scheduled.")
        self.kv_cache_usage = gauge("octavo:kv_cache_usage_perc", "Fraction of KV cache blocks in use (0-1).")
        self.prefix_hit_rate = gauge(
            "octavo:prefix_cache_hit_rate", "Prefix cache hits / queries (in tokens) since start."
        )
        self.prefix_queries = counter("octavo:prefix_cache_queries", "Prompt tokens looked up in the prefix cache.")
        self.prefix_hits = counter("octavo:prefix_cache_hits", "Prompt tokens found in the prefix cache.")
        self.preemptions = counter("octavo:num_preemptions", "Requests preempted (recomputed later).")
        self.prompt_tokens = counter("octavo:prompt_tokens", "Prompt tokens processed (counted at the first token).")
        self.generation_tokens = counter("octavo:generation_tokens", "Tokens generated.")
        self._success = Counter(
            "octavo:request_success", "Finished requests by finish reason.", ["model_name", "finished_reason"],
            registry=reg,
        )
        self.model_name = model_name
        self.ttft = hist("octavo:time_to_first_token_seconds", "Time from arrival to the first generated token.")
        self.itl = hist("octavo:inter_token_latency_seconds", "Time between consecutive tokens of one sequence.")
        self.e2e = hist("octavo:e2e_request_latency_seconds", "Time from arrival to the last token.")
        self._last: dict[str, int] = {"queries": 0, "hits": 0, "preemptions": 0}

    # -- from the engine core's stats snapshots --------------------------------------------------
    def record_scheduler_stats(self, stats: SchedulerStats) -> None:
        self.num_running.set(stats.num_running_reqs)
        self.num_waiting.set(stats.num_waiting_reqs)
        self.kv_cache_usage.set(stats.kv_cache_usage)
        for key, value, counter in (
            ("queries", stats.prefix_cache_queries, self.prefix_queries),
            ("hits", stats.prefix_cache_hits, self.prefix_hits),
            ("preemptions", stats.num_preemptions, self.preemptions),
        ):
            if value > self._last[key]:
                counter.inc(value - self._last[key])
                self._last[key] = value
        q = stats.prefix_cache_queries
        self.prefix_hit_rate.set(stats.prefix_cache_hits / q if q else 0.0)

    # -- from per-request bookkeeping in AsyncLLM ------------------------------------------------
    def record_first_token(self, ttft_s: float, num_prompt_tokens: int) -> None:
        self.ttft.observe(ttft_s)
        self.prompt_tokens.inc(num_prompt_tokens)

    def record_tokens(self, num_tokens: int, inter_token_s: float | None) -> None:
        self.generation_tokens.inc(num_tokens)
        if inter_token_s is not None:
            self.itl.observe(inter_token_s)

    def record_finished(self, finish_reason: str | None, e2e_s: float) -> None:
        self.e2e.observe(e2e_s)
        self._success.labels(self.model_name, finish_reason or "unknown").inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
