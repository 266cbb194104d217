"""Theorem D.1 through the HTTP service: exact ties accepted (issue #15 item 1).

Binary objects with a budget of exactly kε receive ``binary_rr`` queries of ε until the first
``409``; the mean number accepted is compared with eq. 68 (E(0)). Each object is registered and
queried through the API (an in-process app on a fresh SQLite file, the service's submit path:
stored state reloaded for every decision). Before exact ties the service stopped at a loss of
(k − 1)ε: 9.68 queries for E(0) = 14.86 at k = 4, ε = 0.25 (issue #15).

Run::

    .venv/bin/python bench/d1_service.py [--objects 100]
"""

from __future__ import annotations

import argparse
import math
import os
import secrets
import statistics
import tempfile
import time
from fractions import Fraction
from pathlib import Path

from fastapi.testclient import TestClient

from app.bootstrap import create_app
from app.db.migrate import upgrade
from app.settings import Settings

PAIRS = [(4, 0.25), (2, 0.5), (3, 0.5), (8, 0.125)]
BINARY = {"attributes": [{"name": "b", "type": "integer", "low": 0, "high": 1}]}


def expected(k: int, eps: float) -> float:
    """Eq. 68."""
    num = -k * math.exp(-2 * k * eps) + 2 * k * math.exp(-k * eps) - k
    return num / ((math.exp(eps) - 1) / (math.exp(eps) + 1) * (math.exp(-2 * k * eps) - 1))


def _check(ok: bool, text: str) -> None:
    if not ok:
        raise RuntimeError(text)


def main() -> None:
    """Print E(0) against the service's mean per (k, ε)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--objects", type=int, default=100)
    parser.add_argument(
        "--pairs",
        default=",".join(f"{k}:{eps}" for k, eps in PAIRS),
        help="k:ε pairs; the budget is k·ε as written (0.3 for 3:0.1)",
    )
    args = parser.parse_args()
    pairs = [(int(k), float(eps)) for k, eps in (p.split(":") for p in args.pairs.split(","))]
    admin = secrets.token_urlsafe(32)
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{Path(tmp) / 'd1.db'}"
        upgrade(url)
        settings = Settings(
            database_url=url,
            gatekeeper_bootstrap_admin_key=admin,
            gatekeeper_encryption_key_file=str(Path(tmp) / "encryption.key"),
            bound_processes=0,
        )
        with TestClient(create_app(settings)) as client:
            head = {"Authorization": f"Bearer {admin}"}
            key = client.post("/v1/keys", headers=head, json={"role": "analyst"}).json()["key"]
            analyst = {"Authorization": f"Bearer {key}"}
            print(f"# {args.objects} objects per row; load {os.getloadavg()}")
            print("| k | ε | budget | E(0) eq. 68 | service mean | stderr | z | s |")
            print("|---:|---:|---:|---:|---:|---:|---:|---:|")
            for k, eps in pairs:
                budget = float(k * Fraction(repr(eps)))  # k·ε as written
                start, counts = time.perf_counter(), []
                query = {
                    "mechanism": "binary_rr",
                    "epsilon": eps,
                    "predicate": {"attribute": "b", "op": "==", "value": 1},
                }
                for i in range(args.objects):
                    oid = f"d1-{k}-{eps}-{i}"
                    body = {"id": oid, "domain": BINARY, "value": {"b": 1}}
                    r = client.post(
                        "/v1/objects", headers=head, json={**body, "budget": {"epsilon": budget}}
                    )
                    _check(r.status_code == 201, r.text)
                    n = 0
                    while True:
                        r = client.post(
                            f"/v1/objects/{oid}/queries", headers=analyst, json={"query": query}
                        )
                        if r.status_code == 409:
                            break
                        _check(r.status_code == 201, r.text)
                        n += 1
                    counts.append(n)
                mean = statistics.mean(counts)
                stderr = statistics.stdev(counts) / math.sqrt(len(counts))
                e0 = expected(k, eps)
                print(
                    f"| {k} | {eps} | {budget} | {e0:.2f} | {mean:.2f} | {stderr:.2f} "
                    f"| {(mean - e0) / stderr:+.2f} | {time.perf_counter() - start:.1f} |"
                )


if __name__ == "__main__":
    main()
