"""``bench/pg_submit.py``: it replays what a real warm submit sends, and its variants do what
they say.

The breakdown means something only while the replayed statements are the service's: a change
to the submit's SQL (a third statement, the load not prepared, another CTE) must fail here, not
leave the script timing an old shape. On a real PostgreSQL and Redis (the service tests'
fixtures).
"""

from __future__ import annotations

import re
import sys
import uuid
from pathlib import Path

import psycopg
import pytest

from tests.service.conftest import (  # noqa: F401 - fixtures
    _postgres_template,
    postgres_url,
    redis_url,
)

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import pg_submit as ps  # noqa: E402
import service_load as sl  # noqa: E402


@pytest.fixture(scope="module")
def captured(
    postgres_url: str,  # noqa: F811 - the fixture
    redis_url: str,  # noqa: F811 - the fixture
    tmp_path_factory: pytest.TempPathFactory,
) -> ps.Captured:
    """A real warm submit's statements, on the module's database (bootstrap admin stored)."""
    from app.db.session import make_engine
    from app.services.auth import ensure_bootstrap_admin

    engine = make_engine(postgres_url)
    ensure_bootstrap_admin(engine=engine, secret=sl.ADMIN_KEY)
    engine.dispose()
    key_file = tmp_path_factory.mktemp("key") / "encryption.key"
    return ps.capture(postgres_url, redis_url, str(key_file))


def test_a_warm_submit_is_the_load_and_one_write(captured: ps.Captured) -> None:
    assert captured.load.text.startswith(ps.LOAD_PREFIX)
    assert captured.load.prepare is True
    assert captured.accept.text.startswith(ps.ACCEPT_PREFIX)
    for cte in ("cas", "query_row", "event", "named"):
        assert f"{cte} AS \n(" in captured.accept.text
    assert isinstance(captured.accept.params["named_state"], bytes)


def test_the_replay_is_an_accepted_submit_each_time(
    captured: ps.Captured,
    postgres_url: str,  # noqa: F811 - the fixture
) -> None:
    """Replayed twice, the write hits (a query row each, the version up by one each)."""
    url = postgres_url.replace("+psycopg", "")
    replay = ps.Replay(url, ps.VARIANTS[0], captured)
    try:
        before = replay.load(uuid.uuid4().hex)
        load_us, write_us, _ = replay.block(2)
        after = replay.load(uuid.uuid4().hex)
    finally:
        replay.close()
    assert replay.lost == 0
    assert after[replay.at_version] == before[replay.at_version] + 2
    assert after[replay.at_accepted] == before[replay.at_accepted] + 2
    assert load_us > 0
    assert write_us > 0
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT count(*) FROM queries WHERE object_id = %s", (captured.object_id,)
        ).fetchone()
    assert rows is not None
    assert rows[0] == after[replay.at_accepted]


def test_a_cte_taken_out_leaves_a_statement_without_it(captured: ps.Captured) -> None:
    for name in ("event", "named"):
        text = ps.without_cte(captured.accept.text, name)
        assert f"{name} AS" not in text
        assert text.count("(") == text.count(")")
        others = {"cas", "query_row", "event", "named"} - {name}
        assert all(f"{cte} AS \n(" in text for cte in others)


def test_the_pgbench_script_binds_every_parameter(captured: ps.Captured) -> None:
    """Each ``%(name)s`` is a pgbench variable set by ``\\set``, ``\\gset`` or ``-D``."""
    script, variables = ps.pgbench_script(captured)
    assert "%(" not in script
    used = set(re.findall(r":([a-z]\w*)", script.replace("::", " ")))
    set_here = set(re.findall(r"\\set (\w+)", script)) | {"client_id"}
    gset = {name for name in used if name.startswith("g_")}
    assert gset == {"g_version", "g_accepted"}
    assert used - gset <= set_here | set(variables)
    assert variables["a_named_state"].startswith("\\x")
