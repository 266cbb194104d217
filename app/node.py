"""``gatekeeper worker``: Celery nodes running bound computations and survey chunks.

One command starts one Celery node per queue — ``bounds`` (interactive: submits, dry-runs,
``/v1/loss``) and ``surveys`` (plans and chunks) — each with ``--concurrency`` prefork
processes, so an interactive computation never waits in a queue behind survey chunks. The
command supervises them: SIGTERM/SIGINT is passed on (Celery's warm shutdown: running tasks
finish), and when one node exits the other is stopped and the command exits non-zero (the
container or service manager restarts it). Nodes die with the command (``PR_SET_PDEATHSIG``).

Start-up fails loudly: the command checks the database, the broker and the result Redis
before it starts any node, and a node announces itself (its heartbeat, which ``/readyz`` and
the surveys' ``waiting_for_workers`` read) only once Celery says it consumes its queue. A node
whose Celery worker stops before that exits non-zero, whatever Celery returned.

The wiring (the Celery app and the survey handlers its tasks run) comes from
:mod:`app.bootstrap`, the composition root.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import logging
import multiprocessing
import os
import signal
import sys
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

from app import bootstrap
from app.settings import Settings
from app.worker.fleet import Heartbeat, broker_unreachable, start_heartbeat
from app.worker.threads import single_threaded_blas

log = logging.getLogger("gatekeeper.worker")

QUEUES = ("bounds", "surveys")
_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """Linux: this process gets SIGKILL when its parent dies (best effort elsewhere)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass


#: What each node imports once forked, imported by the command before it forks them: the
#: survey tasks' handlers (:func:`app.bootstrap.survey_handlers`: the services, the store,
#: SQLAlchemy's ORM, psycopg), the Celery command line ``worker_main`` parses with (its
#: ``amqp`` shell brings prompt_toolkit), the worker's consumer and prefork pool, and cffi's C
#: parser (billiard's ``PR_SET_PDEATHSIG`` in each pool process). Each node had imported them
#: itself, the same modules twice a start (docs/benchmarks.md, "Nineteenth session, h/spawn");
#: forked, the nodes share the parent's copy. tests/service/test_celery_worker.py checks that a
#: node's start imports none of these, nor any ``app`` module, itself.
NODE_MODULES = (
    "app.services.survey_runs",
    "app.worker.celery_app",
    "app.worker.pool",
    "celery.bin.celery",
    "celery.apps.worker",
    "celery.worker.consumer",
    "celery.concurrency.prefork",
    "celery.concurrency.asynpool",
    "celery.events.dispatcher",
    "celery.events.receiver",
    "billiard.sharedctypes",
    "billiard.synchronize",
    "kombu.matcher",
    "kombu.pidbox",
    "cffi.cparser",
)


def _preload() -> None:
    """Import :data:`NODE_MODULES` once, in the command, before the nodes fork."""
    for name in NODE_MODULES:
        try:
            importlib.import_module(name)
        except ImportError:  # cffi is optional for billiard; the nodes do without it too
            if not name.startswith("cffi"):
                raise


#: Exit status of a node whose Celery worker stopped before it was ready, or of the command
#: when the broker or the result Redis cannot be reached at start.
START_FAILED = 3


def _run_node(settings: Settings, queue: str, concurrency: int) -> None:
    """A forked child: one Celery node consuming ``queue`` (never returns normally).

    The heartbeat starts when Celery's ``worker_ready`` fires, and stops (its key deleted) at
    ``worker_shutdown``; a worker that stops before it was ready exits with
    :data:`START_FAILED` (Celery may return or exit 0 when it refuses to start).
    """
    _die_with_parent()
    from celery.signals import worker_process_init, worker_ready, worker_shutdown

    app, cfg = bootstrap.worker_celery(settings)

    def one_blas_thread(**_: object) -> None:
        single_threaded_blas()

    name = getattr(cfg, f"{queue}_queue")
    ready = threading.Event()
    beat: list[Heartbeat] = []

    def announce(**_: object) -> None:
        ready.set()
        beat.append(start_heartbeat(app.backend.client, cfg, queue=queue, concurrency=concurrency))

    def withdraw(**_: object) -> None:
        for heartbeat in beat:
            heartbeat.stop()

    hooks: list[tuple[Any, Callable[..., None]]] = [
        (worker_process_init, one_blas_thread),
        (worker_ready, announce),
        (worker_shutdown, withdraw),
    ]
    for signal_, hook in hooks:
        signal_.connect(hook, weak=False)
    status = 0
    try:
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
                f"{cfg.namespace}-{queue}@{os.uname().nodename}:{os.getpid()}",
                "--loglevel",
                settings.log_level.upper(),
                "--without-gossip",
                "--without-mingle",
            ]
        )
    except SystemExit as exc:
        status = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    finally:
        for signal_, hook in hooks:
            signal_.disconnect(hook)
    if not ready.is_set():
        print(f"gatekeeper worker: the {queue} node did not start", file=sys.stderr)
        status = status or START_FAILED
    withdraw()
    sys.exit(status)


def run_worker(settings: Settings, *, concurrency: int, queues: tuple[str, ...]) -> int:
    """Start one node per queue and supervise them; returns the exit status.

    Non-zero before any node starts when the database, the broker or the result Redis cannot
    be reached within ``DATABASE_WAIT_SECONDS``.
    """
    bootstrap.prepare_worker(settings)
    probe = bootstrap.sending_celery(settings)
    try:
        problem = broker_unreachable(probe, settings.database_wait_seconds)
    finally:  # no connection of the check is inherited by the nodes
        with contextlib.suppress(Exception):
            probe.backend.client.close()
        probe.close()
    if problem is not None:
        print(f"gatekeeper worker: {problem}", file=sys.stderr)
        return START_FAILED
    _preload()
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
