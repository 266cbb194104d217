"""Housekeeping of a web process on a timer, off the request path.

:class:`Periodic` calls one function every ``seconds`` (each wait drawn between half and all of
it, so that the processes of a deployment, started together, do not all run it at once) in a
daemon thread, until :meth:`Periodic.close`. A failing call is logged and the timer goes on: the
work is housekeeping (:func:`app.services.snapshots.collect_states_periodically`, which deletes
the likelihood states no object names), and the next call does what this one did not.
"""

from __future__ import annotations

import logging
import secrets
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)

_JITTER = secrets.SystemRandom()


class Periodic:
    """``task()`` every ``seconds`` (±, see the module) in a thread of its own."""

    def __init__(self, *, name: str, task: Callable[[], object], seconds: float) -> None:
        if seconds <= 0:
            raise ValueError("a periodic task needs a positive interval")
        self._name = name
        self._task = task
        self._seconds = seconds
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop the timer (a call under way finishes in its thread)."""
        self._stopped.set()

    def _loop(self) -> None:
        while not self._stopped.wait(self._seconds * _JITTER.uniform(0.5, 1.0)):
            try:
                self._task()
            except Exception as exc:  # the database may be away for a moment: try next time
                log.warning("%s skipped: %s", self._name, type(exc).__name__)
