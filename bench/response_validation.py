"""What validating answers against their ``response_model`` costs (issue 23 item 1).

Every JSON route declares its answer's model (app/services/schemas.py); FastAPI validates what
the route returns against it and serialises the result with pydantic. This script times two
requests through the whole in-process app (auth, database, engine, serialisation), with the
validation on (as served) and off (FastAPI's path without a response model:
``jsonable_encoder`` and ``json.dumps``, what the app did before), interleaved round by round
in the same run so that load drifts hit both alike:

* ``submit``: ``POST /v1/objects/{id}/queries``, one ``grr`` query (SQLite, a finite domain);
* ``survey responses``: ``GET /v1/surveys/{id}/responses?limit=1000``, a page of 1,000
  members' decisions with their outputs (the largest answer the API builds).

It prints the median milliseconds per request of each, the overhead of validation in percent,
and the load average (``uptime``)::

    .venv/bin/python bench/response_validation.py --rounds 7 --submits 200 --pages 40
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import fastapi.routing
from fastapi.encoders import jsonable_encoder
from fastapi.testclient import TestClient

from app.bootstrap import create_app
from app.db.migrate import upgrade
from app.settings import Settings

ADMIN = "bench-admin-" + "k" * 40
HEADERS = {"Authorization": f"Bearer {ADMIN}"}
DOMAIN = {"attributes": [{"name": "x", "type": "integer", "low": 0, "high": 9}]}
GRR = {"mechanism": "grr", "attribute": "x", "epsilon": 0.001}
MEMBERS = 1000

_validated = fastapi.routing.serialize_response


async def _unvalidated(*, response_content: Any, dump_json: bool = False, **_: Any) -> Any:
    """FastAPI's answer without a response model: ``jsonable_encoder``, then JSONResponse's
    ``json.dumps`` (done here when the caller expects bytes)."""
    content = jsonable_encoder(response_content)
    if not dump_json:
        return content
    return json.dumps(content, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode()


@contextmanager
def validation(on: bool) -> Iterator[None]:
    """Serve answers with (as the app does) or without response-model validation."""
    fastapi.routing.serialize_response = _validated if on else _unvalidated  # type: ignore[assignment]
    try:
        yield
    finally:
        fastapi.routing.serialize_response = _validated  # type: ignore[assignment]


def ms_per_call(call: Callable[[], Any], count: int) -> float:
    start = time.perf_counter()
    for _ in range(count):
        call()
    return (time.perf_counter() - start) * 1000 / count


def setup(client: TestClient) -> tuple[Callable[[], Any], Callable[[], Any]]:
    """An object to submit to, a finished survey of MEMBERS objects; the two calls to time."""
    client.post(
        "/v1/objects",
        json={
            "id": "bench-submit",
            "domain": DOMAIN,
            "value": {"x": 3},
            "budget": {"epsilon": 1e4},
        },
        headers=HEADERS,
    ).raise_for_status()
    members = [
        {
            "id": f"bench-{i:05d}",
            "domain": DOMAIN,
            "value": {"x": i % 10},
            "budget": {"epsilon": 1},
            "labels": {"study": "bench"},
        }
        for i in range(MEMBERS)
    ]
    client.post("/v1/imports", json={"objects": members}, headers=HEADERS).raise_for_status()
    survey = {"name": "bench", "query": GRR, "cohort": {"labels": {"study": "bench"}}}
    created = client.post("/v1/surveys", json=survey, headers=HEADERS)
    created.raise_for_status()
    survey_id = created.json()["id"]
    while client.get(f"/v1/surveys/{survey_id}", headers=HEADERS).json()["status"] != "done":
        time.sleep(0.2)

    def submit() -> None:
        r = client.post("/v1/objects/bench-submit/queries", json={"query": GRR}, headers=HEADERS)
        if r.status_code != 201:
            raise RuntimeError(r.text)

    def responses() -> None:
        r = client.get(f"/v1/surveys/{survey_id}/responses?limit=1000", headers=HEADERS)
        if r.status_code != 200 or len(r.json()["items"]) != MEMBERS:
            raise RuntimeError(r.text[:200])

    return submit, responses


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=7, help="timed rounds of each mode")
    parser.add_argument("--submits", type=int, default=200, help="submits a round")
    parser.add_argument("--pages", type=int, default=40, help="response pages a round")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as where:
        os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
        url = f"sqlite:///{where}/bench.db"
        upgrade(url)
        settings = Settings(
            database_url=url,
            gatekeeper_encryption_key_file=f"{where}/encryption.key",
            gatekeeper_bootstrap_admin_key=ADMIN,
            bound_processes=0,
        )
        with TestClient(create_app(settings)) as client:
            submit, responses = setup(client)
            cases = {"submit": (submit, args.submits), "survey responses": (responses, args.pages)}
            times: dict[tuple[str, bool], list[float]] = {}
            for call, count in cases.values():  # warm-up: caches, connections, both paths
                for on in (True, False):
                    with validation(on):
                        ms_per_call(call, max(1, count // 10))
            for round_ in range(args.rounds):
                for name, (call, count) in cases.items():
                    # alternate which mode goes first, so neither always runs warmer
                    for on in (True, False) if round_ % 2 == 0 else (False, True):
                        with validation(on):
                            times.setdefault((name, on), []).append(ms_per_call(call, count))
    print(f"{'request':<18} {'validated ms':>13} {'unvalidated ms':>15} {'overhead':>9}")
    for name in cases:
        on = statistics.median(times[(name, True)])
        off = statistics.median(times[(name, False)])
        print(f"{name:<18} {on:>13.3f} {off:>15.3f} {100 * (on - off) / off:>8.1f}%")
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"medians of {args.rounds} rounds; load average (uptime): {load}")


if __name__ == "__main__":
    main()
