"""What validating answers against their ``response_model`` costs (issue 23 item 1).

Every JSON route declares its answer's model (app/services/schemas.py) and the services return
instances of it: FastAPI passes an instance of the route's model through without validating it
again and serialises it with pydantic-core. This script times two requests through the whole
in-process app (auth, database, engine, serialisation):

* ``submit``: ``POST /v1/objects/{id}/queries``, one ``grr`` query (SQLite, a finite domain);
* ``survey responses``: ``GET /v1/surveys/{id}/responses?limit=1000``, a page of 1,000
  members' decisions with their outputs (the largest answer the API builds).

Two comparisons, interleaved round by round in the same run so that load drifts hit all alike:

* in each source tree, the answers as served (``validated``) and through FastAPI's path
  without a response model (``unvalidated``: ``jsonable_encoder``, then ``json.dumps``);
* with ``--baseline DIR`` (a checkout of an earlier commit, e.g. ``git archive <commit> | tar
  -x -C DIR``), this tree against that one: each tree runs in its own process (``spawn``), so the
  two apps never share a module.

Each request is timed in wall-clock and in CPU seconds of the process serving it
(``time.process_time``: the client, the event loop and the worker threads), which six helpers
sharing two cores disturb far less than wall-clock. It prints the medians per request and the
load average (``uptime``)::

    .venv/bin/python bench/response_validation.py --rounds 7 --submits 200 --pages 40 \
        --baseline /tmp/before
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import fastapi.routing
from fastapi.encoders import jsonable_encoder
from fastapi.testclient import TestClient

ADMIN = "bench-admin-" + "k" * 40
HEADERS = {"Authorization": f"Bearer {ADMIN}"}
DOMAIN = {"attributes": [{"name": "x", "type": "integer", "low": 0, "high": 9}]}
GRR = {"mechanism": "grr", "attribute": "x", "epsilon": 0.001}
MEMBERS = 1000

_validated = fastapi.routing.serialize_response


async def _unvalidated(
    *,
    response_content: Any,
    dump_json: bool = False,
    exclude_unset: bool = False,
    by_alias: bool = True,
    **_: Any,
) -> Any:
    """FastAPI's answer without a response model: ``jsonable_encoder``, then JSONResponse's
    ``json.dumps`` (done here when the caller expects bytes). A model is dumped with the route's
    ``exclude_unset`` and aliases, so the bytes are the served ones."""
    content = jsonable_encoder(response_content, exclude_unset=exclude_unset, by_alias=by_alias)
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


def timed(call: Callable[[], Any], count: int) -> tuple[float, float]:
    """Milliseconds per call: wall-clock and this process's CPU time."""
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(count):
        call()
    return (
        (time.perf_counter() - wall) * 1000 / count,
        (time.process_time() - cpu) * 1000 / count,
    )


def setup(client: TestClient) -> tuple[Callable[[], Any], Callable[[], Any], int]:
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

    return submit, responses, survey_id


def _steps(field: Any, body: Any, model: Any) -> list[Callable[[], Any]]:
    """Validate, serialise, and the path without a model, of one answer."""
    return [
        lambda: field.validate(body, {}, loc=("response",)),
        lambda: field.serialize_json(model, exclude_unset=True, by_alias=True),
        lambda: json.dumps(
            jsonable_encoder(body), ensure_ascii=False, allow_nan=False, separators=(",", ":")
        ),
    ]


def answer_costs(client: TestClient, survey_id: int) -> dict[str, list[float]]:
    """Microseconds of CPU per answer, on one served answer of each request.

    ``validate``: the route's response field validating the answer as a dict (what FastAPI did
    when services returned dicts; the survey page's service now does the same into its model);
    ``serialize``: that model to JSON bytes (pydantic-core, as served); ``encode``: the path
    without a response model (``jsonable_encoder``, ``json.dumps``) on the dict.
    """
    from app.api.routes import objects, surveys

    served = {
        ("POST", "/v1/objects/{object_id}/queries"): client.post(
            "/v1/objects/bench-submit/queries", json={"query": GRR}, headers=HEADERS
        ).json(),
        ("GET", "/v1/surveys/{survey_id}/responses"): client.get(
            f"/v1/surveys/{survey_id}/responses?limit=1000", headers=HEADERS
        ).json(),
    }
    costs = {}
    for (method, path), body in served.items():
        route = next(
            r
            for r in (*objects.router.routes, *surveys.router.routes)
            if getattr(r, "path_format", None) == path and method in getattr(r, "methods", ())
        )
        field = route.response_field
        model, errors = field.validate(body, {}, loc=("response",))
        if errors:
            raise RuntimeError(errors)
        count = 2000 if method == "POST" else 40
        costs[path] = [timed(step, count)[1] * 1000 for step in _steps(field, body, model)]
    return costs


def serve(tree: str, conn: Connection) -> None:
    """A child process: the app of source tree ``tree``; times what the parent asks."""
    sys.path.insert(0, tree)
    import app
    from app.bootstrap import create_app
    from app.db.migrate import upgrade
    from app.settings import Settings

    if not Path(app.__file__).resolve().is_relative_to(Path(tree).resolve()):
        raise RuntimeError(f"{tree}: imported {app.__file__} instead")
    with tempfile.TemporaryDirectory() as where:
        url = f"sqlite:///{where}/bench.db"
        upgrade(url)
        settings = Settings(
            database_url=url,
            gatekeeper_encryption_key_file=f"{where}/encryption.key",
            gatekeeper_bootstrap_admin_key=ADMIN,
            bound_processes=0,
        )
        with TestClient(create_app(settings)) as client:
            submit, responses, survey_id = setup(client)
            calls = {"submit": submit, "survey responses": responses}
            conn.send("ready")
            while (job := conn.recv()) is not None:
                if job == "answers":
                    conn.send(answer_costs(client, survey_id))
                    continue
                name, count, on = job
                with validation(on):
                    conn.send(timed(calls[name], count))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=7, help="timed rounds of each mode")
    parser.add_argument("--submits", type=int, default=200, help="submits a round")
    parser.add_argument("--pages", type=int, default=40, help="response pages a round")
    parser.add_argument("--baseline", help="a source tree of an earlier commit to compare")
    args = parser.parse_args()
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    trees = {"this tree": str(Path(__file__).resolve().parents[1])}
    if args.baseline:
        trees["baseline"] = args.baseline
    spawn = multiprocessing.get_context("spawn")
    children: dict[str, tuple[Connection, Any]] = {}
    for label, tree in trees.items():
        parent, child = spawn.Pipe()
        process = spawn.Process(target=serve, args=(tree, child))
        process.start()
        child.close()  # the child's end lives in the child: its death ends recv() with EOFError
        if parent.recv() != "ready":
            raise RuntimeError(f"{label}: the app did not start")
        children[label] = (parent, process)
    cases = {"submit": args.submits, "survey responses": args.pages}
    modes = [(label, on) for label in trees for on in (True, False)]
    times: dict[tuple[str, str, bool], list[tuple[float, float]]] = {}
    try:
        for name, count in cases.items():  # warm-up: caches, connections, both paths
            for label, on in modes:
                children[label][0].send((name, max(1, count // 10), on))
                children[label][0].recv()
        for round_ in range(args.rounds):
            # rotate which mode goes first, so that none always runs warmer
            order = modes[round_ % len(modes) :] + modes[: round_ % len(modes)]
            for name, count in cases.items():
                for label, on in order:
                    children[label][0].send((name, count, on))
                    times.setdefault((label, name, on), []).append(children[label][0].recv())
        # the answers' own costs, measured in each tree's process (the field and models are its)
        answers = {}
        for label in trees:
            children[label][0].send("answers")
            answers[label] = children[label][0].recv()
    finally:
        for parent, process in children.values():
            parent.send(None)
            process.join()

    def median(label: str, name: str, on: bool, which: int) -> float:
        return statistics.median(t[which] for t in times[(label, name, on)])

    print(
        f"{'tree':<10} {'request':<17} {'validated ms':>19} {'unvalidated ms':>19} "
        f"{'overhead (CPU)':>15}"
    )
    print(f"{'':<10} {'':<17} {'CPU':>9} {'wall':>9} {'CPU':>9} {'wall':>9}")
    for label in trees:
        for name in cases:
            on_cpu, on_wall = median(label, name, True, 1), median(label, name, True, 0)
            off_cpu, off_wall = median(label, name, False, 1), median(label, name, False, 0)
            print(
                f"{label:<10} {name:<17} {on_cpu:>9.3f} {on_wall:>9.3f} {off_cpu:>9.3f} "
                f"{off_wall:>9.3f} {100 * (on_cpu - off_cpu) / off_cpu:>14.1f}%"
            )
    if "baseline" in trees:
        print("\nas served, this tree against the baseline (CPU ms per request, medians):")
        for name in cases:
            now, before = median("this tree", name, True, 1), median("baseline", name, True, 1)
            change = 100 * (now - before) / before
            print(f"  {name:<17} {now:>9.3f} vs {before:>9.3f}  {change:+.1f}%")
    print(
        "\none served answer, CPU µs (in each tree's process): validate (dict → model, one "
        "pydantic-core call), serialize (model → bytes), the path without a model "
        "(jsonable_encoder + json.dumps); share: validate over the request's CPU as served"
    )
    print(
        f"{'tree':<10} {'request':<17} {'validate':>10} {'serialize':>10} {'no model':>10} "
        f"{'share':>8}"
    )
    for label in trees:
        for (name, _), (validate, serialize, encode) in zip(
            cases.items(), answers[label].values(), strict=True
        ):
            share = 100 * validate / (1000 * median(label, name, True, 1))
            print(
                f"{label:<10} {name:<17} {validate:>10.1f} {serialize:>10.1f} {encode:>10.1f} "
                f"{share:>7.2f}%"
            )
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"medians of {args.rounds} rounds; load average (uptime): {load}")


if __name__ == "__main__":
    main()
