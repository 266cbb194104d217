"""The requests' threads (app.api.deps.RequestThreads): results, errors, context, bounds, cancel."""

from __future__ import annotations

import asyncio
import contextvars
import functools
import threading
import time

import pytest

from app.api.deps import RequestThreads

marker: contextvars.ContextVar[str] = contextvars.ContextVar("marker", default="none")


def test_results_errors_and_the_callers_context() -> None:
    threads = RequestThreads(2)

    async def main() -> None:
        assert await threads.run(lambda: 6 * 7) == 42
        with pytest.raises(ZeroDivisionError):
            await threads.run(lambda: 1 / 0)
        marker.set("request-7")
        seen = await threads.run(functools.partial(contextvars.copy_context().run, marker.get))
        assert seen == "request-7"
        assert await threads.run(threading.current_thread) is not threading.current_thread()

    asyncio.run(main())
    threads.shutdown()


def test_at_most_size_calls_at_once_and_a_cancelled_waiting_call_never_runs() -> None:
    threads = RequestThreads(2)
    running = 0
    most = 0
    guard = threading.Lock()
    ran: list[int] = []

    def work(n: int) -> int:
        nonlocal running, most
        with guard:
            running += 1
            most = max(most, running)
        time.sleep(0.05)
        with guard:
            running -= 1
        ran.append(n)
        return n

    async def main() -> None:
        calls = [threads.run(lambda n=n: work(n)) for n in range(6)]
        late = threads.run(lambda: work(99))  # queued behind six calls of 50 ms on 2 threads
        late.cancel()
        assert sorted(await asyncio.gather(*calls)) == list(range(6))
        await asyncio.sleep(0.1)

    asyncio.run(main())
    threads.shutdown()
    assert most == 2
    assert 99 not in ran
