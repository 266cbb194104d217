"""What a project's quota costs a survey: the same cohort surveyed with and without a quota.

On a fresh PostgreSQL database, in process (the app's own survey runner): registers N objects in
each of three label sets and surveys each with ``binary_rr`` (ε = 0.1) as

* ``unscoped``: an analyst outside projects (the object's filters only);
* ``project, empty``: a project key, every member's sub-history empty (one quota decision);
* ``unscoped, 2nd`` and ``project, 2nd``: each set surveyed again, every history one answer
  long (the project's members decided once per distinct stored sub-history: two hash chains
  for binary_rr), writing the updated sub-histories;

and prints the time from ``POST /v1/surveys`` to ``done`` with members per second::

    .venv/bin/python bench/quota_survey.py --objects 20000
"""

from __future__ import annotations

import argparse
import secrets
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.service_load import ADMIN_KEY, fresh_database  # noqa: E402

QUERY = {
    "mechanism": "binary_rr",
    "epsilon": 0.1,
    "predicate": {"attribute": "x", "op": "==", "value": 1},
}
DOMAIN = {"attributes": [{"name": "x", "type": "integer", "low": 0, "high": 1}]}


def _check(ok: bool, what: Any) -> None:
    if not ok:
        raise SystemExit(f"unexpected answer: {what}")


def _auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def _import(client: Any, tag: str, n: int) -> None:
    for start in range(0, n, 10_000):
        objects = [
            {
                "id": f"{tag}-{i:07d}",
                "domain": DOMAIN,
                "value": {"x": i % 2},
                "budget": {"epsilon": 10},
                "labels": {"set": tag},
            }
            for i in range(start, min(n, start + 10_000))
        ]
        r = client.post("/v1/imports", headers=_auth(ADMIN_KEY), json={"objects": objects})
        _check(r.status_code == 200, r.text)


def _survey(client: Any, key: str, tag: str) -> tuple[float, dict[str, Any]]:
    body = {"name": tag, "query": QUERY, "cohort": {"labels": {"set": tag}}}
    started = time.perf_counter()
    r = client.post("/v1/surveys", headers=_auth(key), json=body)
    _check(r.status_code == 202, r.text)
    while True:
        survey = client.get(f"/v1/surveys/{r.json()['id']}", headers=_auth(key)).json()
        if survey["status"] not in ("queued", "running"):
            return time.perf_counter() - started, survey
        time.sleep(0.05)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--objects", type=int, default=20_000)
    args = parser.parse_args(argv)
    from cryptography.fernet import Fernet
    from fastapi.testclient import TestClient

    from app.bootstrap import create_app
    from app.settings import Settings

    with fresh_database() as (url, _name):
        settings = Settings(
            database_url=url,
            gatekeeper_bootstrap_admin_key=ADMIN_KEY,
            gatekeeper_encryption_keys=Fernet.generate_key().decode(),  # no key file written
        )
        with TestClient(create_app(settings)) as client:
            tags = {name: secrets.token_hex(3) for name in ("unscoped", "project")}
            for tag in tags.values():
                _import(client, tag, args.objects)
            r = client.post("/v1/keys", headers=_auth(ADMIN_KEY), json={"role": "analyst"})
            unscoped = r.json()["key"]
            project = {
                "name": "bench-" + tags["project"],
                "scope": {"labels": {"set": tags["project"]}},
                "quota": {"epsilon": 1},
            }
            r = client.post("/v1/projects", headers=_auth(ADMIN_KEY), json=project)
            _check(r.status_code == 201, r.text)
            r = client.post(
                "/v1/keys",
                headers=_auth(ADMIN_KEY),
                json={"role": "analyst", "project": project["name"]},
            )
            scoped = r.json()["key"]
            runs = [
                ("unscoped", unscoped, tags["unscoped"]),
                ("project, empty", scoped, tags["project"]),
                ("unscoped, 2nd", unscoped, tags["unscoped"]),
                ("project, 2nd", scoped, tags["project"]),
            ]
            print(f"{'survey':<16} {'members':>8} {'accepted':>8} {'seconds':>8} {'members/s':>10}")
            for label, key, tag in runs:
                seconds, survey = _survey(client, key, tag)
                progress = survey["progress"]
                _check(survey["status"] == "done", survey)
                print(
                    f"{label:<16} {progress['total']:>8} {progress['accepted']:>8} "
                    f"{seconds:>8.2f} {progress['total'] / seconds:>10.0f}"
                )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
