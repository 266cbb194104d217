"""Quadratic weights (``x^2``, ``x*y``) of ``linear`` and ``logistic``: parsing, ranges, finite
domains against brute force, sampling, and integer coordinates of a continuous domain.

The brute force evaluates contract.md's formulas at every point of the grid with no engine code.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import numpy as np
import pytest

from app.engine.calculator import compute_loss
from app.engine.domain import parse_domain
from app.engine.errors import InvalidInput
from app.engine.mechanisms import parse_query
from app.engine.mechanisms.polynomial import MAX_EXACT_COMPONENT, Polynomial
from app.engine.mechanisms.regression import ScalarResponse

FINITE = {
    "attributes": [
        {"name": "x", "type": "integer", "low": -3, "high": 3},
        {"name": "y", "type": "integer", "low": 0, "high": 4},
        {"name": "kind", "type": "categorical", "values": ["a", "b"]},
    ]
}
BOX = {
    "attributes": [
        {"name": "x", "type": "real", "low": -1, "high": 1},
        {"name": "y", "type": "real", "low": -2, "high": 2},
        {"name": "kind", "type": "categorical", "values": ["a", "b"]},
    ]
}


def monomial(key: str, point: dict[str, float]) -> float:
    if "*" in key:
        left, right = key.split("*")
        return point[left] * point[right]
    if key.endswith("^2"):
        return point[key[:-2]] ** 2
    return point[key]


def log_prob(query: dict[str, Any], output: Any, point: dict[str, float]) -> float:
    """contract.md: ``Pr(high) = t (e^ε - 1)/(e^ε + 1) + 1/(e^ε + 1)``."""
    z = query.get("intercept", 0.0) + sum(
        w * monomial(k, point) for k, w in query["weights"].items()
    )
    eps = query["epsilon"]
    if query["mechanism"] == "logistic":
        t, high = 1.0 / (1.0 + math.exp(-z)), output == 1
    else:
        a, b = query["range"]
        t, high = (min(max(z, a), b) - a) / (b - a), output == b
    p_high = t * math.expm1(eps) / (math.exp(eps) + 1) + 1 / (math.exp(eps) + 1)
    return math.log(p_high if high else 1.0 - p_high)


QUADRATIC_HISTORY = [
    {
        "query": {
            "mechanism": "linear",
            "weights": {"x": 1, "x^2": 0.5, "x*y": -1},
            "range": [-20, 20],
            "epsilon": 1.0,
        },
        "output": 20,
    },
    {
        "query": {
            "mechanism": "linear",
            "weights": {"y^2": 0.25, "x*y": 0.5},
            "intercept": -1,
            "range": [-1, 2],
            "truncate": True,
            "epsilon": 0.7,
        },
        "output": -1,
    },
    {
        "query": {
            "mechanism": "logistic",
            "weights": {"x^2": -0.3, "y": 0.8, "x*y": 0.2},
            "intercept": 0.5,
            "epsilon": 1.3,
        },
        "output": 1,
    },
    {
        "query": {"mechanism": "logistic", "weights": {"y * x": -0.4}, "epsilon": 0.4},
        "output": 0,
    },
]


def brute_force_loss(history: list[dict[str, Any]]) -> float:
    values = []
    for x, y in itertools.product(range(-3, 4), range(5)):
        point = {"x": float(x), "y": float(y)}
        values.append(sum(log_prob(e["query"], e["output"], point) for e in history))
    return max(values) - min(values)


def test_finite_domain_quadratic_history_matches_brute_force() -> None:
    history = [dict(e, query=dict(e["query"])) for e in QUADRATIC_HISTORY]
    history[3]["query"]["weights"] = {"x*y": -0.4}  # the brute force reads "x*y" only
    answer = compute_loss({"domain": FINITE, "history": QUADRATIC_HISTORY})
    exact = brute_force_loss(history)
    found = answer["realized_loss"]
    assert answer["status"] == "ok"
    assert found["lower"] - 1e-9 <= exact <= found["upper"] + 1e-9
    assert found["upper"] - found["lower"] <= 1e-9


def test_continuous_domain_with_integer_coordinates_matches_the_lattice() -> None:
    domain = {"attributes": [*FINITE["attributes"][:2]]}
    domain["attributes"].append({"name": "r", "type": "real", "low": -1.0, "high": 2.5})
    answer = compute_loss(
        {"domain": domain, "history": QUADRATIC_HISTORY, "options": {"time_limit": 60.0}}
    )
    finite = compute_loss({"domain": FINITE, "history": QUADRATIC_HISTORY})
    found, exact = answer["realized_loss"], finite["realized_loss"]
    assert answer["status"] == "ok"
    assert found["upper"] >= exact["lower"] - 1e-9
    assert found["lower"] <= exact["upper"] + 1e-9
    assert found["upper"] <= exact["upper"] + 1e-4


def test_table_sampler_and_one_value_read_the_same_polynomial() -> None:
    domain = parse_domain(FINITE)
    query = parse_query(QUADRATIC_HISTORY[0]["query"], domain)
    assert isinstance(query, ScalarResponse)
    assert query.axes == (0, 1)
    table = query.table()
    for x, y in itertools.product(range(-3, 4), range(5)):
        value = {"x": x, "y": y, "kind": "a"}
        coords = {a: float(value[domain.attributes[a].name]) for a in query.axes}
        z = float(query.polynomial.evaluate(coords))
        assert z == x + 0.5 * x * x - x * y
        t, one_minus_t = query.response(np.array([z]))
        assert table[x + 3, y, 1] == pytest.approx(
            math.log1p(float(t[0]) * math.expm1(1.0)) - math.log1p(math.e), abs=1e-15
        )
        assert table[x + 3, y, 0] == pytest.approx(
            math.log1p(float(one_minus_t[0]) * math.expm1(1.0)) - math.log1p(math.e), abs=1e-15
        )


def test_sampling_follows_the_quadratic_probability() -> None:
    domain = parse_domain(BOX)
    query = parse_query(
        {"mechanism": "logistic", "weights": {"x^2": 3.0, "x*y": -1.0}, "epsilon": 2.0}, domain
    )
    value = {"x": 0.9, "y": -1.5, "kind": "b"}
    z = 3.0 * 0.81 + 0.9 * 1.5
    p_high = (1 + math.expm1(2.0) / (1 + math.exp(-z))) / (1 + math.exp(2.0))
    n = 4000
    highs = sum(query.sample(value) == 1 for _ in range(n))
    assert abs(highs / n - p_high) <= 4.5 * math.sqrt(p_high * (1 - p_high) / n)


# --- ranges --------------------------------------------------------------------------------------


def test_linear_range_check_uses_the_true_minimum_of_the_quadratic() -> None:
    """``x^2 + x`` on ``[-1, 1]`` reaches ``[-1/4, 2]``: its minimum is interior."""
    domain = parse_domain(BOX)
    ok = {"mechanism": "linear", "weights": {"x^2": 1, "x": 1}, "range": [-0.25, 2], "epsilon": 1}
    query = parse_query(ok, domain)
    assert isinstance(query, ScalarResponse)
    assert query.z_min == pytest.approx(-0.25, abs=1e-12)
    assert query.z_max == pytest.approx(2.0, abs=1e-12)
    with pytest.raises(InvalidInput) as caught:
        parse_query(dict(ok, range=[-0.2, 2]), domain)
    error = caught.value.errors[0]
    assert error.field == "query.range"
    assert "-0.25" in error.message
    assert "2]" in error.message


def test_range_of_a_coupled_quadratic_is_exact() -> None:
    """``x² - xy + y² - x`` on ``[-1, 1] x [-2, 2]``: minimum -1/3 at (2/3, 1/3), interior."""
    domain = parse_domain(BOX)
    raw = {"mechanism": "logistic", "weights": {"x^2": 1, "x*y": -1, "y^2": 1, "x": -1}}
    query = parse_query(dict(raw, epsilon=1), domain)
    assert isinstance(query, ScalarResponse)
    gx, gy = np.meshgrid(np.linspace(-1, 1, 601), np.linspace(-2, 2, 1201))
    grid = gx**2 - gx * gy + gy**2 - gx
    assert query.z_min == pytest.approx(-1.0 / 3.0, abs=1e-12)
    assert query.z_max == pytest.approx(float(grid.max()), abs=1e-12)  # at a vertex


@pytest.mark.parametrize("seed", range(5))
def test_random_quadratic_ranges_contain_and_reach_the_grid(seed: int) -> None:
    rng = np.random.default_rng(seed)
    names = ["u", "v", "w"]
    lo = rng.uniform(-2, 0.5, size=3)
    hi = lo + rng.uniform(0.2, 3, size=3)
    domain = parse_domain(
        {
            "attributes": [
                {"name": n, "type": "real", "low": float(a), "high": float(b)}
                for n, a, b in zip(names, lo, hi, strict=True)
            ]
        }
    )
    keys = ["u", "v", "w", "u^2", "v^2", "w^2", "u*v", "u*w", "v*w"]
    weights = {k: float(rng.normal()) for k in keys}
    query = parse_query({"mechanism": "logistic", "weights": weights, "epsilon": 1}, domain)
    assert isinstance(query, ScalarResponse)
    axes = [np.linspace(a, b, 121) for a, b in zip(lo, hi, strict=True)]
    u, v, w = np.meshgrid(*axes, indexing="ij")
    point = {"u": u, "v": v, "w": w}
    grid = sum(wt * monomial(k, point) for k, wt in weights.items())
    assert query.z_min <= float(grid.min())
    assert query.z_max >= float(grid.max())
    # exact: the grid (spacing <= 0.025) comes within its curvature error of both ends
    assert float(grid.min()) - query.z_min <= 0.01
    assert query.z_max - float(grid.max()) <= 0.01


def test_large_components_fall_back_to_a_sound_interval() -> None:
    size = MAX_EXACT_COMPONENT + 1
    names = [f"a{k}" for k in range(size)]
    domain = parse_domain(
        {"attributes": [{"name": n, "type": "real", "low": -1, "high": 2} for n in names]}
    )
    weights = {f"{names[k]}*{names[k + 1]}": 1.0 for k in range(size - 1)}
    weights["a0^2"] = -1.0
    poly = Polynomial.parse(weights, 0.5, domain, "weights")
    lo = dict.fromkeys(range(size), -1.0)
    hi = dict.fromkeys(range(size), 2.0)
    z_lo, z_hi = poly.range_over_box(lo, hi)
    rng = np.random.default_rng(0)
    points = rng.uniform(-1, 2, size=(20000, size))
    corners = np.array(list(itertools.product((-1.0, 2.0), repeat=size)))
    for p in np.vstack([points, corners]):
        z = poly.evaluate(dict(enumerate(p)))
        assert z_lo <= z <= z_hi


# --- validation ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("weights", "field"),
    [
        ({"x^3": 1}, "query.weights.x^3"),
        ({"x*y*x": 1}, "query.weights.x*y*x"),
        ({"x^2*y": 1}, "query.weights.x^2*y"),
        ({"q^2": 1}, "query.weights.q^2"),
        ({"x*q": 1}, "query.weights.x*q"),
        ({"kind^2": 1}, "query.weights.kind^2"),
        ({"x*kind": 1}, "query.weights.x*kind"),
        ({"x*y": 1, "y*x": 2}, "query.weights.y*x"),
        ({"x^2": 1, "x*x": 2}, "query.weights.x*x"),
        ({"x^2": "1"}, "query.weights.x^2"),
        ({"x*y": float("nan")}, "query.weights.x*y"),
    ],
)
def test_invalid_quadratic_weights_name_the_key(weights: dict[str, Any], field: str) -> None:
    domain = parse_domain(BOX)
    query = {"mechanism": "logistic", "weights": weights, "epsilon": 1}
    with pytest.raises(InvalidInput) as caught:
        parse_query(query, domain)
    assert caught.value.errors[0].field == field


def test_canonical_json_names_the_monomials_in_attribute_order() -> None:
    domain = parse_domain(BOX)
    query = parse_query(
        {"mechanism": "logistic", "weights": {"y*x": 2, "x * x": 1, "y": 0}, "epsilon": 1}, domain
    )
    assert query.to_json()["weights"] == {"x^2": 1, "x*y": 2}


def test_survey_estimate_of_a_square_is_the_mean_of_the_square() -> None:
    """Appendix A's variance estimator: the survey's ``linear`` estimate of ``x^2`` is unbiased
    for the population's mean of ``x^2`` (the estimator never reads the weights)."""
    import json

    from app.engine.estimates import estimate

    domain = parse_domain(BOX)
    query = parse_query(
        {"mechanism": "linear", "weights": {"x^2": 1}, "range": [0, 1], "epsilon": 2.0}, domain
    )
    population = np.linspace(-1.0, 1.0, 3000)
    counts: dict[str, int] = {}
    for x in population:
        output = query.output_json(query.sample({"x": float(x), "y": 0.0, "kind": "a"}))
        counts[json.dumps(output)] = counts.get(json.dumps(output), 0) + 1
    found = estimate(query, population.size, counts).value
    assert found is not None
    truth = float(np.mean(population**2))
    assert abs(found["value"] - truth) <= 4.5 * found["stderr"]


def test_a_product_whose_canonical_key_is_an_attribute_name_is_refused() -> None:
    domain = parse_domain(
        {
            "attributes": [
                {"name": "x", "type": "real", "low": 0, "high": 1},
                {"name": "x^2", "type": "real", "low": 0, "high": 1},
            ]
        }
    )
    plain = parse_query({"mechanism": "logistic", "weights": {"x^2": 1}, "epsilon": 1}, domain)
    assert isinstance(plain, ScalarResponse)
    assert plain.axes == (1,)  # the attribute itself
    assert not plain.quadratic
    with pytest.raises(InvalidInput) as caught:
        parse_query({"mechanism": "logistic", "weights": {"x*x": 1}, "epsilon": 1}, domain)
    assert caught.value.errors[0].field == "query.weights.x*x"
