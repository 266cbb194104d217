"""app.worker.periodic: a task on a timer, going on after a failure, stopping when closed."""

from __future__ import annotations

import threading
import time

import pytest

from app.worker.periodic import Periodic


def test_the_task_runs_again_after_a_failure_and_stops_when_closed() -> None:
    calls: list[float] = []
    third = threading.Event()

    def task() -> None:
        calls.append(time.monotonic())
        if len(calls) >= 3:
            third.set()
        if len(calls) == 1:
            raise RuntimeError("the database is away")

    started = time.monotonic()
    periodic = Periodic(name="test-periodic", task=task, seconds=0.05)
    assert third.wait(10), calls
    periodic.close()
    # each wait is between half and all of the interval: never before half of it
    assert calls[0] - started >= 0.025
    time.sleep(0.2)
    stopped = len(calls)
    time.sleep(0.2)
    assert len(calls) == stopped


def test_an_interval_must_be_positive() -> None:
    with pytest.raises(ValueError, match="positive interval"):
        Periodic(name="never", task=lambda: None, seconds=0)
