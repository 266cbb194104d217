"""``likelihood_states`` statements a survey chunk runs on many keys at once (app.store.states)."""

from __future__ import annotations

from app.db.session import make_engine
from app.store import transaction
from app.store.states import add_refs, count_states, drop_unused, insert_states, load_states


def test_many_keys_are_counted_and_dropped_when_unused(database_url: str) -> None:
    engine = make_engine(database_url)
    try:
        keys = [f"canon2-{n:04d}" for n in range(1200)]  # more than one IN list (500)
        with transaction(engine) as conn:
            before = count_states(conn)
            insert_states(conn, [(key, key.encode(), 0.5, 1) for key in keys])
            # every other state loses its one user, the others keep it or gain one
            add_refs(conn, [(key, -1) for key in keys[::2]])
            add_refs(conn, [(key, 1) for key in keys[1::4]])
            drop_unused(conn, keys)
            kept = load_states(conn, set(keys))
            assert set(kept) == set(keys[1::2])
            assert kept[keys[1]] == (keys[1].encode(), 0.5)
            assert count_states(conn) == before + len(keys) // 2
            # a single key (a submit's: one user left, now none) and no key
            add_refs(conn, [(keys[3], -1)])
            drop_unused(conn, [keys[3]])
            drop_unused(conn, [])
            assert keys[3] not in load_states(conn, {keys[3]})
            # two keys: one unused now, one with two users left (it gained one above)
            add_refs(conn, [(keys[7], -1), (keys[5], -1)])
            drop_unused(conn, [keys[7], keys[5]])
            assert set(load_states(conn, {keys[7], keys[5]})) == {keys[5]}
    finally:
        engine.dispose()
