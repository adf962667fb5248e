"""``octavo bench``: throughput, latency and serving benchmarks with same-run baselines."""
