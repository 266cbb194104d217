"""Bound computations on Celery workers: single flight by canonical key, sound fallback.

:class:`CeleryBoundWorker` is a :class:`~app.worker.pool.BoundWorker` whose computations run on
``gatekeeper worker`` processes, on any machine. A computation's task id is its canonical key
(:func:`~app.worker.keys.request_key` for the calculator, :func:`~app.worker.keys.call_key` for
typed calls), so:

- identical requests from any thread, web worker or replica share one computation: the first
  takes a short Redis claim on the key (``SET NX`` for the deadline) and sends the task; the
  others wait for the same task id's result;
- a finished result stays in Redis for ``BROKER_RESULT_TTL`` seconds and answers later identical
  requests without a computation.

Every wait ends by the deadline (``4 * BOUND_TIME_LIMIT + grace``, as in the process pool):
past it — no worker alive, a broker or Redis away, a task killed by its time limit — the caller
answers with basic composition (Lemma 6.1), which is always sound, and the task expires unrun.
"""

from __future__ import annotations

import asyncio
import copy
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any, TypeVar

from celery import Celery, states

from app.engine.pipeline import ObjectSnapshot
from app.metrics import BOUND_CACHE, CELERY_TASK_WAIT
from app.worker.cache import ResultCache
from app.worker.celery_app import BOUND_PRIORITY, CALCULATOR_TASK, CALL_TASK, CelerySettings
from app.worker.keys import call_key, request_key
from app.worker.pool import BoundWorker, WorkerSettings, _with_time_limit

R = TypeVar("R")

#: Seconds between two reads of a pending result (doubling from the first up to the last).
POLL_FIRST, POLL_MAX = 0.002, 0.05


class CeleryBoundWorker(BoundWorker):
    """A bound worker whose computations run as Celery tasks (no local pool)."""

    def __init__(
        self,
        settings: WorkerSettings,
        cache: ResultCache | None,
        *,
        celery: Celery,
        cfg: CelerySettings,
    ) -> None:
        super().__init__(replace(settings, processes=0), cache)
        self.celery = celery
        self.cfg = cfg

    def compute(self, request: dict[str, Any]) -> dict[str, Any]:
        """The calculator's answer for ``request``, computed once per key by a Celery worker."""
        key = request_key(request)
        cached = self.cache.get(key)
        BOUND_CACHE.labels("hit" if cached is not None else "miss").inc()
        if cached is not None:
            return copy.deepcopy(cached)
        job = _with_time_limit(request, self.settings.time_limit)
        answer: dict[str, Any] | None = self._flight(
            CALCULATOR_TASK, key, lambda stop_at: (job, stop_at)
        )
        if answer is None:
            return self._fallback(request)
        self.cache.set(key, answer)
        return copy.deepcopy(answer)

    async def compute_async(self, request: dict[str, Any]) -> dict[str, Any]:
        """:meth:`compute` without blocking the event loop."""
        return await asyncio.to_thread(self.compute, request)

    def call(
        self,
        fn: Callable[..., R],
        snapshot: ObjectSnapshot,
        *args: Any,
        fallback: Callable[[], R],
    ) -> R:
        """``fn(snapshot, *args)`` on a Celery worker, shared by identical calls.

        Past the deadline (or on any failure of the broker, Redis or the task): ``fallback()``.
        """
        bnb = replace(snapshot.bnb, time_limit=self.settings.time_limit, stop_at=None)
        key = call_key(fn, snapshot, args, bnb)
        result: R | None = self._flight(
            CALL_TASK, key, lambda stop_at: (fn, snapshot, args, replace(bnb, stop_at=stop_at))
        )
        if result is None:
            self._count_fallback()
            return fallback()
        return result

    def task_id(self, name: str, key: str) -> str:
        """The task id of computation ``key`` of task ``name`` in this deployment."""
        return f"{self.cfg.namespace}:{name.rsplit('.', 1)[-1]}:{key}"

    def _flight(self, name: str, key: str, make_args: Callable[[float], tuple[Any, ...]]) -> Any:
        """The result of task ``name`` for ``key``: stored, in flight, or sent now.

        None past the deadline or on any failure (the caller falls back).
        """
        started = time.monotonic()
        deadline = started + self.deadline
        task_id = self.task_id(name, key)
        backend = self.celery.backend
        outcome = "fallback"
        try:
            meta = backend.get_task_meta(task_id)
            if meta["status"] == states.SUCCESS:
                outcome = "shared"
                return meta["result"]
            claim = self.cfg.key("flight", task_id)
            lead = backend.client.set(claim, b"1", nx=True, px=max(1, int(self.deadline * 1000)))
            if lead:
                if meta["status"] in states.READY_STATES:
                    backend.forget(task_id)  # a failure of an earlier attempt: compute again
                self.celery.send_task(
                    name,
                    args=make_args(time.time() + self.deadline),
                    task_id=task_id,
                    queue=self.cfg.bounds_queue,
                    priority=BOUND_PRIORITY,
                    expires=self.deadline,
                )
            result = self._poll(task_id, deadline)
            if result is not None:
                outcome = "done" if lead else "shared"
            return result
        except Exception:  # broker or Redis unreachable, a failed task: the sound fallback
            return None
        finally:
            CELERY_TASK_WAIT.labels(name.rsplit(".", 1)[-1], outcome).observe(
                time.monotonic() - started
            )

    def _poll(self, task_id: str, deadline: float) -> Any:
        backend = self.celery.backend
        delay = POLL_FIRST
        while True:
            meta = backend.get_task_meta(task_id)
            status = meta["status"]
            if status == states.SUCCESS:
                return meta["result"]
            if status in states.READY_STATES:
                return None  # failed or revoked: the caller falls back
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            time.sleep(min(delay, left))
            delay = min(delay * 2, POLL_MAX)
