"""Decoding ``olh`` and ``hadamard`` reports: support counts against brute force, and the 95%
intervals of the per-value estimates covering the truth at their nominal rate."""

from __future__ import annotations

import json
import math
import random

import numpy as np
import pytest

from app.engine.domain import parse_domain
from app.engine.estimates import (
    estimate,
    hadamard_support_counts,
    olh_support_counts,
    tally_outputs,
)
from app.engine.mechanisms import parse_query
from app.engine.mechanisms.oracles import hadamard_sign, olh_hash_value


@pytest.mark.parametrize("g", [2, 3, 4, 6, 7, 12, 1000])
def test_olh_support_counts_equal_a_brute_force(g: int) -> None:
    rng = random.Random(g)
    n, k = 300, 40
    seeds = [rng.getrandbits(64) for _ in range(n)] + [0, 2**64 - 1]
    buckets = [rng.randrange(g) for _ in seeds]
    got = olh_support_counts(np.array(seeds, dtype=np.uint64), np.array(buckets), k, g)
    want = [sum(olh_hash_value(s, v, g) == b for s, b in zip(seeds, buckets, strict=True))
            for v in range(k)]  # fmt: skip
    assert got.tolist() == want


def test_hadamard_support_counts_equal_a_brute_force() -> None:
    rng = random.Random(3)
    k, size = 37, 64
    columns = [rng.randrange(size) for _ in range(500)]
    got = hadamard_support_counts(np.array(columns), k, size)
    want = [sum(hadamard_sign(v + 1, j) == 1 for j in columns) for v in range(k)]
    assert got.tolist() == want


@pytest.mark.parametrize("kind", ["olh", "hadamard", "grr"])
def test_the_95_percent_intervals_cover_at_their_nominal_rate(kind: str) -> None:
    """60 simulated surveys of 3,000 members over 10 values (Zipf-like shares), sampled by the
    engine's own samplers: the share of the 600 per-value intervals that contain the true
    frequency is 0.95 within 4 binomial standard errors."""
    k, n, runs = 10, 3000, 60
    domain = parse_domain({"attributes": [{"name": "v", "type": "integer", "low": 0,
                                           "high": k - 1}]})  # fmt: skip
    mech = parse_query({"mechanism": kind, "attribute": "v", "epsilon": 1.0}, domain)
    weights = [1 / (i + 1) ** 1.1 for i in range(k)]
    rng = random.Random(5)
    covered = total = 0
    errors = []
    for _ in range(runs):
        values = rng.choices(range(k), weights=weights, k=n)
        outputs = [mech.sample({"v": v}) for v in values]
        found = estimate(mech, n, tally_outputs(mech, outputs)).value
        assert found is not None
        assert found["kind"] == "histogram"
        for v in range(k):
            truth = values.count(v) / n
            low, high = found["ci95"][str(v)]
            covered += low <= truth <= high
            total += 1
            errors.append(found["values"][str(v)] - truth)
    share = covered / total
    assert abs(share - 0.95) <= 4 * math.sqrt(0.95 * 0.05 / total), share
    # unbiased: the mean error over all runs and values is within 4 standard errors of 0
    spread = float(np.std(errors)) / math.sqrt(len(errors))
    assert abs(float(np.mean(errors))) <= 4 * spread


def test_batch_tallies_equal_per_output_tallies() -> None:
    domain = parse_domain({"attributes": [{"name": "v", "type": "categorical",
                                           "values": ["a", "b", "c", "d", "e"]}]})  # fmt: skip
    for kind in ("olh", "hadamard"):
        mech = parse_query({"mechanism": kind, "attribute": "v", "epsilon": 2.0}, domain)
        outputs = [mech.sample({"v": v}) for v in "abcdeabcab"]
        one_by_one: dict[str, int] = {}
        for output in outputs:
            for key in tally_outputs(mech, [output]):
                one_by_one[key] = one_by_one.get(key, 0) + 1
        assert dict(tally_outputs(mech, outputs)) == one_by_one
        assert set(one_by_one) <= {json.dumps(v) for v in "abcde"}
