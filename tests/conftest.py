"""Settings every test process shares.

Private values are encrypted at rest (:mod:`app.crypto`). Every in-process app and every
``gatekeeper`` subprocess of the suite reads the same key from ``GATEKEEPER_ENCRYPTION_KEYS`` —
set here, before anything reads the settings — so processes sharing a database can read each
other's rows and no key file is written into the checkout. ``tests/service/test_encryption.py``
covers the key file of the embedded default separately.
"""

from __future__ import annotations

import gc
import os
from collections.abc import Callable, Hashable
from typing import TypeVar

import pytest

from app import crypto
from tests import cpu_map

T = TypeVar("T")
TEST_ENCRYPTION_KEY = os.environ.setdefault("GATEKEEPER_ENCRYPTION_KEYS", crypto.new_key())
crypto.configure(crypto.cipher_from_settings(TEST_ENCRYPTION_KEY, "", production=False))


def pytest_configure(config: pytest.Config) -> None:
    # opt-in: GATEKEEPER_TEST_CPU=path.jsonl records each test's CPU (tests/cpu_map.py)
    cpu_map.register(config)


#: Container allocations (net of frees) between two youngest-generation collections of a test
#: process (Python's default is 700; a serving process's, ``app.bootstrap.COLLECT_EVERY``, is
#: 50,000: measured on the fuzz tests, 50,000 saved 8 % of the collector's time, 10,000 54 %).
TEST_COLLECT_EVERY = 10_000


def pytest_collection_finish(session: pytest.Session) -> None:
    """The test process's cyclic garbage collector: what collection built (the modules, the
    test items, hypothesis's strategies) frozen, and a youngest pass every
    :data:`TEST_COLLECT_EVERY` allocations.

    With Python's default thresholds the collector took 10–13 % of the CPU of the schemathesis,
    stateful, contract and theory tests, much of it passes over what collection left and over
    the cycles each generated case keeps alive while it runs (docs/benchmarks.md, "Nineteenth
    session, the lead's runs"). Every reference cycle is still collected; no test's check
    depends on when.
    """
    gc.freeze()
    gc.set_threshold(TEST_COLLECT_EVERY, *gc.get_threshold()[1:])


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Long tests first in *each* share, so the test processes finish together.

    The suite is mostly fast tables plus a few tests of minutes (SIGKILL scenarios, schemathesis,
    the browser, statistical checks), all marked ``slow``. pytest-xdist's ``worksteal`` gives
    each of the two processes a contiguous half of this list (the first ``N // 2`` items, then
    the rest) and an idle process steals from the *end* of the other's queue. Sorting the slow
    tests to the front put them all in the first half: one process ran every long test while
    the other finished the fast ones and then stole the service tests queued last. So the slow
    tests are dealt alternately to the two halves, each half starting with its share and filled
    with fast tests; with ``-n N`` (``PYTEST_XDIST_WORKER_COUNT``) worksteal's first split is
    into N contiguous shares, and the slow tests are dealt to N. Stable: within each group the
    collection order stays. Without xdist the order is simply slow, fast, slow, fast.

    Slow tests marked ``shared_fixtures`` that share a module's fixture (with the same
    parameter, such as a lock mode) are dealt together, to one share: dealt one by one, each
    process that ran one of them set the fixture up again (``test_concurrency.py``: a 4-worker
    ``gatekeeper serve`` per lock mode in each of the three processes, six starts for two).
    """
    slow = [item for item in items if item.get_closest_marker("slow") is not None]
    fast = [item for item in items if item.get_closest_marker("slow") is None]
    processes = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 2)
    items[:] = dealt(slow, fast, processes, group=fixture_group)


def fixture_group(item: pytest.Item) -> Hashable | None:
    """The slow tests dealt together with ``item``: its module and the parameters of its
    fixtures wider than a function (a module's server per lock mode), when it is marked
    ``shared_fixtures``; ``None`` (dealt alone) otherwise."""
    if item.get_closest_marker("shared_fixtures") is None:
        return None
    params: tuple[tuple[str, int], ...] = ()
    callspec = getattr(item, "callspec", None)
    if callspec is not None:
        definitions = item._fixtureinfo.name2fixturedefs  # type: ignore[attr-defined]
        params = tuple(
            sorted(
                (name, callspec.indices[name])
                for name in callspec.params
                if name in definitions and definitions[name][-1].scope != "function"
            )
        )
    return (item.nodeid.split("::", 1)[0], params)


def dealt(
    slow: list[T],
    fast: list[T],
    processes: int,
    group: Callable[[T], Hashable | None] = lambda _: None,
) -> list[T]:
    """``slow`` dealt in turn to ``processes`` contiguous shares, each share starting with its
    slow items and filled up with fast ones (the rest of them at the end). The shares' lengths
    are worksteal's first split: ``pending // remaining`` processes, in turn.

    Slow items with the same ``group`` (not ``None``) are dealt as one, in their order: each
    group, or lone item, in turn goes to the share with the fewest slow items so far (the first
    of them on a tie), which for lone items is dealing in turn."""
    groups: dict[object, list[T]] = {}
    for index, item in enumerate(slow):
        key = group(item)
        groups.setdefault(("lone", index) if key is None else ("group", key), []).append(item)
    shares: list[list[T]] = [[] for _ in range(processes)]
    for members in groups.values():
        min(shares, key=len).extend(members)
    out: list[T] = []
    pending, taken, end = len(slow) + len(fast), 0, 0
    for k in range(processes):
        size = pending // (processes - k)
        pending -= size
        end += size
        share = shares[k]
        fill = max(0, end - len(out) - len(share))
        out += share + fast[taken : taken + fill]
        taken += fill
    return out + fast[taken:]
