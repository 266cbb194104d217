"""Request bodies validated by their models, in our words (issue 23, item 1).

:func:`app.services.bodies.validated` is what every route's body goes through
(:func:`app.api.deps.typed_body`, and registration's use case): these pin how Pydantic's errors
become ours — JSON paths without union members' names, every bad field at once, ``null`` refused
for an optional field, never a value — and that the engine still gets the JSON as written.
"""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel

from app.engine.errors import InvalidInput
from app.services import schemas
from app.services.bodies import validated

SENTINEL = "SENTINEL-Zq7"
DOMAIN = {"attributes": [{"name": "x", "type": "integer", "low": 0, "high": 3}]}


def errors_of(model: type[BaseModel], body: Any) -> dict[str, str]:
    with pytest.raises(InvalidInput) as caught:
        validated(model, body)
    found = {e.field: e.message for e in caught.value.errors}
    assert caught.value.field == caught.value.errors[0].field
    return found


def test_a_query_error_names_the_json_path_not_the_union_member() -> None:
    body = {"query": {"mechanism": "grr", "attribute": "x", "epsilon": True}}
    assert errors_of(schemas.QueryRequest, body) == {"query.epsilon": "must be a number"}


def test_a_missing_or_unknown_mechanism_names_the_discriminator() -> None:
    assert errors_of(schemas.QueryRequest, {"query": {"epsilon": 1}}) == {
        "query.mechanism": "is required"
    }
    message = errors_of(schemas.QueryRequest, {"query": {"mechanism": SENTINEL}})["query.mechanism"]
    assert message.startswith("must be one of grr, binary_rr")


def test_every_bad_field_is_named_at_once_and_no_value_is_echoed() -> None:
    body = {
        "id": SENTINEL + " ",
        "domain": DOMAIN,
        "value": {"x": [SENTINEL]},
        "budget": {"epsilon": -1.5, "bogus": 1},
        "labels": {"site": "a\x01" + SENTINEL},
    }
    found = errors_of(schemas.RegisterRequest, body)
    assert set(found) == {"id", "value.x", "budget.epsilon", "budget.bogus", "labels.site"}
    assert found["budget.epsilon"] == "must be greater than 0"
    assert found["budget.bogus"] == "is not a known field"
    assert not [m for m in found.values() if SENTINEL in m]


def test_a_bad_label_name_names_the_labels_not_the_name() -> None:
    body = {"id": "a", "domain": DOMAIN, "value": {"x": 1}, "budget": {"epsilon": 1}}
    found = errors_of(schemas.RegisterRequest, {**body, "labels": {"bad name": "v"}})
    assert list(found) == ["labels"]


@pytest.mark.parametrize(
    ("model", "body", "field", "message"),
    [
        (schemas.KeyRequest, {"role": "viewer", "label": None}, "label", "must be a string"),
        (
            schemas.QueryRequest,
            {"query": {"mechanism": "olh", "attribute": "x", "epsilon": 1, "g": None}},
            "query.g",
            "must be an integer",
        ),
        (
            schemas.LossRequest,
            {"domain": DOMAIN, "history": [], "candidate": None},
            "candidate",
            "must be an object",
        ),
    ],
)
def test_an_optional_field_is_left_out_never_null(
    model: type[BaseModel], body: dict[str, Any], field: str, message: str
) -> None:
    assert errors_of(model, body) == {field: message}


def test_rules_between_fields_name_the_field_they_are_about() -> None:
    body = {"id": "a", "domain": DOMAIN, "value": {"x": 1}, "budget": {"epsilon": 1}}
    assert errors_of(schemas.RegisterRequest, {**body, "filter": "approx_bayesian"}) == {
        "budget.delta": "is required by the approx_bayesian filter"
    }
    cohort = {"ids": ["a", "b", "a"]}
    survey = {"name": "s", "query": {"mechanism": "grr", "attribute": "x", "epsilon": 1}}
    assert errors_of(schemas.SurveyRequest, {**survey, "cohort": cohort}) == {
        "cohort.ids[2]": "repeats an earlier id"
    }


def test_the_engine_gets_the_json_as_written() -> None:
    """``1`` stays ``1`` (not ``1.0``): the idempotency fingerprint and decimals as written."""
    query = {"mechanism": "grr", "attribute": "x", "epsilon": 1}
    body = validated(schemas.QueryRequest, {"query": query})
    assert isinstance(body.query, schemas.GrrQuery)
    assert body.written("query") == query
    assert type(body.written("query")["epsilon"]) is int
    assert body.written() == {"query": query}


def test_the_json_as_written_is_read_without_pydantics_attribute_fallback(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``written`` reads the private attributes' dict, not ``BaseModel.__getattr__`` (3.5 µs)."""
    query = {"mechanism": "grr", "attribute": "x", "epsilon": 1}
    body = validated(schemas.QueryRequest, {"query": query})

    def refused(self: BaseModel, item: str) -> Any:
        raise AssertionError(f"BaseModel.__getattr__ asked for {item}")

    monkeypatch.setattr(BaseModel, "__getattr__", refused)
    assert body.written("query") is body.written()["query"]
    assert body.written() == {"query": query}


def test_a_history_query_is_the_engines_to_read() -> None:
    """Past queries were accepted under their own rules (ε below today's floor too)."""
    entry = {"query": {"mechanism": "grr", "attribute": "x", "epsilon": 1e-9}, "output": 0}
    body = validated(schemas.LossRequest, {"domain": DOMAIN, "history": [entry]})
    assert body.written("history") == [entry]
