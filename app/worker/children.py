"""Child processes deciding a web process's bulk work beside it: a survey's chunks.

The embedded runner (:class:`app.worker.jobs.InProcessJobs`) runs a survey in one thread of the
web process; its chunks are CPU-bound Python, so threads of that one process share one core (the
GIL). A :class:`ChildPool` hands each call to one of ``processes`` child processes instead:

* started on the first call, not before: a web process that never runs a survey (``make run``,
  every test server) pays nothing for them;
* never ``fork`` from the web process: it has threads (a forked child would inherit their locks
  held). Where the platform has one (Linux, macOS), from a *forkserver*: a single-threaded
  process started by the web process with the first pool's first child, which imports the
  modules the pools ``preload`` once, then forks each child (two children replacing killed
  ones answered in 0.16-0.24 s instead of 4.1-5.4 s spawned, docs/benchmarks.md).
  Elsewhere ``spawn`` (:data:`START_METHOD`). Each child is set up once by the ``initializer`` it
  is given (plain data: a child builds its own database engine), runs one BLAS thread and exits
  when the web process is gone, a ``kill -9`` included (:func:`app.worker.pool.init_pool_process`:
  a forkserver's child watches the web process, not its parent); the forkserver then exits
  too (its "alive" pipe is held by the web process and the children alone);
* the forkserver is one per process, shared by every pool of the process, and keeps the list
  of modules it was started with: each pool's ``preload`` is added to that list when the pool
  is built, so pools built before the first child starts are all preloaded; a pool built later
  with modules the running forkserver lacks still works, its children importing those modules
  themselves at their start (as a spawned child does). The preloaded modules must open no
  connection and start no thread when imported (they would be the forkserver's, and forked;
  numpy's OpenBLAS starts its threads when loaded but stops them before every fork, with a
  ``pthread_atfork`` handler: the forkserver forks from one thread);
* a child that dies (killed, out of memory) breaks the pool — ``concurrent.futures`` then fails
  every call in flight with ``BrokenProcessPool`` and stops the other children: the caller
  knows which calls to make again and calls :meth:`ChildPool.restart`;
* :meth:`ChildPool.close` stops the children and waits for them (a running call is dropped: a
  chunk's transaction is rolled back by the database when its connection goes).

This module knows nothing of surveys: the composition root (:mod:`app.bootstrap`) gives the
target and the initializer.
"""

from __future__ import annotations

import concurrent.futures
import multiprocessing
import os
import threading
import time
from collections.abc import Callable, Sequence
from multiprocessing.context import BaseContext
from typing import Any, Generic, TypeVar

from app.worker.pool import init_pool_process

R = TypeVar("R")


#: How children start: ``forkserver`` where the platform has it, else ``spawn``.
START_METHOD = "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"

#: The modules the forkserver imports when it starts: every pool's ``preload``, in order.
_PRELOAD: list[str] = []
_PRELOAD_GUARD = threading.Lock()


def _want_preloaded(modules: Sequence[str]) -> None:
    """Add ``modules`` to the forkserver's list (taken when it starts: see the module's doc)."""
    with _PRELOAD_GUARD:
        _PRELOAD.extend(m for m in dict.fromkeys(modules) if m not in _PRELOAD)


def _context(start_method: str) -> BaseContext:
    context = multiprocessing.get_context(start_method)
    if start_method == "forkserver":
        with _PRELOAD_GUARD:
            # the process's one forkserver reads its list when it starts (or starts again)
            context.set_forkserver_preload(list(_PRELOAD))
    return context


def _init_child(
    parent: int, forked_by_server: bool, initializer: Callable[..., None], initargs: tuple[Any, ...]
) -> None:
    """A child's start: one BLAS thread, exit with ``parent``, then the caller's set-up."""
    init_pool_process(parent, forked_by_server=forked_by_server)
    initializer(*initargs)


class ChildPool(Generic[R]):
    """``processes`` child processes calling ``target``, started on the first call.

    ``target`` and ``initializer`` must be module-level functions (a child imports them by
    name); their arguments and results plain data. ``preload``: the modules a child imports
    (the target's, the initializer's and what it imports), imported once by the forkserver
    instead of by every child; none of them may open a connection or start a thread when
    imported. ``start_method``: :data:`START_METHOD` unless given (``spawn`` for a comparison).
    """

    def __init__(
        self,
        *,
        processes: int,
        target: Callable[..., R],
        initializer: Callable[..., None],
        initargs: tuple[Any, ...] = (),
        preload: Sequence[str] = (),
        start_method: str | None = None,
    ) -> None:
        if processes < 1:
            raise ValueError("a child pool needs at least one process")
        self.processes = processes
        self.start_method = start_method or START_METHOD
        if self.start_method not in ("forkserver", "spawn"):
            raise ValueError("children start from a forkserver or are spawned, never forked")
        self.preload = tuple(preload)
        if self.start_method == "forkserver":
            _want_preloaded(self.preload)
        self._target = target
        self._initializer = initializer
        self._initargs = initargs
        self._pool: concurrent.futures.ProcessPoolExecutor | None = None
        self._closed = False
        self._guard = threading.Lock()

    def submit(self, *args: Any) -> concurrent.futures.Future[R]:
        """``target(*args)`` in a child; raises ``BrokenProcessPool`` once a child died."""
        with self._guard:
            if self._closed:
                raise RuntimeError("the child processes are closed")
            if self._pool is None:
                self._pool = concurrent.futures.ProcessPoolExecutor(
                    max_workers=self.processes,
                    mp_context=_context(self.start_method),
                    initializer=_init_child,
                    initargs=(
                        os.getpid(),
                        self.start_method == "forkserver",
                        self._initializer,
                        self._initargs,
                    ),
                )
            return self._pool.submit(self._target, *args)

    def restart(self) -> None:
        """Drop the children (a broken pool's, or live ones): the next call starts new ones."""
        with self._guard:
            pool, self._pool = self._pool, None
        if pool is not None:
            _stop(pool)

    def pids(self) -> list[int]:
        """The children's process ids (none before the first call)."""
        with self._guard:
            return [] if self._pool is None else list(_processes(self._pool))

    def close(self) -> None:
        """Stop the children and wait for them to exit; later calls are refused."""
        with self._guard:
            self._closed = True
            pool, self._pool = self._pool, None
        if pool is not None:
            _stop(pool)


#: Seconds a child is given to exit after its pool's shutdown before it is terminated.
STOP_SECONDS = 5.0


def _processes(pool: concurrent.futures.ProcessPoolExecutor) -> dict[int, Any]:
    # the executor keeps its processes by pid; it has no public accessor
    return dict(pool._processes or {})


def _stop(pool: concurrent.futures.ProcessPoolExecutor) -> None:
    """Shut ``pool`` down and make sure its processes are gone (terminated if they linger)."""
    processes = list(_processes(pool).values())
    pool.shutdown(wait=False, cancel_futures=True)
    deadline = time.monotonic() + STOP_SECONDS
    for process in processes:
        process.join(max(0.0, deadline - time.monotonic()))
    for process in processes:
        if process.is_alive():  # still in a long call: its transaction is rolled back
            process.terminate()
            process.join(STOP_SECONDS)
