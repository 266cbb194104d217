"""Run bound computations in a process pool, with a time limit and a sound fallback.

Each call runs :func:`app.engine.calculator.compute_loss` in a worker process with the search's
own time limit (``options.time_limit``, default :attr:`WorkerSettings.time_limit`), so a hard
history comes back with ``"status": "limit"`` and sound bounds. As a safety net the caller also
stops waiting after ``time_limit * 4 + grace`` seconds; it then answers with basic composition
— ``0 <= loss <= Σ ε`` (Lemma 6.1), the fallback of last resort — computed in the calling process,
and logs the event. Only complete (non-fallback) answers are cached.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import copy
import logging
import multiprocessing
import os
import select
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from fractions import Fraction
from pathlib import Path
from typing import Any, TypeVar

from app.engine.approx import NEEDS_FINITE_DOMAIN, parse_delta_value
from app.engine.calculator import compute_loss
from app.engine.continuous.branch_and_bound import BnBSettings
from app.engine.domain import parse_domain
from app.engine.errors import InvalidInput
from app.engine.filters import Decision, FilterKind
from app.engine.jsonfields import as_object, as_positive_number
from app.engine.likelihood import LossBounds
from app.engine.mechanisms import Mechanism, parse_query
from app.engine.pipeline import (
    BasicState,
    ObjectSnapshot,
    candidate_bounds,
    decisions_by_filter,
    evaluate,
    history_account,
    parse_history,
    realized_loss,
)
from app.metrics import BOUND_CACHE, BOUND_FALLBACKS, BOUND_SECONDS
from app.worker.cache import LRUCache, ResultCache
from app.worker.keys import request_key
from app.worker.threads import single_threaded_blas
from app.worker.wire import (
    bounds_from_json,
    decision_from_json,
    evaluate_request,
    realized_loss_request,
    run_call,
    with_bnb,
)

log = logging.getLogger(__name__)

#: Time of the computations this worker runs (cache misses, fallbacks included).
_CALCULATOR_SECONDS = BOUND_SECONDS.labels("calculator")

R = TypeVar("R")


@dataclass(frozen=True)
class WorkerSettings:
    """Settings of the bound worker.

    Attributes
    ----------
    processes:
        Worker processes (0 computes in the calling thread: for tests and the CLI).
    time_limit:
        Seconds a single search may take before answering with ``"status": "limit"``.
    grace:
        Extra seconds of the safety net beyond ``4 * time_limit``.
    cache_entries:
        Entries of the default in-process LRU cache.
    """

    processes: int = 1
    time_limit: float = BnBSettings.time_limit
    grace: float = 5.0
    cache_entries: int = 4096


def with_time_limit(request: dict[str, Any], time_limit: float) -> dict[str, Any]:
    """``request`` whose searches take at most ``time_limit`` unless its options say less."""
    raw = request.get("options", {})
    if not isinstance(raw, dict):
        return request  # the calculator rejects it, naming "options"
    options = dict(raw)
    options.setdefault("time_limit", time_limit)
    return {**request, "options": options}


#: Seconds between a pool process's checks that the process that started it is still alive.
PARENT_CHECK_PERIOD = 0.5


def init_pool_process(parent: int, *, forked_by_server: bool = False) -> None:
    """Pool-process initializer: one BLAS thread, and exit when ``parent`` is gone.

    ``parent`` started this process (``spawn``), or, with ``forked_by_server``, started the
    forkserver that forked it (:func:`_exit_with_grandparent`).
    """
    single_threaded_blas()
    if forked_by_server:
        _exit_with_grandparent(parent)
    else:
        _exit_with_parent(parent)


def _exit_with_parent(parent: int) -> None:
    """Exit this pool process as soon as ``parent`` (the web worker) is gone.

    A pool process otherwise outlives a web worker that exits while a computation runs, or that
    is killed: it blocks on its task queue forever, holding memory and the multiprocessing
    resource tracker (seen after every multi-worker benchmark and test server). A daemon thread
    compares ``os.getppid()`` with ``parent`` (a dead parent's children are re-parented).
    """

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_CHECK_PERIOD)
        os._exit(0)

    threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()


def _exit_with_grandparent(web: int) -> None:
    """Exit this process, forked by a forkserver that ``web`` started, as soon as ``web`` is gone.

    Watching the parent would not do: the forkserver exits only when every holder of its "alive"
    pipe is gone, and its children hold it too (``multiprocessing.forkserver``), so children
    waiting for it would wait forever after a ``kill -9`` of ``web``. A daemon thread waits on a
    pidfd of ``web`` (readable once it exited, reaped or not); the pidfd is opened first, then
    the forkserver's parent read from ``/proc`` must still be ``web`` (had ``web`` exited before,
    the forkserver would have been re-parented and ``web``'s pid could name another process).
    Without pidfds (not Linux): ``os.kill(web, 0)`` every :data:`PARENT_CHECK_PERIOD`.
    """
    try:
        pidfd = os.pidfd_open(web)
    except ProcessLookupError:
        os._exit(0)
    except (AttributeError, OSError):  # no pidfd_open here (not Linux, or a kernel before 5.3)
        pidfd = None
    if _parent_of(os.getppid()) not in (web, None):
        os._exit(0)  # web exited before the pidfd was opened: the pid may be another's now

    def watch() -> None:
        if pidfd is not None:
            select.select([pidfd], [], [])
        else:
            while True:
                try:
                    os.kill(web, 0)
                except ProcessLookupError:
                    break
                except PermissionError:
                    pass
                time.sleep(PARENT_CHECK_PERIOD)
        os._exit(0)

    threading.Thread(target=watch, name="exit-with-web-process", daemon=True).start()


def _parent_of(pid: int) -> int | None:
    """Process ``pid``'s parent from ``/proc`` (None where there is no ``/proc``)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(encoding="ascii")
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[1])


def run_calculator(request: dict[str, Any], stop_at: float | None = None) -> dict[str, Any]:
    """Worker-process entry point: the calculator, every search ending by ``stop_at``."""
    return compute_loss(request, stop_at=stop_at)


def basic_fallback(request: dict[str, Any]) -> dict[str, Any]:
    """The calculator's answer from basic composition alone (always sound, never tight).

    The same pipeline as every decision, on a snapshot that knows the history only by its
    ``Σ ε_i`` (:class:`~app.engine.pipeline.BasicState`: loss in ``[0, Σ ε_i]``, Lemma 6.1).
    """
    obj = as_object(request, "")
    domain = parse_domain(obj["domain"], "domain")
    entries = parse_history(domain, obj["history"])
    total = sum((e.mechanism.epsilon_exact for e in entries), Fraction(0))
    budget = None
    if "candidate" in obj:
        if "budget" not in obj:
            raise InvalidInput("budget", "is required when a candidate is given")
        budget = as_positive_number(obj["budget"], "budget")
    delta = parse_delta_value(obj["delta"], "delta") if "delta" in obj else None
    if delta is not None and not domain.is_finite:
        raise InvalidInput("delta", NEEDS_FINITE_DOMAIN)
    kind = FilterKind.BAYESIAN if delta is None else FilterKind.APPROX_BAYESIAN
    snapshot = ObjectSnapshot(
        domain,
        budget or 1.0,
        kind,
        total,
        BasicState(),
        delta=delta,
        f0_account=history_account(entries, budget or 1.0, delta, domain),
    )
    answer: dict[str, Any] = {
        "realized_loss": snapshot.loss().to_json(),
        "basic_composition": float(total),
        "status": "limit",
    }
    if "candidate" in obj:
        mech = parse_query(obj["candidate"], domain, "candidate")
        evaluation = candidate_bounds(snapshot, mech)
        answer["candidate"] = {
            **evaluation.to_json(),
            "accepted": decisions_by_filter(snapshot, evaluation),
        }
    return answer


class BoundWorker:
    """Computes calculator answers off the caller's thread, cached by canonical request key."""

    def __init__(
        self, settings: WorkerSettings | None = None, cache: ResultCache | None = None
    ) -> None:
        self.settings = settings or WorkerSettings()
        self.cache: ResultCache = (
            cache if cache is not None else LRUCache(self.settings.cache_entries)
        )
        self._pool: concurrent.futures.ProcessPoolExecutor | None = None
        if self.settings.processes > 0:
            self._pool = concurrent.futures.ProcessPoolExecutor(
                max_workers=self.settings.processes,
                mp_context=multiprocessing.get_context("spawn"),
                initializer=init_pool_process,
                initargs=(os.getpid(),),
            )
        self.fallbacks = 0

    @property
    def deadline(self) -> float:
        """Seconds the caller waits before falling back to basic composition."""
        return 4.0 * self.settings.time_limit + self.settings.grace

    def compute(self, request: dict[str, Any]) -> dict[str, Any]:
        """The calculator's answer for ``request`` (blocking).

        Raises ``InvalidInput``/``Unsupported`` for bad requests, like the calculator.
        """
        key = request_key(request)
        cached = self.cache.get(key)
        BOUND_CACHE.labels("hit" if cached is not None else "miss").inc()
        if cached is not None:
            return copy.deepcopy(cached)
        job = with_time_limit(request, self.settings.time_limit)
        answer: dict[str, Any] | None
        with _CALCULATOR_SECONDS.time():
            if self._pool is None:
                answer = run_calculator(job)
            else:
                # the search ends when its caller stops waiting (a still-queued one is dropped)
                answer = self._wait(
                    self._pool.submit(run_calculator, job, time.time() + self.deadline)
                )
        if answer is None:
            return self._fallback(request)
        self.cache.set(key, answer)
        return copy.deepcopy(answer)

    def evaluate(
        self, snapshot: ObjectSnapshot, mechanism: Mechanism, *, fallback: Callable[[], Decision]
    ) -> Decision:
        """``evaluate(snapshot, mechanism, tight=True)`` in a worker process (blocking)."""
        if self._pool is None:
            with _CALCULATOR_SECONDS.time():
                return evaluate(snapshot.with_bnb(self._bnb(snapshot)), mechanism, tight=True)
        answer = self._engine_call(evaluate_request(snapshot, mechanism))
        return fallback() if answer is None else decision_from_json(answer["decision"])

    def realized_loss(
        self, snapshot: ObjectSnapshot, *, fallback: Callable[[], LossBounds]
    ) -> LossBounds:
        """``realized_loss(snapshot)`` (searches a continuous history) in a worker process."""
        if self._pool is None:
            with _CALCULATOR_SECONDS.time():
                return realized_loss(snapshot.with_bnb(self._bnb(snapshot)))
        answer = self._engine_call(realized_loss_request(snapshot))
        return fallback() if answer is None else bounds_from_json(answer["bounds"])

    def _bnb(self, snapshot: ObjectSnapshot) -> BnBSettings:
        """The snapshot's search settings with this worker's time limit."""
        return replace(snapshot.bnb, time_limit=self.settings.time_limit)

    def _engine_call(self, request: dict[str, Any]) -> dict[str, Any] | None:
        """A call request (:mod:`app.worker.wire`) answered by a pool process, or None.

        None past the deadline (logged and counted; the caller answers with its ``fallback``).

        The request and the answer are plain data, like a Celery task's. Not cached: callers
        cache snapshots by object version.
        """
        assert self._pool is not None  # noqa: S101 - the callers compute in-thread otherwise
        job = with_bnb(
            request, time_limit=self.settings.time_limit, stop_at=time.time() + self.deadline
        )
        with _CALCULATOR_SECONDS.time():
            answer = self._wait(self._pool.submit(run_call, job))
        if answer is None:
            self._count_fallback()
        return answer

    def _wait(self, future: concurrent.futures.Future[R]) -> R | None:
        """The job's result, or None once the deadline passed (a still-queued job is dropped)."""
        try:
            return future.result(timeout=self.deadline)
        except concurrent.futures.TimeoutError:
            future.cancel()  # still queued: nobody waits for it any more
            return None

    async def compute_async(self, request: dict[str, Any]) -> dict[str, Any]:
        """:meth:`compute` without blocking the event loop."""
        key = await asyncio.to_thread(request_key, request)
        cached = self.cache.get(key)
        BOUND_CACHE.labels("hit" if cached is not None else "miss").inc()
        if cached is not None:
            return copy.deepcopy(cached)
        job = with_time_limit(request, self.settings.time_limit)
        answer: dict[str, Any] | None
        with _CALCULATOR_SECONDS.time():
            if self._pool is None:
                answer = await asyncio.to_thread(run_calculator, job)
            else:
                pending = self._pool.submit(run_calculator, job, time.time() + self.deadline)
                try:
                    answer = await asyncio.wait_for(
                        asyncio.wrap_future(pending), timeout=self.deadline
                    )
                except TimeoutError:
                    pending.cancel()  # still queued: nobody waits for it any more
                    answer = None
        if answer is None:
            return self._fallback(request)
        self.cache.set(key, answer)
        return copy.deepcopy(answer)

    def _count_fallback(self) -> None:
        self.fallbacks += 1
        BOUND_FALLBACKS.inc()
        log.warning(
            "bound computation exceeded %.1f s; answering with basic composition", self.deadline
        )

    def _fallback(self, request: dict[str, Any]) -> dict[str, Any]:
        self._count_fallback()
        return basic_fallback(request)

    def close(self) -> None:
        """Stop the worker processes (running computations are cancelled)."""
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None

    def __enter__(self) -> BoundWorker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
