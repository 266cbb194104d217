"""A rejected submit is counted in the data version its decision read (issue 24), PostgreSQL.

A rejection's count (``objects.rejected``) used to be an ``UPDATE`` without the compare-and-set
that an accepted query goes through: a rejection decided on version N whose write landed after a
new data version (``POST /v1/objects/{id}/versions``) had closed N counted itself on N + 1 — N's
closed count missed it and N + 1 counted a rejection its audit event places in N. Now the count
is a compare-and-set on the object's version (and bumps it): the late rejection loses its race
and is decided again against the new version.

Both tests check the same invariant: for every data version, the rejections counted (the closed
version's ``object_versions.rejected``, the current one's ``objects.rejected``) are exactly the
``decision.rejected`` audit events that name that version.
"""

from __future__ import annotations

import json
import threading
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import text

from app.bootstrap import create_app
from app.db.session import make_engine
from app.services import queries as query_service
from tests.service.conftest import ADMIN_KEY, auth, make_settings, new_key, unique_id

BINARY = {"attributes": [{"name": "b", "type": "integer", "low": 0, "high": 1}]}
ADMIN = auth(ADMIN_KEY)
#: basic filter, budget 1.0: one query of ε 0.6 fits a version, a second is rejected.
QUERY = {
    "mechanism": "binary_rr",
    "epsilon": 0.6,
    "predicate": {"attribute": "b", "op": "==", "value": 1},
}


@pytest.fixture(scope="module")
def client(postgres_url: str) -> Iterator[TestClient]:
    with TestClient(create_app(make_settings(postgres_url))) as test_client:
        yield test_client


def _register(client: TestClient) -> str:
    oid = unique_id("rejrace")
    body = {
        "id": oid,
        "domain": BINARY,
        "value": {"b": 1},
        "budget": {"epsilon": 1.0},
        "filter": "basic",
    }
    r = client.post("/v1/objects", headers=ADMIN, json=body)
    assert r.status_code == 201, r.text
    return oid


def _submit(client: TestClient, headers: dict[str, str], oid: str) -> Any:
    return client.post(f"/v1/objects/{oid}/queries", headers=headers, json={"query": QUERY})


def _new_version(client: TestClient, oid: str, value: int, bulk: bool = False) -> Any:
    if bulk:  # holds no lock of the object, as another process's (or replica's) would not
        body = {"versions": [{"id": oid, "value": {"b": value}}]}
        return client.post("/v1/versions", headers=ADMIN, json=body)
    return client.post(f"/v1/objects/{oid}/versions", headers=ADMIN, json={"value": {"b": value}})


def _counts(postgres_url: str, oid: str) -> tuple[dict[int, int], dict[int, int]]:
    """(rejections counted per data version, rejection audit events per data version)."""
    engine = make_engine(postgres_url)
    try:
        with engine.connect() as conn:
            counted = {
                int(v): int(n)
                for v, n in conn.execute(
                    text("SELECT data_version, rejected FROM object_versions WHERE object_id = :o"),
                    {"o": oid},
                )
            }
            current, rejected = conn.execute(
                text("SELECT data_version, rejected FROM objects WHERE id = :o"), {"o": oid}
            ).one()
            counted[int(current)] = int(rejected)
            details = conn.execute(
                text(
                    "SELECT detail FROM audit_events "
                    "WHERE object_id = :o AND kind = 'decision.rejected'"
                ),
                {"o": oid},
            ).scalars()
            events = Counter(int(json.loads(d)["version"]) for d in details)
    finally:
        engine.dispose()
    return counted, {v: events.get(v, 0) for v in counted}


def test_a_rejection_decided_before_a_new_version_is_not_counted_in_it(
    client: TestClient, postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The rejection's decision reads version 1; a new version commits; then it writes.

    The new version goes through bulk versions, which takes no object lock (the in-process lock
    would serialise them here; across uvicorn workers or replicas without Redis nothing does).
    """
    headers = auth(new_key(client, "analyst"))
    oid = _register(client)
    assert _submit(client, headers, oid).status_code == 201  # version 1's budget is spent
    decided, go = threading.Event(), threading.Event()
    calls: list[int] = []
    real_decide = query_service.decide

    def paused_decide(*args: Any, **kwargs: Any) -> Any:
        decision = real_decide(*args, **kwargs)
        calls.append(int(decision.accepted))
        if len(calls) == 1:  # the first decision only: hold it until the new version is in
            decided.set()
            assert go.wait(30)
        return decision

    monkeypatch.setattr(query_service, "decide", paused_decide)
    answers: list[Any] = []
    late = threading.Thread(target=lambda: answers.append(_submit(client, headers, oid)))
    late.start()
    try:
        assert decided.wait(30)
        created = _new_version(client, oid, 0, bulk=True)
        assert created.status_code in (200, 201), created.text
    finally:
        go.set()
        late.join(60)
    assert calls[0] == 0  # it was rejected on version 1 ...
    # ... and decided again on version 2 (a fresh budget): accepted there, nothing counted
    assert calls == [0, 1], calls
    assert answers[0].status_code == 201, answers[0].text
    assert answers[0].json()["version"] == 2
    counted, events = _counts(postgres_url, oid)
    assert counted == events == {1: 0, 2: 0}


def test_threads_rejecting_while_versions_change_count_each_rejection_in_its_version(
    client: TestClient, postgres_url: str
) -> None:
    """Submitters (mostly rejected: each version's budget holds one query) and a versioner run
    together; every version's rejection count matches its rejection events."""
    headers = auth(new_key(client, "analyst"))
    oid = _register(client)
    codes: list[int] = []
    busy: list[int] = []
    guard = threading.Lock()

    def submitter() -> None:
        for _ in range(12):
            r = _submit(client, headers, oid)
            with guard:
                codes.append(r.status_code)

    def versioner() -> None:
        for i in range(6):
            for _ in range(20):  # 503 Busy (Retry-After): too many lost races; retry as told
                r = _new_version(client, oid, i % 2, bulk=i % 2 == 1)
                if r.status_code != 503:
                    break
                with guard:
                    busy.append(i)
            with guard:
                codes.append(r.status_code)

    threads = [threading.Thread(target=submitter) for _ in range(3)]
    threads.append(threading.Thread(target=versioner))
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert set(codes) <= {200, 201, 409}, codes
    assert codes.count(409) > 0
    assert len(busy) < 20, busy
    counted, events = _counts(postgres_url, oid)
    assert len(counted) == 7
    assert counted == events
