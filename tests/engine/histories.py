"""Random randomized-response histories for the engine's tests, drawn from a seeded ``rng``.

The tests that check a fast path against its definition on random histories
(``test_batched_decisions``, ``test_exact_known_loss``) draw their domains, queries and states
here. Each helper draws from ``rng`` in the order each file's own copy did (the kind, then ε,
then what the kind needs): the same seeds meet the same queries as before they were shared.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

from app.engine.domain import Domain, parse_domain
from app.engine.likelihood import LikelihoodState
from app.engine.mechanisms import Mechanism, parse_query

EPSILONS = [0.1, 0.25, 0.5, 1.0, 0.3, 2.0]
#: Every kind :func:`random_query` draws; ``grr`` asks about ``v``, ``grr_w`` about ``w`` and
#: ``grr_vw`` about either (one more draw, after ε).
KINDS = ["grr", "grr_w", "olh", "binary_rr", "ue", "hadamard"]

#: The kinds that ask about one attribute: their mechanism and attribute.
_ON_ONE = {
    "grr": ("grr", "v"),
    "grr_w": ("grr", "w"),
    "olh": ("olh", "v"),
    "ue": ("unary_encoding", "w"),
    "hadamard": ("hadamard", "v"),
}


def vw_domain(k: int) -> Domain:
    """Two integer attributes: ``v`` in ``0..k-1`` and ``w`` in ``0..2``."""
    return parse_domain(
        {
            "attributes": [
                {"name": "v", "type": "integer", "low": 0, "high": k - 1},
                {"name": "w", "type": "integer", "low": 0, "high": 2},
            ]
        }
    )


def random_query(
    rng: random.Random,
    k: int,
    kind: str,
    *,
    epsilons: Sequence[float] = EPSILONS,
    epsilon: float | None = None,
) -> Any:
    """A query of ``kind`` on :func:`vw_domain` ``(k)``: ε drawn from ``epsilons`` if not given.

    ``binary_rr`` (and any kind not named here): a predicate on ``v``.
    """
    e = epsilon if epsilon is not None else rng.choice(epsilons)
    if kind == "grr_vw":
        return {"mechanism": "grr", "attribute": rng.choice("vw"), "epsilon": e}
    if kind in _ON_ONE:
        mechanism, attribute = _ON_ONE[kind]
        return {"mechanism": mechanism, "attribute": attribute, "epsilon": e}
    bound = rng.randint(0, k - 1)
    predicate = {"attribute": "v", "op": rng.choice([">=", "<=", "=="]), "value": bound}
    return {"mechanism": "binary_rr", "predicate": predicate, "epsilon": e}


def draw(rng: random.Random, mech: Mechanism, k: int) -> Any:
    """An output of ``mech`` for a random value of :func:`vw_domain` ``(k)``."""
    return mech.sample({"v": rng.randrange(k), "w": rng.randrange(3)})


def random_history(
    rng: random.Random,
    domain: Domain,
    k: int,
    kinds: Sequence[str],
    most: int,
    *,
    epsilons: Sequence[float] = EPSILONS,
) -> tuple[LikelihoodState, list[Mechanism]]:
    """A state after ``0..most`` queries of ``kinds`` (each drawn), answered for random values.

    ``domain``: :func:`vw_domain` ``(k)``. The queries too, in their order.
    """
    state = LikelihoodState(domain)
    mechs = []
    for _ in range(rng.randint(0, most)):
        mech = parse_query(random_query(rng, k, rng.choice(kinds), epsilons=epsilons), domain)
        state.apply(mech.term(draw(rng, mech, k)))
        mechs.append(mech)
    return state, mechs
