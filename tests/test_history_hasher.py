"""The history hashes' prebuilt BLAKE2b (``app.services.snapshots``): copied, never updated.

Every history hash and state key starts from a copy of one empty hasher; one call that updated
the shared hasher itself would change every later digest (and each thread's, at once).
"""

from __future__ import annotations

import hashlib
import threading

from app.services import snapshots
from app.services.snapshots import history_hashes_after, next_history_hash, state_key

EMPTY = hashlib.blake2b(digest_size=16).hexdigest()


def test_the_shared_hasher_stays_empty_and_the_digests_repeat() -> None:
    first = [
        next_history_hash("ab", '{"q":1}', '"a"'),
        history_hashes_after('{"q":1}', '"a"')("ab"),
        state_key("dom", "0123"),
    ]
    for _ in range(3):
        assert [
            next_history_hash("ab", '{"q":1}', '"a"'),
            history_hashes_after('{"q":1}', '"a"')("ab"),
            state_key("dom", "0123"),
        ] == first
    assert first[0] == first[1]
    assert snapshots._BLAKE2B_128.hexdigest() == EMPTY


def test_threads_hashing_at_once_get_the_digests_of_one_thread() -> None:
    expected = [next_history_hash(str(n), "q", "o") for n in range(200)]
    results: list[list[str]] = []

    def hash_all() -> None:
        step = history_hashes_after("q", "o")
        results.append([step(str(n)) for n in range(200) for _ in range(20)][::20])

    threads = [threading.Thread(target=hash_all) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == [expected] * 4
    assert snapshots._BLAKE2B_128.hexdigest() == EMPTY
