"""A randomized-response query is parsed once per text, domain and limits (``_mechanism_of``).

The kept mechanism is the one ``parse_query`` builds from the same JSON; other texts (another
ε, the same ε written as another number type, another key order) and other kinds are parsed
anew, and an invalid query raises every time (nothing kept).
"""

from __future__ import annotations

import json

import pytest

from app.engine.errors import InvalidInput
from app.engine.limits import EngineLimits
from app.engine.mechanisms import parse_query
from app.services import queries

DOMAIN = json.dumps(
    {
        "attributes": [
            {"name": "a", "type": "integer", "low": 0, "high": 9},
            {"name": "c", "type": "categorical", "values": ["x", "y", "z"]},
        ]
    }
)
LIMITS = EngineLimits()


def test_the_same_query_text_gets_the_same_mechanism() -> None:
    grr = {"mechanism": "grr", "attribute": "a", "epsilon": 0.5}
    first = queries._mechanism_of(grr, DOMAIN, LIMITS)
    assert queries._mechanism_of(dict(grr), DOMAIN, LIMITS) is first
    fresh = parse_query(grr, queries._domain_of(DOMAIN, LIMITS), "query", limits=LIMITS)
    assert type(first) is type(fresh)
    assert (first.to_json(), first.epsilon_exact, first.log_hit, first.log_miss) == (
        fresh.to_json(),
        fresh.epsilon_exact,
        fresh.log_hit,  # type: ignore[attr-defined]
        fresh.log_miss,  # type: ignore[attr-defined]
    )
    for other in (
        {"mechanism": "grr", "attribute": "a", "epsilon": 0.25},
        {"mechanism": "grr", "attribute": "c", "epsilon": 0.5},
        {"mechanism": "grr", "attribute": "a", "epsilon": 1},
        {"mechanism": "grr", "epsilon": 0.5, "attribute": "a"},
    ):
        assert queries._mechanism_of(other, DOMAIN, LIMITS) is not first
    assert queries._mechanism_of(grr, DOMAIN, EngineLimits(max_epsilon=5.0)) is not first
    binary = {
        "mechanism": "binary_rr",
        "predicate": {"attribute": "c", "op": "in", "value": ["x", "z"]},
        "epsilon": 0.5,
    }
    assert queries._mechanism_of(binary, DOMAIN, LIMITS) is queries._mechanism_of(
        json.loads(json.dumps(binary)), DOMAIN, LIMITS
    )


def test_other_kinds_are_parsed_each_time_and_errors_are_never_kept() -> None:
    ue = {"mechanism": "unary_encoding", "attribute": "a", "epsilon": 0.5}
    assert queries._mechanism_of(ue, DOMAIN, LIMITS) is not queries._mechanism_of(
        ue, DOMAIN, LIMITS
    )
    bad = {"mechanism": "grr", "attribute": "nope", "epsilon": 0.5}
    for _ in range(2):
        with pytest.raises(InvalidInput):
            queries._mechanism_of(bad, DOMAIN, LIMITS)


def test_a_kept_mechanism_comes_with_its_stored_query_text() -> None:
    """The text an accepted submit stores is ``json.dumps(mech.to_json())``, computed once."""
    grr = {"epsilon": 0.5, "attribute": "c", "mechanism": "grr"}
    mech, text = queries._mechanism_and_text(grr, DOMAIN, LIMITS)
    assert text == json.dumps(mech.to_json())
    again, text_again = queries._mechanism_and_text(dict(grr), DOMAIN, LIMITS)
    assert again is mech
    assert text_again is text
    ue = {"mechanism": "unary_encoding", "attribute": "a", "epsilon": 0.5}
    assert queries._mechanism_and_text(ue, DOMAIN, LIMITS)[1] is None
