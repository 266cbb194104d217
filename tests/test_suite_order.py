"""The order tests/conftest.py gives the suite: the slow tests spread over the xdist shares."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import dealt

ROOT = Path(__file__).resolve().parents[1]


def worksteal_shares(items: list[str], processes: int) -> list[list[str]]:
    """The contiguous shares pytest-xdist's worksteal sends first (``pending // remaining``)."""
    shares, pending = [], list(items)
    for remaining in range(processes, 0, -1):
        count = len(pending) // remaining
        shares.append(pending[:count])
        del pending[:count]
    return shares


@pytest.mark.parametrize("processes", [1, 2, 3, 4])
@pytest.mark.parametrize(("n_slow", "n_fast"), [(0, 10), (7, 100), (30, 1000), (12, 5), (5, 0)])
def test_each_share_starts_with_its_slow_tests(processes: int, n_slow: int, n_fast: int) -> None:
    slow = [f"slow{i}" for i in range(n_slow)]
    fast = [f"fast{i}" for i in range(n_fast)]
    order = dealt(slow, fast, processes)
    assert sorted(order) == sorted(slow + fast)
    # the fast tests keep their order
    assert [t for t in order if t.startswith("fast")] == fast
    if n_fast >= n_slow:  # enough fast tests to fill every share behind its slow ones
        for k, share in enumerate(worksteal_shares(order, processes)):
            mine = slow[k::processes]
            assert share[: len(mine)] == mine, (k, share[:5])
            assert all(t.startswith("fast") for t in share[len(mine) :])


def test_two_processes_keep_the_earlier_order() -> None:
    """``-n 2`` (``make unit``) orders the suite exactly as before ``dealt`` took a count."""
    for n_slow, n_fast in [(0, 10), (7, 100), (30, 1000), (12, 5), (5, 0), (1, 1)]:
        slow = [f"slow{i}" for i in range(n_slow)]
        fast = [f"fast{i}" for i in range(n_fast)]
        first, second = slow[0::2], slow[1::2]
        split = max(0, (n_slow + n_fast) // 2 - len(first))
        assert dealt(slow, fast, 2) == first + fast[:split] + second + fast[split:]


@pytest.mark.parametrize("processes", [2, 3])
def test_a_group_is_dealt_to_one_share_in_its_order(processes: int) -> None:
    """Slow items of one group go together, in their order, to the share with the fewest."""
    slow = ["a0", "g1", "b0", "g2", "c0", "h1", "d0", "h2", "g3", "e0"]
    fast = [f"fast{i}" for i in range(100)]

    def group(item: str) -> str | None:
        return item[0] if item[0] in "gh" else None

    order = dealt(slow, fast, processes, group=group)
    assert sorted(order) == sorted(slow + fast)
    assert [t for t in order if t.startswith("fast")] == fast
    shares = worksteal_shares(order, processes)
    heads = [[t for t in share if not t.startswith("fast")] for share in shares]
    for name in "gh":
        holding = [head for head in heads if any(t[0] == name for t in head)]
        assert len(holding) == 1, (name, heads)
        members = [t for t in holding[0] if t[0] == name]
        assert members == [t for t in slow if t[0] == name]  # together, in their order
    for share, head in zip(shares, heads, strict=True):
        assert share[: len(head)] == head  # each share still starts with its slow items
    # the shares' slow counts stay within the largest group of each other
    counts = sorted(len(head) for head in heads)
    assert counts[-1] - counts[0] <= 3


def test_the_concurrency_servers_start_once_per_lock_mode() -> None:
    """test_concurrency.py's tests of one lock mode share one 4-worker server: under ``-n 3``
    they are dealt to one process, which starts it once (dealt one by one, each of the three
    processes started both)."""
    files = ["tests/service/test_concurrency.py", "tests/service/test_faults.py"]
    done = subprocess.run(  # noqa: S603 - pytest of our venv collecting two files of the suite
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--collect-only", "-q", *files],
        cwd=ROOT,
        # a collection only: no line in the outer run's CPU map (tests/cpu_map.py)
        env={
            **{k: v for k, v in os.environ.items() if k != "GATEKEEPER_TEST_CPU"},
            "PYTEST_XDIST_WORKER_COUNT": "3",
        },
        capture_output=True,
        text=True,
        check=True,
    )
    order = [line for line in done.stdout.splitlines() if "::" in line]
    shares = worksteal_shares(order, 3)
    for mode in ("redis-locks", "db-only"):
        holding = [share for share in shares if any(f"[{mode}]" in t for t in share)]
        assert len(holding) == 1, (mode, shares)
        assert sum(f"[{mode}]" in t for t in holding[0]) == 4
