"""``in_thread``: the request's hand-off to the runtime's threads, as ``run_in_executor`` does it.

``app.api.deps.in_thread`` settles the awaited future from the worker thread instead of chaining
an executor future to it (``loop.run_in_executor``); every outcome must be the same: the result,
the exception (the same object), the caller's context, a cancelled call that had not started
never running, a started one running to its end. Each case runs both ways, on asyncio's loop
and on uvloop (the server's).
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import threading
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from app.api.deps import in_thread

_seen: contextvars.ContextVar[str] = contextvars.ContextVar("seen", default="none")


class _Runtime:
    def __init__(self, threads: ThreadPoolExecutor) -> None:
        self.threads = threads


async def _by_executor(runtime: Any, func: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """The definition: what ``in_thread`` did with ``run_in_executor``."""
    loop = asyncio.get_running_loop()
    call = functools.partial(contextvars.copy_context().run, func, *args, **kwargs)
    return await loop.run_in_executor(runtime.threads, call)


WAYS = {"in_thread": in_thread, "run_in_executor": _by_executor}


@pytest.fixture(params=["asyncio", "uvloop"])
def run(request: pytest.FixtureRequest) -> Iterator[Callable[[Awaitable[Any]], Any]]:
    if request.param == "uvloop":
        uvloop = pytest.importorskip("uvloop")

        def go(coro: Awaitable[Any]) -> Any:
            return uvloop.run(coro)

        yield go
    else:
        yield asyncio.run


@pytest.fixture
def runtime() -> Iterator[_Runtime]:
    threads = ThreadPoolExecutor(1, thread_name_prefix="test-request")
    yield _Runtime(threads)
    threads.shutdown(wait=True)


def _outcome(run: Callable[[Awaitable[Any]], Any], coro: Awaitable[Any]) -> tuple[str, Any]:
    try:
        return "result", run(coro)
    except BaseException as exc:  # the outcome is what is compared
        return "raised", exc


@pytest.mark.parametrize("way", list(WAYS))
def test_results_arguments_and_context_as_run_in_executor(
    way: str, run: Callable[[Awaitable[Any]], Any], runtime: _Runtime
) -> None:
    def work(a: int, *, b: int) -> tuple[int, str, str]:
        return a + b, _seen.get(), threading.current_thread().name

    async def main() -> Any:
        _seen.set("the request's")
        return await WAYS[way](runtime, work, 2, b=3)

    total, seen, thread = run(main())
    assert (total, seen) == (5, "the request's")
    assert thread.startswith("test-request")


@pytest.mark.parametrize("kind", [ValueError, KeyboardInterrupt])
def test_an_exception_is_the_same_object_both_ways(
    kind: type[BaseException], run: Callable[[Awaitable[Any]], Any], runtime: _Runtime
) -> None:
    raised = {}
    for name, way in WAYS.items():

        def fail(name: str = name) -> None:
            raised[name] = kind(name)
            raise raised[name]

        outcome = _outcome(run, way(runtime, fail))
        assert outcome == ("raised", raised[name])


@pytest.mark.parametrize("way", list(WAYS))
def test_a_cancelled_call_that_had_not_started_never_runs(
    way: str, run: Callable[[Awaitable[Any]], Any], runtime: _Runtime
) -> None:
    """The one thread is busy; the second call waits in the queue, is cancelled, and never
    runs; the first runs to its end although its await was cancelled too."""
    release = threading.Event()
    ran: list[str] = []

    def first() -> None:
        release.wait(5)
        ran.append("first")

    def second() -> None:
        ran.append("second")

    async def main() -> None:
        one = asyncio.ensure_future(WAYS[way](runtime, first))
        two = asyncio.ensure_future(WAYS[way](runtime, second))
        await asyncio.sleep(0.05)
        one.cancel()
        two.cancel()
        for task in (one, two):
            with pytest.raises(asyncio.CancelledError):
                await task
        release.set()

    run(main())
    runtime.threads.shutdown(wait=True)
    assert ran == ["first"]
