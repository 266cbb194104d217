"""How soon a key revoked through one app instance is refused by another (Redis announcements).

How to run (from the project root, Redis reachable)::

    .venv/bin/python bench/revocation_lag.py --redis redis://127.0.0.1:6379/14 --keys 30

Two app instances (like two uvicorn workers) share one SQLite database and one Redis, each caching
API keys for 300 s (``AUTH_CACHE_SECONDS``). For each of ``--keys`` new viewer keys: the second
instance authenticates it (and caches it), the first revokes it (``DELETE /v1/keys/{id}``), then
the second is asked again and again until it answers 401. Printed: how many of the second's
requests after the ``DELETE`` answered were still accepted (0 means the very next one was refused),
and the time from the ``DELETE``'s answer to the refusal (the refusing request's own time
included).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument(
        "--redis",
        default=os.environ.get("GATEKEEPER_BENCH_REDIS_URL", "redis://127.0.0.1:6379/14"),
    )
    parser.add_argument("--keys", type=int, default=30)
    args = parser.parse_args(argv)
    from fastapi.testclient import TestClient

    from app.bootstrap import create_app
    from app.db.migrate import upgrade
    from app.settings import Settings

    admin_key = "bench-admin-" + "r" * 40
    admin = {"Authorization": f"Bearer {admin_key}"}
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{tmp}/lag.db"
        upgrade(url)
        settings = Settings(
            database_url=url,
            redis_url=args.redis,
            gatekeeper_bootstrap_admin_key=admin_key,
            gatekeeper_encryption_key_file=f"{tmp}/encryption.key",
            bound_processes=0,
            auth_cache_seconds=300.0,
        )
        lags: list[float] = []
        accepted = 0
        with TestClient(create_app(settings)) as a, TestClient(create_app(settings)) as b:
            for client in (a, b):
                listener = client.app.state.revocations  # type: ignore[attr-defined]
                if not listener.subscribed.wait(5.0):
                    print("the revocation listener did not subscribe (Redis?)")
                    return 1
            for _ in range(args.keys):
                key = a.post("/v1/keys", headers=admin, json={"role": "viewer"}).json()
                mine = {"Authorization": f"Bearer {key['key']}"}
                assert b.get("/v1/odometers", headers=mine).status_code == 200  # noqa: S101
                a.delete(f"/v1/keys/{key['id']}", headers=admin)
                start = time.monotonic()
                while b.get("/v1/odometers", headers=mine).status_code != 401:
                    accepted += 1
                lags.append(1000 * (time.monotonic() - start))
    lags.sort()
    print(
        f"{len(lags)} revocations: requests still accepted by the other instance after the DELETE "
        f"answered: {accepted}; ms until it refused the key: median {statistics.median(lags):.2f}, "
        f"max {lags[-1]:.2f}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
