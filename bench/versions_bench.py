"""Bulk data versions on PostgreSQL: ``gatekeeper import --versions`` of N objects, timed.

Registers N objects (``gatekeeper import``, no query history yet), then times ``gatekeeper
import --versions FILE`` (batches of 10,000, one transaction each) and the same file again (every
batch replayed by its key), and reports the bytes per closed version (``object_versions``' heap
and index per row, and the value's ciphertext among them). Prints a table::

    .venv/bin/python bench/versions_bench.py --objects 100000
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.service_load import fresh_database  # noqa: E402
from bench.survey_load import KEY_FILE, REGIONS, cli, sql, write_population  # noqa: E402


def write_versions(path: Path, n: int, seed: int) -> None:
    rng = random.Random(seed)
    with path.open("w") as out:
        for i in range(n):
            value = {
                "age": rng.randrange(10),
                "sex": rng.randrange(2),
                "region": rng.choice(REGIONS),
            }
            out.write(json.dumps({"id": f"p{i:07d}", "value": value}) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--objects", type=int, default=100_000)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args(argv)
    from cryptography.fernet import Fernet

    KEY_FILE.write_text(Fernet.generate_key().decode())
    try:
        return _run(args)
    finally:
        KEY_FILE.unlink(missing_ok=True)


def _run(args: argparse.Namespace) -> int:
    with fresh_database() as (url, _name), tempfile.TemporaryDirectory() as tmp:
        population = Path(tmp) / "population.ndjson"
        write_population(population, args.objects, args.seed)
        done = cli(url, "import", str(population), "--quiet")
        if done.returncode != 0:
            print(done.stderr, file=sys.stderr)
            return 1
        versions = Path(tmp) / "versions.ndjson"
        write_versions(versions, args.objects, args.seed + 1)
        rows = []
        for label in ("versions", "same file again (replayed)"):
            start = time.perf_counter()
            done = cli(
                url, "import", "--versions", str(versions), "--quiet", "--batch-size", "10000"
            )
            seconds = time.perf_counter() - start
            if done.returncode != 0:
                print(done.stderr, file=sys.stderr)
                return 1
            rows.append((label, seconds, done.stdout.strip()))
        heap = int(sql(url, "SELECT pg_relation_size('object_versions')"))
        total = int(sql(url, "SELECT pg_total_relation_size('object_versions')"))
        cipher = float(sql(url, "SELECT avg(octet_length(value)) FROM object_versions"))
        count = int(sql(url, "SELECT count(*) FROM object_versions"))
    print(f"{'run':<28} {'objects':>9} {'seconds':>8} {'objects/s':>10}  answer")
    for label, seconds, answer in rows:
        rate = args.objects / seconds
        print(f"{label:<28} {args.objects:>9,} {seconds:>8.1f} {rate:>10,.0f}  {answer}")
    print(
        f"object_versions: {count:,} rows, heap {heap / count:.0f} B/row, with index "
        f"{total / count:.0f} B/row, of which value ciphertext {cipher:.0f} B"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
