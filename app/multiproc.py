"""Prometheus metrics across uvicorn worker processes (``PROMETHEUS_MULTIPROC_DIR``).

Each worker of ``gatekeeper serve --workers N`` is a separate process; a scrape of ``/metrics``
reaches one of them. So that the scrape shows the whole service, the values live in
memory-mapped files of one directory (prometheus client's multiprocess mode) and ``/metrics``
sums them:

* :func:`metrics_directory` (``gatekeeper serve``): with more than one worker, creates a private
  temporary directory, exports it as ``PROMETHEUS_MULTIPROC_DIR`` to the workers (which read it
  when they import prometheus client) and removes it when the server stops. A directory given in
  ``PROMETHEUS_MULTIPROC_DIR`` is used instead and emptied of metric files at start (stale files
  of an earlier run would add their old counts), but not removed.
* :func:`mark_dead_workers` (each scrape): a worker that died (crashed, killed, replaced by
  uvicorn) leaves its files behind. Counters and histograms keep counting its requests, as they
  must, but ``livesum`` gauges must forget it: the files of live gauges of dead processes are
  removed (``prometheus_client.multiprocess.mark_process_dead``). A worker that stops normally
  marks itself (:func:`mark_this_process_dead`).
* :func:`forget_this_process`: the ``serve`` parent that imported the metrics before forking its
  workers (:mod:`app.webfork`) removes its own files, which never count anything.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ENV = "PROMETHEUS_MULTIPROC_DIR"
_LIVE_GAUGE_FILE = re.compile(r"gauge_live\w*?_(\d+)\.db")


def directory() -> str | None:
    """The multiprocess directory of this process, or None in single-process mode."""
    return os.environ.get(ENV) or None


@contextmanager
def metrics_directory(workers: int) -> Iterator[str | None]:
    """Set up ``PROMETHEUS_MULTIPROC_DIR`` for ``workers`` processes for the ``with`` block.

    Yields the directory, or None when one worker needs none (and none is configured).
    """
    given = directory()
    if given is not None:
        path = Path(given)
        path.mkdir(parents=True, exist_ok=True)
        for stale in path.glob("*.db"):
            stale.unlink()
        yield str(path)
        return
    if workers <= 1:
        yield None
        return
    created = tempfile.mkdtemp(prefix="gatekeeper-metrics-")
    os.environ[ENV] = created
    try:
        yield created
    finally:
        os.environ.pop(ENV, None)
        shutil.rmtree(created, ignore_errors=True)


def _alive(pid: int) -> bool:
    """Whether ``pid`` is a running process (a zombie, dead but not yet reaped, is not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    try:  # Linux: the state follows the parenthesised command name in /proc/<pid>/stat
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rpartition(")")[2].split()[:1] != ["Z"]


def mark_dead_workers(path: str) -> list[int]:
    """Remove the live-gauge files of processes that no longer exist; returns their pids."""
    from prometheus_client import multiprocess

    dead = set()
    for entry in os.listdir(path):
        match = _LIVE_GAUGE_FILE.fullmatch(entry)
        if match is not None and not _alive(int(match.group(1))):
            dead.add(int(match.group(1)))
    for pid in sorted(dead):
        multiprocess.mark_process_dead(pid, path)  # type: ignore[no-untyped-call]
    return sorted(dead)


def mark_this_process_dead() -> None:
    """Called by a worker that stops normally (no-op in single-process mode)."""
    path = directory()
    if path is not None:
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(os.getpid(), path)  # type: ignore[no-untyped-call]


def forget_this_process() -> list[str]:
    """Remove every metrics file of this process; returns their names.

    For the ``gatekeeper serve`` parent that imports :mod:`app.metrics` before it forks its
    workers (:mod:`app.webfork`): it never counts anything, and its files (all zero) would name
    a process that does not serve — a live-gauge file of a process still alive is never marked
    dead. Its forked workers write their own files (prometheus_client notices the pid change at
    each one's first metric). No-op in single-process mode.
    """
    path = directory()
    if path is None:
        return []
    suffix = f"_{os.getpid()}.db"
    removed = []
    for entry in sorted(os.listdir(path)):
        if entry.endswith(suffix):
            Path(path, entry).unlink(missing_ok=True)
            removed.append(entry)
    return removed
