"""Background jobs of a web process: population surveys, off the request path.

The embedded default runs them in this process — ``make run`` needs no broker: a survey created
here is started at once, and a sweeper picks up every active survey nobody holds (queued ones
created by other processes, and those of a crashed process once its lease expired). A survey
runs in one thread at a time per process, its chunks decided by child processes
(``SURVEY_PROCESSES``, :mod:`app.worker.children`) or by threads of this process; its chunks are
transactions, so a process that dies mid-chunk loses nothing but the samples of that chunk,
unseen.

The interface (:class:`SurveyJobs`) is what a distributed engine implements instead: ``start``
enqueues a survey, ``cancelled`` drops its queued work, ``close`` stops taking work
(:class:`app.worker.celery_jobs.CeleryJobs` with a broker), and ``waiting_for_workers`` says
whether surveys wait for workers that are not there. This module knows nothing of
surveys beyond the two callables it is given (the worker layer runs what the services hand it).
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from typing import Any, Protocol

from app.worker.children import ChildPool

log = logging.getLogger(__name__)


class SurveyJobs(Protocol):
    """Where surveys run."""

    def start(self, survey_id: int) -> None:
        """Run the survey soon (idempotent: a survey already queued or running is left)."""

    def cancelled(self, survey_id: int) -> None:
        """Drop the queued work of a survey cancelled in the database.

        An optimisation: a chunk that runs anyway sees the cancel at its commit and rolls back.
        """

    def close(self) -> None:
        """Stop taking work; a running chunk may finish or be rolled back."""

    def waiting_for_workers(self) -> bool:
        """Whether surveys wait for workers that are not there (no live ``surveys`` node).

        False when this process runs surveys itself, and when it cannot tell.
        """


class InProcessJobs:
    """Surveys run by a thread of this process; a sweeper resumes orphaned ones.

    ``run(survey_id)`` decides a survey to the end (it claims the survey's lease itself and
    returns at once if another process holds it); ``orphans()`` lists active surveys nobody
    holds. Both are called from this class's threads only. ``children``: the child processes
    ``run`` hands the chunks to (``SURVEY_PROCESSES``; None: threads of this process), closed
    with this runner.
    """

    def __init__(
        self,
        *,
        run: Callable[[int], str],
        orphans: Callable[[], list[int]],
        sweep_seconds: float = 10.0,
        children: ChildPool[Any] | None = None,
    ) -> None:
        self._run = run
        self._orphans = orphans
        self.children = children
        self._sweep_seconds = sweep_seconds
        self._queue: queue.Queue[int | None] = queue.Queue()
        self._pending: set[int] = set()
        self._guard = threading.Lock()
        self._stopped = threading.Event()
        self._runner = threading.Thread(target=self._work, name="survey-runner", daemon=True)
        self._sweeper = threading.Thread(target=self._sweep, name="survey-sweeper", daemon=True)
        self._runner.start()
        self._sweeper.start()

    def start(self, survey_id: int) -> None:
        """Queue ``survey_id`` unless it is queued or running here already."""
        with self._guard:
            if survey_id in self._pending or self._stopped.is_set():
                return
            self._pending.add(survey_id)
        self._queue.put(survey_id)

    def cancelled(self, survey_id: int) -> None:
        """Nothing to drop: the running survey stops at its next chunk (it reads the status)."""

    def waiting_for_workers(self) -> bool:
        """Never: this process runs its surveys (and any other active one, by its sweeper)."""
        return False

    def close(self) -> None:
        """Stop both threads and the child processes.

        The running survey stops after its current chunk's thread dies; a child process exits
        (a chunk it was deciding is rolled back).
        """
        self._stopped.set()
        self._queue.put(None)
        if self.children is not None:
            self.children.close()

    def _work(self) -> None:
        while not self._stopped.is_set():
            survey_id = self._queue.get()
            if survey_id is None:
                return
            try:
                status = self._run(survey_id)
                log.info("survey %d: %s", survey_id, status)
            except Exception:  # the sweeper retries it once its lease expires
                log.exception("survey %d: the run stopped on an error", survey_id)
            finally:
                with self._guard:
                    self._pending.discard(survey_id)

    def _sweep(self) -> None:
        delay = 0.0  # the first sweep at once: resume what a previous process left
        while not self._stopped.wait(delay):
            delay = self._sweep_seconds
            try:
                for survey_id in self._orphans():
                    self.start(survey_id)
            except Exception as exc:  # the database may be away for a moment
                log.warning("survey sweep skipped: %s", type(exc).__name__)
