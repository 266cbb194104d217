"""``olh`` and ``hadamard``: the contract's hash and sign, exact losses, worst cases, samplers.

Every loss here is checked against a brute force over the domain in exact rationals (the
two-level likelihood: ``ε`` on the values an output supports), and every worst case against an
enumeration of outputs — not against the formulas the engine uses.
"""

from __future__ import annotations

import itertools
import math
import random
from collections import Counter
from fractions import Fraction
from typing import Any

import numpy as np
import pytest

from app.engine import pipeline
from app.engine.calculator import compute_loss
from app.engine.domain import parse_domain
from app.engine.errors import InvalidInput
from app.engine.exact import subset_losses
from app.engine.filters import FilterKind
from app.engine.limits import EngineLimits
from app.engine.mechanisms import parse_query
from app.engine.mechanisms.oracles import (
    HASH_PRIME,
    HadamardResponse,
    OptimizedLocalHashing,
    default_g,
    hash_coefficients,
    olh_hash,
    olh_hash_value,
    separating_column,
)

MASK = (1 << 64) - 1


def _splitmix_reference(seed: int) -> tuple[int, int]:
    """contract.md's recipe, written out again independently of the engine's code."""
    state, out = seed, []
    for _ in range(2):
        state = (state + 0x9E3779B97F4A7C15) % (1 << 64)
        z = state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) % (1 << 64)
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) % (1 << 64)
        out.append(z ^ (z >> 31))
    return out[0], out[1]


def _h(seed: int, i: int, g: int) -> int:
    p = (1 << 61) - 1
    first, second = _splitmix_reference(seed)
    a, b = first % (p - 1) + 1, second % p
    return ((a * i + b) % p) % g


#: The test vectors of docs/oracles.md (seed, value index, g → bucket): any client that
#: implements the hash must reproduce them.
VECTORS = [
    (0, 0, 2, _h(0, 0, 2)),
    (1, 5, 3, _h(1, 5, 3)),
    (12345, 7, 5, _h(12345, 7, 5)),
    (2**63, 999, 4, _h(2**63, 999, 4)),
    (MASK, 2**24 - 1, 1000, _h(MASK, 2**24 - 1, 1000)),
]


def test_the_hash_follows_the_contracts_recipe() -> None:
    assert VECTORS == [(0, 0, 2, 1), (1, 5, 3, 2), (12345, 7, 5, 0), (2**63, 999, 4, 1),
                       (MASK, 2**24 - 1, 1000, 292)]  # fmt: skip
    for seed, index, g, bucket in VECTORS:
        assert olh_hash_value(seed, index, g) == bucket


def test_the_vectorised_hash_equals_python_integers_at_the_extremes() -> None:
    rng = random.Random(7)
    cases = [(HASH_PRIME - 1, HASH_PRIME - 1), (1, 0), (2**32, 2**32 - 1), (2**61 - 2, 0)]
    cases += [hash_coefficients(rng.getrandbits(64)) for _ in range(2000)]
    indexes = np.array([0, 1, 2**24 - 1, 2**23, 12345], dtype=np.uint64)
    for a, b in cases:
        g = rng.randint(2, 5000)
        got = olh_hash(np.uint64(a), np.uint64(b), indexes, g).tolist()
        assert got == [((a * int(i) + b) % HASH_PRIME) % g for i in indexes]


def _domain(k: int, extra: bool = True) -> dict[str, Any]:
    attributes = [{"name": "v", "type": "integer", "low": 0, "high": k - 1}]
    if extra:
        attributes.append({"name": "c", "type": "categorical", "values": ["a", "b", "c"]})
    return {"attributes": attributes}


def _supports(mech: Any, output: Any) -> list[int]:
    if isinstance(mech, OptimizedLocalHashing):
        seed, bucket = output
        return [int(_h(seed, i, mech.g) == bucket) for i in range(mech.k)]
    return [int(bin((i + 1) & output).count("1") % 2 == 0) for i in range(mech.k)]


def _brute_loss(entries: list[tuple[Any, Any, Fraction]], shape: tuple[int, int]) -> Fraction:
    """max − min over every point of Σ ε·[v ∈ S] (grr on ``c`` adds ε on its output)."""
    totals = []
    for v, c in itertools.product(range(shape[0]), range(shape[1])):
        total = Fraction(0)
        for kind, support, eps in entries:
            if kind == "v":
                total += eps * support[v]
            else:
                total += eps * (c == support)
        totals.append(total)
    return max(totals) - min(totals)


@pytest.mark.parametrize("kind", ["olh", "hadamard"])
def test_losses_are_exact_and_the_worst_case_is_attained(kind: str) -> None:
    rng = random.Random(11 if kind == "olh" else 12)
    k = 6
    raw_domain = _domain(k)
    domain = parse_domain(raw_domain)
    for trial in range(25):
        eps = rng.choice(["0.1", "0.25", "0.5", "1"])
        query: dict[str, Any] = {"mechanism": kind, "attribute": "v", "epsilon": float(eps)}
        if kind == "olh":
            query["g"] = rng.randint(2, k)
        grr = {"mechanism": "grr", "attribute": "c", "epsilon": 0.3}
        mech = parse_query(query, domain)
        history, entries = [], []
        for _ in range(rng.randint(0, 6)):
            if rng.random() < 0.2:
                out = rng.randrange(3)
                history.append({"query": grr, "output": ["a", "b", "c"][out]})
                entries.append(("c", out, Fraction(3, 10)))
                continue
            output = mech.sample({"v": rng.randrange(k)})
            history.append({"query": query, "output": mech.output_json(output)})
            entries.append(("v", _supports(mech, output), Fraction(eps)))
        answer = compute_loss(
            {"domain": raw_domain, "history": history, "budget": 100, "candidate": query}
        )
        assert answer["realized_loss"]["exact"] is True
        assert Fraction(answer["realized_loss"]["upper"]) == _float(_brute_loss(entries, (k, 3)))
        # every output, enumerated: olh over the first 120 seeds, hadamard over all columns
        outputs = (
            [(s, b) for s in range(120) for b in range(query["g"])]
            if kind == "olh"
            else list(range(mech.output_count))
        )
        worst = max(
            _brute_loss([*entries, ("v", _supports(mech, o), Fraction(eps))], (k, 3))
            for o in outputs
        )
        found = answer["candidate"]
        assert found["worst_case_upper"] == _float(worst), trial
        # the listed outputs' losses are their own, and the worst one is listed
        for listed in found["per_output"]:
            output = mech.parse_output(listed["output"], "output")
            own = _brute_loss([*entries, ("v", _supports(mech, output), Fraction(eps))], (k, 3))
            assert listed["upper"] == listed["lower"] == _float(own)
        assert max(o["upper"] for o in found["per_output"]) == found["worst_case_upper"]


def _float(x: Fraction) -> float:
    return float(x)


def test_hadamard_lists_every_column_when_few_and_one_witness_beyond_the_listing_limit() -> None:
    domain = parse_domain(_domain(6, extra=False))
    query = {"mechanism": "hadamard", "attribute": "v", "epsilon": 1.0}
    assert parse_query(query, domain).output_count == 8
    few = compute_loss(
        {"domain": _domain(6, False), "history": [], "budget": 5, "candidate": query}
    )
    assert few["candidate"]["per_output_complete"] is True
    assert [o["output"] for o in few["candidate"]["per_output"]] == list(range(8))
    tight = EngineLimits(max_listed_outputs=4)
    one = compute_loss(
        {"domain": _domain(6, False), "history": [], "budget": 5, "candidate": query}, limits=tight
    )
    assert one["candidate"]["per_output_complete"] is False
    assert len(one["candidate"]["per_output"]) == 1
    assert one["candidate"]["worst_case_upper"] == 1.0


def test_separating_columns_separate_every_ordered_pair() -> None:
    for inside, outside in itertools.permutations(range(40), 2):
        c = separating_column(inside, outside)
        assert bin((inside + 1) & c).count("1") % 2 == 0
        assert bin((outside + 1) & c).count("1") % 2 == 1


def test_ties_are_exact_in_the_written_decimals() -> None:
    """Two olh reports of ε = 0.1 supporting value 0 and not 1: loss exactly 0.2; a third
    query's worst case is exactly 0.3, equal to the budget 0.3, and accepted (floats give
    0.30000000000000004)."""
    raw = _domain(4, extra=False)
    query = {"mechanism": "olh", "attribute": "v", "epsilon": 0.1, "g": 2}
    seeds = [s for s in range(100) if _h(s, 0, 2) != _h(s, 1, 2)][:2]
    history = [{"query": query, "output": {"seed": str(s), "bucket": _h(s, 0, 2)}} for s in seeds]
    answer = compute_loss({"domain": raw, "history": history, "budget": 0.3, "candidate": query})
    assert answer["realized_loss"] == {"lower": 0.2, "upper": 0.2, "exact": True}
    assert answer["candidate"]["worst_case_upper"] == 0.3
    assert answer["candidate"]["accepted"]["bayesian"] is True
    over = compute_loss({"domain": raw, "history": history, "budget": 0.29, "candidate": query})
    assert over["candidate"]["accepted"]["bayesian"] is False


def test_the_default_g_and_its_range() -> None:
    assert default_g(1.0, 1000) == round(math.e) + 1 == 4
    assert default_g(5.0, 10) == 10  # round(e^5) + 1 = 149 is above k
    assert default_g(0.01, 1) == 2
    domain = parse_domain(_domain(1000, extra=False))
    mech = parse_query({"mechanism": "olh", "attribute": "v", "epsilon": 1.0}, domain)
    assert mech.to_json() == {"mechanism": "olh", "attribute": "v", "epsilon": 1.0, "g": 4}


@pytest.mark.parametrize(
    ("query", "field", "domain"),
    [
        ({"mechanism": "olh", "attribute": "v", "epsilon": 1, "g": 1}, "query.g", _domain(5)),
        ({"mechanism": "olh", "attribute": "v", "epsilon": 1, "g": 6}, "query.g", _domain(5)),
        ({"mechanism": "olh", "attribute": "v", "epsilon": 1, "g": 2.5}, "query.g", _domain(5)),
        ({"mechanism": "olh", "attribute": "x", "epsilon": 1}, "query.attribute",
         {"attributes": [{"name": "x", "type": "real", "low": 0, "high": 1}]}),
        ({"mechanism": "hadamard", "attribute": "v", "epsilon": 1}, "query.attribute",
         {"attributes": [{"name": "v", "type": "integer", "low": 0, "high": 2**20}]}),
        ({"mechanism": "hadamard", "attribute": "v", "epsilon": 1, "g": 2}, "query.g",
         _domain(5)),
    ],
)  # fmt: skip
def test_bad_queries_name_their_field(query: dict[str, Any], field: str, domain: Any) -> None:
    with pytest.raises(InvalidInput) as caught:
        parse_query(query, parse_domain(domain))
    assert caught.value.field == field


@pytest.mark.parametrize(
    ("output", "field"),
    [
        ({"seed": 5, "bucket": 0}, "output.seed"),
        ({"seed": "-5", "bucket": 0}, "output.seed"),
        ({"seed": "0x10", "bucket": 0}, "output.seed"),
        ({"seed": str(2**64), "bucket": 0}, "output.seed"),
        ({"seed": "5", "bucket": 3}, "output.bucket"),
        ({"seed": "5"}, "output.bucket"),
        ({"seed": "5", "bucket": 0, "x": 1}, "output.x"),
        ([5, 0], "output"),
    ],
)
def test_bad_olh_outputs_name_their_field(output: Any, field: str) -> None:
    mech = parse_query(
        {"mechanism": "olh", "attribute": "v", "epsilon": 1, "g": 3}, parse_domain(_domain(5))
    )
    with pytest.raises(InvalidInput) as caught:
        mech.parse_output(output, "output")
    assert caught.value.field == field
    assert mech.parse_output({"seed": str(MASK), "bucket": 2}, "output") == (MASK, 2)


def test_the_olh_sampler_keeps_the_bucket_with_the_declared_probability() -> None:
    mech = parse_query(
        {"mechanism": "olh", "attribute": "v", "epsilon": 1.0, "g": 4}, parse_domain(_domain(50))
    )
    n = 20_000
    kept = 0
    seeds = set()
    for _ in range(n):
        seed, bucket = mech.sample({"v": 17})
        seeds.add(seed)
        kept += bucket == _h(seed, 17, 4)
    p = math.e / (math.e + 3)
    assert abs(kept / n - p) < 5 * math.sqrt(p * (1 - p) / n)
    assert len(seeds) == n  # fresh 64-bit seeds


def test_the_hadamard_sampler_draws_columns_with_the_declared_probabilities() -> None:
    mech = parse_query(
        {"mechanism": "hadamard", "attribute": "v", "epsilon": 1.0}, parse_domain(_domain(6))
    )
    assert isinstance(mech, HadamardResponse)
    assert mech.output_count == 8
    n = 40_000
    counts = Counter(mech.sample({"v": 4}) for _ in range(n))
    plus = [c for c in range(8) if bin(5 & c).count("1") % 2 == 0]
    expected = {c: (math.e if c in plus else 1.0) / (4 * (1 + math.e)) for c in range(8)}
    chi2 = sum((counts[c] - n * expected[c]) ** 2 / (n * expected[c]) for c in range(8))
    assert chi2 < 24.3  # 7 degrees of freedom, p = 0.001


def test_the_docs_vector_table_and_worked_example_hold() -> None:
    """docs/oracles.md's table, row by row, and its worked example (seed 12345, g = 4)."""
    from pathlib import Path

    text = (Path(__file__).parents[2] / "docs" / "oracles.md").read_text()
    rows = [
        [int(cell) for cell in line.strip("|").split("|")]
        for line in text.splitlines()
        if line.startswith("| ") and line.strip("| ").replace("|", "").replace(" ", "").isdigit()
    ]
    assert len(rows) == 7
    for seed, index, g, bucket in rows:
        assert _h(seed, index, g) == bucket
        assert olh_hash_value(seed, index, g) == bucket
    assert [olh_hash_value(12345, i, 4) for i in range(4)] == [2, 1, 0, 3]
    assert hash_coefficients(12345) == (149043579997720995, 1472357008447633646)
    assert [1 if bin(3 & c).count("1") % 2 == 0 else -1 for c in range(4)] == [1, -1, -1, 1]


@pytest.mark.parametrize(("k", "g", "probe"), [(6, 3, 64), (200, 4, 8), (300, 250, 64), (40, 2, 1)])
def test_every_report_s_loss_at_once_equals_the_brute_force(k: int, g: int, probe: int) -> None:
    """``subset_losses`` (a survey's olh answers, no state built) against a brute force.

    Reports on several histories at once (olh reports of two ε's and grr on another
    attribute); probes of 1–8 values leave some reports unsettled (no member, or no
    non-member, among the probed values) so they are looked up over every value; g = 250 of
    300 values makes most of them so.
    """
    rng = random.Random(k * 1000 + g)
    domain = parse_domain(_domain(k))
    query: dict[str, Any] = {"mechanism": "olh", "attribute": "v", "epsilon": 0.5, "g": g}
    mech = parse_query(query, domain)
    assert isinstance(mech, OptimizedLocalHashing)
    grr = parse_query({"mechanism": "grr", "attribute": "c", "epsilon": 0.3}, domain)
    empty = pipeline.ObjectSnapshot.empty(domain, budget=100, filter=FilterKind.BAYESIAN)
    snapshots, histories = [empty], [[]]
    for step in range(5):  # histories of 0..5 entries
        last = snapshots[-1]
        entries = list(histories[-1])
        if step % 2:
            out = rng.randrange(3)
            snapshots.append(pipeline.record(last, grr, out, None))
            entries.append(("c", out, Fraction(3, 10)))
        else:
            output = mech.sample({"v": rng.randrange(k)})
            snapshots.append(pipeline.record(last, mech, output, None))
            entries.append(("v", _supports(mech, output), Fraction(1, 2)))
        histories.append(entries)
    outputs = [mech.sample({"v": rng.randrange(k)}) for _ in range(60)]
    outputs += [(rng.randrange(1 << 64), rng.randrange(g)) for _ in range(30)]
    owners = [rng.randrange(len(snapshots)) for _ in outputs]
    exacts = [s.state.exact for s in snapshots]  # type: ignore[union-attr]
    profiles = [e.subset_profile(mech.axis, mech._group) for e in exacts]  # type: ignore[union-attr]
    found = subset_losses(profiles, np.array(owners), _olh_hits(mech, outputs), probe=probe)  # type: ignore[arg-type]
    expected = [
        _brute_loss([*histories[o], ("v", _supports(mech, y), Fraction(1, 2))], (k, 3))
        if k <= 40
        else pipeline.record(snapshots[o], mech, y, None).state.exact.loss()  # type: ignore[union-attr]
        for y, o in zip(outputs, owners, strict=True)
    ]
    assert found == expected
    # as a survey records them: the same bounds as recording each output
    bounds = pipeline.losses_after(mech, snapshots, outputs, owners, [None] * len(snapshots))
    assert bounds == [
        pipeline.record(snapshots[o], mech, y, None).loss()
        for y, o in zip(outputs, owners, strict=True)
    ]


def _olh_hits(mech: OptimizedLocalHashing, outputs: list[Any]) -> Any:
    """The reference ``hits`` of ``subset_losses``: Python integers, value by value."""

    def hits(rows: Any, values: Any) -> Any:
        return np.array(
            [
                [_h(outputs[r][0], int(v), mech.g) == outputs[r][1] for v in row]
                for r, row in zip(rows, values, strict=True)
            ]
        )

    return hits


def test_losses_after_records_each_output_when_the_history_is_not_exact() -> None:
    """A ``matrix`` query has no exact form: the loss of each report comes from its own record."""
    domain = parse_domain(_domain(5))
    matrix = parse_query(
        {"mechanism": "matrix", "outputs": [0, 1],
         "probabilities": [[0.7, 0.3]] * 7 + [[0.4, 0.6]] * 8},
        domain,
    )  # fmt: skip
    mech = parse_query({"mechanism": "olh", "attribute": "v", "epsilon": 1.0}, domain)
    empty = pipeline.ObjectSnapshot.empty(domain, budget=100, filter=FilterKind.BAYESIAN)
    inexact = pipeline.record(empty, matrix, 1, None)
    assert inexact.state.exact is None  # type: ignore[union-attr]
    snapshots = [inexact, empty]
    outputs = [mech.sample({"v": v % 5}) for v in range(30)]
    owners = [v % 2 for v in range(30)]
    found = pipeline.losses_after(mech, snapshots, outputs, owners, [None, None])
    assert found == [
        pipeline.record(snapshots[o], mech, y, None).loss()
        for y, o in zip(outputs, owners, strict=True)
    ]
    assert len(set(found[::2])) > 1
