"""Scope matrix: every route × {in scope, out of scope, missing}, generated from ``app.routes``.

A project key (issue 25, contract.md "Tenants") sees only the objects whose labels include its
project's scope; any other object must be answered **exactly** as a missing id — same status,
same headers that matter, same body byte for byte — on every endpoint. Each ``(method, path)``
the application serves needs a rule here (:data:`RULES`); a route added without one fails
:func:`test_every_route_has_a_scope_rule`, so a new endpoint cannot ship without saying how a
project key's scope applies to it. Runs on SQLite and PostgreSQL (the ``client`` fixture).

The rules:

* ``OBJECT``: a route of one object. In scope: the documented success. Out of scope and
  missing: 404 ``not-found``, the two answers identical byte for byte.
* ``LISTING``: ``GET /v1/odometers``: an object out of scope is neither listed nor counted in
  ``total`` — the page filtered to it is byte for byte the page of a label nobody carries.
* ``COHORT``: survey creation and dry-run with an ids cohort: an out-of-scope id is "unknown",
  with the same 422 as a missing id (the ids themselves aside); a labels cohort selects only
  within the scope.
* ``SURVEY``: one survey: the project's own survey is served; another's survey is a 404
  identical to a missing survey id. ``SURVEYS``: the listing shows only the project's surveys.
* ``ADMIN``: admin-only routes: a project key (never an admin) gets the same 403 for an id in
  scope, out of scope or missing — the role is checked before anything is read.
* ``STATELESS`` (``/v1/loss``), ``WHOAMI`` and ``PUBLIC`` routes read no object.
"""

from __future__ import annotations

import os
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from tests.service.conftest import ADMIN_KEY, auth, unique_id
from tests.service.factories import integer_domain
from tests.service.test_authz_matrix import ROWS, served_routes

DOMAIN = integer_domain(3)
QUERY = {"mechanism": "grr", "attribute": "x", "epsilon": 0.01}
IN, OUT, MISSING = "in", "out", "missing"
VARIANTS = [IN, OUT, MISSING]
#: A survey id nobody has.
NO_SURVEY = 2_000_000_000


@dataclass(frozen=True)
class World:
    """A project, its keys, and objects and surveys in and out of its scope."""

    project: str
    team: str
    other_team: str
    site: str  # a label both objects carry (only this world's: fixtures may be built twice)
    analyst: str
    viewer: str
    other_analyst: str  # a key of another project
    ids: dict[str, str]  # IN, OUT, MISSING -> an object id
    tags: dict[str, str]  # IN, OUT, MISSING -> a label value only that object carries


def _register(client: TestClient, labels: dict[str, str]) -> str:
    oid = unique_id("scope")
    body = {
        "id": oid,
        "domain": DOMAIN,
        "value": {"x": 1},
        "budget": {"epsilon": 10_000},
        "labels": labels,
    }
    r = client.post("/v1/objects", headers=auth(ADMIN_KEY), json=body)
    assert r.status_code == 201, r.text
    return oid


def _project(client: TestClient, team: str) -> str:
    name = unique_id("team")
    body = {"name": name, "scope": {"labels": {"team": team}}, "quota": {"epsilon": 10_000}}
    r = client.post("/v1/projects", headers=auth(ADMIN_KEY), json=body)
    assert r.status_code == 201, r.text
    return name


def _key(client: TestClient, role: str, project: str) -> str:
    r = client.post("/v1/keys", headers=auth(ADMIN_KEY), json={"role": role, "project": project})
    assert r.status_code == 201, r.text
    assert r.json()["project"] == project
    return str(r.json()["key"])


@pytest.fixture(scope="module")
def world(client: TestClient) -> World:
    team, other_team = secrets.token_hex(4), secrets.token_hex(4)
    project = _project(client, team)
    other = _project(client, other_team)
    tags = {v: unique_id("tag") for v in VARIANTS}
    site = unique_id("site")
    ids = {
        IN: _register(client, {"team": team, "tag": tags[IN], "site": site}),
        OUT: _register(client, {"team": other_team, "tag": tags[OUT], "site": site}),
        MISSING: unique_id("scope"),
    }
    return World(
        project=project,
        team=team,
        other_team=other_team,
        site=site,
        analyst=_key(client, "analyst", project),
        viewer=_key(client, "viewer", project),
        other_analyst=_key(client, "analyst", other),
        ids=ids,
        tags=tags,
    )


Call = Callable[[TestClient, World, str], httpx.Response]


@dataclass(frozen=True)
class Rule:
    """How a project key's scope applies to one route."""

    kind: str
    call: Call
    success: int = 200


def _object(method: str, suffix: str = "", json: Any = None, success: int = 200) -> Rule:
    def call(client: TestClient, world: World, variant: str) -> httpx.Response:
        url = f"/v1/objects/{world.ids[variant]}{suffix}"
        return client.request(method, url, headers=auth(world.analyst), json=json)

    return Rule("OBJECT", call, success)


def _viewer_object(suffix: str) -> Rule:
    def call(client: TestClient, world: World, variant: str) -> httpx.Response:
        return client.get(f"/v1/objects/{world.ids[variant]}{suffix}", headers=auth(world.viewer))

    return Rule("OBJECT", call)


def _odometers(client: TestClient, world: World, variant: str) -> httpx.Response:
    params = {"label": f"tag:{world.tags[variant]}", "include_retired": "true"}
    return client.get("/v1/odometers", params=params, headers=auth(world.viewer))


def _totals(client: TestClient, world: World, variant: str) -> httpx.Response:
    params = {"label": f"tag:{world.tags[variant]}", "include_retired": "true"}
    return client.get("/v1/odometers/totals", params=params, headers=auth(world.viewer))


def _cohort(path: str) -> Call:
    def call(client: TestClient, world: World, variant: str) -> httpx.Response:
        body = {"name": "scope", "query": QUERY, "cohort": {"ids": [world.ids[variant]]}}
        return client.post(path, headers=auth(world.analyst), json=body)

    return call


def _survey_of(client: TestClient, world: World, variant: str) -> int:
    """IN: a survey of the project's analyst; OUT: another project's; MISSING: no survey."""
    if variant == MISSING:
        return NO_SURVEY
    key = world.analyst if variant == IN else world.other_analyst
    oid = _register(client, {"team": world.team if variant == IN else world.other_team})
    body = {"name": "scope", "query": QUERY, "cohort": {"ids": [oid]}}
    r = client.post("/v1/surveys", headers=auth(key), json=body)
    assert r.status_code == 202, r.text
    return int(r.json()["id"])


def _survey(method: str, suffix: str = "") -> Rule:
    def call(client: TestClient, world: World, variant: str) -> httpx.Response:
        survey_id = _survey_of(client, world, variant)
        return client.request(
            method, f"/v1/surveys/{survey_id}{suffix}", headers=auth(world.analyst)
        )

    return Rule("SURVEY", call)


def _surveys(client: TestClient, world: World, variant: str) -> httpx.Response:
    survey_id = _survey_of(client, world, variant)
    r = client.get("/v1/surveys", params={"limit": 200}, headers=auth(world.viewer))
    r.extensions["survey_id"] = survey_id
    return r


def _admin(method: str, path: str) -> Rule:
    """An admin-only route, called by the project's analyst with the variant's id in its path."""

    def call(client: TestClient, world: World, variant: str) -> httpx.Response:
        url = path.format(
            object_id=world.ids[variant], key_id=1, name=world.project, survey_id=NO_SURVEY
        )
        return client.request(method, url, headers=auth(world.analyst), json={})

    return Rule("ADMIN", call, 403)


def _as_authz(route: tuple[str, str], kind: str) -> Rule:
    """A route that reads no object: called as in the authorization matrix, with a project key."""
    row = ROWS[route]

    def call(client: TestClient, world: World, variant: str) -> httpx.Response:
        url, kwargs = row.prepare(client)
        return client.request(route[0], url, headers=auth(world.analyst), **kwargs)

    return Rule(kind, call, row.success)


RULES: dict[tuple[str, str], Rule] = {
    ("GET", "/v1/objects/{object_id}"): _object("GET"),
    ("POST", "/v1/objects/{object_id}/dry-run"): _object("POST", "/dry-run", json={"query": QUERY}),
    ("POST", "/v1/objects/{object_id}/queries"): _object(
        "POST", "/queries", json={"query": QUERY}, success=201
    ),
    ("GET", "/v1/objects/{object_id}/queries"): _object("GET", "/queries"),
    ("GET", "/v1/objects/{object_id}/odometer"): _viewer_object("/odometer"),
    ("GET", "/v1/objects/{object_id}/odometer/history"): _viewer_object("/odometer/history"),
    ("GET", "/v1/odometers"): Rule("LISTING", _odometers),
    ("GET", "/v1/odometers/totals"): Rule("TOTALS", _totals),
    ("POST", "/v1/surveys"): Rule("COHORT", _cohort("/v1/surveys"), 202),
    ("POST", "/v1/surveys/dry-run"): Rule("COHORT", _cohort("/v1/surveys/dry-run")),
    ("GET", "/v1/surveys"): Rule("SURVEYS", _surveys),
    ("GET", "/v1/surveys/{survey_id}"): _survey("GET"),
    ("GET", "/v1/surveys/{survey_id}/responses"): _survey("GET", "/responses"),
    ("DELETE", "/v1/surveys/{survey_id}"): _survey("DELETE"),
    ("POST", "/v1/objects"): _admin("POST", "/v1/objects"),
    ("DELETE", "/v1/objects/{object_id}"): _admin("DELETE", "/v1/objects/{object_id}"),
    ("POST", "/v1/imports"): _admin("POST", "/v1/imports"),
    ("GET", "/v1/audit"): _admin("GET", "/v1/audit"),
    ("GET", "/v1/audit/export"): _admin("GET", "/v1/audit/export"),
    ("POST", "/v1/objects/{object_id}/versions"): _admin(
        "POST", "/v1/objects/{object_id}/versions"
    ),
    ("POST", "/v1/versions"): _admin("POST", "/v1/versions"),
    ("POST", "/v1/keys"): _admin("POST", "/v1/keys"),
    ("GET", "/v1/keys"): _admin("GET", "/v1/keys"),
    ("DELETE", "/v1/keys/{key_id}"): _admin("DELETE", "/v1/keys/{key_id}"),
    ("POST", "/v1/projects"): _admin("POST", "/v1/projects"),
    ("GET", "/v1/projects"): _admin("GET", "/v1/projects"),
    ("GET", "/v1/projects/{name}"): _admin("GET", "/v1/projects/{name}"),
    ("PATCH", "/v1/projects/{name}"): _admin("PATCH", "/v1/projects/{name}"),
    ("DELETE", "/v1/projects/{name}"): _admin("DELETE", "/v1/projects/{name}"),
    ("POST", "/v1/loss"): _as_authz(("POST", "/v1/loss"), "STATELESS"),
    ("GET", "/v1/whoami"): _as_authz(("GET", "/v1/whoami"), "WHOAMI"),
    **{
        route: _as_authz(route, "PUBLIC")
        for route in ROWS
        if route[1] in {"/healthz", "/readyz", "/metrics", "/openapi.json", "/redoc"}
        or route[1].startswith(("/dashboard", "/docs"))
    },
}


def test_every_route_has_a_scope_rule(client: TestClient) -> None:
    """A new route without a scope rule fails (and so does a rule for a route that is gone)."""
    app: FastAPI = client.app  # type: ignore[assignment]
    served = served_routes(app)
    assert served - set(RULES) == set(), "routes without a scope rule in RULES"
    assert set(RULES) - served == set(), "rules for routes the app does not serve"


def _same_answer(out: httpx.Response, missing: httpx.Response, world: World) -> None:
    """The out-of-scope answer is the missing one: status, content type, body byte for byte."""
    assert out.status_code == missing.status_code, (out.text, missing.text)
    assert out.headers["content-type"] == missing.headers["content-type"]
    # an ids cohort's 422 lists the ids it calls unknown: the only difference is the id itself
    body_out = out.content.replace(world.ids[OUT].encode(), b"<id>")
    body_missing = missing.content.replace(world.ids[MISSING].encode(), b"<id>")
    assert body_out == body_missing
    assert world.ids[OUT].encode() not in missing.content


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("route", sorted(RULES), ids=[f"{m} {p}" for m, p in sorted(RULES)])
def test_route_scope_matrix(
    client: TestClient, world: World, route: tuple[str, str], variant: str
) -> None:
    """Each route answers a project key as its rule says, for each variant."""
    rule = RULES[route]
    r = rule.call(client, world, variant)
    if rule.kind in ("ADMIN", "STATELESS", "PUBLIC", "WHOAMI"):
        assert r.status_code == rule.success, r.text[:300]
        if rule.kind == "ADMIN":
            assert r.json()["type"] == "forbidden"
            assert world.ids[variant] not in r.text
        if rule.kind == "WHOAMI":
            assert r.json()["project"] == world.project
        return
    if rule.kind == "LISTING":
        body = r.json()
        assert r.status_code == 200, r.text
        if variant == IN:
            assert [item["id"] for item in body["items"]] == [world.ids[IN]]
            assert body["total"] == 1
        else:
            assert body["items"] == []
            assert body["total"] == 0
            _same_answer(r, rule.call(client, world, MISSING), world)
        return
    if rule.kind == "TOTALS":  # counted as in the listing: the object out of scope is no one
        assert r.status_code == 200, r.text
        assert r.json()["objects"] == (1 if variant == IN else 0)
        if variant != IN:
            _same_answer(r, rule.call(client, world, MISSING), world)
        return
    if rule.kind == "SURVEYS":
        listed = {item["id"] for item in r.json()["items"]}
        assert r.status_code == 200, r.text
        survey_id = r.extensions["survey_id"]
        assert (survey_id in listed) is (variant == IN)
        return
    if variant == IN:
        assert r.status_code == rule.success, r.text[:300]
        return
    missing = r if variant == MISSING else rule.call(client, world, MISSING)
    if rule.kind == "COHORT":
        assert missing.status_code == 422, missing.text
        assert missing.json()["type"] == "invalid-cohort"
    else:
        assert missing.status_code == 404, missing.text
        assert missing.json()["type"] == "not-found"
    if variant == OUT:
        _same_answer(r, missing, world)


def test_a_labels_cohort_selects_within_the_scope(client: TestClient, world: World) -> None:
    """``{"labels": {"site": …}}`` matches both objects; a project key's survey gets one."""
    body = {"name": "scope", "query": QUERY, "cohort": {"labels": {"site": world.site}}}
    r = client.post("/v1/surveys/dry-run", headers=auth(world.analyst), json=body)
    assert r.status_code == 200, r.text
    assert r.json()["members"] == 1
    r = client.post("/v1/surveys/dry-run", headers=auth(ADMIN_KEY), json=body)
    assert r.json()["members"] == 2  # the admin also sees the object out of scope
    # a labels cohort naming only what is out of scope matches nothing, like a label nobody has
    out = {"name": "s", "query": QUERY, "cohort": {"labels": {"tag": world.tags[OUT]}}}
    missing = {"name": "s", "query": QUERY, "cohort": {"labels": {"tag": world.tags[MISSING]}}}
    a = client.post("/v1/surveys", headers=auth(world.analyst), json=out)
    b = client.post("/v1/surveys", headers=auth(world.analyst), json=missing)
    assert a.status_code == b.status_code == 422, a.text
    assert a.content == b.content


def test_an_unscoped_analyst_still_sees_everything(client: TestClient, world: World) -> None:
    """Keys outside projects are unscoped: both objects answer."""
    r = client.post("/v1/keys", headers=auth(ADMIN_KEY), json={"role": "analyst"})
    analyst = r.json()["key"]
    assert r.json()["project"] is None
    for variant in (IN, OUT):
        r = client.get(f"/v1/objects/{world.ids[variant]}", headers=auth(analyst))
        assert r.status_code == 200, r.text


def test_a_reused_idempotency_key_out_of_scope_is_still_a_404(
    client: TestClient, world: World
) -> None:
    """Another client's Idempotency-Key on an out-of-scope object never answers its 422."""
    key = unique_id("idem")
    r = client.post(
        f"/v1/objects/{world.ids[OUT]}/queries",
        headers={**auth(world.other_analyst), "Idempotency-Key": key},
        json={"query": QUERY},
    )
    assert r.status_code == 201, r.text
    out = client.post(
        f"/v1/objects/{world.ids[OUT]}/queries",
        headers={**auth(world.analyst), "Idempotency-Key": key},
        json={"query": QUERY},
    )
    missing = client.post(
        f"/v1/objects/{world.ids[MISSING]}/queries",
        headers={**auth(world.analyst), "Idempotency-Key": key},
        json={"query": QUERY},
    )
    assert out.status_code == 404, out.text
    _same_answer(out, missing, world)


#: Pairs of requests of the timing test (``GATEKEEPER_SCOPE_TIMING_SAMPLES``; docs/reliability.md
#: records a run with 3,000).
TIMING_SAMPLES = int(os.environ.get("GATEKEEPER_SCOPE_TIMING_SAMPLES", "400"))


@pytest.mark.slow
def test_out_of_scope_and_missing_take_the_same_time(client: TestClient, world: World) -> None:
    """The two 404s' latencies are one distribution (two-sample Kolmogorov–Smirnov, 1% level).

    Both read one row by primary key (the scope is checked on the row read). The requests go
    in pairs, an out-of-scope and a missing one right after each other in an order drawn at
    random (as ``tests/service/test_timing.py`` sends its submits), so that every stretch of a
    slow machine holds as many of each: with all requests shuffled at once, a stretch could hold
    more of one kind, and on two busy cores the test refused at medians of 5.8 against 4.7 ms
    (p = 0.002), a gap no quiet run shows.

    With ``-s`` it prints the medians, the test's p and, for information, a paired test's
    (Wilcoxon signed-rank on the differences within the pairs: it resolves a smaller shift,
    docs/reliability.md "Timing").
    """

    from scipy.stats import ks_2samp, wilcoxon

    latencies: dict[str, list[float]] = {OUT: [], MISSING: []}
    headers = auth(world.analyst)
    for _ in range(TIMING_SAMPLES):
        pair = (OUT, MISSING) if secrets.randbelow(2) else (MISSING, OUT)
        for variant in pair:
            start = time.perf_counter()
            r = client.get(f"/v1/objects/{world.ids[variant]}/odometer", headers=headers)
            latencies[variant].append(time.perf_counter() - start)
            assert r.status_code == 404
    result = ks_2samp(latencies[OUT], latencies[MISSING])
    pairs = [a - b for a, b in zip(latencies[OUT], latencies[MISSING], strict=True)]
    summary = (
        f"{TIMING_SAMPLES} pairs: median out of scope"
        f" {1e3 * sorted(latencies[OUT])[TIMING_SAMPLES // 2]:.3f} vs missing"
        f" {1e3 * sorted(latencies[MISSING])[TIMING_SAMPLES // 2]:.3f} ms, KS p ="
        f" {result.pvalue:.3f} (paired Wilcoxon p = {wilcoxon(pairs).pvalue:.4f}, not tested)"
    )
    print(summary)
    assert result.pvalue > 0.01, summary


def _plan_work(conn: Any, sql: str, params: dict[str, Any]) -> tuple[int, int]:
    """The buffers a statement's run touches (hit or read: EXPLAIN ANALYZE) and its rows."""
    plan = conn.exec_driver_sql(f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {sql}", params).scalar()
    top = plan[0]["Plan"]
    return top["Shared Hit Blocks"] + top["Shared Read Blocks"], top["Actual Rows"]


def test_out_of_scope_and_missing_touch_the_same_buffers(
    client: TestClient, world: World, database_url: str
) -> None:
    """The timing test's cause, counted (PostgreSQL): each scoped read — a dry-run's load, a
    submit's, the object view's (``get_object``: odometers, histories) and an ids cohort's
    check — touches as many buffers for an object out of scope as for a missing id, and keeps
    no row. Before h/scope the out-of-scope read touched one more: the object's heap page.

    A fresh object is the decoy a missing id reads in its place; ``VACUUM`` first, once no
    survey of the module is running, so that no page's visibility changes between the runs.
    The reads are planned as on a table of more than a few pages (``enable_seqscan`` off):
    this module's dozen objects fit in three pages, which PostgreSQL scans rather than probes.
    """
    if not database_url.startswith("postgresql"):
        pytest.skip("buffer counts are PostgreSQL's (EXPLAIN ANALYZE BUFFERS)")
    from app.db.session import make_engine
    from app.store import objects
    from app.store.surveys import unknown_ids

    decoy = _register(client, {"team": world.other_team, "site": unique_id("decoy")})
    _settled_surveys(client, world)
    engine = make_engine(database_url, pool_size=1, max_overflow=0)
    scope = [("team", world.team)]
    try:
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.exec_driver_sql("VACUUM objects")
            conn.exec_driver_sql("SET enable_seqscan = off")
            objects._decoys[engine] = decoy  # the row a missing id reads in its place
            runs: list[tuple[str, Callable[[str], dict[str, Any]]]] = []
            for read, unscoped in (
                (objects._READ_STATE, objects._LOAD_STATE_PG),
                (objects._READ_FOR_SUBMIT, objects._LOAD_FOR_SUBMIT_PG),
            ):
                load, values = objects._compiled_load(conn, read, unscoped, scope)
                runs.append(
                    (
                        load.text,
                        lambda oid, c=load, v=values: c.params({"object_id": oid, "key": "k", **v}),
                    )
                )
            get, values = objects._in_scope(conn, objects._READ_RECORD, scope)
            text = get.compile(dialect=conn.dialect)
            runs.append(
                (str(text), lambda oid, c=text, v=values: {**c.params, **v, "object_id": oid})
            )
            assert unknown_ids(conn, [world.ids[OUT]], scope) == [world.ids[OUT]]
            among = objects._scoped_among[True, ("team",)].compile(dialect=conn.dialect)
            runs.append((str(among), lambda oid, c=among, v=values: {**c.params, **v, "ids": oid}))
            for sql, params in runs:
                out = _plan_work(conn, sql, params(world.ids[OUT]))
                missing = _plan_work(conn, sql, params(world.ids[MISSING]))
                assert out == missing, (sql, out, missing)
                assert out[1] == 0
    finally:
        engine.dispose()


def _settled_surveys(client: TestClient, world: World) -> dict[str, Any]:
    """The survey listing once no survey of the module's earlier tests is queued or running.

    A survey an earlier test started may still be finishing in the background (its member
    decided, its status not yet ``done``): listed before it ends and after, it would differ
    by its own progress, not by anything the test under way created.
    """
    deadline = time.monotonic() + 60
    while True:
        listing: dict[str, Any] = client.get(
            "/v1/surveys", params={"limit": 200}, headers=auth(world.viewer)
        ).json()
        if all(item["status"] not in ("queued", "running") for item in listing["items"]):
            return listing
        assert time.monotonic() < deadline, "an earlier test's survey did not finish in 60 s"
        time.sleep(0.05)


@pytest.mark.parametrize("path", ["/v1/surveys", "/v1/surveys/dry-run"])
def test_a_cohort_mixing_ids_in_and_out_of_scope_names_only_the_unknown(
    client: TestClient, world: World, path: str
) -> None:
    """Issue 25 bad input: an ids cohort with an id out of scope is refused exactly as with a
    missing id — 422 ``invalid-cohort`` naming ``cohort.ids``, ``unknown_ids`` the one id — and
    the id in scope is not mentioned; nothing is created."""
    before = _settled_surveys(client, world)
    answers = {}
    for variant in (OUT, MISSING):
        ids = [world.ids[IN], world.ids[variant]]
        body = {"name": "mixed", "query": QUERY, "cohort": {"ids": ids}}
        r = client.post(path, headers=auth(world.analyst), json=body)
        assert r.status_code == 422, r.text
        problem = r.json()
        assert problem["type"] == "invalid-cohort"
        assert problem["errors"] == [
            {"field": "cohort.ids", "message": "names objects that do not exist"}
        ]
        assert problem["unknown_ids"] == [world.ids[variant]]
        assert world.ids[IN] not in r.text
        answers[variant] = r
    _same_answer(answers[OUT], answers[MISSING], world)
    after = client.get("/v1/surveys", params={"limit": 200}, headers=auth(world.viewer)).json()
    assert after["items"] == before["items"]
