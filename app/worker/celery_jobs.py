"""Surveys on Celery workers: a web process only enqueues; ``gatekeeper worker`` runs them.

``start(survey_id)`` sends a *plan* task; a worker claims the survey's lease and sends one
*chunk* task per pending chunk of members (``SURVEY_CHUNK_SIZE`` each), which any worker on any
machine runs. Each chunk renews the lease; the chunk that leaves no member pending marks the
survey done.

Whatever the broker loses (a restart without persistence, a node killed while holding tasks),
the lease stops being renewed and expires; this process's sweeper (every ``sweep_seconds``)
then sends a new plan for the chunks still pending. No member is ever asked twice: the
database decides (a chunk is decided only from pending, under the objects' compare-and-set).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from celery import Celery

from app.worker.celery_app import PLAN_TASK, CelerySettings, revoke_survey_tasks
from app.worker.fleet import alive_nodes

log = logging.getLogger(__name__)

#: Seconds during which a survey's plan task is not sent again (by any process).
PLAN_INTERVAL = 30


class CeleryJobs:
    """:class:`~app.worker.jobs.SurveyJobs` on Celery, with a sweeper resuming orphans."""

    def __init__(
        self,
        *,
        celery: Celery,
        cfg: CelerySettings,
        orphans: Callable[[], list[int]],
        sweep_seconds: float = 10.0,
    ) -> None:
        self.celery = celery
        self.cfg = cfg
        self._orphans = orphans
        self._sweep_seconds = sweep_seconds
        self._stopped = threading.Event()
        self._sweeper = threading.Thread(target=self._sweep, name="survey-sweeper", daemon=True)
        self._sweeper.start()

    def start(self, survey_id: int) -> None:
        """Send the survey's plan task, at most once per :data:`PLAN_INTERVAL` seconds.

        A survey waiting behind another one's chunks stays "nobody holds it" until its plan
        runs; without the interval every web process's sweeper would queue another plan task
        for it every ``sweep_seconds``. (A plan that finds the survey held does nothing.)
        """
        if self._stopped.is_set():
            return
        try:
            fresh = self.celery.backend.client.set(
                self.cfg.key("planned", str(survey_id)), b"1", nx=True, ex=PLAN_INTERVAL
            )
            if not fresh:
                return
        except Exception as exc:  # Redis away: send anyway (a duplicate plan is harmless)
            log.warning("survey %d: plan not deduplicated (%s)", survey_id, type(exc).__name__)
        try:
            self.celery.send_task(
                PLAN_TASK, args=(survey_id,), queue=self.cfg.surveys_queue, ignore_result=True
            )
        except Exception as exc:  # broker away: the sweeper sends it again later
            log.warning("survey %d not dispatched yet (%s)", survey_id, type(exc).__name__)

    def cancelled(self, survey_id: int) -> None:
        """Revoke the survey's queued chunk tasks."""
        try:
            revoked = revoke_survey_tasks(self.celery, self.cfg, survey_id)
            log.info("survey %d: %d tasks revoked", survey_id, revoked)
        except Exception as exc:  # they roll back at their commit anyway
            log.warning("survey %d: tasks not revoked (%s)", survey_id, type(exc).__name__)

    def waiting_for_workers(self) -> bool:
        """True when no ``surveys`` node has a live heartbeat (the result Redis answering)."""
        return alive_nodes(self.celery, self.cfg, "surveys") == 0

    def close(self) -> None:
        """Stop the sweeper."""
        self._stopped.set()

    def _sweep(self) -> None:
        delay = 0.0
        while not self._stopped.wait(delay):
            delay = self._sweep_seconds
            try:
                for survey_id in self._orphans():
                    self.start(survey_id)
            except Exception as exc:  # the database may be away for a moment
                log.warning("survey sweep skipped: %s", type(exc).__name__)
