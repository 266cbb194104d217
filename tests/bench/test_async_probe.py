"""``bench/async_probe.py``: its probes make the real submit's round trips, and a run completes.

The probe's figures mean something only while its two roads send what a real accepted submit
sends (the same Redis commands, the same SQL text, prepared alike): a change to the submit's
statements (one more read, a pipeline, another lock) must fail here, not leave the probe
measuring an old shape. On a real PostgreSQL and Redis (the service tests' fixtures).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.service.conftest import (  # noqa: F401 - fixtures
    POSTGRES_URL,
    _postgres_template,
    postgres_url,
    redis_url,
)

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import async_probe as ap  # noqa: E402
import service_load as sl  # noqa: E402


@pytest.fixture(scope="module")
def captured(
    postgres_url: str,  # noqa: F811 - the fixture
    redis_url: str,  # noqa: F811 - the fixture
    tmp_path_factory: pytest.TempPathFactory,
) -> ap.Captured:
    """Six real submits' round trips, on the module's database (bootstrap admin stored)."""
    from app.db.session import make_engine
    from app.services.auth import ensure_bootstrap_admin

    key_file = tmp_path_factory.mktemp("key") / "encryption.key"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("GATEKEEPER_ENCRYPTION_KEY_FILE", str(key_file))
        engine = make_engine(postgres_url)
        ensure_bootstrap_admin(engine=engine, secret=sl.ADMIN_KEY)
        engine.dispose()
        return ap.capture(postgres_url, redis_url)


def test_the_real_warm_submit_is_four_round_trips(captured: ap.Captured) -> None:
    warm = [ap.per_submit(trips) for trips in captured.trips[2:]]
    assert all(trips == warm[0] for trips in warm)
    kinds = [(kind, text.split()[0]) for kind, text in warm[0]]
    assert kinds == [
        ("redis", "SET"),
        ("pg prepared", "SELECT"),
        ("pg", "WITH"),
        ("redis", "EVALSHA"),
    ]
    # the first submit also looked the key up and set its connections up
    assert len(captured.trips[0]) > len(warm[0])


@pytest.mark.slow
def test_both_roads_send_the_real_submits_round_trips(
    captured: ap.Captured,
    postgres_url: str,  # noqa: F811 - the fixture
    redis_url: str,  # noqa: F811 - the fixture
) -> None:
    pools = ["queue", "lean"]
    try:
        import psycopg_pool  # noqa: F401 - optional
    except ImportError:
        pass
    else:
        pools.append("psycopg_pool")
    assert ap.check_probes(postgres_url, redis_url, captured, pools) == []


def test_a_probe_that_differs_is_reported(captured: ap.Captured) -> None:
    warm = ap.per_submit(captured.trips[-1])
    assert ap.check_trips(captured.trips, {"sync": list(warm)}) == []
    # one statement fewer, or one not prepared, or a Redis command more: each is a difference
    unprepared = [("pg", text) if kind == "pg prepared" else (kind, text) for kind, text in warm]
    for changed in (warm[:-1], unprepared, [*warm, ("redis", "GET")]):
        problems = ap.check_trips(captured.trips, {"async_queue": changed})
        assert len(problems) == 1
        assert problems[0].startswith("async_queue: ")
    # connection set-up is not per submit
    assert ap.check_trips(captured.trips, {"sync": [("redis", "HELLO"), *warm]}) == []


def test_parts_counts_each_sample_for_its_innermost_frame() -> None:
    raw = "\n".join(
        [
            "worker (1);run (asyncio/runners.py:1);execute (psycopg/cursor_async.py:2) 6",
            "worker (1);run (asyncio/runners.py:1);send (redis/asyncio/connection.py:3) 3",
            "worker (1);run (asyncio/runners.py:1) 1",
            "not a sample",
        ]
    )
    shares = ap.parts(raw)
    assert shares == pytest.approx(
        {
            "psycopg (execute, waits, adaptation)": 0.6,
            "redis-py (commands, replies, connections)": 0.3,
            "asyncio, futures, threads, queues": 0.1,
        }
    )


@pytest.mark.slow
def test_a_small_run_prints_its_table(
    postgres_url: str,  # noqa: F811 - the fixture
    redis_url: str,  # noqa: F811 - the fixture
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    # the script makes (and drops) a database of its own
    monkeypatch.setattr(sl, "POSTGRES_URL", POSTGRES_URL.replace("+psycopg", ""))
    monkeypatch.setattr(sl, "REDIS_URL", redis_url)
    monkeypatch.setenv("GATEKEEPER_ENCRYPTION_KEY_FILE", str(tmp_path / "encryption.key"))
    assert (
        ap.main(
            [
                *("--blocks", "2", "--block", "20", "--clients", "4", "--workers", "1"),
                *("--objects", "2", "--warmup", "10", "--db-prefix", "gk_test_probe_"),
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "round trips per warm submit" in out
    rows = {
        line.split()[0]: line
        for line in out.splitlines()
        if line.split()[:1] in (["sync"], ["async_queue"]) and "/" not in line  # not a ratio
    }
    assert set(rows) == {"sync", "async_queue"}
    for line in rows.values():
        assert "{201: 40}" in line  # every timed submit accepted
    assert "async_queue / sync server CPU" in out
    assert "submits tried again after a lost race (the probes' logs): sync " in out
