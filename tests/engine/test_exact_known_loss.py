"""A submit's new exact loss is the decision's loss for the sampled output, not computed again.

``record`` after ``evaluate`` on an exact history gives a new form whose loss is already
known (the decision's :meth:`~app.engine.exact.ExactLoss.candidate_losses` entry for the
output). It must equal the loss of the same counts computed from scratch, for random histories,
queries of every randomized-response kind and every output; and a mechanism whose outputs do
not index those losses (``olh``, unary encoding) must not be given one.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Sequence
from fractions import Fraction
from typing import Any

import numpy as np
import pytest

from app.engine.domain import Domain
from app.engine.exact import ExactLoss, ExactTerm, Group, canonical_json, stored_json
from app.engine.filters import FilterKind
from app.engine.likelihood import LikelihoodState
from app.engine.mechanisms import Mechanism, parse_query
from app.engine.pipeline import ObjectSnapshot, evaluate, record
from tests.engine import histories
from tests.engine.histories import draw, random_history, random_query, vw_domain

#: The histories' ε's: one more than :data:`tests.engine.histories.EPSILONS`.
EPSILONS = [*histories.EPSILONS, 0.7]
#: ``grr`` on either attribute, ``binary_rr`` and ``hadamard``: the kinds with outputs that
#: index the decision's candidate losses.
KINDS = ["grr_vw", "binary_rr", "hadamard"]


def _outputs(mech: Mechanism, domain: Domain) -> list[Any]:
    query = mech.exact_query()
    assert query is not None
    if query.kind == "grr":
        return list(range(domain.shape[query.axis]))
    assert query.table is not None
    return list(range(query.table.shape[1]))


def _from_scratch(exact: ExactLoss) -> Fraction:
    """The form's loss computed on a fresh copy of its counts (nothing kept)."""
    return ExactLoss(exact.shape, exact.groups, dict(exact.counts)).loss()


#: The random terms' written ε's: decimals, thirds and sevenths (``D`` grows with new ones).
DECIMALS = [Fraction(n, d) for n, d in [(1, 10), (1, 4), (1, 3), (7, 9), (2, 1), (3, 7)]]


def _random_term(
    rng: random.Random,
    shape: tuple[int, ...],
    *,
    decimals: Sequence[Fraction] = DECIMALS,
    scales: Sequence[int] = (1, 1, 1, 1 << 40),
    coefficients: Sequence[int] = (0, 1, -1, 2),
) -> ExactTerm:
    """A term on a random axis: each coefficient one of ``coefficients`` times one scale."""
    axis = rng.randrange(len(shape))
    scale = rng.choice(scales)
    coeff = np.array([rng.choice(coefficients) * scale for _ in range(shape[axis])])
    return ExactTerm(axis, Group(rng.choice(decimals)), coeff)


def _case(rng: random.Random) -> tuple[int, Domain, LikelihoodState]:
    """A random domain size, its domain and a random exact history on it."""
    k = rng.choice([1, 2, 3, 5, 12])
    domain = vw_domain(k)
    state, _ = random_history(rng, domain, k, KINDS, 8, epsilons=EPSILONS)
    return k, domain, state


def _derived(exact: ExactLoss) -> bool:
    """Whether the form was handed its parent's ranges and has a moved axis's still to compute."""
    ranges = exact.kept.ranges
    return ranges is not None and len(ranges[2]) < len(exact.counts)


@pytest.mark.parametrize("seed", range(4))
def test_recorded_exact_loss_is_the_decisions_and_exact(seed: int) -> None:
    rng = random.Random(900 + seed)
    seeded = 0
    for _ in range(60):
        k, domain, state = _case(rng)
        assert state.exact is not None
        mech = parse_query(random_query(rng, k, rng.choice(KINDS), epsilons=EPSILONS), domain)
        for y in _outputs(mech, domain):
            copy = LikelihoodState.from_bytes(domain, state.to_bytes(), state.err)
            snapshot = ObjectSnapshot(domain, 100.0, FilterKind.BAYESIAN, Fraction(0), copy)
            decision = evaluate(snapshot, mech, tight=True)  # every output's loss computed
            assert decision.accepted
            after = record(snapshot, mech, y, decision)
            assert isinstance(after.state, LikelihoodState)
            exact = after.state.exact
            assert exact is not None
            # known without computing it: the decision's loss for this output
            assert exact.kept.loss is not None
            seeded += 1
            want = _from_scratch(exact)
            assert exact.loss() == want
            assert want == copy.exact.with_term(mech.exact_term(y)).loss()  # type: ignore[arg-type, union-attr]
            assert after.loss() == after.state.loss(after.basic_total)
            # and the next term's loss derives from it
            z = rng.choice(_outputs(mech, domain))
            following = exact.with_term(mech.exact_term(z))  # type: ignore[arg-type]
            assert _derived(following)
            assert following.loss() == _from_scratch(following)
    assert seeded > 100


@pytest.mark.parametrize("seed", range(4))
def test_quick_decision_then_record_derives_the_loss(seed: int) -> None:
    """Basic composition accepts (no per-output losses): the new loss from one axis."""
    rng = random.Random(1900 + seed)
    derived = 0
    for _ in range(80):
        k, domain, state = _case(rng)
        copy = LikelihoodState.from_bytes(domain, state.to_bytes(), state.err)
        snapshot = ObjectSnapshot(domain, 100.0, FilterKind.BAYESIAN, Fraction(0), copy)
        mech = parse_query(random_query(rng, k, rng.choice(KINDS), epsilons=EPSILONS), domain)
        decision = evaluate(snapshot, mech)
        y = rng.choice(_outputs(mech, domain))
        after = record(snapshot, mech, y, decision)
        assert isinstance(after.state, LikelihoodState)
        exact = after.state.exact
        assert exact is not None
        derived += _derived(exact)
        assert exact.loss() == _from_scratch(exact)
        assert not _derived(exact)
    assert derived > 60


@pytest.mark.parametrize("seed", range(6))
def test_with_term_chains_derive_exact_losses(seed: int) -> None:
    """Random terms (new ε's, new axes, counts past int64): each loss equals a fresh one's."""
    rng = random.Random(2900 + seed)
    for _ in range(40):
        shape = tuple(rng.choice([1, 2, 3, 7]) for _ in range(rng.randint(1, 3)))
        exact = ExactLoss(shape)
        exact.loss()
        for _ in range(rng.randint(1, 25)):
            term = _random_term(rng, shape, scales=(1, 1, 1, 1 << 40, 1 << 61))
            if rng.random() < 0.3:
                exact.loss()
            if rng.random() < 0.2:
                exact = ExactLoss(exact.shape, exact.groups, dict(exact.counts))  # nothing kept
            exact = exact.with_term(term)
            if rng.random() < 0.7:
                assert exact.loss() == _from_scratch(exact)
        assert exact.loss() == _from_scratch(exact)


@pytest.mark.parametrize("kind", ["olh", "ue"])
def test_no_known_loss_for_mechanisms_with_other_outputs(kind: str) -> None:
    rng = random.Random(7)
    domain = vw_domain(5)
    state = LikelihoodState(domain)
    for _ in range(3):
        mech = parse_query(random_query(rng, 5, "grr_vw", epsilons=EPSILONS), domain)
        state.apply(mech.term(draw(rng, mech, 5)))
    mech = parse_query(random_query(rng, 5, kind, epsilons=EPSILONS), domain)
    snapshot = ObjectSnapshot(domain, 100.0, FilterKind.BAYESIAN, Fraction(0), state)
    decision = evaluate(snapshot, mech)
    y = mech.sample({"v": 1, "w": 2})
    after = record(snapshot, mech, y, decision)
    assert isinstance(after.state, LikelihoodState)
    exact = after.state.exact
    if exact is not None:
        assert exact.kept.loss is None
        assert exact.loss() == _from_scratch(exact)


def test_candidate_losses_kept_per_query() -> None:
    rng = random.Random(11)
    domain = vw_domain(4)
    state = LikelihoodState(domain)
    for _ in range(4):
        mech = parse_query(random_query(rng, 4, "grr_vw", epsilons=EPSILONS), domain)
        state.apply(mech.term(draw(rng, mech, 4)))
    assert state.exact is not None
    grr = parse_query({"mechanism": "grr", "attribute": "v", "epsilon": 0.3}, domain)
    other = parse_query({"mechanism": "grr", "attribute": "v", "epsilon": 0.7}, domain)
    query, query_other = grr.exact_query(), other.exact_query()
    assert query is not None
    assert query_other is not None
    assert state.exact.kept_candidate_losses(query) is None
    first = state.exact.candidate_losses(query)
    assert state.exact.candidate_losses(grr.exact_query()) is first  # type: ignore[arg-type]
    assert state.exact.kept_candidate_losses(query_other) is None
    assert first == [state.exact.with_term(grr.exact_term(y)).loss() for y in range(4)]  # type: ignore[arg-type]


@pytest.mark.parametrize("seed", range(6))
def test_with_term_chains_write_the_same_bytes(seed: int) -> None:
    """A form's bytes from its parent's per-axis texts equal their definition's, every step."""
    rng = random.Random(3900 + seed)
    inherited = 0
    decimals = [*DECIMALS[:-1], Fraction(1, 2)]
    for _ in range(40):
        shape = tuple(rng.choice([1, 2, 3, 7, 12]) for _ in range(rng.randint(1, 4)))
        exact = ExactLoss(shape)
        for _ in range(rng.randint(1, 25)):
            term = _random_term(rng, shape, decimals=decimals, coefficients=(0, 1, -1, 3))
            if rng.random() < 0.6:
                assert exact.canonical_bytes() == canonical_json(exact)
            if rng.random() < 0.3:
                assert exact.to_bytes() == stored_json(exact)
            inherits = exact.kept.texts is not None and term.group in exact.groups
            exact = exact.with_term(term)
            assert (exact.kept.texts is not None) == inherits
            if inherits:
                assert term.axis not in exact.kept.texts  # type: ignore[operator]
            inherited += inherits
            if rng.random() < 0.5:
                assert exact.to_bytes() == stored_json(exact)
            assert exact.canonical_bytes() == canonical_json(exact)
            assert exact.kept.texts is not None
            assert sorted(exact.kept.texts) == sorted(exact.counts)  # every axis's now
    assert inherited > 50  # the texts were inherited (not only written anew)


@pytest.mark.parametrize("seed", range(6))
def test_with_term_hands_over_only_what_its_groups_decide(seed: int) -> None:
    """The order of the groups, whether it is ε order, the shape's text: a form built by
    :meth:`ExactLoss.with_term` gets its parent's when computed there and the groups are the
    same (one group more: not handed over); each is what a fresh form computes, and the bytes
    written from them are their definitions'."""
    rng = random.Random(5900 + seed)
    handed = fresh_groups = 0
    decimals = [*DECIMALS[:-1], Fraction(1, 2)]
    for _ in range(40):
        shape = tuple(rng.choice([1, 2, 3, 7]) for _ in range(rng.randint(1, 4)))
        exact = ExactLoss(shape)
        for _ in range(rng.randint(1, 25)):
            if rng.random() < 0.5:
                exact.canonical_bytes()  # the parent's order and shape text computed
            if rng.random() < 0.3:
                assert isinstance(exact._in_order, bool)  # computed on the parent
            term = _random_term(rng, shape, decimals=decimals)
            parent = exact.__dict__
            same = term.group in exact.groups
            exact = exact.with_term(term)
            fresh = ExactLoss(exact.shape, exact.groups, dict(exact.counts))
            for name in ("_sorted_order", "_in_order", "_shape_text"):
                got = exact.__dict__.get(name)
                if name in parent and (same or name == "_shape_text"):
                    assert got == parent[name]
                    handed += 1
                else:
                    assert got is None, name
                    fresh_groups += not same
                if got is not None:
                    assert got == getattr(fresh, name), name
            assert exact.canonical_bytes() == canonical_json(exact)
            assert exact.to_bytes() == stored_json(exact)
    assert handed > 100
    assert fresh_groups > 20


@pytest.mark.parametrize("seed", range(6))
def test_kept_values_are_the_forms_own(seed: int) -> None:
    """Whatever a form was handed (ranges, texts, a known loss), they are what it would compute.

    Random chains of :meth:`ExactLoss.with_term` and :meth:`ExactLoss.with_term_known` (the
    true loss given), losses computed at random steps (so ranges are handed over complete,
    partial or not at all): every kept range equals a fresh form's, every loss and byte string
    its definition's.
    """
    rng = random.Random(4900 + seed)
    known = 0
    for _ in range(40):
        shape = tuple(rng.choice([1, 2, 3, 7]) for _ in range(rng.randint(1, 4)))
        exact = ExactLoss(shape)
        for _ in range(rng.randint(1, 25)):
            term = _random_term(rng, shape)
            if rng.random() < 0.3:
                exact.loss()
            if rng.random() < 0.2:
                exact.canonical_bytes()
            if rng.random() < 0.5:
                loss = exact.with_term(term).loss()  # a form of its own: nothing shared
                exact = exact.with_term_known(term, loss)
                assert exact.kept.loss == loss
                known += 1
            else:
                exact = exact.with_term(term)
            fresh = ExactLoss(exact.shape, exact.groups, dict(exact.counts))
            fresh.loss()
            assert fresh.kept.ranges is not None
            kept = exact.kept.ranges
            if kept is not None:  # every range it holds is the fresh form's, in its units
                assert kept[:2] == fresh.kept.ranges[:2]
                assert all(fresh.kept.ranges[2][a] == r for a, r in kept[2].items())
            if rng.random() < 0.7:
                computed = exact.kept.loss is None  # else known: its ranges stay as they are
                assert exact.loss() == fresh.loss()
                if computed:  # from its ranges, completed: every axis's
                    assert exact.kept.ranges == fresh.kept.ranges
            if exact.kept.texts is not None:
                assert exact.canonical_bytes() == canonical_json(exact)
        assert exact.loss() == _from_scratch(exact)
        assert exact.to_bytes() == stored_json(exact)
    assert known > 100


def _one_grr(output: int) -> tuple[Mechanism, ExactLoss]:
    """``grr`` ε = 0.5 on ``v`` (4 values) and the exact form after its ``output``."""
    domain = vw_domain(4)
    state = LikelihoodState(domain)
    mech = parse_query({"mechanism": "grr", "attribute": "v", "epsilon": 0.5}, domain)
    state.apply(mech.term(output))
    assert state.exact is not None
    return mech, state.exact


def test_kept_values_are_not_copied_to_another_form() -> None:
    """``dataclasses.replace`` (other counts) or a fresh form starts knowing nothing."""
    _, exact = _one_grr(0)
    assert exact.loss() == Fraction(1, 2)
    exact.canonical_bytes()
    other = dataclasses.replace(exact, counts={0: np.array([[2, 0, 0, 0]])})
    assert other.kept is not exact.kept
    assert other.kept.loss is None
    assert other.kept.ranges is None
    assert other.kept.texts is None
    assert other.loss() == 1
    assert other.canonical_bytes() == canonical_json(other)
    assert exact.loss() == Fraction(1, 2)


def test_canonical_handed_over_is_used() -> None:
    """:attr:`Kept.canonical` set before the first :meth:`ExactLoss.canonical_bytes` is read."""
    mech, exact = _one_grr(1)
    term = mech.exact_term(2)
    assert term is not None
    canonical = exact.canonical_after(term)
    assert canonical is not None
    after = exact.with_term(term)
    after.kept.canonical = canonical
    assert after.canonical_bytes() is canonical
    assert canonical == canonical_json(after)
    assert after.to_bytes() == stored_json(after)
