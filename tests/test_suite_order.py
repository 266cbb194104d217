"""The order tests/conftest.py gives the suite: the slow tests spread over the xdist shares."""

from __future__ import annotations

import pytest

from tests.conftest import dealt


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
