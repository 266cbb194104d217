"""An import's validation per item: each domain validated on every line, or once per request.

Issue 27 (the import's CPU, h/imp's finding): every imported item is validated by the strict
``RegisterRequest`` model, its domain included. Since the sixteenth session a bulk request keeps
each distinct domain validated once (``DomainCache.models``, the model's validation context).
This script times both in one process, interleaved, on the population ``bench/survey_load.py``
writes (one domain on every line): ``per line`` validates without the context (as a single
registration does, and as every line did before), ``per request`` with it. Both then parse the
value and build the registration the same way (``registration_of``). Since the seventeenth
session the engine's parse of a domain is kept by the validated model (``DomainCache.parsed``),
so ``per line`` parses every line's domain as well, as a single registration does: the ratio
now covers both (the sixteenth session's 0.75–0.84 covered the validation alone).
CPU time of this process only; no database, no encryption (``gatekeeper import`` also seals
each value: ``bench/import_trees.py --parse-only`` times the whole worker's job across trees).

    .venv/bin/python bench/import_validation.py --objects 10000 --rounds 15
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import survey_load

from app.engine.limits import DEFAULT_LIMITS
from app.services.bodies import validated
from app.services.objects import DomainCache, registration_of
from app.services.schemas import RegisterRequest


def once(items: list[Any], *, per_request: bool) -> float:
    """CPU µs per item of validating ``items`` as one request."""
    domains = DomainCache()
    context = domains.context if per_request else None
    start = time.process_time()
    for i, item in enumerate(items):
        field = f"objects[{i}]"
        registration_of(
            validated(RegisterRequest, item, field, context), field, DEFAULT_LIMITS, domains
        )
    return 1e6 * (time.process_time() - start) / len(items)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--objects", type=int, default=10_000, help="items of one request")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--seed", type=int, default=20261127)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        population = Path(tmp) / "population.ndjson"
        survey_load.write_population(population, args.objects, args.seed)
        items = [orjson.loads(line) for line in population.read_bytes().splitlines()]
    found: dict[bool, list[float]] = {False: [], True: []}
    for _ in range(args.rounds):
        for per_request in (False, True):  # interleaved: the machine's drift hits both
            found[per_request].append(once(items, per_request=per_request))
    ratios = [b / a for a, b in zip(found[False], found[True], strict=True)]
    print(f"{args.objects} items, {args.rounds} rounds, load {os.getloadavg()[0]:.2f}")
    print()
    print("| domain validated | min µs/item | median µs/item | ratio of medians |")
    print("|---|---|---|---|")
    base = statistics.median(found[False])
    for per_request, label in ((False, "per line"), (True, "once per request")):
        med = statistics.median(found[per_request])
        print(f"| {label} | {min(found[per_request]):.1f} | {med:.1f} | {med / base:.3f} |")
    print()
    print("pairwise ratios (per request / per line):", " ".join(f"{r:.2f}" for r in sorted(ratios)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
