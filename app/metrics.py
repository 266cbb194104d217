"""Prometheus metrics of the service (``/metrics``).

With several uvicorn workers each process keeps its own counters (Prometheus scrapes one of them
per request); ``PROMETHEUS_MULTIPROC_DIR`` aggregation is left to the deployment.
"""

from __future__ import annotations

from prometheus_client import Counter, Histogram

DECISIONS = Counter(
    "gatekeeper_decisions_total", "Filter decisions of submits", ["filter", "outcome"]
)
REQUESTS = Histogram(
    "gatekeeper_request_seconds",
    "HTTP request latency",
    ["method", "path", "status"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
)
BOUND_CACHE = Counter("gatekeeper_bound_cache_total", "Bound-cache lookups", ["result"])
