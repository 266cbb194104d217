"""Filter inputs for continuous objects: bounds on the loss after each output of a candidate.

A cheap sound bound comes first. With ``r_y`` the range of the new term ``h_y`` over the domain
(``h_y`` is monotone in ``z``, so ``r_y = |h_y(z_max) - h_y(z_min)|``)::

    max(F + h_y) <= max F + max h_y,   min(F + h_y) >= min F + min h_y
    =>  loss_now - r_y  <=  loss_after(y)  <=  loss_now + r_y

When a decision ``target`` is given and every cheap upper bound is already within it, no search
runs. Otherwise each output's loss is bounded by the branch-and-bound (two searches per output),
and those results are kept so that recording the realized output costs nothing more.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np

from app.engine.continuous.state import ContinuousLoss, ContinuousState, curve_for
from app.engine.filters import CandidateEvaluation, OutputLoss
from app.engine.mechanisms import Mechanism
from app.engine.mechanisms.regression import ScalarResponse
from app.engine.numerics import UNIT_ROUNDOFF, float_up


def _term_range(mechanism: ScalarResponse, output: int) -> float:
    """``|h(z_max) - h(z_min)|`` for the output's log-likelihood over the domain.

    The mechanism's own (clipped) curve: its values over the query's reach are what the output's
    probability really is, whatever continuation the search uses for an untruncated ``linear``.
    """
    curve = curve_for(mechanism, output, truncate=True)
    ends = curve.value(np.array(mechanism.z_outward))
    # the exact reach rounded outward (h is monotone), each end within a few ulp of itself
    slack = 16.0 * UNIT_ROUNDOFF * float(np.abs(ends).sum())
    return float(abs(ends[1] - ends[0])) * (1 + 1e-12) + slack + 1e-15


def evaluate_continuous(
    state: ContinuousState,
    mechanism: Mechanism,
    *,
    basic_total: Fraction,
    target: float | None,
    field_path: str = "query",
) -> CandidateEvaluation:
    """Per-output loss bounds of ``mechanism`` against ``state``.

    The branch-and-bound results per output index are in ``searched`` (empty when the cheap
    bound sufficed).
    """
    state.check_supported(mechanism, field_path)
    assert isinstance(mechanism, ScalarResponse)  # noqa: S101 - checked just above
    cap = float_up(basic_total + mechanism.epsilon_exact)
    now = state.loss_detail()
    ranges = [_term_range(mechanism, j) for j in (0, 1)]
    cheap = [(max(0.0, now.lower - r), min(cap, now.upper + r)) for r in ranges]
    computed: dict[int, ContinuousLoss] = {}
    if target is None or max(u for _, u in cheap) > target:
        for j in (0, 1):
            after = state.loss_after(mechanism, j, field_path)
            computed[j] = after
            cheap[j] = (min(after.lower, cap), min(after.upper, cap))
    per_output = tuple(
        OutputLoss(mechanism.output_json(j), lo, up) for j, (lo, up) in enumerate(cheap)
    )
    worst = max(up for _, up in cheap)
    return CandidateEvaluation(
        mechanism.epsilon,
        mechanism.epsilon_exact,
        per_output,
        worst,
        True,
        tight=bool(computed),
        searched=computed,
    )
