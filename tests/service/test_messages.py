"""Every validation message is in the service's own words (issue #11, 13).

Query and path parameters and headers are validated by FastAPI (Pydantic), whose stock
messages ("Input should be greater than or equal to 1", "String should have at most 255
characters") read unlike every other message of the API. SQLite and PostgreSQL.
"""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from tests.service.conftest import ADMIN_KEY, auth, unique_id
from tests.service.factories import integer_domain

STOCK = ("Input should", "String should", "Field required", "Value error", "should have")
DOMAIN = integer_domain(2)


@pytest.fixture(scope="module")
def oid(client: TestClient) -> str:
    object_id = unique_id("msg")
    body = {"id": object_id, "domain": DOMAIN, "value": {"x": 1}, "budget": {"epsilon": 1}}
    assert client.post("/v1/objects", json=body, headers=auth(ADMIN_KEY)).status_code == 201
    return object_id


CASES = [
    ("GET", "/v1/objects/{oid}/queries?limit=0", {}, "limit", "must be at least 1"),
    ("GET", "/v1/objects/{oid}/queries?limit=5000", {}, "limit", "must be at most 1000"),
    ("GET", "/v1/objects/{oid}/queries?limit=ten", {}, "limit", "must be an integer"),
    ("GET", "/v1/objects/{oid}/queries?after=-1", {}, "after", "must be at least 0"),
    ("GET", "/v1/odometers?limit=0", {}, "limit", "must be at least 1"),
    ("GET", "/v1/audit?after=x", {}, "after", "must be an integer"),
    ("GET", "/v1/keys?limit=1001", {}, "limit", "must be at most 1000"),
    ("DELETE", "/v1/keys/0", {}, "key_id", "must be at least 1"),
    (
        "POST",
        "/v1/objects/{oid}/queries",
        {"Idempotency-Key": "k" * 256},
        "Idempotency-Key",
        "must be at most 255 characters",
    ),
]


@pytest.mark.parametrize(
    ("method", "url", "headers", "field", "message"), CASES, ids=[c[1] for c in CASES]
)
def test_parameter_errors_are_in_our_words(
    client: TestClient,
    oid: str,
    method: str,
    url: str,
    headers: dict[str, str],
    field: str,
    message: str,
) -> None:
    body = {"query": {"mechanism": "grr", "attribute": "x", "epsilon": 0.1}}
    r = client.request(
        method,
        url.format(oid=oid),
        headers={**auth(ADMIN_KEY), **headers},
        json=body if method == "POST" else None,
    )
    assert r.status_code == 422, r.text
    problem = r.json()
    assert problem["errors"] == [{"field": field, "message": message}], problem
    assert not [s for s in STOCK if s in r.text], r.text


def test_a_matrix_with_the_wrong_number_of_rows_says_rows_are_domain_points(
    client: TestClient, oid: str
) -> None:
    query = {"mechanism": "matrix", "outputs": [0, 1], "probabilities": [[0.5, 0.5]] * 2}
    r = client.post(f"/v1/objects/{oid}/dry-run", json={"query": query}, headers=auth(ADMIN_KEY))
    assert r.status_code == 422, r.text
    assert r.json()["errors"] == [
        {
            "field": "query.probabilities",
            "message": "must have one row per domain point, in the domain's order: 3 row(s), not 2",
        }
    ]
    query["probabilities"] = [[0.5, 0.5], [1.0], [0.5, 0.5]]
    r = client.post(f"/v1/objects/{oid}/dry-run", json={"query": query}, headers=auth(ADMIN_KEY))
    assert r.json()["errors"] == [
        {
            "field": "query.probabilities[1]",
            "message": "must have one probability per output: 2, not 1",
        }
    ]


def test_a_domain_too_large_says_how_large(client: TestClient) -> None:
    big = {
        "attributes": [
            {"name": "a", "type": "integer", "low": 0, "high": 9999},
            {"name": "b", "type": "integer", "low": 0, "high": 9999},
        ]
    }
    body = {"id": unique_id(), "domain": big, "value": {"a": 1, "b": 1}, "budget": {"epsilon": 1}}
    r = client.post("/v1/objects", json=body, headers=auth(ADMIN_KEY))
    assert r.status_code == 422, r.text
    assert r.json()["errors"] == [
        {
            "field": "domain.attributes",
            "message": "describe a domain of 100,000,000 points; at most 10,000,000 are "
            "supported (the product of the attributes' numbers of values)",
        }
    ]
