"""``gatekeeper worker``: Celery nodes running bound computations and survey chunks.

One command starts one Celery node per queue — ``bounds`` (interactive: submits, dry-runs,
``/v1/loss``) and ``surveys`` (plans and chunks) — each with ``--concurrency`` prefork
processes, so an interactive computation never waits in a queue behind survey chunks. The
command supervises them: SIGTERM/SIGINT is passed on (Celery's warm shutdown: running tasks
finish), and when one node exits the other is stopped and the command exits non-zero (the
container or service manager restarts it). Nodes die with the command (``PR_SET_PDEATHSIG``).

Wiring lives here, above the layers: the survey tasks (:mod:`app.worker.celery_app`) get
their implementation from :mod:`app.services.survey_runs`; every worker process opens its own
database connections (never shared across ``fork``).
"""

from __future__ import annotations

import ctypes
import logging
import multiprocessing
import os
import secrets
import signal
import sys
from functools import cache
from types import FrameType

from sqlalchemy import Engine

from app import crypto
from app.db.session import make_engine, wait_for_database
from app.engine.limits import DEFAULT_LIMITS
from app.services import survey_runs
from app.settings import Settings
from app.worker.celery_app import CelerySettings, SurveyHandlers, install_survey_handlers
from app.worker.fleet import start_heartbeat
from app.worker.pool import BoundWorker, WorkerSettings
from app.worker.threads import single_threaded_blas

log = logging.getLogger("gatekeeper.worker")

QUEUES = ("bounds", "surveys")
_PR_SET_PDEATHSIG = 1


def celery_settings(settings: Settings) -> CelerySettings:
    """The Celery configuration of ``settings`` (``BROKER_URL`` must be set)."""
    if settings.broker_url is None or settings.result_url is None:
        raise ValueError("BROKER_URL is not set")
    return CelerySettings(
        broker_url=settings.broker_url,
        result_url=settings.result_url,
        namespace=settings.broker_namespace,
        time_limit=settings.bound_time_limit,
        result_ttl=settings.broker_result_ttl,
    )


def survey_handlers(settings: Settings) -> SurveyHandlers:
    """The survey tasks' implementation: plan and decide ranges on this process's engine."""
    bound = BoundWorker(WorkerSettings(processes=0, time_limit=settings.bound_time_limit))

    @cache
    def engine(pid: int) -> Engine:  # one engine per process: connections never cross a fork
        return make_engine(settings.database_url, pool_size=1, max_overflow=1)

    def plan(survey_id: int) -> tuple[str, list[int]] | None:
        owner = f"celery:{secrets.token_hex(8)}"
        chunks = survey_runs.plan_survey(
            engine=engine(os.getpid()),
            survey_id=survey_id,
            owner=owner,
            lease_seconds=settings.survey_lease_seconds,
        )
        return None if not chunks else (owner, chunks)

    def run_range(survey_id: int, owner: str, chunk: int) -> str:
        return survey_runs.run_survey_range(
            engine=engine(os.getpid()),
            worker=bound,
            survey_id=survey_id,
            owner=owner,
            chunk=chunk,
            limits=DEFAULT_LIMITS,
            lease_seconds=settings.survey_lease_seconds,
        )

    return SurveyHandlers(plan=plan, run_range=run_range)


def _die_with_parent() -> None:
    """Linux: this process gets SIGKILL when its parent dies (best effort elsewhere)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass


def _run_node(settings: Settings, queue: str, concurrency: int) -> None:
    """A forked child: one Celery node consuming ``queue`` (never returns normally)."""
    _die_with_parent()
    from celery.signals import worker_process_init

    from app.worker.celery_app import make_celery

    cfg = celery_settings(settings)
    app = make_celery(cfg)
    worker_process_init.connect(lambda **_: single_threaded_blas(), weak=False)
    node = start_heartbeat(app.backend.client, cfg, queue=queue, concurrency=concurrency)
    name = getattr(cfg, f"{queue}_queue")
    app.worker_main(
        [
            "worker",
            "--queues",
            name,
            "--concurrency",
            str(concurrency),
            "--pool",
            "prefork",
            "--hostname",
            f"{cfg.namespace}-{node}",
            "--loglevel",
            settings.log_level.upper(),
            "--without-gossip",
            "--without-mingle",
        ]
    )


def run_worker(settings: Settings, *, concurrency: int, queues: tuple[str, ...]) -> int:
    """Start one node per queue and supervise them; returns the exit status."""
    crypto.configure(settings.value_cipher())
    probe = make_engine(settings.database_url, pool_size=1, max_overflow=0)
    wait_for_database(probe, settings.database_wait_seconds)
    probe.dispose()
    install_survey_handlers(survey_handlers(settings))
    context = multiprocessing.get_context("fork")
    nodes = [
        context.Process(target=_run_node, args=(settings, q, concurrency), name=f"node-{q}")
        for q in queues
    ]
    for node in nodes:
        node.start()
    print(
        f"gatekeeper: worker nodes {', '.join(queues)} with {concurrency} process(es) each, "
        f"broker {settings.broker_url.split('://')[0] if settings.broker_url else '?'}",
        file=sys.stderr,
    )

    def forward(signum: int, _frame: FrameType | None) -> None:
        for node in nodes:
            if node.pid is not None and node.is_alive():
                os.kill(node.pid, signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    status = 0
    while any(node.is_alive() for node in nodes):
        for node in nodes:
            node.join(timeout=0.5)
            if node.exitcode is not None and any(n.is_alive() for n in nodes):
                status = status or (node.exitcode or 1)
                forward(signal.SIGTERM, None)
    for node in nodes:
        node.join()
        status = status or (node.exitcode or 0)
    return status
