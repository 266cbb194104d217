"""The pieces a survey uses to name an exact state before building its array (issue 27 item 3).

A survey chunk names the state after each (decision group, output) by its exact form
(:func:`~app.engine.likelihood.exact_after`, keyed by :meth:`ExactLoss.canonical_bytes`) and
takes its loss from the group's :meth:`ExactLoss.candidate_losses` — these must be what
recording the output (:meth:`LikelihoodState.applied`) gives, on many random histories,
including several ε's, negative counts, ties and values far beyond ``int64``-safe sums.
"""

from __future__ import annotations

import json
import random
from fractions import Fraction
from typing import Any

import numpy as np
import pytest

from app.engine.domain import parse_domain
from app.engine.exact import (
    MAX_GROUPS,
    ExactLoss,
    ExactTerm,
    Group,
    canonical_json,
    stored_json,
)
from app.engine.likelihood import LikelihoodState, exact_after
from app.engine.mechanisms import parse_query
from app.engine.mechanisms.base import output_index
from app.engine.pipeline import fold_history, history_entry

DOMAIN = {
    "attributes": [
        {"name": "age", "type": "integer", "low": 0, "high": 5},
        {"name": "sex", "type": "integer", "low": 0, "high": 1},
        {"name": "region", "type": "categorical", "values": ["a", "b", "c", "d", "e", "f", "g"]},
    ]
}
EPSILONS = [0.5, 0.25, 1.0, 0.1, 0.3, 2.0]


def _query(rng: random.Random, attribute: str | None = None) -> dict[str, Any]:
    attribute = attribute or rng.choice(["age", "sex", "region"])
    if rng.random() < 0.2:
        return {
            "mechanism": "binary_rr",
            "epsilon": rng.choice(EPSILONS),
            "predicate": {"attribute": "age", "op": ">=", "value": rng.randrange(6)},
        }
    return {"mechanism": "grr", "attribute": attribute, "epsilon": rng.choice(EPSILONS)}


def _history(rng: random.Random, length: int) -> LikelihoodState:
    domain = parse_domain(DOMAIN)
    entries = []
    for _ in range(length):
        mech = parse_query(_query(rng), domain)
        entries.append(history_entry(domain, mech.to_json(), mech.output_json(_output(rng, mech))))
    state, _ = fold_history(domain, entries)
    assert isinstance(state, LikelihoodState)
    return state


def _output(rng: random.Random, mech: Any) -> Any:
    return mech.parse_output(mech.output_json(rng.randrange(mech.output_count)), "output")


@pytest.mark.parametrize("seed", range(6))
def test_named_state_and_loss_equal_the_recorded_ones(seed: int) -> None:
    rng = random.Random(seed)
    domain = parse_domain(DOMAIN)
    for _ in range(60):
        state = _history(rng, rng.randrange(0, 9))
        mech = parse_query(_query(rng, "region"), domain)
        query = mech.exact_query()
        assert state.exact is not None
        assert query is not None
        losses = state.exact.candidate_losses(query)
        for output in range(mech.output_count):
            term = mech.term(output)
            after = state.applied(term)
            named = exact_after(state.exact, term)
            assert named is not None
            assert after.exact is not None
            assert named.canonical_bytes() == after.exact.canonical_bytes()
            assert named.loss() == after.exact.loss() == after.loss().value
            if query.kind == "grr":
                assert losses[output_index(output)] == after.exact.loss()


def test_named_state_drops_the_exact_form_as_applied_does() -> None:
    """Past :data:`MAX_GROUPS` distinct ε's the form is dropped by both (the float rule)."""
    domain = parse_domain(DOMAIN)
    groups = tuple(Group(Fraction(n, 1000)) for n in range(1, MAX_GROUPS + 1))
    counts = {2: np.ones((MAX_GROUPS, 7), dtype=np.int64)}
    state = LikelihoodState(domain, exact=ExactLoss((6, 2, 7), groups, counts))
    mech = parse_query({"mechanism": "grr", "attribute": "region", "epsilon": 0.77}, domain)
    term = mech.term(3)
    assert exact_after(state.exact, term) is None
    assert state.applied(term).exact is None


def _random_form(rng: random.Random) -> ExactLoss:
    """An exact form with 0-4 groups, 1-3 axes and counts small or near ``int64``'s limits."""
    groups = tuple(
        dict.fromkeys(
            Group(Fraction(rng.randint(1, 30), rng.choice([1, 2, 3, 7, 10, 1000])))
            for _ in range(rng.randint(0, 4))
        )
    )
    shape = tuple(rng.randint(1, 6) for _ in range(rng.randint(1, 3)))
    counts = {
        axis: np.array(
            [
                [rng.choice([rng.randint(-3, 5), rng.randint(-(2**60), 2**60)]) for _ in range(k)]
                for _ in groups
            ],
            dtype=np.int64,
        ).reshape(len(groups), k)
        for axis, k in enumerate(shape)
        if rng.random() < 0.7
    }
    return ExactLoss(shape, groups, counts)


def test_canonical_bytes_are_the_json_document() -> None:
    """The hand-written bytes equal ``json.dumps`` of the definition, whatever the form."""
    rng = random.Random(7)
    for _ in range(2000):
        form = _random_form(rng)
        shape, groups, counts = form.shape, form.groups, form.counts
        assert form.canonical_bytes() == canonical_json(form)
        # in any order of its groups: the same bytes
        order = list(range(len(groups)))
        rng.shuffle(order)
        shuffled = ExactLoss(
            shape, tuple(groups[g] for g in order), {a: c[order] for a, c in counts.items()}
        )
        assert shuffled.canonical_bytes() == form.canonical_bytes()


def test_stored_bytes_are_the_json_document() -> None:
    """``to_bytes`` (written by hand, from the canonical bytes when the groups are in ε order)
    equals ``json.dumps`` of its document — the stored format, read by ``from_bytes`` — for
    forms in any group order, computed before or after their canonical bytes."""
    rng = random.Random(11)
    for n in range(2000):
        form = _random_form(rng)
        if n % 2:
            form.canonical_bytes()
        data = form.to_bytes()
        assert data == stored_json(form)
        back = ExactLoss.from_bytes(form.shape, data)
        assert back.groups == form.groups
        assert back.counts.keys() == form.counts.keys()
        assert all(back.counts[a].tolist() == form.counts[a].tolist() for a in form.counts)


def test_canonical_after_is_the_canonical_bytes_of_the_form_after_the_term() -> None:
    """A survey keys each (group, output)'s next state by ``canonical_after`` without building
    it: the bytes must be those of ``with_term`` (or None, and the caller builds the form)."""
    rng = random.Random(13)
    pool = [Group(Fraction(n, d)) for n, d in ((1, 2), (1, 4), (3, 10), (1, 1), (7, 3))]
    answered = ordered = 0
    for _ in range(3000):
        groups = tuple(rng.sample(pool, rng.randint(0, 3)))
        shape = tuple(rng.randint(1, 6) for _ in range(rng.randint(1, 3)))
        counts = {
            axis: np.array(
                [[rng.randint(-3, 6) for _ in range(k)] for _ in groups], dtype=np.int64
            ).reshape(len(groups), k)
            for axis, k in enumerate(shape)
            if rng.random() < 0.7 and groups
        }
        form = ExactLoss(shape, groups, counts)
        for _ in range(4):
            axis = rng.randrange(len(shape))
            group = rng.choice(pool)
            coeff = np.zeros(shape[axis], dtype=np.int64)
            if rng.random() < 0.5:
                coeff[rng.randrange(shape[axis])] = 1  # grr: one value up
            else:
                coeff[:] = [rng.randint(0, 1) for _ in range(shape[axis])]  # binary_rr: a table
            term = ExactTerm(axis, group, coeff)
            found = form.canonical_after(term)
            if found is None:
                assert group not in groups or axis not in counts
                continue
            answered += 1
            after = form.with_term(term)
            assert found == after.canonical_bytes()
            # the stored bytes from the canonical ones, when the groups are in ε order
            stored = form.to_bytes_after(found)
            in_order = [g.epsilon for g in groups] == sorted(g.epsilon for g in groups)
            assert (stored is not None) == in_order
            if stored is not None:
                ordered += 1
                assert stored == after.to_bytes() == stored_json(after)
    assert answered > 1000
    assert 300 < ordered < answered


def test_canonical_after_near_the_int64_guard_is_the_canonical_bytes_after_the_term() -> None:
    """Counts near ``2**62`` (the template's guard): the answer is ``with_term``'s or None.

    ``canonical_after`` writes only the moved counts again (the others' texts kept per
    template); the rows here mix small, huge and negative counts.
    """
    rng = random.Random(29)
    pool = [Group(Fraction(n, d)) for n, d in ((1, 2), (1, 4), (3, 10))]
    big = 1 << 62
    answered = refused = 0
    for _ in range(600):
        groups = tuple(rng.sample(pool, rng.randint(1, 3)))
        shape = tuple(rng.randint(1, 5) for _ in range(rng.randint(1, 3)))
        values = [0, 1, -1, 7, big - 2, big - 1, big, -big + 1, -big, 123456789]
        counts = {
            axis: np.array(
                [[rng.choice(values) for _ in range(k)] for _ in groups], dtype=np.int64
            ).reshape(len(groups), k)
            for axis, k in enumerate(shape)
        }
        form = ExactLoss(shape, groups, counts)
        for _ in range(3):
            axis = rng.randrange(len(shape))
            group = rng.choice(groups)
            coeff = np.zeros(shape[axis], dtype=np.int64)
            coeff[rng.randrange(shape[axis])] = 1
            term = ExactTerm(axis, group, coeff)
            found = form.canonical_after(term)
            row = counts[axis][groups.index(group)].tolist()
            if found is None:
                refused += 1
                assert any(abs(v) >= big for v in row)
                continue
            answered += 1
            assert all(abs(v) < big for v in row)
            assert (
                found
                == form.with_term(term).canonical_bytes()
                == canonical_json(form.with_term(term))
            )
    assert answered > 300
    assert refused > 300


def test_a_template_cut_from_the_canonical_bytes_is_the_written_one() -> None:
    """A form whose canonical bytes are known cuts its template from them (a survey's group
    forms, :meth:`ExactLoss._template_cut`): the same prefix, row, suffix and texts as the
    template written piece by piece, for groups in and out of ε order, every (axis, group)
    and rows near the int64 guard; and ``canonical_after`` answers as ``with_term``."""
    rng = random.Random(31)
    pool = [Group(Fraction(n, d)) for n, d in ((1, 2), (1, 4), (3, 10), (1, 1), (7, 3))]
    big = 1 << 62
    values = [0, 1, -1, 2, 7, 10, 123456789, big - 1, big, -big]
    cut = later = refused = 0
    for _ in range(800):
        groups = tuple(rng.sample(pool, rng.randint(1, 4)))
        shape = tuple(rng.randint(1, 12) for _ in range(rng.randint(1, 4)))
        counts = {
            axis: np.array(
                [
                    [rng.choice(values[: 7 if rng.random() < 0.8 else None]) for _ in range(k)]
                    for _ in groups
                ],
                dtype=np.int64,
            ).reshape(len(groups), k)
            for axis, k in enumerate(shape)
            if rng.random() < 0.8
        }
        written = ExactLoss(shape, groups, counts)
        known = ExactLoss(shape, groups, counts)
        known.kept.canonical = canonical_json(written)
        order = sorted(range(len(groups)), key=lambda g: groups[g].epsilon)
        for axis in range(len(shape)):
            for group in (*groups, rng.choice(pool)):
                expected = written._template(axis, group)
                assert known._template(axis, group) == expected
                if axis not in counts or group not in groups:
                    assert expected is None
                    continue
                g = groups.index(group)
                found = known._template_cut(canonical_json(written), axis, g)
                assert found == expected
                if found is None:
                    refused += 1
                    continue
                cut += 1
                later += order.index(g) > 0
                coeff = np.zeros(shape[axis], dtype=np.int64)
                coeff[rng.randrange(shape[axis])] = 1
                term = ExactTerm(axis, group, coeff)
                assert known.canonical_after(term) == written.with_term(term).canonical_bytes()
    assert cut > 2000
    assert later > 800  # rows after others in the canonical order
    assert refused > 100  # rows past the guard refused by the cut too


def test_canonical_bytes_from_stored_ones_only_for_to_bytes_in_order() -> None:
    """The candidate canonical bytes from stored ones (the shape, then the stored document) are
    the form's when the stored bytes are ``to_bytes``'s with the groups in ε order; not for
    groups out of ε order, an older writer's spacing or a pair not in lowest terms — all of
    which parse to the same form (why a caller must verify the candidate)."""
    rng = random.Random(37)
    pool = [Group(Fraction(n, d)) for n, d in ((1, 2), (1, 4), (3, 10), (1, 1), (7, 3))]
    in_order = out_of_order = 0
    for _ in range(400):
        groups = tuple(rng.sample(pool, rng.randint(1, 3)))
        shape = tuple(rng.randint(1, 6) for _ in range(rng.randint(1, 3)))
        counts = {
            axis: np.array(
                [[rng.randint(-3, 9) for _ in range(k)] for _ in groups], dtype=np.int64
            ).reshape(len(groups), k)
            for axis, k in enumerate(shape)
            if rng.random() < 0.8
        }
        form = ExactLoss(shape, groups, counts)
        stored = form.to_bytes()
        read = ExactLoss.from_bytes(shape, stored)
        candidate = read.canonical_from_stored(stored)
        if [g.epsilon for g in groups] == sorted(g.epsilon for g in groups):
            in_order += 1
            assert candidate == form.canonical_bytes() == read.canonical_bytes()
        else:
            out_of_order += 1
            assert candidate != read.canonical_bytes()
        spaced = json.dumps(json.loads(stored)).encode()  # json.dumps' default separators
        again = ExactLoss.from_bytes(shape, spaced)
        assert again.canonical_bytes() == read.canonical_bytes()
        assert again.canonical_from_stored(spaced) != read.canonical_bytes()
    assert in_order > 100
    assert out_of_order > 100
    doubled = b'{"g":[[2,4]],"c":{"0":[[1,0,0]]}}'
    form = ExactLoss.from_bytes((3,), doubled)
    assert form.canonical_bytes() == b'{"s":[3],"g":[[1,2]],"c":{"0":[[1,0,0]]}}'
    assert form.canonical_from_stored(doubled) != form.canonical_bytes()


def test_stored_groups_are_read_as_before() -> None:
    """``from_bytes`` shares one group per stored pair: equal to a new one, and a pair that
    is not two integers is refused as ``Fraction`` refuses it."""
    form = ExactLoss.from_bytes((3,), b'{"g":[[1,2],[3,10]],"c":{"0":[[1,0,0],[0,0,2]]}}')
    again = ExactLoss.from_bytes((3,), b'{"g":[[3,10],[1,2]],"c":{"0":[[0,0,2],[1,0,0]]}}')
    assert form.groups == (Group(Fraction(1, 2)), Group(Fraction(3, 10)))
    assert again.groups == form.groups[::-1]
    assert form.canonical_bytes() == again.canonical_bytes()
    assert ExactLoss.from_bytes((3,), b'{"g":[[2,4]],"c":{}}').groups == (Group(Fraction(1, 2)),)
    for bad in (b'{"g":[[1.0,2]],"c":{}}', b'{"g":[["1",2]],"c":{}}'):
        with pytest.raises(TypeError):
            ExactLoss.from_bytes((3,), bad)
