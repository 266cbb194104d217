"""Child processes deciding a web process's bulk work beside it: a survey's chunks.

The embedded runner (:class:`app.worker.jobs.InProcessJobs`) runs a survey in one thread of the
web process; its chunks are CPU-bound Python, so threads of that one process share one core (the
GIL). A :class:`ChildPool` hands each call to one of ``processes`` child processes instead:

* started on the first call, not before: a web process that never runs a survey (``make run``,
  every test server) pays nothing for them;
* ``spawn``, never ``fork``: the web process has threads (a forked child would inherit their
  locks held). Each child is set up once by the ``initializer`` it is given (plain data: a
  child builds its own database engine), runs one BLAS thread and exits when its parent is gone
  (:func:`app.worker.pool.init_pool_process`, as the bound worker's pool);
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
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from app.worker.pool import init_pool_process

R = TypeVar("R")


def _init_child(parent: int, initializer: Callable[..., None], initargs: tuple[Any, ...]) -> None:
    """A child's start: one BLAS thread, exit with ``parent``, then the caller's set-up."""
    init_pool_process(parent)
    initializer(*initargs)


class ChildPool(Generic[R]):
    """``processes`` spawned child processes calling ``target``, started on the first call.

    ``target`` and ``initializer`` must be module-level functions (a child imports them by
    name); their arguments and results plain data.
    """

    def __init__(
        self,
        *,
        processes: int,
        target: Callable[..., R],
        initializer: Callable[..., None],
        initargs: tuple[Any, ...] = (),
    ) -> None:
        if processes < 1:
            raise ValueError("a child pool needs at least one process")
        self.processes = processes
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
                    mp_context=multiprocessing.get_context("spawn"),
                    initializer=_init_child,
                    initargs=(os.getpid(), self._initializer, self._initargs),
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
