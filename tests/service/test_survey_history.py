"""Survey answers packed per chunk are part of every object's history (issue #13's storage).

An object's history is its single-submit rows and its survey answers (in the chunks covering
its id): the history API, the odometer history, continuous snapshots and ``gatekeeper
verify`` all see both, in sequence order; verify finds answers that were tampered with.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, select, update

from app.bootstrap import create_app
from app.db.models import Base, ProtectedObject, Survey, SurveyChunk
from app.db.session import make_engine
from app.services import snapshots
from app.services.verify import (
    Report,
    verify_all,
    verify_object,
    verify_project_states,
    verify_states,
    verify_surveys,
)
from app.store.chunks import (
    ChunkCache,
    Variant,
    chunks_covering,
    decided_columns,
    decode,
    load_chunks,
    pack_sorted,
)
from app.store.verify import objects
from tests.service.conftest import ADMIN_KEY, auth, make_settings, new_key, unique_id
from tests.service.test_surveys import GRR, import_study, verify_clean, wait_done


def cut_members(ids: Iterable[str], *, survey_id: int, size: int) -> list[dict[str, Any]]:
    """``survey_chunks`` rows (pending) holding ``ids`` sorted, ``size`` members a chunk."""
    return list(pack_sorted(sorted(ids), survey_id=survey_id, size=size))


CHUNK = 4
CONT_DOMAIN = {
    "attributes": [
        {"name": "x1", "type": "real", "low": -1, "high": 1},
        {"name": "x2", "type": "real", "low": -1, "high": 1},
    ]
}
LINEAR = {
    "mechanism": "linear",
    "weights": {"x1": 0.25, "x2": 0.25},
    "intercept": 0.0,
    "range": [-0.5, 0.5],
    "epsilon": 0.5,
}


@pytest.fixture(scope="module")
def client(database_url: str) -> Iterator[TestClient]:
    """An app cutting surveys into chunks of four members."""
    settings = make_settings(database_url, survey_chunk_size=CHUNK)
    with TestClient(create_app(settings)) as test_client:
        yield test_client


def _survey(client: TestClient, headers: dict[str, str], study: str, query: dict[str, Any]) -> Any:
    body = {"name": "h", "query": query, "cohort": {"labels": {"study": study}}}
    r = client.post("/v1/surveys", headers=headers, json=body)
    assert r.status_code == 202, r.text
    return wait_done(client, headers, r.json()["id"])


def _submit(client: TestClient, headers: dict[str, str], oid: str) -> Any:
    r = client.post(f"/v1/objects/{oid}/queries", headers=headers, json={"query": GRR})
    assert r.status_code == 201, r.text
    return r.json()


def _history(client: TestClient, headers: dict[str, str], oid: str, **params: Any) -> Any:
    r = client.get(f"/v1/objects/{oid}/queries", headers=headers, params=params)
    assert r.status_code == 200, r.text
    return r.json()


def test_history_interleaves_submits_and_survey_answers(
    client: TestClient, database_url: str
) -> None:
    first, second = auth(new_key(client, "analyst")), auth(new_key(client, "analyst"))
    study = unique_id("hist")
    ids = import_study(client, study, 10)
    oid = ids[5]
    submitted = [_submit(client, first, oid)]
    one = _survey(client, first, study, GRR)
    submitted.append(_submit(client, first, oid))
    two = _survey(client, second, study, GRR)
    assert one["progress"]["accepted"] == two["progress"]["accepted"] == 10

    admin = auth(ADMIN_KEY)
    items = _history(client, admin, oid)["items"]
    assert [i["seq"] for i in items] == [1, 2, 3, 4]
    assert [i["survey_id"] for i in items] == [None, one["id"], None, two["id"]]
    assert [i["query_id"] for i in items] == [
        submitted[0]["query_id"],
        None,
        submitted[1]["query_id"],
        None,
    ]
    responses = {}
    for survey in (one, two):
        r = client.get(
            f"/v1/surveys/{survey['id']}/responses", headers=admin, params={"limit": 100}
        )
        responses[survey["id"]] = {i["object_id"]: i["output"] for i in r.json()["items"]}
    assert items[1]["output"] == responses[one["id"]][oid]
    assert items[3]["output"] == responses[two["id"]][oid]
    # the bounds after each entry follow one another as the odometer moved
    r = client.get(f"/v1/objects/{oid}/odometer/history", headers=admin)
    points = r.json()["points"]
    assert [p["accepted"] for p in points] == [1, 2, 3, 4]
    assert [p["basic_composition"] for p in points] == pytest.approx([1.0, 2.0, 3.0, 4.0])
    odometer = client.get(f"/v1/objects/{oid}/odometer", headers=admin).json()
    assert points[-1]["realized_loss"] == odometer["realized_loss"]

    # paging walks both kinds: one item a page
    seen, after = [], 0
    while True:
        page = _history(client, admin, oid, limit=1, after=after)
        seen.extend(i["seq"] for i in page["items"])
        if page["next_after"] is None:
            break
        after = page["next_after"]
    assert seen == [1, 2, 3, 4]
    # an analyst sees its own submits and its own surveys' answers only
    assert [i["seq"] for i in _history(client, first, oid)["items"]] == [1, 2, 3]
    assert [i["seq"] for i in _history(client, second, oid)["items"]] == [4]
    verify_clean(database_url)


def test_continuous_snapshots_replay_survey_answers(client: TestClient, database_url: str) -> None:
    analyst = auth(new_key(client, "analyst"))
    study = unique_id("cont")
    body = {
        "objects": [
            {
                "id": f"{study}-{i}",
                "domain": CONT_DOMAIN,
                "value": {"x1": (i - 3) / 4, "x2": 0.5 - i / 8},
                "budget": {"epsilon": 3},
                "labels": {"study": study},
            }
            for i in range(6)
        ]
    }
    r = client.post("/v1/imports", headers=auth(ADMIN_KEY), json=body)
    assert r.status_code == 200, r.text
    survey = _survey(client, analyst, study, LINEAR)
    assert survey["progress"]["accepted"] == 6
    oid = f"{study}-2"
    odometer = client.get(f"/v1/objects/{oid}/odometer", headers=analyst).json()
    assert odometer["realized_loss"]["upper"] > 0
    snapshots.HISTORIES.clear()  # the next decision must read the history from the database
    r = client.post(f"/v1/objects/{oid}/dry-run", headers=analyst, json={"query": LINEAR})
    assert r.status_code == 200, r.text
    now = r.json()["realized_loss"]
    assert now["lower"] <= odometer["realized_loss"]["upper"] + 1e-9
    assert now["upper"] >= odometer["realized_loss"]["lower"] - 1e-9
    assert now["upper"] > 0  # a history without the survey's answer would have no loss
    r = client.post(f"/v1/objects/{oid}/queries", headers=analyst, json={"query": LINEAR})
    assert r.status_code == 201, r.text
    assert r.json()["seq"] == 2
    snapshots.HISTORIES.clear()
    verify_clean(database_url)


def _tampered(
    engine: Engine, change: Callable[[Any], None], restore: Callable[[Any], None]
) -> list[str]:
    try:
        with engine.begin() as conn:
            change(conn)
        return verify_all(engine).problems
    finally:
        with engine.begin() as conn:
            restore(conn)


def test_verify_finds_tampered_survey_answers(client: TestClient, database_url: str) -> None:
    analyst = auth(new_key(client, "analyst"))
    study = unique_id("tamp")
    ids = import_study(client, study, 6)
    survey = _survey(client, analyst, study, GRR)
    chunks = SurveyChunk.__table__
    first = (chunks.c.survey_id == survey["id"], chunks.c.chunk == 0)
    engine = make_engine(database_url)
    try:
        with engine.connect() as conn:
            row = conn.execute(select(chunks).where(*first)).one()
        original = {"members": row.members, "picks": row.picks, "seqs": row.seqs}

        def chunk_with(**values: Any) -> Callable[[Any], None]:
            def apply(conn: Any) -> None:
                conn.execute(update(chunks).where(*first).values(**values))

            return apply

        restore = chunk_with(**original)
        picks, seqs = json.loads(row.picks), json.loads(row.seqs)
        # an answer turned into a refusal: the object's history lost it
        problems = _tampered(engine, chunk_with(picks=json.dumps([-1, *picks[1:]])), restore)
        assert f"{ids[0]}: accepted=1 but 0 queries are stored" in problems
        assert any(f"survey {survey['id']}: total/decided/accepted" in p for p in problems)
        # an answer renumbered
        problems = _tampered(engine, chunk_with(seqs=json.dumps([2, *seqs[1:]])), restore)
        assert f"{ids[0]}: sequence numbers are not 1..1" in problems
        # a refusal with a sequence number, an unknown pick
        bad = json.dumps([-2, 99, *picks[2:]])
        problems = _tampered(engine, chunk_with(picks=bad), restore)
        assert any(f"member {ids[0]}: pick -2 / seq 1 is invalid" in p for p in problems)
        assert any(f"member {ids[1]}: pick 99 / seq 1 is invalid" in p for p in problems)
        # members out of order
        members = row.members.split("\n")
        swapped = "\n".join([members[1], members[0], *members[2:]])
        problems = _tampered(engine, chunk_with(members=swapped), restore)
        assert any("members are not" in p and "sorted distinct ids" in p for p in problems)
    finally:
        engine.dispose()
    verify_clean(database_url)


def _one_by_one(engine: Engine) -> list[str]:
    """Verify's problems found object by object (each history read on its own)."""
    report = Report()
    with engine.connect() as conn:
        for row in objects(conn):
            verify_object(conn, row, report)
        verify_states(conn, report)
        verify_surveys(conn, report)
        verify_project_states(conn, report)
    return report.problems


def test_paged_verify_finds_what_object_by_object_finds(
    client: TestClient, database_url: str
) -> None:
    """Pages of any size (across chunk boundaries) see the same histories and mismatches."""
    analyst = auth(new_key(client, "analyst"))
    study = unique_id("page")
    ids = import_study(client, study, 11)  # three chunks of four
    _survey(client, analyst, study, GRR)
    _submit(client, analyst, ids[6])
    _survey(client, analyst, study, GRR)
    engine = make_engine(database_url)
    objects_table = ProtectedObject.__table__
    chunks = SurveyChunk.__table__
    try:
        with engine.connect() as conn:
            survey_id = conn.execute(select(Survey.id).order_by(Survey.id.desc())).scalars().first()
            middle = (chunks.c.survey_id == survey_id, chunks.c.chunk == 1)
            row = conn.execute(select(chunks).where(*middle)).one()
            loss = conn.execute(
                select(objects_table.c.loss_upper).where(objects_table.c.id == ids[9])
            ).scalar_one()
        picks = json.loads(row.picks)

        def change(conn: Any) -> None:
            # a survey answer of chunk 1 turned into a refusal, another object's loss moved
            refused = json.dumps([picks[0], -1, *picks[2:]])
            conn.execute(update(chunks).where(*middle).values(picks=refused))
            conn.execute(
                update(objects_table)
                .where(objects_table.c.id == ids[9])
                .values(loss_upper=loss + 0.5)
            )

        def restore(conn: Any) -> None:
            conn.execute(update(chunks).where(*middle).values(picks=row.picks))
            conn.execute(
                update(objects_table).where(objects_table.c.id == ids[9]).values(loss_upper=loss)
            )

        with engine.begin() as conn:
            change(conn)
        try:
            expected = _one_by_one(engine)
            lost = row.members.split("\n")[1]
            assert f"{lost}: accepted=2 but 1 queries are stored" in expected
            assert f"{ids[9]}: stored loss bounds differ from the history's" in expected
            for size in (1, 3, 4, 5, 1000):
                report = verify_all(engine, page_size=size)
                assert sorted(report.problems) == sorted(expected), size
                assert report.checked >= 11
        finally:
            with engine.begin() as conn:
                restore(conn)
        report = verify_all(engine, page_size=3)
        assert report.ok, report.problems
        # the study's members drew from a few outputs: fewer histories replayed than objects
        assert report.replays < report.checked
    finally:
        engine.dispose()


# ------------------------------------------------------------------------------ the format
def test_chunks_hold_sorted_members_and_decode_their_decisions() -> None:
    rows = cut_members(["c", "a", "e", "b", "d"], survey_id=3, size=2)
    assert [(r["chunk"], r["first_id"], r["last_id"], r["size"]) for r in rows] == [
        (0, "a", "b", 2),
        (1, "c", "d", 2),
        (2, "e", "e", 1),
    ]
    with pytest.raises(ValueError, match="out of order: 'a' after 'b'"):
        list(pack_sorted(["a", "b", "a"], survey_id=3, size=2))
    with pytest.raises(ValueError, match="out of order"):
        list(pack_sorted(["a", "a"], survey_id=3, size=5))  # repeated
    variant = Variant('{"q":1}', '"yes"', 1.0, "1", 0.1, 0.2, 2.0)
    columns = decided_columns([0, -3], [4, 0], [variant])
    row = type("Row", (), {**rows[0], "decided_at": None, **columns})
    chunk = decode(row)
    accepted, refused = chunk.answer("a"), chunk.answer("b")
    assert accepted is not None
    assert refused is not None
    assert (accepted.status, accepted.seq, accepted.variant) == ("accepted", 4, variant)
    assert (refused.status, refused.reason, refused.variant) == ("refused", "retired", None)
    assert chunk.answer("c") is None
    pending = decode(
        type(
            "Row",
            (),
            {**rows[1], "decided_at": None, "picks": None, "seqs": None, "variants": None},
        )
    )
    assert pending.decision(0).status == "pending"


def test_chunk_cache_returns_what_it_evicts_meanwhile(tmp_path: Any) -> None:
    engine = make_engine(f"sqlite:///{tmp_path / 'c.db'}")
    try:
        Base.metadata.create_all(engine)
        with engine.begin() as conn:
            conn.execute(
                Survey.__table__.insert(),
                {"id": 1, "name": "s", "query": "{}", "cohort": "{}", "fingerprint": "f"}
                | {"status": "queued", "total": 10},
            )
            conn.execute(
                SurveyChunk.__table__.insert(),
                cut_members([f"m{i:02d}" for i in range(10)], survey_id=1, size=2),
            )
        with engine.connect() as conn:
            cache = ChunkCache(capacity=2)
            keys = [(1, 0), (1, 1)]
            assert [c.chunk for c in cache.get_many(conn, keys)] == [0, 1]
            got = cache.get_many(conn, [(1, 0), (1, 2), (1, 3), (1, 4)])
            assert [c.chunk for c in got] == [0, 2, 3, 4]
            assert sorted(load_chunks(conn, [(1, 4), (1, 4)])) == [(1, 4)]
            with pytest.raises(LookupError, match="no chunk 9"):
                cache.get_many(conn, [(1, 9)])
            assert chunks_covering(conn, "m02") == []  # pending chunks hold no answer yet
        with engine.begin() as conn:
            decided = {"decided_at": datetime.now(UTC), "picks": "[-1,-1]", "seqs": "[0,0]"}
            conn.execute(
                update(SurveyChunk.__table__).where(SurveyChunk.chunk == 1).values(**decided)
            )
        with engine.connect() as conn:
            assert chunks_covering(conn, "m02") == chunks_covering(conn, "m03") == [(1, 1)]
            assert chunks_covering(conn, "m021") == [(1, 1)]  # covered, not a member
            assert chunks_covering(conn, "m04") == chunks_covering(conn, "a") == []
            assert chunks_covering(conn, "m09") == []  # the last chunk: pending
    finally:
        engine.dispose()
