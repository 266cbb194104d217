"""A survey chunk's decryption (``ValueCipher.decrypt_many``) on stored values, trees side by side.

Issue 27 item 3 (h/member). A chunk decrypts its 5,000 members' values at once; this times that
call alone on the values of a database kept by ``bench/chunk_arrays.py --keep`` (read once, in
the chunks' order of ids), each tree in its own subprocess (``PYTHONPATH`` = that tree; the run
checks it imported that tree's ``app``), the trees alternated round by round:

    bench/decrypt_chunks.py --database vc_1f7ee5c06224 --trees /work/wt/base,/work/wt/member

Each run decrypts ``--chunks`` chunks ``--repeats`` times and reports the process's CPU per token
(``time.process_time``): the minimum and the median over the repeats of the whole set. The
plaintexts of both trees are compared (their digest must agree).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.append(str(ROOT))  # appended: a run of another tree imports that tree's ``app``

from bench.chunk_arrays import ADMIN, KEY_FILE  # noqa: E402


def _values(database: str, chunks: int, size: int) -> list[list[str]]:
    import psycopg

    url = ADMIN.rsplit("/", 1)[0] + "/" + database
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT CAST(value AS TEXT) FROM objects ORDER BY id LIMIT %s", (chunks * size,)
        ).fetchall()
    values = [r[0] for r in rows]
    return [values[at : at + size] for at in range(0, len(values), size)]


def one(args: argparse.Namespace) -> dict[str, object]:
    """This process's tree: CPU per token of ``decrypt_many`` over the chunks."""
    import app
    from app import crypto

    cipher = crypto.cipher_from_settings(None, str(KEY_FILE), production=False, create=False)
    chunks = _values(args.database, args.chunks, args.size)
    digest = hashlib.sha256()
    for chunk in chunks:
        for text in cipher.decrypt_many(chunk):
            digest.update(text.encode() + b"\x1f")
    tokens = sum(map(len, chunks))
    seconds = []
    for _ in range(args.repeats):
        start = time.process_time()
        for chunk in chunks:
            cipher.decrypt_many(chunk)
        seconds.append(time.process_time() - start)
    return {
        "app": str(Path(app.__file__).parents[1]),
        "tokens": tokens,
        "min_us": min(seconds) / tokens * 1e6,
        "median_us": statistics.median(seconds) / tokens * 1e6,
        "digest": digest.hexdigest()[:16],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database", required=True, help="a database kept by chunk_arrays.py")
    parser.add_argument("--trees", default=str(ROOT), help="comma-separated trees (alternated)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--chunks", type=int, default=8)
    parser.add_argument("--size", type=int, default=5000)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one(args)))
        return
    trees = [t for t in args.trees.split(",") if t]
    print("| round | tree | tokens | CPU µs a token (min) | (median) | plaintexts | load |")
    print("|---|---|---:|---:|---:|---|---|")
    for n in range(args.rounds):
        for tree in trees if n % 2 == 0 else trees[::-1]:
            env = {**os.environ, "PYTHONPATH": f"{tree}:{tree}/clients/python/src"}
            out = subprocess.run(  # noqa: S603 - this script
                [sys.executable, __file__, *sys.argv[1:], "--one"],
                env=env,
                check=True,
                capture_output=True,
                text=True,
            ).stdout
            got = json.loads(out.strip().splitlines()[-1])
            if Path(str(got["app"])).resolve() != Path(tree).resolve():
                raise SystemExit(f"{tree}: imported {got['app']}")
            load = os.getloadavg()[0]
            print(
                f"| {n + 1} | {tree} | {got['tokens']:,} | {got['min_us']:.2f} | "
                f"{got['median_us']:.2f} | {got['digest']} | {load:.2f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
