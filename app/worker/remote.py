"""Bound computations on Celery workers: single flight by canonical key, sound fallback.

:class:`CeleryBoundWorker` is a :class:`~app.worker.pool.BoundWorker` whose computations run on
``gatekeeper worker`` processes, on any machine. A computation's task id is its canonical key
(:func:`~app.worker.keys.request_key` for the calculator, :func:`~app.worker.wire.call_key` for
typed calls, whose requests and answers are plain JSON: :mod:`app.worker.wire`), so:

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
from typing import Any

from celery import Celery, states

from app.engine.filters import Decision
from app.engine.likelihood import LossBounds
from app.engine.mechanisms import Mechanism
from app.engine.pipeline import ObjectSnapshot
from app.metrics import BOUND_CACHE, CELERY_TASK_WAIT
from app.worker.cache import ResultCache
from app.worker.celery_app import BOUND_PRIORITY, CALCULATOR_TASK, CALL_TASK, CelerySettings
from app.worker.keys import request_key
from app.worker.pool import BoundWorker, WorkerSettings, with_time_limit
from app.worker.wire import (
    bounds_from_json,
    call_key,
    decision_from_json,
    evaluate_request,
    realized_loss_request,
    with_bnb,
)

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
        job = with_time_limit(request, self.settings.time_limit)
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

    def evaluate(
        self, snapshot: ObjectSnapshot, mechanism: Mechanism, *, fallback: Callable[[], Decision]
    ) -> Decision:
        """``evaluate(snapshot, mechanism, tight=True)`` on a Celery worker.

        Shared by identical calls; past the deadline (or on any failure of the broker, Redis or
        the task): ``fallback()``.
        """
        answer = self._remote_call(evaluate_request(snapshot, mechanism))
        return fallback() if answer is None else decision_from_json(answer["decision"])

    def realized_loss(
        self, snapshot: ObjectSnapshot, *, fallback: Callable[[], LossBounds]
    ) -> LossBounds:
        """``realized_loss(snapshot)`` on a Celery worker (as :meth:`evaluate`)."""
        answer = self._remote_call(realized_loss_request(snapshot))
        return fallback() if answer is None else bounds_from_json(answer["bounds"])

    def _remote_call(self, request: dict[str, Any]) -> dict[str, Any] | None:
        job = with_bnb(request, time_limit=self.settings.time_limit, stop_at=None)
        key = call_key(job)
        answer: dict[str, Any] | None = self._flight(
            CALL_TASK, key, lambda stop_at: (with_bnb(job, stop_at=stop_at),)
        )
        if answer is None:
            self._count_fallback()
        return answer

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
