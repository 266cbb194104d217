"""Exact forms kept by their stored bytes (:class:`app.engine.likelihood.ExactForms`).

A state read with the forms gets the very form kept under its bytes, and that form decides as
the one parsed from the bytes would: the same loss, canonical bytes and bytes after any term.
The cache is bounded by its bytes and never answers for other bytes.
"""

from __future__ import annotations

import numpy as np

from app.engine.domain import parse_domain
from app.engine.exact import MAGIC
from app.engine.likelihood import ExactForms, LikelihoodState
from app.engine.limits import EngineLimits
from app.engine.mechanisms import parse_query

DOMAIN = parse_domain(
    {
        "attributes": [
            {"name": "a", "type": "integer", "low": 0, "high": 9},
            {"name": "b", "type": "categorical", "values": ["p", "q", "r"]},
        ]
    }
)
LIMITS = EngineLimits()


def _state(outputs: list[tuple[str, float, int]]) -> LikelihoodState:
    state = LikelihoodState(DOMAIN)
    for attribute, epsilon, output in outputs:
        query = {"mechanism": "grr", "attribute": attribute, "epsilon": epsilon}
        state = state.applied(parse_query(query, DOMAIN, "query", limits=LIMITS).term(output))
    return state


def _tail(data: bytes) -> bytes:
    return data[data.index(MAGIC) + len(MAGIC) :]


HISTORY = [("a", 0.5, 3), ("b", 0.25, 1), ("a", 0.5, 3), ("a", 0.1, 7), ("b", 0.5, 2)]


def test_a_remembered_form_is_found_by_its_bytes_and_decides_as_the_parsed_one() -> None:
    forms = ExactForms()
    built = _state(HISTORY)
    data = built.to_bytes()
    forms.remember(built)
    found = LikelihoodState.from_bytes(DOMAIN, data, built.err, forms)
    parsed = LikelihoodState.from_bytes(DOMAIN, data, built.err)
    assert found.exact is built.exact
    assert forms.hits == 1
    assert parsed.exact is not None
    assert found.exact is not None
    assert found.exact.loss() == parsed.exact.loss()
    assert found.exact.canonical_bytes() == parsed.exact.canonical_bytes()
    assert found.to_bytes() == parsed.to_bytes() == data
    assert np.array_equal(found.logp, parsed.logp)
    for attribute, epsilon, output in [("b", 0.25, 0), ("a", 0.3, 9), ("a", 0.5, 3)]:
        query = {"mechanism": "grr", "attribute": attribute, "epsilon": epsilon}
        term = parse_query(query, DOMAIN, "query", limits=LIMITS).term(output)
        found, parsed = found.applied(term), parsed.applied(term)
        assert found.to_bytes() == parsed.to_bytes()
        assert found.loss() == parsed.loss()


def test_a_parsed_form_is_kept_and_other_bytes_are_never_answered() -> None:
    forms = ExactForms()
    one, other = _state(HISTORY), _state(HISTORY[:-1])
    first = LikelihoodState.from_bytes(DOMAIN, one.to_bytes(), one.err, forms)
    again = LikelihoodState.from_bytes(DOMAIN, one.to_bytes(), one.err, forms)
    assert again.exact is first.exact
    assert (forms.hits, forms.misses) == (1, 1)
    different = LikelihoodState.from_bytes(DOMAIN, other.to_bytes(), other.err, forms)
    assert different.exact is not first.exact
    assert different.exact is not None
    assert different.exact.loss() == other.loss().value
    assert (forms.hits, forms.misses) == (1, 2)


def test_the_forms_are_bounded_by_their_bytes() -> None:
    states = [_state([("a", 0.5, i % 10), ("b", 0.5, i % 3)] * (i + 1)) for i in range(12)]
    tails = [_tail(s.to_bytes()) for s in states]
    assert len(set(tails)) == len(tails)
    forms = ExactForms(max_bytes=sum(len(t) for t in tails[-4:]), max_entry=max(map(len, tails)))
    for state in states:
        forms.remember(state)
    assert [forms.get(DOMAIN.shape, t) is not None for t in tails] == [False] * 8 + [True] * 4
    small = ExactForms(max_entry=len(tails[0]) - 1)
    small.remember(states[0])
    assert small.get(DOMAIN.shape, tails[0]) is None


def test_a_state_without_an_exact_form_is_not_kept() -> None:
    forms = ExactForms()
    state = LikelihoodState(DOMAIN, np.arange(30, dtype=np.float64))
    assert state.exact is None
    forms.remember(state)
    restored = LikelihoodState.from_bytes(DOMAIN, state.to_bytes(), 0.0, forms)
    assert restored.exact is None
    assert (forms.hits, forms.misses) == (0, 0)
