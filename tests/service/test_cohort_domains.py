"""A cohort's distinct domain texts, read by their hashes (``app.store.surveys.cohort_domains``).

The distinct hashes are read first and their texts after: the same set as a text per object
(which made PostgreSQL sort every member's text: docs/benchmarks.md, "h/plans"), for a labels
cohort, an ids cohort (in several statements) and a scope.
"""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import text

from app.db.session import make_engine
from app.store import ids as ids_
from app.store import surveys as survey_store
from tests.service.conftest import ADMIN_KEY, auth, unique_id
from tests.service.factories import integer_domain


def test_cohort_domains_are_the_members_domain_texts(
    client: TestClient, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    study, other = unique_id("dom"), unique_id("dom")
    ids = []
    for n in range(9):
        oid = unique_id("cd")
        body = {
            "id": oid,
            "domain": integer_domain(2 + n % 3),  # three domains
            "value": {"x": 1},
            "budget": {"epsilon": 1.0},
            "labels": {"study": study, "part": "a" if n < 6 else "b"},
        }
        assert client.post("/v1/objects", json=body, headers=auth(ADMIN_KEY)).status_code == 201
        ids.append(oid)
    outsider = {
        "id": unique_id("cd"),
        "domain": integer_domain(9),
        "value": {"x": 1},
        "budget": {"epsilon": 1.0},
        "labels": {"study": other},
    }
    assert client.post("/v1/objects", json=outsider, headers=auth(ADMIN_KEY)).status_code == 201
    engine = make_engine(database_url)
    try:
        with engine.connect() as conn:

            def texts(of: list[str]) -> set[str]:
                """The domain texts of the objects ``of``, joined row by row."""
                joined = text(
                    "SELECT d.text FROM objects AS o JOIN domains AS d "
                    "ON d.hash = o.domain_hash WHERE o.id = :id"
                )
                return {str(conn.execute(joined, {"id": i}).scalar_one()) for i in of}

            everyone = texts(ids)
            assert len(everyone) == 3
            assert survey_store.cohort_domains(conn, labels={"study": study}) == everyone
            assert survey_store.cohort_domains(conn, ids=ids) == everyone
            assert survey_store.cohort_domains(conn, ids=ids[:1]) == texts(ids[:1])
            scoped = survey_store.cohort_domains(
                conn, labels={"study": study}, scope=[("part", "b")]
            )
            assert scoped == texts(ids[6:])
            assert survey_store.cohort_domains(conn, labels={"study": unique_id("none")}) == set()
            # an ids cohort read in statements of two ids: the texts of all of them, once each
            with_pairs = {"PG_PER_STATEMENT": 2, "SQLITE_PER_STATEMENT": 2}
            for name, value in with_pairs.items():
                monkeypatch.setattr(ids_, name, value)
            assert survey_store.cohort_domains(conn, ids=ids) == everyone
    finally:
        engine.dispose()
