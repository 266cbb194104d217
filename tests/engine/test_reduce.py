"""The fast paths of the likelihood state are exact: staged reductions and ``applied``.

Per-value extremes of ``log P`` reduced in stages equal numpy's own reduction bit for bit, and
the two-pass ``applied`` equals ``apply`` on a copy bit for bit.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from app.engine.domain import parse_domain
from app.engine.likelihood import LikelihoodState, Term, _reduce_to

SHAPES = [(100, 16, 125, 5), (3, 4, 5), (7,), (2, 3, 4, 5, 6), (1601, 3), (4, 1031, 2), (6, 1, 8)]


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_staged_reduction_equals_numpy(shape: tuple[int, ...]) -> None:
    array = np.random.default_rng(len(shape)).normal(size=shape)
    for size in range(len(shape)):
        for keep in itertools.combinations(range(len(shape)), size):
            others = tuple(i for i in range(len(shape)) if i not in keep)
            for fn, ufunc in ((np.max, np.maximum.reduce), (np.min, np.minimum.reduce)):
                expected = fn(array, axis=others)
                for way in (fn, ufunc):  # extremes_over passes the ufuncs' reduce
                    got = _reduce_to(array, keep, way)
                    assert got.shape == np.shape(expected), (keep, way)
                    assert np.array_equal(got, expected), (keep, way)


@pytest.mark.parametrize("first", [20, 400])
def test_applied_is_bit_identical_to_apply_on_a_copy(first: int) -> None:
    """``applied`` takes the new extremes from per-cell ones: exact, not an estimate.

    A small array (700 points) without the decision's extremes takes two passes instead; a
    large one (14,000 points) computes them.
    """
    domain = parse_domain(
        {
            "attributes": [
                {"name": "a", "type": "integer", "low": 0, "high": first - 1},
                {"name": "b", "type": "categorical", "values": ["p", "q", "r", "s", "t"]},
                {"name": "c", "type": "integer", "low": 0, "high": 6},
            ]
        }
    )
    rng = np.random.default_rng(3)
    state = LikelihoodState(domain, rng.normal(size=domain.shape) * 5)
    for step in range(40):
        axes = tuple(sorted(rng.choice(3, size=int(rng.integers(1, 4)), replace=False).tolist()))
        shape = tuple(domain.shape[a] for a in axes)
        term = Term(axes, rng.normal(size=shape) * 3, extra_error=1e-15)
        if step % 2:  # the decision's extremes already computed (the common case) or not
            state.extremes_over(axes)
        expected = state.copy()
        expected.apply(term)
        after = state.applied(term)
        assert np.array_equal(after.logp, expected.logp), step
        assert after.computed_loss == expected.computed_loss, step
        assert after.err == expected.err, step
        assert after.logp.max() == 0.0
        state = after
