"""Settings every test process shares.

Private values are encrypted at rest (:mod:`app.crypto`). Every in-process app and every
``gatekeeper`` subprocess of the suite reads the same key from ``GATEKEEPER_ENCRYPTION_KEYS`` —
set here, before anything reads the settings — so processes sharing a database can read each
other's rows and no key file is written into the checkout. ``tests/service/test_encryption.py``
covers the key file of the embedded default separately.
"""

from __future__ import annotations

import os
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
    """
    slow = [item for item in items if item.get_closest_marker("slow") is not None]
    fast = [item for item in items if item.get_closest_marker("slow") is None]
    items[:] = dealt(slow, fast, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 2))


def dealt(slow: list[T], fast: list[T], processes: int) -> list[T]:
    """``slow`` dealt in turn to ``processes`` contiguous shares, each share starting with its
    slow items and filled up with fast ones (the rest of them at the end). The shares' lengths
    are worksteal's first split: ``pending // remaining`` processes, in turn."""
    out: list[T] = []
    pending, taken, end = len(slow) + len(fast), 0, 0
    for k in range(processes):
        size = pending // (processes - k)
        pending -= size
        end += size
        share = slow[k::processes]
        fill = max(0, end - len(out) - len(share))
        out += share + fast[taken : taken + fill]
        taken += fill
    return out + fast[taken:]
