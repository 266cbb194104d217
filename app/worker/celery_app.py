"""The Celery application of the distributed worker module (``BROKER_URL``).

Two queues per deployment (``<namespace>.bounds``, ``<namespace>.surveys``): bound computations
are interactive (a submit or a dry-run waits for them), survey chunks are bulk work.
``gatekeeper worker`` consumes them in two separate Celery nodes, so a submit's computation
never waits in a queue behind survey chunks, however many are queued.

Every task is acknowledged *after* it ran (``acks_late``) and given back to the broker when its
process dies (``task_reject_on_worker_lost``); a worker process reserves one task at a time
(prefetch 1). A task may therefore run twice — harmless by construction: bound computations are
pure functions of public data, and a survey chunk writes nothing unless the database's
compare-and-set and the members' ``pending`` status allow it.

Tasks and their results are JSON, never pickle: ids, chunk numbers, calculator requests and
typed engine calls as plain data (:mod:`app.worker.wire`), rebuilt in the worker. A party able
to write to the broker can ask for computations but cannot run code on the workers, and
Celery runs a JSON-only worker under any user, root included. This module knows nothing of
surveys beyond the two callables it is given (:class:`SurveyHandlers`, built by
:mod:`app.bootstrap` for ``gatekeeper worker``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from celery import Celery
from celery.exceptions import SoftTimeLimitExceeded

from app.engine.continuous.branch_and_bound import BnBSettings
from app.worker.pool import run_calculator
from app.worker.wire import run_call

log = logging.getLogger(__name__)

CALCULATOR_TASK = "gatekeeper.bounds.calculator"
CALL_TASK = "gatekeeper.bounds.call"
PLAN_TASK = "gatekeeper.surveys.plan"
RANGE_TASK = "gatekeeper.surveys.chunk"

#: Interactive work first when a broker orders by priority too (RabbitMQ with x-max-priority).
BOUND_PRIORITY = 9


@dataclass(frozen=True)
class CelerySettings:
    """What the Celery app needs (read from :class:`app.settings.Settings` by the callers).

    Attributes
    ----------
    broker_url, result_url:
        The broker (Redis or RabbitMQ) and the Redis holding results.
    namespace:
        Prefix of the queues, task ids and Redis keys of this deployment.
    time_limit:
        ``BOUND_TIME_LIMIT``: seconds of one branch-and-bound search.
    grace:
        Seconds beyond ``4 * time_limit`` a caller waits for a bound task (the deadline).
    result_ttl:
        Seconds a result stays in Redis.
    """

    broker_url: str
    result_url: str
    namespace: str = "gatekeeper"
    time_limit: float = BnBSettings.time_limit
    grace: float = 5.0
    result_ttl: int = 3600

    @property
    def bound_deadline(self) -> float:
        """Seconds a caller waits for a bound task (the in-process pool's deadline too)."""
        return 4.0 * self.time_limit + self.grace

    @property
    def bound_soft_limit(self) -> float:
        """A bound task still running this long gets ``SoftTimeLimitExceeded``."""
        return self.bound_deadline

    @property
    def bound_hard_limit(self) -> float:
        """A bound task still running this long is killed (its process replaced)."""
        return self.bound_deadline + 10.0

    @property
    def survey_soft_limit(self) -> float:
        """Seconds after which a survey chunk is interrupted (rolled back, re-planned).

        A chunk holds up to ``SURVEY_CHUNK_SIZE`` members, and each of its decision groups may
        search for the bound deadline.
        """
        return 60.0 * self.time_limit

    @property
    def survey_hard_limit(self) -> float:
        """A survey chunk still running this long is killed; its transaction rolls back."""
        return self.survey_soft_limit + 30.0

    @property
    def bounds_queue(self) -> str:
        """The queue of interactive bound computations."""
        return f"{self.namespace}.bounds"

    @property
    def surveys_queue(self) -> str:
        """The queue of survey planning and chunks."""
        return f"{self.namespace}.surveys"

    def key(self, *parts: str) -> str:
        """A Redis key of this deployment's worker module."""
        return ":".join(("gatekeeper", "celery", self.namespace, *parts))


#: ``counted(survey_id, digests)``: how many of a committed chunk's decision groups a chunk of
#: the survey counted before (:func:`counted_before` on the worker's result Redis).
CountedBefore = Callable[[int, list[bytes]], int]


@dataclass(frozen=True)
class SurveyHandlers:
    """What the survey tasks run (given to :func:`make_celery` by ``gatekeeper worker``).

    ``plan(survey_id)`` claims the survey and returns ``(owner, chunks)`` (the pending chunks'
    numbers), or None when there is nothing to dispatch (held elsewhere, finished, inactive);
    ``run_range(survey_id, owner, chunk, counted)`` decides one chunk and returns the survey's
    status; ``counted`` is the deployment's ledger of the survey's counted groups
    (:data:`CountedBefore`; None: the chunk's count stands).
    """

    plan: Callable[[int], tuple[str, list[int]] | None]
    run_range: Callable[[int, str, int, CountedBefore | None], str]


def record_task(app: Celery, cfg: CelerySettings, name: str, seconds: float) -> None:
    """Count a finished task and its run time in Redis (``/metrics`` of every replica reads it).

    Errors are ignored: statistics must never fail a task.
    """
    try:
        client = app.backend.client
        pipe = client.pipeline()
        pipe.hincrby(cfg.key("tasks"), name, 1)
        pipe.hincrbyfloat(cfg.key("task-seconds"), name, seconds)
        pipe.execute()
    except Exception as exc:  # the result Redis is away: the task's work is done anyway
        log.warning("task statistics not recorded (%s)", type(exc).__name__)


#: Seconds a survey's counted decision groups stay in Redis after its last chunk task.
GROUPS_TTL = 7 * 24 * 3600


def counted_before(client: Any, cfg: CelerySettings, survey_id: int, digests: list[bytes]) -> int:
    """How many of a committed chunk's decision groups a chunk of the survey counted before.

    ``digests``: the chunk's groups (:func:`~app.services.survey_runs.group_digest`), now
    recorded in the survey's set (``SADD`` says how many were new; the rest were counted).
    """
    key = cfg.key("survey-groups", str(survey_id))
    pipe = client.pipeline()
    pipe.sadd(key, *digests)
    pipe.expire(key, GROUPS_TTL)
    added, _ = pipe.execute()
    return len(digests) - int(added)


def make_celery(cfg: CelerySettings, surveys: SurveyHandlers | None = None) -> Celery:
    """The Celery app of ``cfg``: queues, reliability settings, and the four tasks.

    ``surveys`` is what a worker's survey tasks run; a web process, which only sends tasks,
    gives none (a survey task run there would fail).
    """

    def handlers() -> SurveyHandlers:
        if surveys is None:
            raise RuntimeError("survey tasks run only in `gatekeeper worker`")
        return surveys

    app = Celery(cfg.namespace, broker=cfg.broker_url, backend=cfg.result_url)
    app.conf.update(
        # plain data only: no message can make a worker run code (and root may run workers)
        task_serializer="json",
        result_serializer="json",
        accept_content=["json"],
        result_accept_content=["json"],
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        task_default_queue=cfg.surveys_queue,
        task_routes={
            CALCULATOR_TASK: {"queue": cfg.bounds_queue},
            CALL_TASK: {"queue": cfg.bounds_queue},
            PLAN_TASK: {"queue": cfg.surveys_queue},
            RANGE_TASK: {"queue": cfg.surveys_queue},
        },
        task_queue_max_priority=10,
        task_default_priority=0,
        result_expires=cfg.result_ttl,
        result_extended=False,
        task_track_started=False,
        broker_connection_retry_on_startup=True,
        # a publish to an unreachable broker gives up quickly: the caller falls back
        broker_connection_timeout=2.0,
        task_publish_retry_policy={
            "max_retries": 2,
            "interval_start": 0.1,
            "interval_step": 0.2,
            "interval_max": 0.5,
        },
        # Redis broker: a task reserved by a worker that vanished without a word (SIGKILL of
        # the whole node) is given to another after this long; the survey lease re-plans
        # sooner anyway (docs/scaling.md)
        broker_transport_options={"visibility_timeout": 300},
        redis_socket_timeout=2.0,
        redis_socket_connect_timeout=2.0,
        redis_backend_health_check_interval=10,
        worker_hijack_root_logger=False,
        worker_send_task_events=False,
        worker_cancel_long_running_tasks_on_connection_loss=True,
    )

    def timed(name: str, fn: Callable[[], Any]) -> Any:
        started = time.perf_counter()
        try:
            return fn()
        finally:
            record_task(app, cfg, name, time.perf_counter() - started)

    @app.task(  # type: ignore[untyped-decorator]
        name=CALCULATOR_TASK,
        shared=False,  # this app's own (its handlers), never another app's of this process
        soft_time_limit=cfg.bound_soft_limit,
        time_limit=cfg.bound_hard_limit,
    )
    def calculator(request: dict[str, Any], stop_at: float | None) -> dict[str, Any]:
        """The loss calculator's answer (searches end by the caller's deadline)."""
        answer: dict[str, Any] = timed(CALCULATOR_TASK, lambda: run_calculator(request, stop_at))
        return answer

    @app.task(  # type: ignore[untyped-decorator]
        name=CALL_TASK,
        shared=False,  # this app's own (its handlers), never another app's of this process
        soft_time_limit=cfg.bound_soft_limit,
        time_limit=cfg.bound_hard_limit,
    )
    def call(request: dict[str, Any]) -> dict[str, Any]:
        """A typed engine call (``evaluate``, ``realized_loss``) as data (:mod:`.wire`)."""
        answer: dict[str, Any] = timed(CALL_TASK, lambda: run_call(request))
        return answer

    @app.task(  # type: ignore[untyped-decorator]
        name=PLAN_TASK,
        shared=False,  # this app's own (its handlers), never another app's of this process
        soft_time_limit=cfg.survey_soft_limit,
        time_limit=cfg.survey_hard_limit,
    )
    def plan(survey_id: int) -> int:
        """Claim a survey and send one task per pending chunk of its members."""
        planned = timed(PLAN_TASK, lambda: handlers().plan(survey_id))
        if planned is None:
            return 0
        owner, chunks = planned
        ids = [f"{cfg.namespace}:survey:{survey_id}:{owner}:{n}" for n in chunks]
        remember_survey_tasks(app, cfg, survey_id, ids)
        for task_id, chunk in zip(ids, chunks, strict=True):
            app.send_task(
                RANGE_TASK,
                args=(survey_id, owner, chunk),
                task_id=task_id,
                queue=cfg.surveys_queue,
                ignore_result=True,
            )
        return len(chunks)

    @app.task(  # type: ignore[untyped-decorator]
        name=RANGE_TASK,
        shared=False,  # this app's own (its handlers), never another app's of this process
        soft_time_limit=cfg.survey_soft_limit,
        time_limit=cfg.survey_hard_limit,
        ignore_result=True,
    )
    def run_range(survey_id: int, owner: str, chunk: int) -> str:
        """Decide one chunk of a survey (at most once per member: the database decides).

        Its decision groups are counted once per survey across the chunks, in a set in the
        worker's result Redis (the client Celery keeps for this process, as :func:`record_task`).
        """

        def counted(survey: int, digests: list[bytes]) -> int:
            return counted_before(app.backend.client, cfg, survey, digests)

        try:
            status: str = timed(
                RANGE_TASK, lambda: handlers().run_range(survey_id, owner, chunk, counted)
            )
        except SoftTimeLimitExceeded:  # rolled back; the lease expires and the survey re-plans
            log.warning("survey %d: a chunk exceeded its time limit", survey_id)
            return "timed-out"
        return status

    return app


def remember_survey_tasks(app: Celery, cfg: CelerySettings, survey_id: int, ids: list[str]) -> None:
    """Note a survey's task ids in Redis, so that cancelling it can revoke them."""
    if not ids:
        return
    try:
        client = app.backend.client
        key = cfg.key("survey-tasks", str(survey_id))
        client.sadd(key, *ids)
        client.expire(key, max(cfg.result_ttl, 24 * 3600))
    except Exception as exc:  # revoke is an optimisation: a cancelled chunk rolls back anyway
        log.warning("survey task ids not recorded (%s)", type(exc).__name__)


def revoke_survey_tasks(app: Celery, cfg: CelerySettings, survey_id: int) -> int:
    """Revoke every queued task of a survey (running chunks roll back at their commit)."""
    key = cfg.key("survey-tasks", str(survey_id))
    client = app.backend.client
    ids = [i.decode() if isinstance(i, bytes) else str(i) for i in client.smembers(key)]
    if ids:
        app.control.revoke(ids)
    client.delete(key)
    return len(ids)
