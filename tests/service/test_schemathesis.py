"""Schemathesis against the app's own OpenAPI document, in process, on SQLite and PostgreSQL.

Every operation of ``/openapi.json`` gets at least ``EXAMPLES`` generated requests (100 per
operation on each backend in CI; ``GATEKEEPER_SCHEMATHESIS_EXAMPLES=1000`` is the full run that
docs/reliability.md records, by hand: at 1,000 the SQLite run alone took 673–719 s of a CI run,
the longest test of the suite, which the rest could not cover on the other core), with the
exceptions of ``FEW_CASES``, plus the explicit examples and schemathesis's coverage cases
(boundary and negative values), sent through the ASGI
transport — no server, no network. Every built-in check runs (schemathesis enables all of them by
default; one is off for two operations, see ``KEPT_AFTER_DELETE``): no 5xx, status codes, content
types, bodies and headers as documented, schema-invalid input rejected with a 4xx, schema-valid
input accepted, auth not ignored, 405 with ``Allow`` for undocumented methods. On top of that every
4xx/5xx answer must be ``application/problem+json`` with ``type``, ``title``, ``status`` (equal to
the HTTP status) and ``detail``.

The run is authenticated as an admin key of its own, and ``DELETE /v1/keys/{key_id}`` is never
generated with that key's id, so the run cannot lock itself out (every other key id is fair game).
Positive request bodies that JSON Schema cannot make meaningful (a value must be a point of the
domain, a query must name an attribute of it, a declared ε must be the mechanism's tight ε, a
survey's cohort must match registered objects, a key's project must name an existing project and
a project key may not be an admin key, a project's scope labels must have valid label names, as
an object's labels, a new version's value must be a point of its object's domain, an audit
export's ``since`` must be an RFC 3339 time with an offset and is exclusive with ``after``) may be
answered with 422: that is documented and configured for those operations only
(``SEMANTIC_422``).
"""

from __future__ import annotations

import os
import time
from collections import Counter
from typing import Any

import pytest
import schemathesis
from schemathesis.config import SchemathesisConfig
from schemathesis.engine import Status, events
from schemathesis.engine import from_schema as engine_for
from schemathesis.python import asgi
from sqlalchemy.orm import Session

from app.bootstrap import create_app
from app.db.models import ApiKey
from app.db.session import make_engine
from app.services.auth import generate_key, hash_key
from tests.service.conftest import make_settings

PROBLEM = "application/problem+json"
#: generated cases per operation, on each backend (see the module docstring)
EXAMPLES = int(os.environ.get("GATEKEEPER_SCHEMATHESIS_EXAMPLES", "100"))
#: Generated sequences of the stateful phase (links between operations), at most.
STATEFUL_EXAMPLES = 100
#: Operations that get fewer cases than asked, and why: no input at all (one distinct request),
#: or schemathesis's fuzzer stops early (measured: ``POST /v1/keys`` about 200 cases, whose body
#: is a role enum and a label; ``DELETE /v1/objects/{object_id}`` one fuzzed case, the fuzzer
#: filling the path from ids it saw, and ``DELETE /v1/surveys/{survey_id}`` about 40 for the same
#: reason; ``DELETE /v1/keys/{key_id}`` about 30 on PostgreSQL, the run's own key id being
#: filtered out; ``DELETE /v1/projects/{name}`` 21 on SQLite, its only input the path's name;
#: the arbitrary ids of these are fuzzed in test_http_contract.py, and a project's deletion is
#: tested in test_projects.py).
FEW_CASES = {
    "GET /healthz",
    "GET /metrics",
    "GET /readyz",
    "POST /v1/keys",
    "DELETE /v1/objects/{object_id}",
    "DELETE /v1/keys/{key_id}",
    "DELETE /v1/surveys/{survey_id}",
    "DELETE /v1/projects/{name}",
}
#: Reads that stay 200 after a successful DELETE of the same path, by contract: ``DELETE`` on a
#: survey cancels it (contract.md "Population surveys": members not yet decided are not queried,
#: accepted ones stay), and the cancelled survey, its estimate and responses remain readable.
#: schemathesis's ``use_after_free`` check assumes DELETE removes; it is off for these only.
KEPT_AFTER_DELETE = ("GET /v1/surveys/{survey_id}", "GET /v1/surveys/{survey_id}/responses")
#: Operations whose schema-valid bodies can still be semantically invalid (see module docstring).
SEMANTIC_422 = (
    "POST /v1/objects",
    "POST /v1/imports",
    "POST /v1/surveys",
    "POST /v1/surveys/dry-run",
    "POST /v1/loss",
    "POST /v1/objects/{object_id}/dry-run",
    "POST /v1/objects/{object_id}/queries",
    "POST /v1/keys",
    "POST /v1/projects",
    "POST /v1/objects/{object_id}/versions",
    "POST /v1/versions",
    "GET /v1/audit/export",
)
#: The run's own admin key id: far from the boundaries (1, 2, 2**31 - 1) the coverage phase tries
#: for ``DELETE /v1/keys/{key_id}``; the fuzzing phase is kept off it by a filter hook.
RUN_KEY_ID = 1_000_003


@schemathesis.check
def problem_json(ctx: Any, response: Any, case: Any) -> bool | None:
    """Every 4xx/5xx is problem+json with type, title, status (= the HTTP status) and detail."""
    if response.status_code < 400:
        return None
    content_type = response.headers.get("content-type", [""])
    content_type = content_type[0] if isinstance(content_type, list) else content_type
    if not content_type.startswith(PROBLEM):
        raise AssertionError(f"{response.status_code} answered as {content_type!r}")
    body = response.json()
    missing = [f for f in ("type", "title", "detail") if not isinstance(body.get(f), str)]
    if missing or body.get("status") != response.status_code:
        raise AssertionError(f"not a problem body: missing {missing}, status {body.get('status')}")
    return None


def _config(key: str, examples: int) -> SchemathesisConfig:
    semantic = {
        "positive_data_acceptance": {
            "expected-statuses": ["2xx", "401", "403", "404", "409", "422", "429"]
        }
    }
    # in the fuzzing phases and in the stateful one (whose links reach the object-scoped
    # operations with ids that exist, where a schema-valid query can still name an attribute
    # the object's domain lacks)
    positive_with_422 = {"checks": semantic, "phases": {"stateful": {"checks": semantic}}}
    no_free = {"use_after_free": {"enabled": False}}
    kept = {"checks": no_free, "phases": {"stateful": {"checks": no_free}}}
    return SchemathesisConfig.from_dict(
        {
            "auth": {"openapi": {"HTTPBearer": {"bearer": key}}},
            # no example database: it only replays failures across runs (CI starts afresh),
            # and writing every example to it took 40% of the run (65.5 s against 38.4 s)
            "generation": {"max-examples": examples, "database": "none"},
            # the stateful phase's examples are sequences of calls over every operation (1000
            # of them were 6,000 requests, a third of the run): capped at STATEFUL_EXAMPLES
            "phases": {
                "stateful": {"generation": {"max-examples": min(examples, STATEFUL_EXAMPLES)}}
            },
            "operations": [{"include-name": name, **positive_with_422} for name in SEMANTIC_422]
            + [{"include-name": name, **kept} for name in KEPT_AFTER_DELETE],
        }
    )


def _run_key(database_url: str) -> str:
    """Store the run's admin key with id :data:`RUN_KEY_ID`; answer its secret."""
    engine = make_engine(database_url, 1, 0)
    secret = generate_key()
    try:
        with Session(engine, expire_on_commit=False) as session, session.begin():
            session.add(
                ApiKey(
                    id=RUN_KEY_ID,
                    key_hash=hash_key(secret),
                    prefix=secret[:10],
                    role="admin",
                    label="schemathesis",
                )
            )
    finally:
        engine.dispose()
    return secret


def run_schemathesis(database_url: str, examples: int) -> tuple[Counter[str], list[str], float]:
    """Run every phase of schemathesis on the app; answer (requests per operation, failures, s)."""
    # a short limit on bound computations keeps a generated calculator history from holding a
    # case for seconds; a limit hit is a normal, sound answer ("status": "limit")
    app = create_app(make_settings(database_url, bound_time_limit=0.2))
    key = _run_key(database_url)
    key_id = RUN_KEY_ID
    try:
        schema = schemathesis.openapi.from_asgi("/openapi.json", app, config=_config(key, examples))

        @schema.hook("filter_path_parameters")
        def _spare_own_key(context: Any, path_parameters: dict[str, Any] | None) -> bool:
            return not path_parameters or path_parameters.get("key_id") != key_id

        sent: Counter[str] = Counter()
        failures: list[str] = []
        start = time.perf_counter()
        for event in engine_for(schema).execute():
            if isinstance(event, events.ScenarioFinished):
                sent[event.recorder.label] += len(event.recorder.interactions)
                # a failed check ends the operation's fuzzing early and is reported here, not
                # in EngineFinished.failures (which holds only class-based after_run failures)
                failures.extend(
                    f"{event.recorder.label}: "
                    f"{event.recorder.cases[case_id].value.operation.label}: {check.name}: "
                    f"{getattr(check.failure_info, 'failure', check.failure_info)}"
                    for case_id, checks in event.recorder.checks.items()
                    for check in checks
                    if check.status == Status.FAILURE
                )
            elif isinstance(event, events.NonFatalError | events.FatalError):
                failures.append(f"error: {event!r}")
            elif isinstance(event, events.EngineFinished):
                failures.extend(f"{f.operation}: {f.title}: {f.message}" for f in event.failures)
        return sent, failures, time.perf_counter() - start
    finally:
        asgi.shutdown_lifespans()


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
@pytest.mark.slow
def test_openapi_contract(backend: str, request: pytest.FixtureRequest) -> None:
    """Every check passes on every generated request, and each operation got its examples."""
    examples = EXAMPLES
    database_url = str(request.getfixturevalue(f"{backend}_url"))
    sent, failures, seconds = run_schemathesis(database_url, examples)
    print(f"schemathesis: {sum(sent.values())} requests in {seconds:.1f} s: {dict(sent)}")
    assert not failures, "\n\n".join(failures[:20])
    short = {
        label: count
        for label, count in sent.items()
        if count < examples and label not in FEW_CASES and label != "Stateful tests"
    }
    assert not short, f"operations with fewer than {examples} cases: {short}"
