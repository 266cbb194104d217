"""Envelope validity (acceptance test 2): property tests of the certified linear estimators.

For random curves (plain/truncated ``linear``, ``logistic``; high/low output; either sign) and
intervals, the minimum of :func:`concave_overestimator`'s lines is ``>= h`` and the maximum of
:func:`convex_underestimator`'s lines is ``<= h`` on a dense grid of ``[l, u]`` (plus the
interval's ends, the inflection point and the kinks). ``h`` is checked both as the engine
evaluates it (exactly: the lines carry their own rounding slack) and as written independently
from contract.md's formulas (up to a few ulp). A sanity bound keeps the lines from being vacuous: a
monotone ``h``'s concave envelope never exceeds ``max(h(l), h(u))``.
"""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from app.engine.continuous.envelopes import (
    Lines,
    added_tangents,
    concave_overestimator,
    convex_underestimator,
)
from app.engine.continuous.univariate import ResponseCurve
from tests.engine.continuous.reference import LOGISTIC, PLAIN, TRUNCATED, sigmoid

GRID = 4001


def reference_h(curve: ResponseCurve, z: np.ndarray) -> np.ndarray:
    """``sign * log Pr(output | z)``: Pr(high) = (1 + t(e^ε - 1)) / (e^ε + 1), Pr(low) likewise."""
    if curve.logistic:
        t, one_minus_t = sigmoid(z), sigmoid(-z)
    else:
        y = np.clip(z, curve.a, curve.b) if curve.truncate else z
        width = curve.b - curve.a
        t, one_minus_t = (y - curve.a) / width, (curve.b - y) / width
    own = t if curve.high else one_minus_t
    log_prob = np.log1p(own * math.expm1(curve.epsilon)) - np.logaddexp(0.0, curve.epsilon)
    return curve.sign * log_prob


def dense(curve: ResponseCurve, zl: float, zu: float) -> np.ndarray:
    special = [zl, zu, curve.inflection, curve.a, curve.b]
    special += [math.nextafter(zl, math.inf), math.nextafter(zu, -math.inf)]
    points = np.concatenate([np.linspace(zl, zu, GRID), np.array(special, dtype=np.float64)])
    points = points[np.isfinite(points) & (points >= zl) & (points <= zu)]
    return np.unique(points)


finite = {"allow_nan": False, "allow_infinity": False}


@st.composite
def curves_and_intervals(
    draw: st.DrawFn, straddle: bool = False
) -> tuple[ResponseCurve, float, float]:
    kind = draw(st.sampled_from([PLAIN, TRUNCATED, LOGISTIC]))
    eps = draw(st.floats(1e-3, 100.0, **finite))
    a = draw(st.floats(-20.0, 20.0, **finite))
    width = draw(st.floats(1e-3, 40.0, **finite))
    b = a + width
    curve = ResponseCurve(
        kind == LOGISTIC,
        draw(st.booleans()),
        eps,
        a,
        b,
        kind == TRUNCATED,
        draw(st.sampled_from([1.0, -1.0])),
    )
    if kind == PLAIN:  # the engine only uses a plain curve inside its range
        ends = sorted(draw(st.lists(st.floats(a, b, **finite), min_size=2, max_size=2)))
        return curve, ends[0], ends[1]
    scale = 60.0 if kind == LOGISTIC else 2.0 * width
    centre = curve.inflection if straddle else draw(st.floats(-scale, scale, **finite))
    left = draw(st.floats(0.0, scale, **finite))
    right = draw(st.floats(0.0 if not straddle else 1e-6, scale, **finite))
    return curve, centre - left, centre + right


def sanity_slack(lines: Lines, ends: np.ndarray, zl: float, zu: float) -> float:
    """Room for the rounding slack the engine adds to every intercept (256 ulp-scaled)."""
    steepest = float(np.abs(lines.slopes).max())
    return 1e-9 * (1.0 + float(np.abs(ends).max())) + 1e-12 * steepest * (abs(zl) + abs(zu) + 1.0)


def check_over(curve: ResponseCurve, zl: float, zu: float, extra: list[float], count: int) -> None:
    z = dense(curve, zl, zu)
    lines = concave_overestimator(curve, zl, zu, extra, count)
    assert np.all(np.isfinite(lines.slopes))
    assert np.all(np.isfinite(lines.intercepts))
    envelope = lines.evaluate(z).min(axis=1)
    engine_h = curve.value(z)
    ref_h = reference_h(curve, z)
    assert np.all(envelope >= engine_h), float(np.min(envelope - engine_h))
    assert np.all(envelope >= ref_h - 1e-13 * (1.0 + np.abs(ref_h)))
    if count >= 2:  # tangents at both ends of the valid range (count=1 only at its left end)
        ends = curve.value(np.array([zl, zu]))
        cap = float(ends.max()) + sanity_slack(lines, ends, zl, zu)
        assert np.all(envelope <= cap), "vacuous overestimator"


def check_under(curve: ResponseCurve, zl: float, zu: float, extra: list[float], count: int) -> None:
    z = dense(curve, zl, zu)
    lines = convex_underestimator(curve, zl, zu, extra, count)
    assert np.all(np.isfinite(lines.slopes))
    assert np.all(np.isfinite(lines.intercepts))
    envelope = lines.evaluate(z).max(axis=1)
    engine_h = curve.value(z)
    ref_h = reference_h(curve, z)
    assert np.all(envelope <= engine_h), float(np.max(envelope - engine_h))
    assert np.all(envelope <= ref_h + 1e-13 * (1.0 + np.abs(ref_h)))
    if count >= 2:
        ends = curve.value(np.array([zl, zu]))
        floor = float(ends.min()) - sanity_slack(lines, ends, zl, zu)
        assert np.all(envelope >= floor), "vacuous underestimator"


extras = st.lists(st.floats(-80.0, 80.0, **finite), max_size=3)
counts = st.integers(1, 6)


@settings(max_examples=300, deadline=None)
@given(curves_and_intervals(), extras, counts)
def test_concave_overestimator_is_above(
    case: tuple[ResponseCurve, float, float], extra: list[float], count: int
) -> None:
    curve, zl, zu = case
    check_over(curve, zl, zu, extra, count)


@settings(max_examples=300, deadline=None)
@given(curves_and_intervals(), extras, counts)
def test_convex_underestimator_is_below(
    case: tuple[ResponseCurve, float, float], extra: list[float], count: int
) -> None:
    curve, zl, zu = case
    check_under(curve, zl, zu, extra, count)


@settings(max_examples=300, deadline=None)
@given(curves_and_intervals(straddle=True), extras, counts)
def test_estimators_across_the_inflection_point(
    case: tuple[ResponseCurve, float, float], extra: list[float], count: int
) -> None:
    """Intervals around ``z*``: the bisection for valid tangent points is exercised."""
    curve, zl, zu = case
    check_over(curve, zl, zu, extra, count)
    check_under(curve, zl, zu, extra, count)


@settings(max_examples=300, deadline=None)
@given(curves_and_intervals(straddle=True), extras, counts)
def test_added_tangents_are_the_lines_of_the_extra_points(
    case: tuple[ResponseCurve, float, float], extra: list[float], count: int
) -> None:
    """A Kelley round's rows: the lines the overestimator has for its extra points, no more.

    The overestimator with ``extra`` is the one without plus :func:`added_tangents` (as sets of
    lines, the same floats), so a node LP extended by them is the LP :func:`relax` builds with
    those points; and each added line is above ``h`` on the interval by itself.
    """
    curve, zl, zu = case
    base = concave_overestimator(curve, zl, zu, (), count)
    full = concave_overestimator(curve, zl, zu, extra, count)
    added = added_tangents(curve, zl, zu, np.array(extra, dtype=np.float64))
    pairs = set(zip(base.slopes.tolist(), base.intercepts.tolist(), strict=True))
    if added is None:  # a single line (a point or the secant): extra points change nothing
        assert set(zip(full.slopes.tolist(), full.intercepts.tolist(), strict=True)) == pairs
        return
    pairs |= set(zip(added.slopes.tolist(), added.intercepts.tolist(), strict=True))
    assert set(zip(full.slopes.tolist(), full.intercepts.tolist(), strict=True)) == pairs
    z = dense(curve, zl, zu)
    assert np.all(added.evaluate(z) >= curve.value(z)[:, None])


def test_reference_agrees_with_the_engine_curves() -> None:
    """The two evaluations of ``h`` the envelope tests use agree (to a few ulp)."""
    rng = np.random.default_rng(7)
    for _ in range(200):
        logistic, truncate = bool(rng.integers(2)), bool(rng.integers(2))
        a = float(rng.uniform(-5, 5))
        curve = ResponseCurve(
            logistic,
            bool(rng.integers(2)),
            float(rng.uniform(0.01, 5)),
            a,
            a + float(rng.uniform(0.1, 5)),
            truncate and not logistic,
            float(rng.choice([-1.0, 1.0])),
        )
        lo, hi = (curve.a, curve.b) if not (logistic or truncate) else (-30.0, 30.0)
        z = np.linspace(lo, hi, 101)
        np.testing.assert_allclose(curve.value(z), reference_h(curve, z), rtol=1e-13, atol=1e-15)
