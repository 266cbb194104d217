"""``gatekeeper serve --workers N``: uvicorn's workers forked from a parent that imported the app.

uvicorn's supervisor (``uvicorn.supervisors.multiprocess``) starts every worker — the first N, a
replacement after a death, SIGHUP's restarts — with multiprocessing's ``spawn``: a new
interpreter that imports the whole app again, about 0.9 s of CPU per worker on the test machine
(docs/benchmarks.md, "Nineteenth session, h/spawn"). Here the ``serve`` parent imports the
app's modules once (:data:`WEB_MODULES`: modules only — no app instance, no settings read for
it, no database connection, no thread, no event loop) and uvicorn's supervisor is given forked
workers instead, each building its app itself as a spawned one does (``app_factory``: its own
settings read afresh, engine, Redis clients and metrics files, in the app's lifespan).

The seam is uvicorn's, not public: the supervisor asks ``get_subprocess(config, target,
sockets)`` of its own module for each worker and runs it with ``subprocess_started(config,
target, sockets, stdin_fileno)``. :func:`forked_workers` replaces that one name for the
duration of the server, and only when both have the shape this module was written for
(uvicorn 0.54), on Linux, and the parent is still single-threaded after its imports; otherwise
the workers are spawned as before, and ``serve`` says which on standard error.

What a fork inherits and a spawned interpreter does not have, and how each is handled:

* Signal handlers: uvicorn's supervisor queues SIGINT, SIGTERM, SIGHUP... in a list before it
  starts workers; a child running those handlers would queue and lose a SIGTERM sent before
  its server captures the signals, and never stop. The parent blocks the signals whose
  handlers uvicorn changed around each fork; the child puts back the handlers the process had
  before uvicorn (Python's defaults) and only then unblocks them.
* Metrics files: importing :mod:`app.metrics` in the parent creates its files in
  ``PROMETHEUS_MULTIPROC_DIR``. prometheus_client gives each child its own files at its first
  metric (it notices the pid change); the parent's, all zero, are removed after the imports
  (:func:`app.multiproc.forget_this_process`), so no file names a process that never serves.
* BLAS threads: NumPy's OpenBLAS starts a thread per core when loaded. Unless the operator chose
  (``OPENBLAS_NUM_THREADS``, ...), the parent loads it with one, which is what every worker
  limits it to at start anyway (:func:`app.worker.threads.single_threaded_blas`).
* Cached settings: :func:`app.settings.get_settings` is read afresh in each child.
* The collector: the imports run with it paused and end frozen (``gc.freeze``), so that the
  children's collections never write to the shared pages (:func:`app.bootstrap.tune_collector`
  does the same in each worker for what it builds).
* Randomness: the app draws from :mod:`secrets` only (the operating system's generator); the
  unread words buffered by :mod:`app.engine.sampling` are dropped at a fork.
"""

from __future__ import annotations

import gc
import importlib
import inspect
import os
import signal
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from multiprocessing import resource_tracker
from multiprocessing.context import ForkProcess
from types import ModuleType
from typing import Any

from app.multiproc import forget_this_process
from app.settings import get_settings
from app.worker.threads import BLAS_THREAD_VARIABLES

#: What a web worker imports to build its app and serve, imported by the ``serve`` parent before
#: it forks them: the app factory and the API (with the services, the store, SQLAlchemy,
#: FastAPI, NumPy), what the lifespan's runtime imports (:func:`app.bootstrap.build_runtime`),
#: and uvicorn's protocol, lifespan and loop modules. A name missing here (another uvicorn, no
#: ``redis`` installed) is skipped: a worker then imports what it lacks itself.
#: tests/service/test_serve_fork.py checks that no worker imports an ``app`` module itself.
WEB_MODULES = (
    "app.bootstrap",
    "app.api.main",
    "app.api.deps",
    "app.services.auth",
    "app.services.locks",
    "app.services.snapshots",
    "app.services.survey_runs",
    "app.worker.cache",
    "app.worker.children",
    "app.worker.jobs",
    "app.worker.periodic",
    "app.worker.pool",
    "redis",
    "uvicorn.server",
    "uvicorn.lifespan.on",
    "uvicorn.loops.auto",
    "uvicorn.protocols.http.auto",
    "uvicorn.protocols.websockets.auto",
)

_SUPERVISOR_ASKS = ("config", "target", "sockets")
_CHILD_ENTRY = ("config", "target", "sockets", "stdin_fileno")


def _parameters(function: Any) -> tuple[str, ...] | None:
    try:
        return tuple(inspect.signature(function).parameters)
    except (TypeError, ValueError):
        return None


def uvicorn_seam() -> tuple[ModuleType, Callable[..., None]] | None:
    """The supervisor's module and child entry, when this module knows them (uvicorn 0.54's).

    None otherwise: the workers are then spawned, as uvicorn does.
    """
    try:
        from uvicorn import _subprocess
        from uvicorn.supervisors import multiprocess
    except ImportError:
        return None
    asks = getattr(multiprocess, "get_subprocess", None)
    entry = getattr(_subprocess, "subprocess_started", None)
    if asks is None or entry is None or asks is not getattr(_subprocess, "get_subprocess", None):
        return None
    if _parameters(asks) != _SUPERVISOR_ASKS or _parameters(entry) != _CHILD_ENTRY:
        return None
    return multiprocess, entry


def _threads() -> int:
    """How many threads this process runs (the kernel's count on Linux: BLAS's too)."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        import threading

        return threading.active_count()


@contextmanager
def _one_blas_thread() -> Iterator[None]:
    """``OPENBLAS_NUM_THREADS=1`` inside, unless the operator set any BLAS variable."""
    if any(os.environ.get(name) for name in BLAS_THREAD_VARIABLES):
        yield
        return
    os.environ["OPENBLAS_NUM_THREADS"] = "1"
    try:
        yield
    finally:
        os.environ.pop("OPENBLAS_NUM_THREADS", None)


def preload() -> None:
    """Import :data:`WEB_MODULES` with the collector paused, then freeze what they built."""
    from app.bootstrap import collector_paused

    with _one_blas_thread(), collector_paused():
        for name in WEB_MODULES:
            with suppress(ImportError):
                importlib.import_module(name)
    gc.freeze()


class ForkedWorker(ForkProcess):
    """One uvicorn worker, forked: handlers put back and signals unblocked before it runs."""

    def __init__(self, handlers: dict[int, Any], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._handlers = handlers
        self._mask: set[Any] = set()

    def start(self) -> None:
        """Fork with the signals whose handlers differ from the child's to-be blocked."""
        changed = [s for s, h in self._handlers.items() if signal.getsignal(s) is not h]
        self._mask = signal.pthread_sigmask(signal.SIG_BLOCK, changed)
        try:
            super().start()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, self._mask)

    def run(self) -> None:
        """In the child: the handlers before uvicorn's, the mask unblocked, then the worker."""
        for signum, handler in self._handlers.items():
            if signal.getsignal(signum) is not handler:
                signal.signal(signum, signal.SIG_DFL if handler is None else handler)
        signal.pthread_sigmask(signal.SIG_SETMASK, self._mask)
        get_settings.cache_clear()
        super().run()


def handlers_now() -> dict[int, Any]:
    """Every catchable signal's handler now (None where not set from Python: the default)."""
    found = {}
    for signum in signal.valid_signals():
        if signum in (signal.SIGKILL, signal.SIGSTOP):
            continue
        try:
            found[int(signum)] = signal.getsignal(signum)
        except (OSError, ValueError):
            continue
    return found


@contextmanager
def forked_workers(workers: int) -> Iterator[bool]:
    """Inside, uvicorn's supervisor forks its workers from this process, which imports the app.

    Yields whether it does (False: ``workers`` < 2, or the workers spawned as before). Enter
    it where ``PROMETHEUS_MULTIPROC_DIR`` is set (the imports create the metrics) and before
    ``uvicorn.run``, whose supervisor installs its signal handlers.
    """
    if workers < 2:
        yield False
        return
    seam = uvicorn_seam()
    if seam is None or not sys.platform.startswith("linux"):
        why = (
            "this uvicorn's supervisor is not the one gatekeeper forks workers for"
            if seam is None
            else "gatekeeper forks workers on Linux only"
        )
        print(f"gatekeeper: workers spawned ({why})", file=sys.stderr)
        yield False
        return
    preload()
    forget_this_process()
    threads = _threads()
    if threads > 1:
        print(
            f"gatekeeper: workers spawned ({threads} threads after the app's imports: "
            "forking is only safe from one)",
            file=sys.stderr,
        )
        yield False
        return
    # multiprocessing's resource tracker, started by a spawning parent at its first worker: the
    # workers share this one (a forked worker would otherwise start its own at its first pool)
    resource_tracker.ensure_running()
    multiprocess, entry = seam
    handlers = handlers_now()

    def get_subprocess(config: Any, target: Callable[..., None], sockets: list[Any]) -> Any:
        kwargs = {"config": config, "target": target, "sockets": sockets, "stdin_fileno": None}
        return ForkedWorker(handlers, target=entry, kwargs=kwargs)

    spawning = multiprocess.get_subprocess
    multiprocess.get_subprocess = get_subprocess  # type: ignore[attr-defined]
    print(
        "gatekeeper: workers forked from this process (the app's modules imported once)",
        file=sys.stderr,
    )
    try:
        yield True
    finally:
        multiprocess.get_subprocess = spawning  # type: ignore[attr-defined]
