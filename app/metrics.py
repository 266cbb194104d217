"""Prometheus metrics of the service (``/metrics``; the list is in docs/dashboard.md).

The metrics defined here live in each process. With several uvicorn workers ``gatekeeper serve``
points ``PROMETHEUS_MULTIPROC_DIR`` at a private directory before the workers start; prometheus
client then keeps every value in a memory-mapped file there, and ``/metrics`` sums the files of
all workers (:mod:`app.multiproc`). Gauges say how to combine processes (``livesum``: the sum over
live processes only). The object counts are not kept here: ``/metrics`` reads them from the
database at scrape time (:func:`app.services.objects.object_counts`).
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

DECISIONS = Counter(
    "gatekeeper_decisions_total", "Filter decisions of submits", ["filter", "outcome"]
)
REQUESTS = Histogram(
    "gatekeeper_request_seconds",
    "HTTP request latency; path is the route template ('unmatched' for unknown paths)",
    ["method", "path", "status"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
)
IN_PROGRESS = Gauge(
    "gatekeeper_requests_in_progress",
    "HTTP requests being served",
    multiprocess_mode="livesum",
)
WEB_WORKERS = Gauge(
    "gatekeeper_web_workers",
    "Web worker processes serving (1 per live process)",
    multiprocess_mode="livesum",
)
SURVEY_MEMBERS = Counter(
    "gatekeeper_survey_members_total",
    "Survey members decided (rate: members decided per second), by outcome",
    ["outcome"],
)
SURVEY_GROUPS = Counter(
    "gatekeeper_survey_groups_total",
    "Decision groups of surveys: members with identical public state, decided once",
)
REUSED = Counter(
    "gatekeeper_reused_answers_total",
    'Stored identical answers returned by "reuse": true (nothing charged), by source: submit '
    "or survey (members)",
    ["source"],
)
VERSIONS_CREATED = Counter(
    "gatekeeper_versions_created_total",
    "Data versions created (single and bulk), each closing the object's previous version",
)
BOUND_CACHE = Counter("gatekeeper_bound_cache_total", "Bound-cache lookups", ["result"])
BOUND_SECONDS = Histogram(
    "gatekeeper_bound_seconds",
    "Time to compute realized-loss bounds: engine=accountant (finite objects, in the request "
    "thread) or calculator (worker pool: continuous objects and /v1/loss; cache misses only)",
    ["engine"],
    buckets=(
        0.0005,
        0.001,
        0.0025,
        0.005,
        0.01,
        0.025,
        0.05,
        0.1,
        0.25,
        0.5,
        1.0,
        2.5,
        5.0,
        10.0,
        30.0,
        60.0,
    ),
)
BOUND_FALLBACKS = Counter(
    "gatekeeper_bound_fallbacks_total",
    "Bound computations that exceeded their deadline and answered with basic composition",
)
LOCK_WAIT = Histogram(
    "gatekeeper_lock_wait_seconds",
    "Time a submit waited for its object's locks (in-process, then Redis); result=acquired|busy",
    ["result"],
    buckets=(0.0001, 0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0),
)
CELERY_TASK_WAIT = Histogram(
    "gatekeeper_celery_task_wait_seconds",
    "Time a web worker waited for a Celery bound task, send to result (BROKER_URL set); "
    "outcome=done|shared (another request's computation or its stored result)|fallback",
    ["task", "outcome"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0),
)
