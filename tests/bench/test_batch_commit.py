"""``bench/batch_commit.py``: a small run measures every size, and every write it times hit.

On a real PostgreSQL and Redis (the service tests' fixtures).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.service.conftest import (  # noqa: F401 - fixtures
    _postgres_template,
    postgres_url,
    redis_url,
)

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import batch_commit as bc  # noqa: E402


def test_a_small_run_times_each_size_and_its_writes_hit(
    postgres_url: str,  # noqa: F811 - the fixture
    redis_url: str,  # noqa: F811 - the fixture
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from sqlalchemy import text

    from app.db.session import make_engine

    monkeypatch.setenv("GATEKEEPER_ENCRYPTION_KEY_FILE", str(tmp_path / "encryption.key"))
    engine = make_engine(postgres_url, pool_size=1, max_overflow=0)
    with engine.connect() as conn:
        before = conn.execute(text("SELECT count(*) FROM queries")).scalar_one()
    rows = bc.measure(postgres_url, redis_url, [1, 2], 3)
    with engine.connect() as conn:
        after = conn.execute(text("SELECT count(*) FROM queries")).scalar_one()
    engine.dispose()
    # two objects, each submitted to once by capture; then per round 2 writes per size
    assert after - before == 2 + 3 * (2 + 2)
    assert set(rows) == {1, 2}
    for found in rows.values():
        assert len(found) == 3
        assert all(pg > 0 and client > 0 for pg, client in found)
    lines = bc.table(rows, skip=1)
    assert lines[0].startswith("batch   1:")
    assert "1.00x batch 1" in lines[0]
    assert lines[1].startswith("batch   2:")
