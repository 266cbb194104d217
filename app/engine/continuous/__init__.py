"""Realized loss over continuous domains (paper section 5, appendices B–C).

For a history of ``linear`` and ``logistic`` queries over a box, ``log P(x) = Σ_i φ_i(θ_i·x + c_i)``
where each ``φ_i`` is a monotone univariate function with one known inflection point
(:mod:`~app.engine.continuous.univariate`). Certified concave over- and convex under-estimators of
each ``φ_i`` over an interval (:mod:`~app.engine.continuous.envelopes`) turn bounding
``max``/``min log P`` over a box of query values into a linear program whose optimum is certified
by weak duality (:mod:`~app.engine.continuous.lp_bound`); branch-and-bound in the space of query
values closes the gap (:mod:`~app.engine.continuous.branch_and_bound`). Histories whose weights
are exact multiples of one direction are bounded in one dimension
(:mod:`~app.engine.continuous.line`).
"""
