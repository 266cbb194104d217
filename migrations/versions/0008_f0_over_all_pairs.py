"""F₀'s account under Definition 4.7 (issue 22): recomputed for every ``approx_bayesian`` object.

F₀ (:mod:`app.engine.approx`) now bounds the realized loss over all ``d(d−1)`` ordered pairs of
a ``d``-point domain: its order ``λ`` — and so every charge ``ψ(λ, ε_i)`` and its threshold —
depends on ``d``. An account stored under the pairwise rule (``L = log(1/δ_g)``) means nothing
under the new one, so each ``approx_bayesian`` object's ``objects.f0_account`` is recomputed
from its accepted history (single submits and survey answers, as decisions read it) with the
engine's own rule (:func:`app.engine.pipeline.history_account`).

The phase is a function of that account (``output-independent`` iff within the threshold), so
an object whose history is already past the new F₀ count is in the Bayesian phase from now on:
it accepts only while the realized loss stays within ε_g for every output (and refuses
everything while it is above, Algorithm 4's line 14). On a continuous domain F₀ is unavailable
(the account is 0 and every history is the Bayesian filter's).

No schema change. The downgrade restores the pairwise accounts (the rule of 0006, which
``OutputIndependentFilter`` reproduces exactly with one pair).

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-25
"""

from __future__ import annotations

import json
from fractions import Fraction

import sqlalchemy as sa
from alembic import op

from app.engine.approx import OutputIndependentFilter
from app.engine.domain import parse_domain
from app.engine.limits import EngineLimits
from app.engine.pipeline import f0_filter, history_entry
from app.services.history import object_history

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

#: Stored domains and histories were checked when they were written: replay them whatever the
#: limits are now.
_STORED = EngineLimits(max_attributes=2**31, max_points=2**63, max_values_per_attribute=2**63)

_APPROX = sa.text(
    "SELECT o.id, o.budget, o.budget_delta, d.text FROM objects o "
    "JOIN domains d ON d.hash = o.domain_hash "
    "WHERE o.filter = 'approx_bayesian' AND o.budget_delta IS NOT NULL ORDER BY o.id"
)
_SET = sa.text("UPDATE objects SET f0_account = :account WHERE id = :id")


def _recompute(*, pairwise: bool) -> None:
    conn = op.get_bind()
    for oid, budget, delta, domain_text in conn.execute(_APPROX).all():
        domain = parse_domain(json.loads(domain_text), limits=_STORED)
        if pairwise:
            f0 = OutputIndependentFilter(budget, delta, 1)
        else:
            f0 = f0_filter(budget, delta, domain)
        account = Fraction(0)
        for item in object_history(conn, oid):
            entry = history_entry(domain, json.loads(item.query), json.loads(item.output))
            account += f0.charge(entry.mechanism.epsilon_exact)
        conn.execute(_SET, {"account": str(account), "id": oid})


def upgrade() -> None:
    _recompute(pairwise=False)


def downgrade() -> None:
    _recompute(pairwise=True)
