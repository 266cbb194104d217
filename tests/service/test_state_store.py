"""``likelihood_states`` kept while named and collected when not (app.store.states).

The collection must never delete a state an object names — not even one a concurrent writer is
about to name (PostgreSQL: the row locks of :mod:`app.store.states`, exercised here with two
connections in both orders) — and must delete every state no object names.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Connection, Engine, text

from app.bootstrap import create_app
from app.db.session import make_engine
from app.services.snapshots import (
    COLLECTED_KEY,
    StateGone,
    StoredState,
    collect_states,
    collect_states_periodically,
    keep_states,
)
from app.store import transaction
from app.store.ids import PG_PER_STATEMENT
from app.store.states import (
    collect_unnamed,
    count_states,
    count_unnamed,
    insert_state,
    load_states,
    name_states,
)
from tests.service import factories
from tests.service.conftest import make_settings, new_key
from tests.service.factories import grr_query, integer_domain
from tests.service.formats import record_result_formats


@pytest.fixture(scope="module")
def engine(database_url: str) -> Iterator[Engine]:
    engine = make_engine(database_url)
    yield engine
    engine.dispose()


def _object(client: TestClient) -> str:
    return factories.register(
        client, domain=integer_domain(4), value={"x": 1}, budget=100.0, prefix="states"
    )


def _name(engine: Engine, oid: str, key: str | None) -> None:
    with transaction(engine) as conn:
        conn.execute(text("UPDATE objects SET state_hash = :k WHERE id = :o"), {"k": key, "o": oid})


def _named(conn: Connection, oid: str) -> str | None:
    found = conn.execute(
        text("SELECT state_hash FROM objects WHERE id = :o"), {"o": oid}
    ).scalar_one()
    return None if found is None else str(found)


def test_many_keys_are_stored_once_and_known_ones_checked(engine: Engine) -> None:
    keys = [f"many-{n:04d}" for n in range(1200)]  # more than one IN list (500)
    with transaction(engine) as conn:
        before = count_states(conn)
        assert name_states(conn, [(key, key.encode(), 0.5) for key in keys]) == set()
        # again, with other bytes: the stored arrays stay as they were (locked, not written)
        assert name_states(conn, [(key, b"other", 0.25) for key in keys[:10]], keys) == set()
        assert count_states(conn) == before + len(keys)
        assert load_states(conn, {keys[1]}) == {keys[1]: (keys[1].encode(), 0.5)}
        assert name_states(conn, [], [keys[0], "never-stored", keys[5]]) == {"never-stored"}
        conn.execute(text("DELETE FROM likelihood_states WHERE hash LIKE 'many-%'"))


def test_collection_deletes_exactly_the_unnamed_states(client: TestClient, engine: Engine) -> None:
    """Submits leave their objects' old states unnamed; the collection deletes those alone."""
    key = new_key(client, "analyst")
    ids = [_object(client) for _ in range(3)]
    for _ in range(3):
        for oid in ids:
            r = client.post(
                f"/v1/objects/{oid}/queries",
                headers={"Authorization": f"Bearer {key}"},
                json={"query": grr_query(0.5)},
            )
            assert r.status_code == 201, r.text
    with transaction(engine) as conn:
        insert_state(conn, key="unnamed-extra", state=b"\x00" * 8, err=0.0)
        named = {_named(conn, oid) for oid in ids}
        unnamed = count_unnamed(conn)
        assert unnamed >= 2  # the extra row, and the states the objects moved on from
        total = count_states(conn)
    assert None not in named
    assert collect_states(engine) == unnamed
    with engine.connect() as conn:
        assert count_unnamed(conn) == 0
        assert count_states(conn) == total - unnamed
        stored = load_states(conn, {k for k in named if k is not None})
    assert set(stored) == named  # every state an object names is still there
    assert collect_states(engine) == 0


def test_collection_deletes_more_unnamed_states_than_one_batch_of_keys(
    client: TestClient, engine: Engine
) -> None:
    """Candidates past ``PG_PER_STATEMENT`` go in the same deleting statement, all of them."""
    oid = _object(client)
    keys = [f"batch-{n:05d}" for n in range(PG_PER_STATEMENT + 7)]
    with transaction(engine) as conn:
        name_states(conn, [(key, b"\x01", 0.0) for key in keys])
    _name(engine, oid, keys[3])  # one of them named: it stays
    with engine.connect() as conn:
        unnamed = count_unnamed(conn)
        total = count_states(conn)
    assert unnamed >= len(keys) - 1
    assert collect_states(engine) == unnamed
    with engine.connect() as conn:
        assert count_unnamed(conn) == 0
        assert count_states(conn) == total - unnamed
        assert set(load_states(conn, set(keys))) == {keys[3]}
    _name(engine, oid, None)
    assert collect_states(engine) == 1


def _postgres(engine: Engine) -> None:
    if engine.dialect.name != "postgresql":
        pytest.skip("SQLite runs one writer at a time: no concurrent collection to race")


def _collect_into(engine: Engine, collected: list[int]) -> None:
    collected.append(collect_states(engine))


def test_a_state_being_named_by_an_open_transaction_is_not_collected(
    client: TestClient, engine: Engine
) -> None:
    """A writer locks an unnamed state and names it; a collection meanwhile must skip it.

    The collection's snapshot does not see the writer's uncommitted object: without the lock it
    would delete the row and the object would commit naming nothing.
    """
    _postgres(engine)
    oid = _object(client)
    for key, mode in (("open-bytes", "submit"), ("open-known", "known"), ("open-chunk", "chunk")):
        with transaction(engine) as conn:
            insert_state(conn, key=key, state=b"\x01" * 8, err=0.0)
        with transaction(engine) as writer:
            if mode == "known":  # a survey chunk naming a state an earlier chunk stored
                keep_states(writer, {key: (StoredState(key, b"", 0.0), 1)}, {key})
            elif mode == "chunk":  # a chunk's new states: insert or lock, all in one statement
                other = StoredState(key + "-x", b"\x02" * 8, 0.0)
                keep_states(
                    writer, {key: (StoredState(key, b"\x09" * 8, 0.0), 1), other.key: (other, 1)}
                )
            else:  # a submit's state: insert or lock
                insert_state(writer, key=key, state=b"\x09" * 8, err=0.0)
            writer.execute(
                text("UPDATE objects SET state_hash = :k WHERE id = :o"), {"k": key, "o": oid}
            )
            collected: list[int] = []
            thread = threading.Thread(target=_collect_into, args=(engine, collected))
            thread.start()
            thread.join(10)
            assert not thread.is_alive()  # SKIP LOCKED: the collection does not wait
        assert len(collected) == 1
        with engine.connect() as conn:
            assert load_states(conn, {key}) == {key: (b"\x01" * 8, 0.0)}  # kept, not rewritten
            assert _named(conn, oid) == key
    _name(engine, oid, None)


def test_a_writer_after_a_collection_stores_the_state_again_or_fails(
    client: TestClient, engine: Engine
) -> None:
    """The collection locked and deleted a state first: the writer waits, then sees it gone.

    With the array's bytes it inserts it again (``ON CONFLICT`` retries the insert); without
    them (a survey's known state) it is told the state is gone and must not name it.
    """
    _postgres(engine)
    oid = _object(client)
    for mode in ("submit", "known", "chunk"):
        known = mode == "known"
        key = f"late-{mode}"
        with transaction(engine) as conn:
            insert_state(conn, key=key, state=b"\x03" * 8, err=0.0)
        outcome: list[str] = []

        def write(key: str = key, mode: str = mode, outcome: list[str] = outcome) -> None:
            try:
                with transaction(engine) as writer:
                    if mode == "known":
                        keep_states(writer, {key: (StoredState(key, b"", 0.0), 1)}, {key})
                    elif mode == "chunk":
                        keep_states(writer, {key: (StoredState(key, b"\x04" * 8, 0.0), 1)})
                    else:
                        insert_state(writer, key=key, state=b"\x04" * 8, err=0.0)
                    writer.execute(
                        text("UPDATE objects SET state_hash = :k WHERE id = :o"),
                        {"k": key, "o": oid},
                    )
                outcome.append("committed")
            except StateGone:
                outcome.append("gone")

        with transaction(engine) as collector:
            assert collect_unnamed(collector) >= 1
            thread = threading.Thread(target=write)
            thread.start()
            time.sleep(0.3)
            assert thread.is_alive()  # waiting for the collection's lock
        thread.join(10)
        with engine.connect() as conn:
            stored = load_states(conn, {key})
            named = _named(conn, oid)
        if known:
            assert outcome == ["gone"]
            assert stored == {}
            assert named != key
        else:
            assert outcome == ["committed"]
            assert stored == {key: (b"\x04" * 8, 0.0)}
            assert named == key
    _name(engine, oid, None)


def _unnamed_after_submits(client: TestClient, engine: Engine) -> int:
    key = new_key(client, "analyst")
    oid = _object(client)
    for _ in range(3):
        r = client.post(
            f"/v1/objects/{oid}/queries",
            headers={"Authorization": f"Bearer {key}"},
            json={"query": grr_query(0.5)},
        )
        assert r.status_code == 201, r.text
    with engine.connect() as conn:
        return count_unnamed(conn)


def test_a_service_taking_only_single_submits_collects_on_a_timer(database_url: str) -> None:
    """``STATES_COLLECT_SECONDS``: the states submits leave unnamed go without a restart."""
    engine = make_engine(database_url)
    settings = make_settings(database_url, states_collect_seconds=0.2)
    try:
        with TestClient(create_app(settings)) as client:
            _unnamed_after_submits(client, engine)  # states left unnamed, then the timer comes
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                with engine.connect() as conn:
                    if count_unnamed(conn) == 0:
                        break
                time.sleep(0.1)
            with engine.connect() as conn:
                assert count_unnamed(conn) == 0
        with TestClient(create_app(make_settings(database_url, states_collect_seconds=0))) as off:
            left = _unnamed_after_submits(off, engine)
            time.sleep(0.5)
            with engine.connect() as conn:
                assert left >= 2
                assert count_unnamed(conn) == left  # no timer: nothing collected
    finally:
        collect_states(engine)
        engine.dispose()


def test_one_process_of_a_deployment_collects_per_interval(
    client: TestClient, engine: Engine, redis_url: str
) -> None:
    """With Redis a second process finds the interval taken and leaves the states alone."""
    import redis

    shared = redis.Redis.from_url(redis_url)
    shared.delete(COLLECTED_KEY)
    try:
        unnamed = _unnamed_after_submits(client, engine)
        assert unnamed >= 2
        assert collect_states_periodically(engine, redis=shared, seconds=30) == unnamed
        left = _unnamed_after_submits(client, engine)
        assert left >= 2
        assert collect_states_periodically(engine, redis=shared, seconds=30) == 0  # taken
        with engine.connect() as conn:
            assert count_unnamed(conn) == left
        shared.delete(COLLECTED_KEY)  # the interval over
        assert collect_states_periodically(engine, redis=shared, seconds=30) == left
        assert collect_states_periodically(engine, redis=None, seconds=30) == 0  # none left
    finally:
        shared.delete(COLLECTED_KEY)
        shared.close()


def test_a_query_that_leaves_the_state_as_it_was_is_accepted(
    client: TestClient, engine: Engine
) -> None:
    """An output as likely at every point leaves an exact state's content, hence its key.

    A unary-encoding report of all ones (or all zeros) on a categorical attribute is as likely
    whatever the value: once the history holds its ε, the object names after it the state it
    named before. That was refused with a 500 (``an accepted query always changes the
    history's state key``, a rule of the reference counts); Hypothesis's state machine met it.
    Here each report is such with probability about 0.27, so 80 submits meet one but with
    probability 0.73^79 < 1e-10.
    """
    key = new_key(client, "analyst")
    domain = {"attributes": [{"name": "c", "type": "categorical", "values": ["a", "b", "c"]}]}
    oid = factories.register(
        client, domain=domain, value={"c": "b"}, budget=1000.0, prefix="same-state"
    )
    query = {
        "mechanism": "unary_encoding",
        "attribute": "c",
        "epsilon": 0.6,
        "variant": "optimized",
    }
    named: list[str | None] = []
    for _ in range(80):
        r = client.post(
            f"/v1/objects/{oid}/queries",
            headers={"Authorization": f"Bearer {key}"},
            json={"query": query},
        )
        assert r.status_code == 201, r.text
        with engine.connect() as conn:
            named.append(_named(conn, oid))
        if len(named) > 1 and named[-1] == named[-2]:
            break
    assert named[-1] == named[-2], "no report left the state as it was"
    collect_states(engine)
    with engine.connect() as conn:
        assert set(load_states(conn, {named[-1]})) == {named[-1]}  # still stored


def _stored(conn: Connection, prefix: str) -> list[tuple[str, bytes, float, str | None]]:
    """The rows under ``prefix`` (the prefix cut), with how PostgreSQL compressed each array."""
    rows = conn.execute(
        text(
            "SELECT hash, state, err, pg_column_compression(state) FROM likelihood_states "
            "WHERE hash LIKE :p ORDER BY hash"
        ),
        {"p": prefix + "%"},
    )
    return [(h[len(prefix) :], bytes(s), float(e), c) for h, s, e, c in rows]


def test_a_chunk_s_states_copied_are_stored_as_one_insert_per_row_stores_them(
    engine: Engine,
) -> None:
    """PostgreSQL names a chunk's states by COPY and one ``INSERT``: the per-row statement's rows.

    Half the keys are stored beforehand with other bytes (they must stay as they were: locked,
    not written), the arrays are as large as a survey's (compressed by TOAST: the copy must
    not change how, lz4 where the column asks for it), and a transaction that made the copy
    table and rolled back must not break the next one.
    """
    _postgres(engine)
    import random

    from app.store import states as store

    rng = random.Random(27)
    arrays = {f"{n:04d}": rng.randbytes(64) * 40 for n in range(300)}  # 2,560 bytes each

    def rolled_back() -> None:  # the copy table created in this transaction, then rolled back
        with transaction(engine) as conn:
            store._name_copied(conn, [("copy-rolled-back", b"\x01", 0.0)])
            raise RuntimeError

    with pytest.raises(RuntimeError):
        rolled_back()
    found = []
    for prefix, name in (("each-", store._name_each), ("copy-", store._name_copied)):
        with transaction(engine) as conn:
            old = [(prefix + k, b"old" + a, 0.125) for k, a in list(arrays.items())[::2]]
            store._name_each(conn, old)
        with transaction(engine) as conn:
            rows = [(prefix + k, a, n / 7) for n, (k, a) in enumerate(arrays.items())]
            rng.shuffle(rows)
            name(conn, rows)
        with transaction(engine) as conn:
            found.append(_stored(conn, prefix))
            conn.execute(
                text("DELETE FROM likelihood_states WHERE hash LIKE :p"), {"p": prefix + "%"}
            )
    each, copied = found
    assert len(each) == len(arrays)
    assert copied == each
    assert each[0][1:3] == (b"old" + arrays[each[0][0]], 0.125)  # kept as it was
    assert each[1][1:3] == (arrays[each[1][0]], 1 / 7)  # inserted
    with engine.connect() as conn:
        column = conn.execute(
            text(
                "SELECT attcompression FROM pg_attribute WHERE attname = 'state' "
                "AND attrelid = 'likelihood_states'::regclass"
            )
        ).scalar_one()
    if column == "l":
        assert {c for *_, c in copied} == {"lz4"}


def test_stored_arrays_read_back_byte_equal_through_every_read(
    client: TestClient, engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every read of ``likelihood_states.state`` gives the bytes written, as ``bytes``.

    The reads: :func:`load_states` (a survey chunk's, a version's; more keys than one
    statement takes), ``gatekeeper verify``'s :func:`~app.store.verify.likelihood_states` and
    :func:`~app.store.verify.likelihood_state`, and an object's loads (a dry-run's
    :func:`~app.store.objects.load_state` and a submit's, unscoped and scoped). The arrays: a
    10^5-point one (800 kB, stored out of line), a 1,000-point one, one TOAST compresses (all
    zeros), the empty one, and one byte; an object naming no array loads None. On PostgreSQL
    every read asks for its binary format (docs/benchmarks.md, "h/loads").
    """
    import random

    from app.store import verify as verify_store
    from app.store.objects import load_for_submit, load_state

    rng = random.Random(2711)
    arrays = {
        "large": rng.randbytes(8 * 100_000),
        "grr": rng.randbytes(8 * 1_000),
        "zeros": bytes(8 * 10_000),
        "empty": b"",
        "byte": b"\x00",
    }
    # more keys than one statement of load_states takes (PostgreSQL: 10,000; SQLite: 500)
    small = {f"n{n:05d}": n.to_bytes(3, "big") + b"\\x" for n in range(PG_PER_STATEMENT + 1)}
    written = {f"bytes-{k}": (a, n / 8) for n, (k, a) in enumerate({**arrays, **small}.items())}
    formats: list[tuple[int, ...]] = []

    oids = {name: _object(client) for name in arrays}
    none = _object(client)
    labelled = {}
    for name in arrays:
        with transaction(engine) as conn:
            conn.execute(
                text("UPDATE objects SET labels = :l WHERE id = :o"),
                {"l": json.dumps({"team": name}), "o": oids[name]},
            )
            labelled[name] = [("team", name)]
    with engine.connect() as conn, conn.begin() as tx:  # rolled back: nothing is left stored
        name_states(conn, [(k, a, e) for k, (a, e) in written.items()])
        for name, oid in oids.items():
            _named_in(conn, oid, f"bytes-{name}")
        record_result_formats(monkeypatch, formats)
        loaded = load_states(conn, set(written) | {"bytes-never"})
        by_verify = verify_store.likelihood_states(conn, sorted(written))
        for key, (array, err) in written.items():
            assert type(loaded[key][0]) is bytes
            assert loaded[key] == (array, err), key
            assert type(by_verify[key].state) is bytes
            assert (by_verify[key].state, by_verify[key].err) == (array, err), key
        assert set(loaded) == set(by_verify) == set(written)
        for name, oid in oids.items():
            key = f"bytes-{name}"
            one = verify_store.likelihood_state(conn, key=key)
            assert one is not None
            assert type(one.state) is bytes
            assert (one.state, one.err) == written[key]
            for scope in (None, labelled[name]):
                state = load_state(conn, object_id=oid, scope=scope)
                submit = load_for_submit(conn, object_id=oid, key=None, scope=scope)
                assert state is not None
                assert submit is not None
                for found in (state, submit[0]):
                    assert type(found.state) is bytes
                    assert (found.state, found.state_err) == written[key], (name, scope)
                    assert found.state_hash == key
            assert load_state(conn, object_id=oid, scope=[("team", "other")]) is None
        assert verify_store.likelihood_state(conn, key="bytes-never") is None
        missing = load_state(conn, object_id=none)
        assert missing is not None
        assert missing.state is None
        assert missing.state_err == 0.0
        monkeypatch.undo()
        tx.rollback()
    with engine.connect() as conn:
        assert load_states(conn, set(written)) == {}
    if engine.dialect.name == "postgresql":
        # load_states and verify's likelihood_states: 2 statements each (10,006 keys); per
        # array verify's single read and 4 loads of its object (the one out of scope finds no
        # row); the never-stored key's read; the object naming none. Every column in binary (1)
        assert len(formats) == 2 + 2 + 5 * (1 + 4) + 1 + 1
        assert all(set(found) == {1} for found in formats), formats


def _named_in(conn: Connection, oid: str, key: str) -> None:
    """Make ``oid`` name ``key`` in ``conn``'s transaction."""
    conn.execute(text("UPDATE objects SET state_hash = :k WHERE id = :o"), {"k": key, "o": oid})
