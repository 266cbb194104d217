"""The bound worker: same answers as the calculator, canonical caching, time limits, errors."""

from __future__ import annotations

import asyncio
import copy
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from app.engine.calculator import compute_loss
from app.engine.errors import InvalidInput, Unsupported
from app.worker.cache import LRUCache
from app.worker.keys import request_key
from app.worker.pool import PARENT_CHECK_PERIOD, BoundWorker, WorkerSettings, basic_fallback

NAMES = [f"x{i}" for i in range(1, 10)]
BOX = {"attributes": [{"name": n, "type": "real", "low": -1, "high": 1} for n in NAMES]}


def _logistic_history(n: int, seed: int) -> list[dict[str, Any]]:
    rng = np.random.default_rng(seed)
    history = []
    for _ in range(n):
        th = rng.uniform(-10, 10, 10)
        query = {
            "mechanism": "logistic",
            "weights": dict(zip(NAMES, th[1:].tolist(), strict=True)),
            "intercept": float(th[0]),
            "epsilon": 0.1,
        }
        history.append({"query": query, "output": int(rng.integers(2))})
    return history


def _request(history: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {"domain": copy.deepcopy(BOX), "history": history, **extra}


@pytest.fixture(scope="module")
def worker() -> Any:
    with BoundWorker(WorkerSettings(processes=1, time_limit=5.0)) as w:
        yield w


def test_process_pool_answers_like_the_calculator(worker: BoundWorker) -> None:
    request = _request(
        _logistic_history(4, 1), budget=1.0, candidate=_logistic_history(1, 2)[0]["query"]
    )
    assert worker.compute(copy.deepcopy(request)) == compute_loss(copy.deepcopy(request))


def test_identical_histories_are_computed_once_whatever_their_order(worker: BoundWorker) -> None:
    cache = LRUCache(16)
    local = BoundWorker(WorkerSettings(processes=0), cache)
    history = _logistic_history(3, 3)
    first = local.compute(_request(history))
    assert (cache.hits, cache.misses) == (0, 1)
    shuffled = list(reversed(history))
    # equivalent spelling: integer-valued floats, explicit default intercept order
    shuffled[0] = copy.deepcopy(shuffled[0])
    shuffled[0]["query"]["epsilon"] = 0.1
    assert local.compute(_request(shuffled)) == first
    assert (cache.hits, cache.misses) == (1, 1)
    assert request_key(_request(history)) == request_key(_request(shuffled))
    assert request_key(_request(history)) != request_key(_request(history[:2]))


def test_lru_evicts_the_least_recently_used() -> None:
    cache = LRUCache(2)
    cache.set("a", {"v": 1})
    cache.set("b", {"v": 2})
    assert cache.get("a") == {"v": 1}
    cache.set("c", {"v": 3})
    assert cache.get("b") is None
    assert cache.get("a") == {"v": 1}
    assert len(cache) == 2


def test_a_hard_history_returns_a_sound_limit_within_the_time_limit(worker: BoundWorker) -> None:
    request = _request(_logistic_history(40, 4), options={"time_limit": 0.3, "tolerance": 1e-9})
    start = time.perf_counter()
    answer = worker.compute(request)
    elapsed = time.perf_counter() - start
    assert answer["status"] == "limit"
    loss = answer["realized_loss"]
    assert 0.0 <= loss["lower"] <= loss["upper"] <= answer["basic_composition"] + 1e-9
    assert elapsed < 10.0


def test_the_safety_net_falls_back_to_basic_composition() -> None:
    # a worker whose deadline is far shorter than the search's own limit must not hang
    settings = WorkerSettings(processes=1, time_limit=30.0, grace=-119.8)
    with BoundWorker(settings) as w:
        request = _request(
            _logistic_history(60, 5), options={"time_limit": 30.0, "tolerance": 1e-12}
        )
        start = time.perf_counter()
        answer = w.compute(request)
        assert time.perf_counter() - start < 5.0
    assert answer["status"] == "limit"
    assert answer["realized_loss"]["lower"] == 0.0
    assert answer["realized_loss"]["upper"] >= answer["basic_composition"]
    assert w.fallbacks == 1


@pytest.mark.slow
def test_requests_given_up_on_do_not_hold_the_pool_afterwards() -> None:
    """A request whose caller fell back is cancelled if it is still queued: once the running
    search ends, the next request is answered by the pool, not by yet another fallback behind a
    backlog of abandoned searches (seen: a server's pool process busy for minutes after its
    callers had given up, every later submit waiting out the deadline)."""
    hard = {"time_limit": 2.0, "tolerance": 1e-12}
    with BoundWorker(WorkerSettings(processes=1, time_limit=1.0, grace=-3.5)) as w:  # 0.5 s
        for seed in range(100, 200):  # until the pool process has started and answers
            if w.compute(_request(_logistic_history(1, seed)))["status"] == "ok":
                break
        w.fallbacks = 0
        assert w.compute(_request(_logistic_history(60, 10), options=hard))["status"] == "limit"
        for seed in (11, 12, 13):  # queued behind the first search, then given up on
            assert w.compute(_request(_logistic_history(60, seed), options=hard))
        assert w.fallbacks == 4
        time.sleep(4.0)  # the first search (2 x 2 s, begun 1.5 s ago) is over
        easy = w.compute(_request(_logistic_history(1, 14)))
    assert easy["status"] == "ok", easy
    assert w.fallbacks == 4


def test_fallback_decisions_follow_basic_composition() -> None:
    history = _logistic_history(3, 6)
    answer = basic_fallback(_request(history, budget=1.0, candidate=history[0]["query"]))
    cand = answer["candidate"]
    assert cand["accepted"]["bayesian"] == cand["accepted"]["basic"]
    assert cand["worst_case_upper"] >= answer["basic_composition"]


def test_errors_cross_the_process_boundary_with_their_field(worker: BoundWorker) -> None:
    bad = _request(_logistic_history(1, 7))
    bad["history"][0]["query"]["epsilon"] = -1
    with pytest.raises(InvalidInput) as info:
        worker.compute(bad)
    assert info.value.field == "history[0].query.epsilon"
    unsupported = _request(
        [],
        budget=1.0,
        candidate={
            "mechanism": "binary_rr",
            "epsilon": 1.0,
            "predicate": {"attribute": "x1", "op": ">", "value": 0},
        },
    )
    with pytest.raises(Unsupported) as info2:
        worker.compute(unsupported)
    assert info2.value.field == "candidate"


def test_async_api_does_not_block_the_event_loop(worker: BoundWorker) -> None:
    async def main() -> tuple[dict[str, Any], int]:
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        task = asyncio.create_task(ticker())
        answer = await worker.compute_async(
            _request(_logistic_history(8, 8), options={"tolerance": 1e-6})
        )
        task.cancel()
        return answer, ticks

    answer, ticks = asyncio.run(main())
    assert answer["realized_loss"]["lower"] <= answer["realized_loss"]["upper"]
    assert ticks >= 3  # the loop kept running while the process computed


def test_fallback_lists_bit_vector_outputs_and_decides_like_the_filters() -> None:
    domain = {"attributes": [{"name": "c", "type": "categorical", "values": ["a", "b", "c"]}]}
    ue = {"mechanism": "unary_encoding", "attribute": "c", "epsilon": 0.5}
    history = [{"query": ue, "output": [0, 1, 0]}]
    for budget, basic_ok in ((1.0, True), (0.9, False)):
        answer = basic_fallback(
            {"domain": domain, "history": history, "budget": budget, "candidate": ue}
        )
        cand = answer["candidate"]
        # 2**3 outputs, listed as bit vectors in counting order, all with the same sound bounds
        assert [o["output"] for o in cand["per_output"]] == [
            [(j >> 2) & 1, (j >> 1) & 1, j & 1] for j in range(8)
        ]
        assert cand["per_output_complete"] is True
        assert {o["upper"] for o in cand["per_output"]} == {cand["worst_case_upper"]}
        assert cand["worst_case_upper"] >= 1.0
        assert answer["realized_loss"] == {"lower": 0.0, "upper": 0.5, "exact": False}
        # basic composition decides basic and Bayesian alike; simplified charges 0.5 + 0.5
        assert cand["accepted"] == {
            "bayesian": basic_ok,
            "simplified": basic_ok,
            "basic": basic_ok,
        }


PARENT_DIES = """
import os, sys
from app.worker.pool import BoundWorker, WorkerSettings

worker = BoundWorker(WorkerSettings(processes=1, time_limit=5.0))
pool = worker._pool
assert pool is not None
pool.submit(os.getpid).result(timeout=60)  # the pool process exists once it has run a task
print(*pool._processes, flush=True)
os._exit(0)  # no shutdown: as if the web worker were killed
"""


def test_pool_processes_exit_when_their_web_worker_dies() -> None:
    """A pool process whose parent exits without shutting the pool down (a killed or crashed
    web worker) exits by itself instead of lingering forever."""
    if not Path("/proc/self/stat").exists():
        pytest.skip("reads process states from /proc (Linux)")
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(  # noqa: S603 - our own interpreter and script
        [sys.executable, "-c", PARENT_DIES],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    children = [int(pid) for pid in done.stdout.split()]
    assert len(children) == 1
    deadline = time.monotonic() + 20 * PARENT_CHECK_PERIOD + 5.0
    alive = children
    while alive and time.monotonic() < deadline:
        time.sleep(0.1)
        alive = [pid for pid in children if Path(f"/proc/{pid}").exists() and not _zombie(pid)]
    assert alive == [], f"pool process(es) {alive} outlived their parent"
    assert os.getpid() not in children


def _zombie(pid: int) -> bool:
    """Whether ``pid`` has exited but not been reaped (state ``Z``)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] == "Z"
    except FileNotFoundError:
        return True
