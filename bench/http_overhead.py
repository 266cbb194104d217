"""CPU of the HTTP side of a single submit, source trees side by side (in process, no sockets).

How to run (from the project root)::

    OPENBLAS_NUM_THREADS=1 .venv/bin/python bench/http_overhead.py --trees MAIN,NEW --rounds 4

What a submit costs outside the service (middleware, routing, authentication with the cached
key, the body's JSON and model, the hand-off to the request thread, serialisation, the JSON
access log, the multiprocess metrics) is a fraction of a millisecond, too little for
``bench/service_load.py`` or ``bench/submit_cpu.py`` to resolve on a shared machine. Here each tree
(a folder of the code, first on ``PYTHONPATH`` of a child process; the order alternates by
round) builds the app with :func:`app.bootstrap.create_app` on a fresh SQLite file, with the JSON
logs configured as ``gatekeeper serve`` does (INFO, to stderr: ``/dev/null`` here) and
``PROMETHEUS_MULTIPROC_DIR`` set as with several workers; it registers an object, makes an
analyst key and sends one real submit through the app. Then :func:`app.services.queries.submit`
is replaced, **in the child only**, by a function returning that submit's outcome, and
``--requests`` submits (each with a fresh ``Idempotency-Key``) are sent as raw ASGI calls, one at
a time. Reported per request: the CPU of the event loop's thread (``time.thread_time``: the HTTP
side and this script's few lines of ASGI driving, the same for every tree) and of the process
(plus the request thread that runs the replaced submit).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ADMIN_KEY = "bench-admin-" + "h" * 40
QUERY = {"query": {"mechanism": "grr", "attribute": "x", "epsilon": 0.5}}


def child(args: argparse.Namespace) -> None:
    """Run in the tree's code: build the app, measure, print one JSON line."""
    from app import logs
    from app.bootstrap import create_app
    from app.db.migrate import upgrade
    from app.settings import Settings

    logs.configure("INFO")
    url = f"sqlite:///{args.dir}/bench.db"
    upgrade(url)
    settings = Settings(
        database_url=url,
        gatekeeper_bootstrap_admin_key=ADMIN_KEY,
        gatekeeper_encryption_key_file=f"{args.dir}/encryption.key",
        bound_processes=0,
    )
    app = create_app(settings)

    async def call(method: str, path: str, body: bytes, headers: list[tuple[bytes, bytes]]) -> Any:
        scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": method,
            "scheme": "http",
            "path": path,
            "raw_path": path.encode(),
            "root_path": "",
            "query_string": b"",
            "headers": [
                (b"host", b"bench"),
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                *headers,
            ],
            "client": ("127.0.0.1", 5000),
            "server": ("127.0.0.1", 8000),
            "state": {},
        }
        sent = False
        out: list[Any] = []

        async def receive() -> dict[str, Any]:
            nonlocal sent
            if sent:
                await asyncio.sleep(3600)
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}

        async def send(message: dict[str, Any]) -> None:
            out.append(message)

        await app(scope, receive, send)
        return out[0]["status"], b"".join(m.get("body", b"") for m in out[1:])

    async def run() -> dict[str, float]:
        admin = [(b"authorization", f"Bearer {ADMIN_KEY}".encode())]
        async with app.router.lifespan_context(app):
            status, raw = await call("POST", "/v1/keys", b'{"role": "analyst"}', admin)
            assert status == 201, raw  # noqa: S101 - a bench's own check
            key = [(b"authorization", f"Bearer {json.loads(raw)['key']}".encode())]
            register = {
                "id": "http-" + secrets.token_hex(4),
                "domain": {"attributes": [{"name": "x", "type": "integer", "low": 0, "high": 9}]},
                "value": {"x": 3},
                "budget": {"epsilon": 10_000.0},
                "filter": "bayesian",
            }
            status, raw = await call("POST", "/v1/objects", json.dumps(register).encode(), admin)
            assert status == 201, raw  # noqa: S101
            path = f"/v1/objects/{register['id']}/queries"
            body = json.dumps(QUERY).encode()

            from app.services import queries as query_service

            real = query_service.submit
            outcomes: list[Any] = []

            def keep(**kwargs: Any) -> Any:
                outcomes.append(real(**kwargs))
                return outcomes[-1]

            query_service.submit = keep  # type: ignore[assignment]
            idem = [(b"idempotency-key", secrets.token_hex(16).encode())]
            status, raw = await call("POST", path, body, key + idem)
            assert status == 201, raw  # noqa: S101
            query_service.submit = lambda **_: outcomes[0]  # type: ignore[assignment]

            async def many(n: int) -> None:
                for _ in range(n):
                    idem = [(b"idempotency-key", secrets.token_hex(16).encode())]
                    status, raw = await call("POST", path, body, key + idem)
                    assert status == 201, raw  # noqa: S101

            await many(args.warmup)
            loop0, cpu0 = time.thread_time(), time.process_time()
            await many(args.requests)
            loop1, cpu1 = time.thread_time(), time.process_time()
            n = args.requests
            return {"loop_us": 1e6 * (loop1 - loop0) / n, "cpu_us": 1e6 * (cpu1 - cpu0) / n}

    print(json.dumps(asyncio.run(run())), flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--trees", default="", help="comma-separated source folders")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--requests", type=int, default=3000, help="timed submits per run")
    parser.add_argument("--warmup", type=int, default=300)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--dir", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(args)
        return 0
    trees = [Path(t).resolve() for t in args.trees.split(",")]
    print(
        f"http_overhead: {args.requests} submits per run ({args.warmup} warm-up), one at a time, "
        "the service's submit replaced by its stored outcome"
    )
    print(f"{'tree':<12} {'round':>5} {'loop us':>8} {'cpu us':>8}  loadavg")
    rows: list[tuple[str, dict[str, float]]] = []
    for r in range(args.rounds):
        for tree in trees if r % 2 == 0 else trees[::-1]:
            with tempfile.TemporaryDirectory() as tmp:
                metrics_dir = Path(tmp) / "metrics"
                metrics_dir.mkdir()
                env = {
                    **os.environ,
                    "PYTHONPATH": f"{tree}:{tree / 'clients' / 'python' / 'src'}",
                    "OPENBLAS_NUM_THREADS": "1",
                    "PROMETHEUS_MULTIPROC_DIR": str(metrics_dir),
                }
                for name in ("DATABASE_URL", "REDIS_URL", "BROKER_URL"):
                    env.pop(name, None)
                command = [sys.executable, str(Path(__file__).resolve()), "--child"]
                command += ["--dir", tmp, "--requests", str(args.requests)]
                command += ["--warmup", str(args.warmup)]
                out = subprocess.run(  # noqa: S603 - our own script
                    command,
                    env=env,
                    cwd=tree,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.DEVNULL,
                    text=True,
                    check=False,
                )
            if out.returncode != 0 or not out.stdout.strip():
                print(f"{tree.name}: the child failed (exit {out.returncode})", file=sys.stderr)
                return 1
            result = json.loads(out.stdout.strip().splitlines()[-1])
            rows.append((tree.name, result))
            load = Path("/proc/loadavg").read_text().split()[0]
            print(
                f"{tree.name:<12} {r + 1:>5} {result['loop_us']:8.1f} {result['cpu_us']:8.1f}  "
                f"{load}",
                flush=True,
            )
    for tree in trees:
        loop = sorted(res["loop_us"] for name, res in rows if name == tree.name)
        cpu = sorted(res["cpu_us"] for name, res in rows if name == tree.name)
        print(
            f"{tree.name:<12} event loop us/submit {loop[0]:.1f}-{loop[-1]:.1f} "
            f"(median {loop[len(loop) // 2]:.1f}), process {cpu[0]:.1f}-{cpu[-1]:.1f} "
            f"(median {cpu[len(cpu) // 2]:.1f})"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
