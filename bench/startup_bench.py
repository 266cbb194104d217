"""Process start-up, two checkouts side by side: a ``gatekeeper`` command and a 4-worker server.

Each round runs, in each tree (alternating which goes first), ``python -m app.cli keys list``,
what a uvicorn worker process does before it serves (``--worker-builds`` times: a new
interpreter importing uvicorn's server and calling ``app.bootstrap.app_factory``, as each worker
that replaces a killed one does) and ``python -m app.cli serve --workers 4`` until ``/readyz``
answers (then SIGTERM), each tree on its own migrated SQLite file, and reports wall times and
the children's CPU (``getrusage(RUSAGE_CHILDREN)``). Usage::

    python bench/startup_bench.py --tree main=/path/to/main --tree branch=. --rounds 5

``--kinds`` measures other starts instead, one table row per kind and tree (CPU of the process
and everything it reaped, to its first answer and its stop; wall to its first answer), each
round alternating which tree goes first: ``help`` (``gatekeeper --help``), ``keys-list``,
``verify`` (on the migrated, empty SQLite file), ``migrate`` (of a database already at the
newest migration), ``states-collect``, ``worker-build`` (as above), ``serve1``/``serve2``/
``serve4`` (``gatekeeper serve --workers N`` to its first 200 on ``/readyz``, then SIGTERM),
``serve2-split``/``serve4-split`` (``serve2``/``serve4``, and a second table of the parent's and
each worker's own CPU, read from ``/proc`` once all workers are up and idle) and ``celery``
(``gatekeeper worker --concurrency 1`` on ``--broker``, a Redis URL, until both nodes have
announced themselves, then SIGTERM to its process group)::

    python bench/startup_bench.py --tree base=/work/wt/base --tree branch=. --rounds 3 \
        --kinds help,keys-list,verify,migrate,serve1,serve2,celery --broker redis://127.0.0.1:6379/7

On a shared machine those CPU times move by a few per cent from run to run, more than a change
of a few milliseconds. ``--instructions`` instead runs the command and one worker build (or
the ``--kinds`` among help, keys-list, verify, migrate, worker-build) once per tree under
Valgrind's callgrind (``PYTHONHASHSEED=0``) and prints the instructions each
executed: the same tree gives the same count to a few parts per million whatever the load
(about 40 s of CPU per run). Instructions are not time — the collector's pointer chasing and
cache misses cost more than their count says — so read them beside the timed rounds.
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from service_load import proc_cpu  # type: ignore[import-not-found]

ADMIN = "bench-admin-" + "k" * 40


def children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def environment(tree: str, database_url: str, key: str) -> dict[str, str]:
    return {
        "PATH": os.environ.get("PATH", ""),
        "PYTHONPATH": tree,
        "DATABASE_URL": database_url,
        "GATEKEEPER_ENCRYPTION_KEYS": key,
        "GATEKEEPER_BOOTSTRAP_ADMIN_KEY": ADMIN,
        "OPENBLAS_NUM_THREADS": "1",
        "BOUND_PROCESSES": "0",
    }


#: What each measured process runs (after the interpreter).
KEYS_LIST = ["-m", "app.cli", "keys", "list"]
WORKER_BUILD = [
    "-c",
    "import uvicorn.config, uvicorn.server\nfrom app.bootstrap import app_factory\napp_factory()",
]


def command(tree: str, env: dict[str, str]) -> tuple[float, float]:
    cpu, wall = children_cpu(), time.perf_counter()
    subprocess.run(  # noqa: S603 - this interpreter, our own CLI
        [sys.executable, *KEYS_LIST],
        cwd=tree,
        env=env,
        check=True,
        capture_output=True,
    )
    return time.perf_counter() - wall, children_cpu() - cpu


def worker_build(tree: str, env: dict[str, str]) -> tuple[float, float]:
    """A new interpreter doing what a uvicorn worker does before it serves: import uvicorn's
    server, then build the app with the factory ``gatekeeper serve`` names."""
    cpu, wall = children_cpu(), time.perf_counter()
    subprocess.run(  # noqa: S603 - this interpreter, a fixed program
        [sys.executable, *WORKER_BUILD],
        cwd=tree,
        env=env,
        check=True,
        capture_output=True,
    )
    return time.perf_counter() - wall, children_cpu() - cpu


def instructions(tree: str, env: dict[str, str], argv: list[str]) -> int:
    """Instructions one run of ``argv`` executes, counted by callgrind."""
    done = subprocess.run(  # noqa: S603 - valgrind on this interpreter, a fixed program
        [  # noqa: S607 - valgrind from PATH, as a developer runs it
            "valgrind",
            "--tool=callgrind",
            "--callgrind-out-file=/dev/null",
            sys.executable,
            *argv,
        ],
        cwd=tree,
        env={**env, "PYTHONHASHSEED": "0"},
        check=True,
        capture_output=True,
        text=True,
    )
    found = re.search(r"Collected : (\d+)", done.stderr)
    if found is None:
        raise RuntimeError(f"no instruction count from valgrind: {done.stderr[-500:]}")
    return int(found.group(1))


def server(tree: str, env: dict[str, str]) -> tuple[float, float, int]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    cpu, wall = children_cpu(), time.perf_counter()
    process = subprocess.Popen(  # noqa: S603 - this interpreter, our own CLI
        [sys.executable, "-m", "app.cli", "serve", "--port", str(port), "--workers", "4"],
        cwd=tree,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    ready = None
    while ready is None:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=1).status_code == 200:
                ready = time.perf_counter() - wall
        except httpx.HTTPError:
            time.sleep(0.05)
    process.terminate()
    out = process.communicate(timeout=60)[0]
    return ready, children_cpu() - cpu, out.count("Application startup complete")


def run_command(tree: str, env: dict[str, str], argv: list[str]) -> tuple[float, float]:
    """Wall and CPU (the process and what it reaped) of one ``python argv`` to its exit."""
    cpu, wall = children_cpu(), time.perf_counter()
    subprocess.run(  # noqa: S603 - this interpreter, our own CLI
        [sys.executable, *argv], cwd=tree, env=env, check=True, capture_output=True
    )
    return time.perf_counter() - wall, children_cpu() - cpu


def spawned_workers(pid: int) -> list[int]:
    """The uvicorn workers ``multiprocessing`` started under ``pid``: spawned (``spawn_main``)
    or forked (``pid``'s own command line, :mod:`app.webfork`); not its resource tracker."""
    own = Path(f"/proc/{pid}/cmdline").read_bytes()
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        for child in (task / "children").read_text().split():
            cmdline = Path(f"/proc/{child}/cmdline").read_bytes()
            if b"spawn_main" in cmdline or cmdline == own:
                found.append(int(child))
    return found


def idle_parts(pid: int, workers: int) -> tuple[float, list[float]]:
    """The serving parent's and each spawned worker's own CPU, once all ``workers`` exist and
    none used CPU for 0.3 s (all started and idle; at most 30 s)."""
    before: tuple[float, list[float]] | None = None
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        kids = spawned_workers(pid)
        now = (proc_cpu(pid), [proc_cpu(k) for k in kids])
        if len(kids) == workers and now == before:
            return now
        before = now
        time.sleep(0.3)
    raise RuntimeError(f"the {workers} workers of {pid} did not settle")


#: Per-process CPU of the ``split`` serve kinds (``serve2-split``), by (kind, tree path).
SPLITS: dict[tuple[str, str], list[tuple[float, list[float]]]] = {}


def serve(
    tree: str,
    env: dict[str, str],
    workers: int,
    split: list[tuple[float, list[float]]] | None = None,
) -> tuple[float, float]:
    """``gatekeeper serve --workers N``: wall to the first 200 on ``/readyz``, CPU to its stop.

    Polled every 50 ms with one kept client (the poll's own CPU is this process's, not counted).
    With ``split`` (N ≥ 2), appends the parent's and each worker's own CPU once all are idle.
    """
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    cpu, wall = children_cpu(), time.perf_counter()
    process = subprocess.Popen(  # noqa: S603 - this interpreter, our own CLI
        [sys.executable, "-m", "app.cli", "serve", "--port", str(port), "--workers", str(workers)],
        cwd=tree,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    ready = None
    with httpx.Client(timeout=1) as client:
        while ready is None:
            if process.poll() is not None:
                raise RuntimeError(f"serve exited: {process.communicate()[0][-2000:]}")
            try:
                if client.get(f"http://127.0.0.1:{port}/readyz").status_code == 200:
                    ready = time.perf_counter() - wall
            except httpx.HTTPError:
                time.sleep(0.05)
    if split is not None:
        split.append(idle_parts(process.pid, workers))
    process.terminate()
    out = process.communicate(timeout=60)[0]
    started = out.count("Application startup complete")
    if started != workers:
        raise RuntimeError(f"{started} of {workers} workers started: {out[-2000:]}")
    return ready, children_cpu() - cpu


def celery_worker(tree: str, env: dict[str, str], broker: str, tag: str) -> tuple[float, float]:
    """``gatekeeper worker --concurrency 1``: wall until both nodes announced themselves in
    Redis (what tests/service/test_celery_worker.py waits for), CPU to its warm stop."""
    import redis

    namespace = f"startbench{tag}"
    client = redis.Redis.from_url(broker)
    pattern = f"gatekeeper:celery:{namespace}:workers:*"
    cpu, wall = children_cpu(), time.perf_counter()
    process = subprocess.Popen(
        [sys.executable, "-m", "app.cli", "worker", "--concurrency", "1"],
        cwd=tree,
        env={**env, "BROKER_URL": broker, "BROKER_NAMESPACE": namespace},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        while len(list(client.scan_iter(match=pattern))) < 2:
            if process.poll() is not None:
                raise RuntimeError(f"worker exited: {process.communicate()[0][-2000:]}")
            time.sleep(0.05)
        ready = time.perf_counter() - wall
        os.killpg(process.pid, signal.SIGTERM)
        process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        for match in (f"gatekeeper:celery:{namespace}:*", f"_kombu.binding*.{namespace}.*"):
            for key in client.scan_iter(match=match):
                client.delete(key)
        client.close()
    return ready, children_cpu() - cpu


#: The kinds that are one command to its exit (what ``--instructions`` can count).
COMMANDS = {
    "help": ["-m", "app.cli", "--help"],
    "keys-list": KEYS_LIST,
    "verify": ["-m", "app.cli", "verify", "--quiet"],
    "migrate": ["-m", "app.cli", "migrate"],
    "states-collect": ["-m", "app.cli", "states", "collect"],
    "worker-build": WORKER_BUILD,
}

KINDS = (
    "help",
    "keys-list",
    "verify",
    "migrate",
    "states-collect",
    "worker-build",
    "serve1",
    "serve2",
    "serve4",
    "serve2-split",
    "serve4-split",
)


def one_start(
    kind: str, tree: str, env: dict[str, str], broker: str | None, tag: str
) -> tuple[float, float]:
    """Wall and CPU of one start of ``kind`` in ``tree``."""
    if kind in COMMANDS:
        return run_command(tree, env, COMMANDS[kind])
    if kind.endswith("-split"):
        split = SPLITS.setdefault((kind, tree), [])
        return serve(tree, env, int(kind.removeprefix("serve").removesuffix("-split")), split)
    if kind.startswith("serve"):
        return serve(tree, env, int(kind.removeprefix("serve")))
    if kind == "celery":
        if broker is None:
            raise SystemExit("--kinds celery needs --broker redis://...")
        return celery_worker(tree, env, broker, tag)
    raise SystemExit(f"unknown kind {kind!r}: one of {', '.join((*KINDS, 'celery'))}")


def by_kind(
    trees: dict[str, str],
    urls: dict[str, str],
    key: str,
    kinds: list[str],
    rounds: int,
    broker: str | None,
) -> None:
    """Each round, each kind, each tree (alternating which tree goes first); then a table."""
    results: dict[tuple[str, str], list[tuple[float, float]]] = {}
    order = list(trees)
    print(f"load at the start: {os.getloadavg()}", flush=True)
    for r in range(rounds):
        for kind in kinds:
            for name in order if r % 2 == 0 else order[::-1]:
                env = environment(trees[name], urls[name], key)
                measured = one_start(kind, trees[name], env, broker, f"{name}{r}")
                results.setdefault((kind, name), []).append(measured)
        print(f"round {r + 1} done, load {os.getloadavg()}", flush=True)
    print(f"load at the end: {os.getloadavg()}")
    first = order[0]
    print(
        "| start | tree | n | CPU mean s | CPU median s | CPU / first tree (means) | wall median s"
        " |"
    )
    print("|---|---|---:|---:|---:|---:|---:|")
    for kind in kinds:
        base_mean = statistics.mean(c for _, c in results[(kind, first)])
        for name in order:
            got = results[(kind, name)]
            cpus = [c for _, c in got]
            print(
                f"| {kind} | {name} | {len(got)} | {statistics.mean(cpus):.3f} |"
                f" {statistics.median(cpus):.3f} | {statistics.mean(cpus) / base_mean:.3f} |"
                f" {statistics.median(w for w, _ in got):.2f} |"
            )
    split_kinds = [kind for kind in kinds if kind.endswith("-split")]
    if split_kinds:
        print()
        print(
            "| start | tree | n | parent's own CPU mean s | per worker: n | CPU mean s |"
            " CPU median s | worker / first tree (means) |"
        )
        print("|---|---|---:|---:|---:|---:|---:|---:|")
    for kind in split_kinds:
        first_workers = [w for _, ws in SPLITS[(kind, trees[first])] for w in ws]
        for name in order:
            parts = SPLITS[(kind, trees[name])]
            each = [w for _, ws in parts for w in ws]
            print(
                f"| {kind} | {name} | {len(parts)} | {statistics.mean(p for p, _ in parts):.3f} |"
                f" {len(each)} | {statistics.mean(each):.3f} | {statistics.median(each):.3f} |"
                f" {statistics.mean(each) / statistics.mean(first_workers):.3f} |"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", action="append", required=True, help="NAME=PATH (repeat)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--worker-builds", type=int, default=3, help="worker starts per round")
    parser.add_argument(
        "--instructions", action="store_true", help="count instructions under callgrind instead"
    )
    parser.add_argument(
        "--kinds",
        help=f"comma-separated starts to measure instead: {', '.join(KINDS)}, celery",
    )
    parser.add_argument("--broker", help="Redis URL for --kinds celery (broker and results)")
    args = parser.parse_args()
    trees = dict(item.split("=", 1) for item in args.tree)
    key = subprocess.run(
        [sys.executable, "-c", "from app import crypto; print(crypto.new_key())"],
        cwd=next(iter(trees.values())),
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    folder = Path(tempfile.mkdtemp(prefix="startup_bench_"))
    urls = {name: f"sqlite:///{folder / name}.db" for name in trees}
    for name, tree in trees.items():
        subprocess.run(  # noqa: S603 - this interpreter
            [sys.executable, "-c", f"from app.db.migrate import upgrade; upgrade({urls[name]!r})"],
            cwd=tree,
            env=environment(tree, urls[name], key),
            check=True,
        )
    if args.kinds and not args.instructions:
        by_kind(trees, urls, key, args.kinds.split(","), args.rounds, args.broker)
        return
    if args.instructions:
        counted = {
            name: {
                what: instructions(tree, environment(tree, urls[name], key), COMMANDS[what])
                for what in (args.kinds or "keys-list,worker-build").split(",")
            }
            for name, tree in trees.items()
        }
        first = next(iter(counted.values()))
        for name, counts in counted.items():
            print(
                f"{name}: "
                + "; ".join(
                    f"{what} {n:,} instructions ({n / first[what]:.4f})"
                    for what, n in counts.items()
                )
            )
        return
    commands: dict[str, list[tuple[float, float]]] = {name: [] for name in trees}
    servers: dict[str, list[tuple[float, float, int]]] = {name: [] for name in trees}
    builds: dict[str, list[tuple[float, float]]] = {name: [] for name in trees}
    order = list(trees)
    for r in range(args.rounds):
        for name in order if r % 2 == 0 else order[::-1]:
            env = environment(trees[name], urls[name], key)
            commands[name].append(command(trees[name], env))
            builds[name] += [worker_build(trees[name], env) for _ in range(args.worker_builds)]
            servers[name].append(server(trees[name], env))
    print(f"load at the end: {os.getloadavg()}")
    for name in trees:
        b = builds[name]
        if b:
            print(
                f"{name}: worker start (import uvicorn, app_factory) x{len(b)}: wall median"
                f" {sorted(w for w, _ in b)[len(b) // 2]:.2f} s, CPU mean"
                f" {sum(x for _, x in b) / len(b):.3f} s, CPU median"
                f" {sorted(x for _, x in b)[len(b) // 2]:.3f} s"
            )
        c, s = commands[name], servers[name]
        median = sorted(w for w, _ in c)[len(c) // 2]
        print(
            f"{name}: keys list x{len(c)}: wall median {median:.2f} s,"
            f" CPU mean {sum(x for _, x in c) / len(c):.2f} s | serve --workers 4 to /readyz:"
            f" wall median {sorted(w for w, _, _ in s)[len(s) // 2]:.2f} s, CPU (parent and"
            f" workers, to stop) mean {sum(x for _, x, _ in s) / len(s):.2f} s,"
            f" workers up {[n for *_, n in s]}"
        )


if __name__ == "__main__":
    main()
