"""The body of ``GET /metrics``: this process's (or all workers') metrics plus object counts."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector
from sqlalchemy.exc import OperationalError
from sqlalchemy.exc import TimeoutError as SATimeoutError

from app import multiproc
from app.engine.limits import NEAR_EXHAUSTION_FRACTION
from app.services.objects import object_counts
from app.store import Database
from app.worker.fleet import fleet_status

log = logging.getLogger(__name__)


class ObjectCounts(Collector):
    """Gauges read from the database when scraped (the database is the one source of truth).

    ``gatekeeper_objects{status}``, ``gatekeeper_objects_near_exhaustion`` and
    ``gatekeeper_objects_exhausted`` (the statuses of ``GET /v1/odometers``). When the database
    does not answer, the families are left out of the scrape (and a warning is logged) so that
    the process metrics are still served.
    """

    def __init__(self, engine: Database) -> None:
        self.engine = engine

    def collect(self) -> Iterator[GaugeMetricFamily]:
        """The object gauges, or nothing if the database is unavailable."""
        try:
            counts = object_counts(engine=self.engine)
        except (OperationalError, SATimeoutError) as exc:
            log.warning("object gauges skipped: database unavailable (%s)", type(exc).__name__)
            return
        objects = GaugeMetricFamily(
            "gatekeeper_objects", "Protected objects by status", labels=["status"]
        )
        objects.add_metric(["active"], counts.active)
        objects.add_metric(["retired"], counts.retired)
        yield objects
        yield GaugeMetricFamily(
            "gatekeeper_objects_near_exhaustion",
            "Active objects whose remaining budget (budget - realized loss upper bound) is below "
            f"{NEAR_EXHAUSTION_FRACTION:g} of their budget",
            value=counts.near_exhaustion,
        )
        yield GaugeMetricFamily(
            "gatekeeper_objects_exhausted",
            "Active objects whose remaining budget is below the smallest epsilon a query may "
            "declare (no query fits)",
            value=counts.exhausted,
        )
        yield GaugeMetricFamily(
            "gatekeeper_likelihood_states",
            "Likelihood arrays stored (one per distinct domain and history, shared by objects)",
            value=counts.states,
        )
        surveys = GaugeMetricFamily(
            "gatekeeper_surveys", "Population surveys by status", labels=["status"]
        )
        for status, count in counts.surveys.items():
            surveys.add_metric([status], count)
        yield surveys


class WorkerFleet(Collector):
    """Gauges of the Celery workers, read from the broker and Redis when scraped.

    ``gatekeeper_celery_workers`` (live nodes), ``gatekeeper_celery_worker_processes``,
    ``gatekeeper_celery_queue_depth{queue}``, and per task ``gatekeeper_celery_tasks_total`` and
    ``gatekeeper_celery_task_run_seconds_total`` (run time summed over every worker: their ratio
    is the mean task latency on the workers). A family whose source does not answer is left out.
    """

    def __init__(self, celery: Any, cfg: Any) -> None:
        self.celery, self.cfg = celery, cfg

    def collect(self) -> Iterator[Metric]:
        """The fleet's gauges and counters."""
        status = fleet_status(self.celery, self.cfg)
        if status.nodes is not None:
            yield GaugeMetricFamily(
                "gatekeeper_celery_workers", "Live gatekeeper worker nodes", value=status.nodes
            )
            yield GaugeMetricFamily(
                "gatekeeper_celery_worker_processes",
                "Worker processes of the live nodes",
                value=status.processes or 0,
            )
        depth = GaugeMetricFamily(
            "gatekeeper_celery_queue_depth", "Tasks waiting in a queue", labels=["queue"]
        )
        for queue, n in status.queues.items():
            if n is not None:
                depth.add_metric([queue], n)
        yield depth
        tasks = CounterMetricFamily(
            "gatekeeper_celery_tasks", "Tasks run by the workers", labels=["task"]
        )
        seconds = CounterMetricFamily(
            "gatekeeper_celery_task_run_seconds",
            "Run time of the workers' tasks, summed",
            labels=["task"],
        )
        for task, n in status.tasks.items():
            tasks.add_metric([task], n)
            seconds.add_metric([task], status.task_seconds.get(task, 0.0))
        yield tasks
        yield seconds


def render(engine: Database, celery: tuple[Any, Any] | None = None) -> bytes:
    """Prometheus text exposition of the service's metrics (blocking: files and database)."""
    path = multiproc.directory()
    if path is None:
        process = generate_latest(REGISTRY)
    else:
        multiproc.mark_dead_workers(path)
        aggregated = CollectorRegistry()
        MultiProcessCollector(aggregated, path)  # type: ignore[no-untyped-call]
        process = generate_latest(aggregated)
    scraped = CollectorRegistry()
    scraped.register(ObjectCounts(engine))
    if celery is not None:
        scraped.register(WorkerFleet(*celery))
    return process + generate_latest(scraped)
