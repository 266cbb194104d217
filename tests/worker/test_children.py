"""The child processes of :mod:`app.worker.children`: started on the first call, set up by their
initializer, replaced after one died, gone after close (no database: the pool alone)."""

from __future__ import annotations

import os
import signal
import time
from concurrent.futures.process import BrokenProcessPool

import pytest

from app.worker.children import ChildPool
from tests.processes import alive

GIVEN: str | None = None


def remember(value: str) -> None:
    """The children's initializer here."""
    global GIVEN
    GIVEN = value


def given(pause: float = 0.0) -> tuple[str | None, int]:
    """The children's target here: what the initializer was given, and the child's pid."""
    time.sleep(pause)
    return GIVEN, os.getpid()


def test_children_start_with_the_first_call_and_are_gone_after_close() -> None:
    pool: ChildPool[tuple[str | None, int]] = ChildPool(
        processes=2, target=given, initializer=remember, initargs=("set up",)
    )
    assert pool.pids() == []  # nothing started before a call
    value, pid = pool.submit().result(timeout=120)
    assert value == "set up"
    assert pid != os.getpid()
    assert pid in pool.pids()
    pids = pool.pids()
    assert all(alive(p) for p in pids)
    pool.close()
    assert pool.pids() == []
    assert not any(alive(p) for p in pids)
    with pytest.raises(RuntimeError, match="closed"):
        pool.submit()


def test_a_child_killed_breaks_the_pool_until_restarted() -> None:
    pool: ChildPool[tuple[str | None, int]] = ChildPool(
        processes=1, target=given, initializer=remember, initargs=("again",)
    )
    try:
        _, first = pool.submit().result(timeout=120)
        running = pool.submit(30.0)
        time.sleep(0.5)
        os.kill(first, signal.SIGKILL)
        with pytest.raises(BrokenProcessPool):
            running.result(timeout=60)
        with pytest.raises(BrokenProcessPool):
            pool.submit().result(timeout=60)
        pool.restart()
        value, second = pool.submit().result(timeout=120)
        assert value == "again"  # the new child was set up as the first
        assert second != first
    finally:
        pool.close()
    assert not alive(second)
