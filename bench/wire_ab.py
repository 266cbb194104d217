"""uvicorn's cost per answer with and without ``app.api.wire`` (one write per answer), A/B.

How to run (from the project root)::

    OPENBLAS_NUM_THREADS=1 .venv/bin/python bench/wire_ab.py --blocks 12 --block 20000

A submit's server CPU (≈ 1.4 ms) is too large, and the machine too shared, for
``bench/http_ab.py`` to resolve a few microseconds per answer. Here two uvicorn servers (one
worker each, uvloop, ``httptools``) serve the same tiny ASGI app — an answer the size and shape of
a submit's (``201``, JSON, ``content-length``, ``x-request-id``; ≈ 500 bytes of body) — one with
uvicorn's own protocol (``http="httptools"``), the other with
:data:`app.api.wire.HTTP` (the head and body in one write). Blocks of ``--block`` ``POST``s over
``--clients`` keep-alive connections go to one server and then the other, ``--blocks`` times,
the order alternating within a pair. Per block: the server process's CPU (``/proc``, clock
ticks, user and system) per answer, and this client's CPU per answer (a second wake-up per
answer when its head and body come apart). The table gives medians, the median per-pair ratio
(wire / httptools) and the system share.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import service_load as sl

ROOT = Path(__file__).resolve().parent.parent

SERVER = r"""
import os, sys, uvicorn
BODY = (b'{"id": "' + b"q" * 32 + b'", "status": "accepted", "answer": "v3", '
        + b'"x": 0, ' * 50 + b'"end": 1}')
async def app(scope, receive, send):
    if scope["type"] != "http":
        return
    while (await receive()).get("more_body"):
        pass
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(BODY)),
               (b"x-request-id", os.urandom(16).hex().encode())]
    await send({"type": "http.response.start", "status": 201, "headers": headers})
    await send({"type": "http.response.body", "body": BODY})
uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), http=sys.argv[2], loop="uvloop",
            log_level="warning", access_log=False, lifespan="off")
"""


def cpu(pid: int) -> tuple[float, float]:
    """User and system CPU seconds of process ``pid``."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) / sl.CLK_TCK, int(fields[12]) / sl.CLK_TCK


async def block(port: int, count: int, clients: int) -> None:
    conns = [sl.Connection("127.0.0.1", port) for _ in range(clients)]
    left = list(range(count))

    async def client(conn: sl.Connection) -> None:
        while left:
            left.pop()
            status, _ = await conn.post("/v1/objects/x/queries", b'{"query": {}}', {})
            if status != 201:
                raise RuntimeError(f"status {status}")

    for conn in conns:
        await conn._open()
    await asyncio.gather(*(client(c) for c in conns))
    for conn in conns:
        await conn.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--blocks", type=int, default=12, help="blocks per server (12)")
    parser.add_argument("--block", type=int, default=20000, help="answers per block (20000)")
    parser.add_argument("--clients", type=int, default=32, help="connections per block (32)")
    args = parser.parse_args(argv)
    import uvloop

    names = ["httptools", "wire"]
    protocols = ["httptools", "app.api.wire:OneWriteHttpToolsProtocol"]
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    servers, ports = [], []
    load0 = os.getloadavg()[0]
    try:
        for protocol in protocols:
            port = sl.free_port()
            servers.append(
                subprocess.Popen(  # noqa: S603 - our own script
                    [sys.executable, "-c", SERVER, str(port), protocol], env=env
                )
            )
            ports.append(port)
        time.sleep(3)
        for port in ports:  # warm-up
            uvloop.run(block(port, 2000, args.clients))
        server_ms: list[list[float]] = [[], []]
        client_ms: list[list[float]] = [[], []]
        system = [0.0, 0.0]
        for b in range(args.blocks):
            for k in (0, 1) if b % 2 == 0 else (1, 0):
                (u0, s0), c0 = cpu(servers[k].pid), time.process_time()
                uvloop.run(block(ports[k], args.block, args.clients))
                (u1, s1), c1 = cpu(servers[k].pid), time.process_time()
                server_ms[k].append(((u1 - u0) + (s1 - s0)) / args.block * 1e6)
                client_ms[k].append((c1 - c0) / args.block * 1e6)
                system[k] += s1 - s0
    finally:
        for s in servers:
            s.terminate()
            s.wait(10)
    load1 = os.getloadavg()[0]
    print(
        f"wire_ab: {args.blocks} blocks of {args.block} answers per server "
        f"({args.clients} connections), alternated; load {load0:.2f} -> {load1:.2f}"
    )
    print(f"{'server':<10} server us/answer median (IQR)   system  client us/answer median")
    for k in (0, 1):
        q = statistics.quantiles(server_ms[k], n=4)
        share = system[k] / (sum(server_ms[k]) * args.block / 1e6)
        print(
            f"{names[k]:<10} {statistics.median(server_ms[k]):>10.1f} ({q[0]:.1f}-{q[2]:.1f})"
            f"  {share:>9.1%}  {statistics.median(client_ms[k]):>10.1f}"
        )
    ratios = [b / a for a, b in zip(server_ms[0], server_ms[1], strict=True)]
    cratios = [b / a for a, b in zip(client_ms[0], client_ms[1], strict=True)]
    lower = sum(b < a for a, b in zip(server_ms[0], server_ms[1], strict=True))
    print(
        f"wire / httptools: server median per-pair ratio {statistics.median(ratios):.3f} "
        f"(lower in {lower} of {len(ratios)}), totals {sum(server_ms[1]) / sum(server_ms[0]):.3f}; "
        f"client median per-pair ratio {statistics.median(cratios):.3f}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
