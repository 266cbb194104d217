"""Each mechanism against an independent brute-force reading of contract.md's table.

For small domains every ``Pr(y | x)`` is recomputed here from the formulas in contract.md with plain
``math`` (no engine code), over every point and every output, and compared with the engine's
terms, tight ε, and realized loss after each output.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import numpy as np
import pytest

from app.engine.domain import Domain, parse_domain
from app.engine.likelihood import LikelihoodState
from app.engine.limits import EngineLimits
from app.engine.mechanisms import parse_query
from app.engine.mechanisms.base import Mechanism

DOMAIN = {
    "attributes": [
        {"name": "age", "type": "integer", "low": 0, "high": 4},
        {"name": "sex", "type": "integer", "low": 0, "high": 1},
        {"name": "disease", "type": "categorical", "values": ["none", "flu", "covid"]},
    ]
}


def _points(domain: Domain) -> list[dict[str, Any]]:
    return [domain.value_at(i) for i in range(domain.size)]


def _brute(query: dict[str, Any], x: dict[str, Any]) -> dict[Any, float]:
    """``{output: Pr(output | x)}`` straight from contract.md's table."""
    kind = query["mechanism"]
    eps = query.get("epsilon", 0.0)
    if kind == "grr":
        attr = next(a for a in DOMAIN["attributes"] if a["name"] == query["attribute"])
        values = attr.get("values") or list(range(attr["low"], attr["high"] + 1))
        k = len(values)
        den = k - 1 + math.exp(eps)
        return {v: (math.exp(eps) if v == x[attr["name"]] else 1.0) / den for v in values}
    if kind == "binary_rr":
        p = query["predicate"]
        xv, v = x[p["attribute"]], p["value"]
        ops = {
            "==": lambda: xv == v,
            "!=": lambda: xv != v,
            "<": lambda: xv < v,
            "<=": lambda: xv <= v,
            ">": lambda: xv > v,
            ">=": lambda: xv >= v,
            "in": lambda: xv in v,
        }
        truth = ops[p["op"]]()
        hi = math.exp(eps) / (1 + math.exp(eps))
        return {1: hi if truth else 1 - hi, 0: 1 - hi if truth else hi}
    if kind in ("linear", "logistic"):
        z = query.get("intercept", 0.0) + sum(w * x[a] for a, w in query["weights"].items())
        if kind == "linear":
            a, b = query["range"]
            y = min(b, max(a, z)) if query.get("truncate") else z
            t = (y - a) / (b - a)
            lo_out, hi_out = a, b
        else:
            t = 1 / (1 + math.exp(-z))
            lo_out, hi_out = 0, 1
        e = math.exp(eps)
        p_hi = t * (e - 1) / (e + 1) + 1 / (e + 1)
        return {hi_out: p_hi, lo_out: 1 - p_hi}
    raise AssertionError(kind)


def _brute_ue(query: dict[str, Any], x: dict[str, Any]) -> dict[tuple[int, ...], float]:
    attr = next(a for a in DOMAIN["attributes"] if a["name"] == query["attribute"])
    values = attr.get("values") or list(range(attr["low"], attr["high"] + 1))
    eps = query["epsilon"]
    if query.get("variant", "optimized") == "optimized":
        p, q = 0.5, 1 / (math.exp(eps) + 1)
    else:
        p = math.exp(eps / 2) / (math.exp(eps / 2) + 1)
        q = 1 - p
    out = {}
    for bits in itertools.product((0, 1), repeat=len(values)):
        prob = 1.0
        for v, bit in zip(values, bits, strict=True):
            pv = p if v == x[attr["name"]] else q
            prob *= pv if bit else 1 - pv
        out[bits] = prob
    return out


QUERIES = [
    {"mechanism": "grr", "attribute": "age", "epsilon": 1.3},
    {"mechanism": "grr", "attribute": "disease", "epsilon": 0.4},
    {
        "mechanism": "binary_rr",
        "predicate": {"attribute": "age", "op": ">=", "value": 3},
        "epsilon": 0.7,
    },
    {
        "mechanism": "binary_rr",
        "predicate": {"attribute": "disease", "op": "in", "value": ["flu", "covid"]},
        "epsilon": 2.0,
    },
    {
        "mechanism": "binary_rr",
        "predicate": {"attribute": "sex", "op": "!=", "value": 0},
        "epsilon": 0.2,
    },
    {
        "mechanism": "linear",
        "weights": {"age": 0.2, "sex": -0.3},
        "intercept": 0.1,
        "range": [-1, 1],
        "epsilon": 0.9,
    },
    {
        "mechanism": "linear",
        "weights": {"age": 2.0},
        "intercept": -3,
        "range": [0, 2],
        "truncate": True,
        "epsilon": 1.1,
    },
    {
        "mechanism": "logistic",
        "weights": {"age": 1.5, "sex": -2.0},
        "intercept": -2.0,
        "epsilon": 0.8,
    },
]
UE_QUERIES = [
    {"mechanism": "unary_encoding", "attribute": "disease", "epsilon": 1.0, "variant": "optimized"},
    {"mechanism": "unary_encoding", "attribute": "age", "epsilon": 0.6, "variant": "symmetric"},
]


def _engine_column(mech: Mechanism, domain: Domain, output: Any) -> np.ndarray:
    state = LikelihoodState(domain)
    term = mech.term(mech.parse_output(output, "output"))
    return np.broadcast_to(state.broadcast(term), domain.shape).ravel()


@pytest.mark.parametrize("query", QUERIES, ids=lambda q: q["mechanism"])
def test_terms_and_tight_epsilon_match_the_formulas(query: dict[str, Any]) -> None:
    domain = parse_domain(DOMAIN)
    mech = parse_query(query, domain)
    points = _points(domain)
    table = [_brute(query, x) for x in points]
    outputs = list(table[0])
    assert mech.output_count == len(outputs)
    tight = 0.0
    for out in outputs:
        expected = np.log([row[out] for row in table])
        np.testing.assert_allclose(
            _engine_column(mech, domain, out), expected, rtol=1e-12, atol=1e-14
        )
        tight = max(tight, float(expected.max() - expected.min()))
    assert mech.epsilon == pytest.approx(tight, rel=1e-12, abs=1e-14)


@pytest.mark.parametrize("query", UE_QUERIES, ids=lambda q: q["variant"])
def test_unary_encoding_terms_match_up_to_an_output_constant(query: dict[str, Any]) -> None:
    domain = parse_domain(DOMAIN)
    mech = parse_query(query, domain)
    points = _points(domain)
    table = [_brute_ue(query, x) for x in points]
    tight = 0.0
    for bits in list(table[0])[:40]:
        expected = np.log([row[bits] for row in table])
        got = _engine_column(mech, domain, list(bits))
        # The engine drops the factor C(s) common to every point: the difference is constant.
        diff = got - expected
        np.testing.assert_allclose(diff, diff[0], atol=1e-12)
        tight = max(tight, float(expected.max() - expected.min()))
    assert mech.epsilon == pytest.approx(query["epsilon"], rel=1e-12)
    assert tight == pytest.approx(query["epsilon"], rel=1e-9)


def _random_state(domain: Domain, rng: np.random.Generator) -> LikelihoodState:
    return LikelihoodState(domain, rng.normal(scale=0.8, size=domain.shape))


def _loss_after_by_applying(state: LikelihoodState, mech: Mechanism, output: Any) -> float:
    copy = state.copy()
    copy.apply(mech.term(mech.parse_output(output, "output")))
    return copy.computed_loss


@pytest.mark.parametrize("query", QUERIES + UE_QUERIES[:1], ids=lambda q: q["mechanism"])
def test_candidate_losses_equal_applying_each_output(query: dict[str, Any]) -> None:
    rng = np.random.default_rng(7)
    domain = parse_domain(DOMAIN)
    mech = parse_query(query, domain)
    for _ in range(5):
        state = _random_state(domain, rng)
        cand = mech.candidate_losses(state)
        for j, loss in enumerate(cand.losses):
            expected = _loss_after_by_applying(state, mech, cand.output_of(j))
            assert loss == pytest.approx(expected, abs=1e-12)


def test_grr_fast_path_equals_the_generic_table_on_many_values() -> None:
    rng = np.random.default_rng(3)
    domain = parse_domain(
        {
            "attributes": [
                {"name": "a", "type": "integer", "low": 0, "high": 29},
                {"name": "b", "type": "integer", "low": 0, "high": 6},
            ]
        }
    )
    mech = parse_query({"mechanism": "grr", "attribute": "a", "epsilon": 0.9}, domain)
    for _ in range(20):
        state = _random_state(domain, rng)
        # make ties and shared extremes likely, the hard cases of the top-two logic
        state.logp[rng.integers(0, 30), :] = 0.0
        cand = mech.candidate_losses(state)
        brute = [_loss_after_by_applying(state, mech, v) for v in range(30)]
        np.testing.assert_allclose(cand.losses, brute, atol=1e-12)


@pytest.mark.parametrize("variant", ["optimized", "symmetric"])
def test_unary_encoding_closed_form_worst_case_equals_enumeration(variant: str) -> None:
    rng = np.random.default_rng(11)
    domain = parse_domain(
        {
            "attributes": [
                {"name": "c", "type": "integer", "low": 0, "high": 9},
                {"name": "d", "type": "integer", "low": 0, "high": 3},
            ]
        }
    )
    query = {"mechanism": "unary_encoding", "attribute": "c", "epsilon": 0.8, "variant": variant}
    closed = parse_query(query, domain, limits=EngineLimits(max_listed_outputs=8))
    enumerated = parse_query(query, domain, limits=EngineLimits(max_listed_outputs=4096))
    for trial in range(30):
        state = _random_state(domain, rng)
        if trial % 3 == 0:  # the same value holds both the max and the min
            state.logp[4, 0], state.logp[4, 1] = 0.5, -3.0
            state = LikelihoodState(domain, state.logp)
        fast = closed.candidate_losses(state)
        full = enumerated.candidate_losses(state)
        assert not fast.complete
        assert full.complete
        assert full.losses.size == 2**10
        assert fast.losses.max() == pytest.approx(full.losses.max(), abs=1e-12)
        # the representative output really attains the worst case
        bits = fast.output_of(0)
        assert _loss_after_by_applying(state, closed, bits) == pytest.approx(
            fast.losses.max(), abs=1e-12
        )


def test_matrix_terms_tight_epsilon_and_zero_columns() -> None:
    domain = parse_domain({"attributes": [{"name": "x", "type": "integer", "low": 0, "high": 2}]})
    probs = [[0.5, 0.3, 0.2, 0.0], [0.25, 0.25, 0.5, 0.0], [0.1, 0.6, 0.3, 0.0]]
    mech = parse_query(
        {"mechanism": "matrix", "outputs": ["a", "b", "c", "never"], "probabilities": probs}, domain
    )
    assert mech.output_count == 3
    expected = max(math.log(max(c) / min(c)) for c in zip(*[r[:3] for r in probs], strict=True))
    assert mech.epsilon == pytest.approx(expected, rel=1e-12)
    np.testing.assert_allclose(
        _engine_column(mech, domain, "c"), np.log([0.2, 0.5, 0.3]), rtol=1e-12
    )
    cand = mech.candidate_losses(LikelihoodState(domain))
    assert [cand.output_of(j) for j in range(3)] == ["a", "b", "c"]


def test_constant_queries_have_zero_epsilon() -> None:
    domain = parse_domain(DOMAIN)
    always = parse_query(
        {
            "mechanism": "binary_rr",
            "epsilon": 1.0,
            "predicate": {"attribute": "age", "op": "<", "value": 100},
        },
        domain,
    )
    assert always.epsilon == 0.0
    no_weights = parse_query({"mechanism": "logistic", "weights": {}, "epsilon": 1.0}, domain)
    assert no_weights.epsilon == 0.0
    clipped = parse_query(
        {
            "mechanism": "linear",
            "weights": {"age": 1.0},
            "range": [10, 20],
            "truncate": True,
            "epsilon": 1.0,
        },
        domain,
    )
    assert clipped.epsilon == 0.0


def test_linear_tight_epsilon_below_declared_when_range_is_not_reached() -> None:
    domain = parse_domain(DOMAIN)
    mech = parse_query(
        {"mechanism": "linear", "weights": {"age": 0.1}, "range": [0, 1], "epsilon": 1.0}, domain
    )
    e = math.e
    p = [t * (e - 1) / (e + 1) + 1 / (e + 1) for t in (0.0, 0.4)]
    expected = max(math.log(p[1] / p[0]), math.log((1 - p[0]) / (1 - p[1])))
    assert mech.epsilon == pytest.approx(expected, rel=1e-12)
    assert mech.epsilon < 1.0
    assert float(mech.epsilon_exact) >= mech.epsilon


def test_state_stays_finite_and_exact_over_thousands_of_queries() -> None:
    rng = np.random.default_rng(5)
    domain = parse_domain(DOMAIN)
    mechs = [parse_query(q, domain) for q in QUERIES]
    state = LikelihoodState(domain)
    total = np.zeros(domain.size, dtype=np.longdouble)
    for _ in range(5000):
        mech = mechs[int(rng.integers(len(mechs)))]
        out = int(rng.integers(mech.output_count))
        term = mech.term(out)
        state.apply(term)
        total += np.broadcast_to(state.broadcast(term), domain.shape).ravel()
    assert np.isfinite(state.logp).all()
    assert state.logp.max() == 0.0
    exact = float(total.max() - total.min())
    bounds = state.loss()
    assert bounds.lower <= exact <= bounds.upper
    assert bounds.upper - bounds.lower < 1e-8


def test_listed_outputs_are_built_once_per_count_and_rebuilt_for_another() -> None:
    domain = parse_domain(DOMAIN)
    mech = parse_query({"mechanism": "grr", "attribute": "disease", "epsilon": 1.0}, domain)
    first = mech.listed_outputs(2)
    assert first == tuple(mech.output_json(mech.listed_output(j)) for j in range(2))
    assert mech.listed_outputs(2) is first
    three = mech.listed_outputs(3)
    assert three == tuple(mech.output_json(mech.listed_output(j)) for j in range(3))
    assert mech.listed_outputs(3) is three
    # another mechanism of the same class keeps its own memo
    other = parse_query({"mechanism": "grr", "attribute": "age", "epsilon": 1.0}, domain)
    assert other.listed_outputs(2) == tuple(
        other.output_json(other.listed_output(j)) for j in range(2)
    )
    assert mech.listed_outputs(3) is three


@pytest.mark.parametrize(
    "query",
    [
        {"mechanism": "grr", "attribute": "disease", "epsilon": 0.3},
        {
            "mechanism": "binary_rr",
            "predicate": {"attribute": "age", "op": ">=", "value": 2},
            "epsilon": 0.7,
        },
    ],
)
def test_an_rr_mechanism_makes_its_exact_query_and_group_once(query: dict[str, Any]) -> None:
    """One ``ExactQuery`` (with its key) and one ``Group`` per mechanism, equal to fresh ones.

    A submit decided by basic composition makes one group (its output's exact term), a tight
    decision three (the exact query, twice, and the term); a mechanism is read-only and a kept
    one (``app.services.queries``) serves every submit of its query, so they are made once —
    and equal to what a freshly parsed mechanism makes, pickled to a bound worker too.
    """
    import pickle

    from app.engine.exact import ExactQuery, Group
    from app.engine.numerics import decimal_fraction

    domain = parse_domain(DOMAIN, "domain")
    mech = parse_query(query, domain, "query")
    found = mech.exact_query()
    assert found is not None
    assert mech.exact_query() is found
    group = Group(decimal_fraction(query["epsilon"]))
    assert found.group == group
    assert hash(found.group) == hash(group)
    table = None if query["mechanism"] == "grr" else found.table
    assert found.key == ExactQuery(found.axis, group, found.kind, table).key
    for output in range(mech.output_count):
        term = mech.exact_term(output)
        assert term is not None
        assert term.group is found.group
    fresh = parse_query(query, domain, "query").exact_query()
    assert fresh is not None
    assert fresh.key == found.key
    copied = pickle.loads(pickle.dumps(mech))  # noqa: S301 - our own object
    assert copied.exact_query().key == found.key
