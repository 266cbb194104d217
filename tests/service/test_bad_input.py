"""Bad input everywhere: every case is a 4xx application/problem+json, never a 5xx.

Validation errors name the offending field in ``errors[].field`` and never echo the submitted
value: the bad values carry sentinels that must not appear in the response.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from app.bootstrap import create_app
from tests.service.conftest import ADMIN_KEY, auth, make_settings, new_key, unique_id

PROBLEM = "application/problem+json"
#: A string sentinel and a number sentinel placed in bad values; neither may be echoed.
S = "SENTINEL-Zq7"
N = 987654.321
N_TEXT = "987654"
NI = 98765432  # an out-of-range integer sentinel

FINITE_DOMAIN = {
    "attributes": [
        {"name": "x", "type": "integer", "low": 0, "high": 3},
        {"name": "disease", "type": "categorical", "values": ["none", "flu", "covid"]},
    ]
}
FINITE_VALUE = {"x": 1, "disease": "flu"}
CONT_DOMAIN = {
    "attributes": [
        {"name": "r", "type": "real", "low": -1, "high": 1},
        {"name": "k", "type": "integer", "low": 0, "high": 3},
    ]
}
CONT_VALUE = {"r": 0.5, "k": 2}
GRR = {"mechanism": "grr", "attribute": "x", "epsilon": 0.5}
BRR = {
    "mechanism": "binary_rr",
    "epsilon": 0.5,
    "predicate": {"attribute": "x", "op": "<=", "value": 1},
}
UE = {"mechanism": "unary_encoding", "attribute": "disease", "epsilon": 0.5, "variant": "optimized"}
MATRIX = {"mechanism": "matrix", "outputs": [0, 1], "probabilities": [[0.5, 0.5]] * 12}
LINEAR = {
    "mechanism": "linear",
    "weights": {"r": 0.5},
    "intercept": 0.0,
    "range": [-0.5, 0.5],
    "epsilon": 0.5,
}
LOGISTIC = {"mechanism": "logistic", "weights": {"r": 1.0}, "intercept": 0.0, "epsilon": 0.5}


def with_(base: dict[str, Any], **changes: Any) -> dict[str, Any]:
    """A copy of ``base`` with keys changed (``...`` removes a key)."""
    out = dict(base)
    for k, v in changes.items():
        if v is ...:
            out.pop(k, None)
        else:
            out[k] = v
    return out


def register_body(**changes: Any) -> dict[str, Any]:
    base = {
        "id": unique_id("bad"),
        "domain": FINITE_DOMAIN,
        "value": FINITE_VALUE,
        "budget": {"epsilon": 1.0},
    }
    return with_(base, **changes)


def attrs(*items: dict[str, Any]) -> dict[str, Any]:
    return {"attributes": list(items)}


def int_attr(name: str = "x", low: Any = 0, high: Any = 3, **extra: Any) -> dict[str, Any]:
    return {"name": name, "type": "integer", "low": low, "high": high, **extra}


def assert_problem(
    response: httpx.Response, status: int | tuple[int, ...], type_: str | None = None
) -> dict[str, Any]:
    """A 4xx problem+json with type/title/status/detail; returns the body."""
    statuses = (status,) if isinstance(status, int) else status
    assert response.status_code in statuses, (response.status_code, response.text)
    assert 400 <= response.status_code < 500
    assert response.headers["content-type"].startswith(PROBLEM), response.headers
    body = response.json()
    assert {"type", "title", "status", "detail"} <= body.keys(), body
    assert body["status"] == response.status_code
    for key in ("type", "title", "detail"):
        assert isinstance(body[key], str)
        assert body[key]
    if type_ is not None:
        assert body["type"] == type_, body
    return dict(body)


def assert_validation(response: httpx.Response, field: str | None, status: int = 422) -> None:
    body = assert_problem(response, status)
    assert S not in response.text, "the submitted value was echoed"
    assert N_TEXT not in response.text, "the submitted value was echoed"
    assert str(NI) not in response.text, "the submitted value was echoed"
    if field is not None:
        assert body["type"] in ("validation-error", "unsupported"), body
        fields = [e["field"] for e in body.get("errors", [])]
        assert fields, body
        assert all(isinstance(e.get("message"), str) for e in body["errors"])
        assert field in fields, (field, body)


@pytest.fixture(scope="module")
def api(database_url: str) -> Iterator[TestClient]:
    """The app on SQLite or PostgreSQL; a server error comes back as a 500 response (short
    failure reports) instead of being re-raised in the test."""
    settings = make_settings(database_url)
    with TestClient(create_app(settings), raise_server_exceptions=False) as test_client:
        yield test_client


@pytest.fixture(scope="module")
def analyst(api: TestClient) -> str:
    return new_key(api, "analyst")


@pytest.fixture(scope="module")
def objects(api: TestClient) -> dict[str, str]:
    """A finite and a continuous object to send bad queries to."""
    ids = {"finite": unique_id("f"), "cont": unique_id("c")}
    for kind, domain, value in (
        ("finite", FINITE_DOMAIN, FINITE_VALUE),
        ("cont", CONT_DOMAIN, CONT_VALUE),
    ):
        r = api.post(
            "/v1/objects",
            headers=auth(ADMIN_KEY),
            json={"id": ids[kind], "domain": domain, "value": value, "budget": {"epsilon": 5}},
        )
        assert r.status_code == 201, r.text
    return ids


# ------------------------------------------------------------------------------------------------
# Malformed JSON and non-object bodies, on every endpoint that takes a body
# ------------------------------------------------------------------------------------------------
BODY_ENDPOINTS = [
    "/v1/objects",
    "/v1/objects/{finite}/dry-run",
    "/v1/objects/{finite}/queries",
    "/v1/loss",
    "/v1/keys",
]
MALFORMED = {
    "truncated": b'{"id": "x", "domain": ',
    "single-quotes": b"{'id': 'x'}",
    "bare-word": b"SENTINEL-Zq7",
    "trailing-garbage": b'{"id": "x"} SENTINEL-Zq7',
    "trailing-comma": b'{"id": "x",}',
    "comment": b'{"id": "x" /* SENTINEL-Zq7 */}',
    "invalid-utf8": b'{"id": "\xff\xfe"}',
    "unterminated-string": b'{"id": "SENTINEL-Zq7',
    "deep-nesting": b"[" * 200_000 + b"]" * 200_000,
    "nul-byte": b'{"id": "x"}\x00',
}


@pytest.mark.parametrize("endpoint", BODY_ENDPOINTS)
@pytest.mark.parametrize("raw", list(MALFORMED.values()), ids=list(MALFORMED))
def test_malformed_json_is_400(
    api: TestClient, objects: dict[str, str], endpoint: str, raw: bytes
) -> None:
    url = endpoint.format(**objects)
    r = api.post(url, content=raw, headers={**auth(ADMIN_KEY), "Content-Type": "application/json"})
    assert_problem(r, 400, "invalid-json")
    assert S not in r.text


DUPLICATES = {
    "top-level": (b'{"id": "a", "id": "b"}', "id"),
    "nested": (
        b'{"query": {"mechanism": "grr", "attribute": "d", "epsilon": 0.1, "epsilon": 50}}',
        "query.epsilon",
    ),
    "in-a-list": (
        b'{"history": [{}, {"output": 1, "output": "SENTINEL-Zq7"}]}',
        "history[1].output",
    ),
    "deep": (b'{"a": [[{"b": {"c": 1, "c": 2}}]]}', "a[0][0].b.c"),
}


@pytest.mark.parametrize("endpoint", BODY_ENDPOINTS)
@pytest.mark.parametrize(("raw", "field"), list(DUPLICATES.values()), ids=list(DUPLICATES))
def test_a_key_given_twice_is_400_naming_it(
    api: TestClient, objects: dict[str, str], endpoint: str, raw: bytes, field: str
) -> None:
    """``json.loads`` kept the last of two equal keys: ε = 50 was evaluated (issue #11, 6)."""
    url = endpoint.format(**objects)
    r = api.post(url, content=raw, headers={**auth(ADMIN_KEY), "Content-Type": "application/json"})
    body = assert_problem(r, 400, "invalid-json")
    assert body["errors"] == [{"field": field, "message": "is given more than once"}]
    assert field in body["detail"]
    assert S not in r.text


LONE_SURROGATES = {
    "value": (b'{"id": "a", "metadata": {"note": "x\\ud800"}}', "metadata.note"),
    "low-half": (b'{"query": {"attribute": "\\uDC00"}}', "query.attribute"),
    "key": (b'{"metadata": {"\\ud83d": 1}}', "metadata.\\ud83d"),
    "in-a-list": (b'{"history": [{}, {"output": "\\udfff"}]}', "history[1].output"),
}


@pytest.mark.parametrize("endpoint", BODY_ENDPOINTS)
@pytest.mark.parametrize(
    ("raw", "field"), list(LONE_SURROGATES.values()), ids=list(LONE_SURROGATES)
)
def test_a_lone_surrogate_escape_is_400_naming_it(
    api: TestClient, objects: dict[str, str], endpoint: str, raw: bytes, field: str
) -> None:
    """``"\\ud800"`` parsed to a str no database could store: a label holding it was a 500."""
    url = endpoint.format(**objects)
    r = api.post(url, content=raw, headers={**auth(ADMIN_KEY), "Content-Type": "application/json"})
    body = assert_problem(r, 400, "invalid-json")
    assert body["errors"] == [{"field": field, "message": "holds a lone UTF-16 surrogate escape"}]


def test_a_surrogate_pair_is_text(api: TestClient) -> None:
    """A pair (an emoji escaped as UTF-16) is valid text and kept."""
    raw = b'{"role": "viewer", "label": "\\ud83d\\ude00 \\u00e9"}'
    r = api.post(
        "/v1/keys", content=raw, headers={**auth(ADMIN_KEY), "Content-Type": "application/json"}
    )
    assert r.status_code == 201, r.text
    assert r.json()["label"] == "\U0001f600 \u00e9"


def test_a_duplicate_key_is_not_evaluated_on_submit(
    api: TestClient, objects: dict[str, str]
) -> None:
    analyst = auth(new_key(api, "analyst"))
    url = "/v1/objects/{finite}/queries".format(**objects)
    before = api.get("/v1/objects/{finite}/odometer".format(**objects), headers=analyst).json()
    raw = b'{"query": {"mechanism": "grr", "attribute": "x", "epsilon": 0.1, "epsilon": 50}}'
    r = api.post(url, content=raw, headers={**analyst, "Content-Type": "application/json"})
    assert_problem(r, 400, "invalid-json")
    after = api.get("/v1/objects/{finite}/odometer".format(**objects), headers=analyst).json()
    assert after == before


NON_OBJECTS = {
    "array": "[]",
    "array-of-object": '[{"id": "x"}]',
    "string": '"SENTINEL-Zq7"',
    "number": "987654.321",
    "null": "null",
    "true": "true",
}


@pytest.mark.parametrize("endpoint", BODY_ENDPOINTS)
@pytest.mark.parametrize("raw", list(NON_OBJECTS.values()), ids=list(NON_OBJECTS))
def test_non_object_body_is_422(
    api: TestClient, objects: dict[str, str], endpoint: str, raw: str
) -> None:
    url = endpoint.format(**objects)
    r = api.post(url, content=raw, headers={**auth(ADMIN_KEY), "Content-Type": "application/json"})
    assert_validation(r, None)
    assert r.json()["type"] == "validation-error"
    assert r.json()["errors"][0]["field"] == "body"


@pytest.mark.parametrize("endpoint", BODY_ENDPOINTS)
def test_empty_body_is_4xx(api: TestClient, objects: dict[str, str], endpoint: str) -> None:
    r = api.post(endpoint.format(**objects), headers=auth(ADMIN_KEY))
    assert_problem(r, (400, 422))


@pytest.mark.parametrize("endpoint", BODY_ENDPOINTS)
@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded"])
def test_form_or_text_bodies_are_4xx(
    api: TestClient, objects: dict[str, str], endpoint: str, content_type: str
) -> None:
    r = api.post(
        endpoint.format(**objects),
        content=b"id=SENTINEL-Zq7&budget=1",
        headers={**auth(ADMIN_KEY), "Content-Type": content_type},
    )
    assert_problem(r, (400, 415, 422))
    assert S not in r.text


# ------------------------------------------------------------------------------------------------
# NaN and Infinity as raw JSON text (not valid JSON; Python's parser accepts them)
# ------------------------------------------------------------------------------------------------
NONFINITE = ["NaN", "Infinity", "-Infinity", "1e400", "-1e400"]


@pytest.mark.parametrize("token", NONFINITE)
@pytest.mark.parametrize(
    ("template", "field"),
    [
        ('{"id":"ID","domain":DOMAIN,"value":VALUE,"budget":{"epsilon":TOKEN}}', "budget.epsilon"),
        (
            '{"id":"ID","domain":{"attributes":[{"name":"r","type":"real","low":TOKEN,"high":1}]},'
            '"value":{"r":0.5},"budget":{"epsilon":1}}',
            "domain.attributes[0].low",
        ),
        (
            '{"id":"ID","domain":{"attributes":[{"name":"r","type":"real","low":0,"high":TOKEN}]},'
            '"value":{"r":0.5},"budget":{"epsilon":1}}',
            "domain.attributes[0].high",
        ),
        (
            '{"id":"ID","domain":{"attributes":[{"name":"r","type":"real","low":-1,"high":1}]},'
            '"value":{"r":TOKEN},"budget":{"epsilon":1}}',
            "value.r",
        ),
        (
            '{"id":"ID","domain":{"attributes":[{"name":"k","type":"integer","low":TOKEN,"high":1}]},'
            '"value":{"k":0},"budget":{"epsilon":1}}',
            "domain.attributes[0].low",
        ),
        (
            '{"id":"ID","domain":DOMAIN,"value":{"x":TOKEN,"disease":"flu"},"budget":{"epsilon":1}}',
            "value.x",
        ),
    ],
    ids=["budget", "real-low", "real-high", "real-value", "int-low", "int-value"],
)
def test_register_nonfinite_numbers(api: TestClient, template: str, field: str, token: str) -> None:
    raw = (
        template.replace("ID", unique_id("nan"))
        .replace("DOMAIN", json.dumps(FINITE_DOMAIN))
        .replace("VALUE", json.dumps(FINITE_VALUE))
        .replace("TOKEN", token)
    )
    r = api.post(
        "/v1/objects", content=raw, headers={**auth(ADMIN_KEY), "Content-Type": "application/json"}
    )
    assert_validation(r, field)
    assert token.lower() not in r.text.lower().replace("finite", "")


QUERY_NONFINITE = [
    ("finite", '{"mechanism":"grr","attribute":"x","epsilon":TOKEN}', "query.epsilon"),
    (
        "finite",
        '{"mechanism":"binary_rr","epsilon":TOKEN,"predicate":{"attribute":"x","op":"<","value":2}}',
        "query.epsilon",
    ),
    (
        "finite",
        '{"mechanism":"binary_rr","epsilon":0.5,"predicate":{"attribute":"x","op":"<","value":TOKEN}}',
        "query.predicate.value",
    ),
    (
        "finite",
        '{"mechanism":"matrix","outputs":[0,1],"probabilities":[[TOKEN,0.5]'
        + ",[0.5,0.5]" * 11
        + "]}",
        "query.probabilities[0][0]",
    ),
    (
        "finite",
        '{"mechanism":"matrix","outputs":[TOKEN,1],"probabilities":[[0.5,0.5]'
        + ",[0.5,0.5]" * 11
        + "]}",
        "query.outputs[0]",
    ),
    (
        "cont",
        '{"mechanism":"linear","weights":{"r":TOKEN},"range":[-1,1],"truncate":true,"epsilon":0.5}',
        "query.weights.r",
    ),
    (
        "cont",
        '{"mechanism":"linear","weights":{"r":0.5},"range":[-1,TOKEN],"epsilon":0.5}',
        "query.range[1]",
    ),
    (
        "cont",
        '{"mechanism":"logistic","weights":{"r":1},"intercept":TOKEN,"epsilon":0.5}',
        "query.intercept",
    ),
    ("cont", '{"mechanism":"logistic","weights":{"r":1},"epsilon":TOKEN}', "query.epsilon"),
]


@pytest.mark.parametrize("token", NONFINITE)
@pytest.mark.parametrize(("target", "template", "field"), QUERY_NONFINITE)
@pytest.mark.parametrize("action", ["dry-run", "queries"])
def test_query_nonfinite_numbers(
    api: TestClient,
    analyst: str,
    objects: dict[str, str],
    action: str,
    target: str,
    template: str,
    field: str,
    token: str,
) -> None:
    raw = '{"query":' + template.replace("TOKEN", token) + "}"
    r = api.post(
        f"/v1/objects/{objects[target]}/{action}",
        content=raw,
        headers={**auth(analyst), "Content-Type": "application/json"},
    )
    assert_validation(r, field)


@pytest.mark.parametrize("token", NONFINITE)
@pytest.mark.parametrize(
    ("template", "field"),
    [
        ('{"domain":DOMAIN,"history":[],"budget":TOKEN,"candidate":GRR}', "budget"),
        ('{"domain":DOMAIN,"history":[],"options":{"tolerance":TOKEN}}', "options.tolerance"),
        (
            '{"domain":DOMAIN,"history":[{"query":{"mechanism":"grr","attribute":"x",'
            '"epsilon":TOKEN},"output":1}]}',
            "history[0].query.epsilon",
        ),
        (
            '{"domain":DOMAIN,"history":[{"query":GRR,"output":TOKEN}]}',
            "history[0].output",
        ),
    ],
    ids=["budget", "tolerance", "history-epsilon", "history-output"],
)
def test_loss_nonfinite_numbers(
    api: TestClient, analyst: str, template: str, field: str, token: str
) -> None:
    raw = (
        template.replace("DOMAIN", json.dumps(FINITE_DOMAIN))
        .replace("GRR", json.dumps(GRR))
        .replace("TOKEN", token)
    )
    r = api.post(
        "/v1/loss", content=raw, headers={**auth(analyst), "Content-Type": "application/json"}
    )
    assert_validation(r, field)


# ------------------------------------------------------------------------------------------------
# Registering objects: wrong types, unknown fields, out of range, huge domains, bad ids
# ------------------------------------------------------------------------------------------------
REGISTER_CASES: list[tuple[str, dict[str, Any], str]] = [
    # missing and unknown top-level fields
    ("missing-id", register_body(id=...), "id"),
    ("missing-domain", register_body(domain=...), "domain"),
    ("missing-value", register_body(value=...), "value"),
    ("missing-budget", register_body(budget=...), "budget"),
    ("unknown-field", register_body(extra=S), "extra"),
    # wrong types
    ("id-number", register_body(id=NI), "id"),
    ("id-null", register_body(id=None), "id"),
    ("id-list", register_body(id=[S]), "id"),
    ("domain-string", register_body(domain=S), "domain"),
    ("domain-list", register_body(domain=[int_attr()]), "domain"),
    ("attributes-object", register_body(domain={"attributes": {"x": S}}), "domain.attributes"),
    ("attributes-empty", register_body(domain={"attributes": []}), "domain.attributes"),
    ("attributes-missing", register_body(domain={}), "domain.attributes"),
    ("domain-unknown-key", register_body(domain={**FINITE_DOMAIN, "extra": S}), "domain.extra"),
    ("attribute-string", register_body(domain=attrs(S)), "domain.attributes[0]"),
    (
        "attribute-type-unknown",
        register_body(domain=attrs({"name": "x", "type": S, "low": 0, "high": 1})),
        "domain.attributes[0].type",
    ),
    (
        "attribute-type-number",
        register_body(domain=attrs({"name": "x", "type": NI, "low": 0, "high": 1})),
        "domain.attributes[0].type",
    ),
    (
        "attribute-name-missing",
        register_body(domain=attrs({"type": "integer", "low": 0, "high": 1})),
        "domain.attributes[0].name",
    ),
    (
        "attribute-name-number",
        register_body(domain=attrs(int_attr(name=NI))),  # type: ignore[arg-type]
        "domain.attributes[0].name",
    ),
    (
        "attribute-name-empty",
        register_body(domain=attrs(int_attr(name=""))),
        "domain.attributes[0].name",
    ),
    (
        "attribute-name-too-long",
        register_body(domain=attrs(int_attr(name=S * 100))),
        "domain.attributes[0].name",
    ),
    (
        "attribute-duplicate-name",
        register_body(domain=attrs(int_attr(), int_attr()), value={"x": 1}),
        "domain.attributes[1].name",
    ),
    (
        "attribute-unknown-key",
        register_body(domain=attrs(int_attr(extra=S)), value={"x": 1}),
        "domain.attributes[0].extra",
    ),
    ("low-string", register_body(domain=attrs(int_attr(low=S))), "domain.attributes[0].low"),
    ("low-bool", register_body(domain=attrs(int_attr(low=True))), "domain.attributes[0].low"),
    ("low-fraction", register_body(domain=attrs(int_attr(low=N))), "domain.attributes[0].low"),
    ("high-null", register_body(domain=attrs(int_attr(high=None))), "domain.attributes[0].high"),
    (
        "high-below-low",
        register_body(domain=attrs(int_attr(low=NI, high=1))),
        "domain.attributes[0].high",
    ),
    (
        "int-low-huge",
        register_body(domain=attrs(int_attr(low=-(10**400)))),
        "domain.attributes[0].low",
    ),
    (
        "int-high-beyond-2^53",
        register_body(domain=attrs(int_attr(low=2**60, high=2**60 + 1))),
        "domain.attributes[0].low",
    ),
    (
        "real-empty-interval",
        register_body(
            domain=attrs({"name": "r", "type": "real", "low": N, "high": N}), value={"r": N}
        ),
        "domain.attributes[0].high",
    ),
    (
        "real-huge-bound",
        register_body(
            domain=attrs({"name": "r", "type": "real", "low": 0, "high": 10**400}),
            value={"r": 0.5},
        ),
        "domain.attributes[0].high",
    ),
    (
        "categorical-values-missing",
        register_body(domain=attrs({"name": "c", "type": "categorical"}), value={"c": "a"}),
        "domain.attributes[0].values",
    ),
    (
        "categorical-values-empty",
        register_body(
            domain=attrs({"name": "c", "type": "categorical", "values": []}), value={"c": "a"}
        ),
        "domain.attributes[0].values",
    ),
    (
        "categorical-values-string",
        register_body(
            domain=attrs({"name": "c", "type": "categorical", "values": S}), value={"c": "a"}
        ),
        "domain.attributes[0].values",
    ),
    (
        "categorical-value-object",
        register_body(
            domain=attrs({"name": "c", "type": "categorical", "values": ["a", {"k": S}]}),
            value={"c": "a"},
        ),
        "domain.attributes[0].values[1]",
    ),
    (
        "categorical-value-bool",
        register_body(
            domain=attrs({"name": "c", "type": "categorical", "values": ["a", True]}),
            value={"c": "a"},
        ),
        "domain.attributes[0].values[1]",
    ),
    (
        "categorical-value-empty-string",
        register_body(
            domain=attrs({"name": "c", "type": "categorical", "values": ["a", ""]}),
            value={"c": "a"},
        ),
        "domain.attributes[0].values[1]",
    ),
    (
        "categorical-duplicate-values",
        register_body(
            domain=attrs({"name": "c", "type": "categorical", "values": [S, S]}),
            value={"c": S},
        ),
        "domain.attributes[0].values[1]",
    ),
    (
        "categorical-with-low-high",
        register_body(
            domain=attrs(
                {"name": "c", "type": "categorical", "values": ["a"], "low": 0, "high": 1}
            ),
            value={"c": "a"},
        ),
        "domain.attributes[0].low",
    ),
    # huge domains: more than 10**7 points
    (
        "attribute-over-10^7-values",
        register_body(domain=attrs(int_attr(low=0, high=10**7)), value={"x": 1}),
        "domain.attributes[0].high",
    ),
    (
        "product-over-10^7-points",
        register_body(
            domain=attrs(int_attr("a", 0, 9999), int_attr("b", 0, 9999), int_attr("c", 0, 9999)),
            value={"a": 1, "b": 1, "c": 1},
        ),
        "domain.attributes",
    ),
    (
        "product-just-over-10^7",
        register_body(
            domain=attrs(int_attr("a", 0, 999), int_attr("b", 0, 10000)),
            value={"a": 1, "b": 1},
        ),
        "domain.attributes",
    ),
    (
        "too-many-attributes",
        register_body(
            domain=attrs(*[int_attr(f"a{i}", 0, 0) for i in range(65)]),
            value={f"a{i}": 0 for i in range(65)},
        ),
        "domain.attributes",
    ),
    # the value
    ("value-string", register_body(value=S), "value"),
    ("value-list", register_body(value=[1, "flu"]), "value"),
    ("value-missing-attribute", register_body(value={"x": 1}), "value.disease"),
    ("value-unknown-attribute", register_body(value={**FINITE_VALUE, "zzz": S}), "value.zzz"),
    ("value-int-out-of-range", register_body(value={"x": NI, "disease": "flu"}), "value.x"),
    ("value-int-negative", register_body(value={"x": -NI, "disease": "flu"}), "value.x"),
    ("value-int-fraction", register_body(value={"x": N, "disease": "flu"}), "value.x"),
    ("value-int-string", register_body(value={"x": S, "disease": "flu"}), "value.x"),
    ("value-int-bool", register_body(value={"x": True, "disease": "flu"}), "value.x"),
    ("value-category-unknown", register_body(value={"x": 1, "disease": S}), "value.disease"),
    ("value-category-number", register_body(value={"x": 1, "disease": NI}), "value.disease"),
    (
        "value-real-out-of-range",
        register_body(domain=CONT_DOMAIN, value={"r": N, "k": 1}),
        "value.r",
    ),
    ("value-real-string", register_body(domain=CONT_DOMAIN, value={"r": S, "k": 1}), "value.r"),
    ("value-real-null", register_body(domain=CONT_DOMAIN, value={"r": None, "k": 1}), "value.r"),
    # the budget
    ("budget-number", register_body(budget=1.0), "budget"),
    ("budget-missing-epsilon", register_body(budget={}), "budget.epsilon"),
    ("budget-unknown-key", register_body(budget={"epsilon": 1, "delta": 1e-5}), "budget.delta"),
    ("budget-string", register_body(budget={"epsilon": "1.0"}), "budget.epsilon"),
    ("budget-bool", register_body(budget={"epsilon": True}), "budget.epsilon"),
    ("budget-null", register_body(budget={"epsilon": None}), "budget.epsilon"),
    ("budget-zero", register_body(budget={"epsilon": 0}), "budget.epsilon"),
    ("budget-negative", register_body(budget={"epsilon": -N}), "budget.epsilon"),
    ("budget-tiny-negative", register_body(budget={"epsilon": -1e-300}), "budget.epsilon"),
    ("budget-huge", register_body(budget={"epsilon": 1e308}), "budget.epsilon"),
    ("budget-above-max", register_body(budget={"epsilon": N}), "budget.epsilon"),
    ("budget-huge-int", register_body(budget={"epsilon": 10**400}), "budget.epsilon"),
    # the filter
    ("filter-unknown", register_body(filter=S), "filter"),
    ("filter-number", register_body(filter=NI), "filter"),
    ("filter-null", register_body(filter=None), "filter"),
    ("filter-case", register_body(filter="Bayesian"), "filter"),
]

BAD_IDS = [
    "",
    " ",
    "-leading-dash",
    ".hidden",
    "has space " + S,
    "slash/" + S,
    "../" + S,
    "back\\slash",
    "new\nline",
    "trailing-newline\n",
    "tab\t",
    "nul\x00",
    "quote'" + S,
    'dq"' + S,
    "percent%2F",
    "question?",
    "hash#",
    "unicode-é-" + S,
    "emoji-😀",
    "x" * 129,
    S + "*",
    "<script>",
]


@pytest.mark.parametrize(
    ("body", "field"),
    [(b, f) for _, b, f in REGISTER_CASES],
    ids=[name for name, _, _ in REGISTER_CASES],
)
def test_register_rejects(api: TestClient, body: dict[str, Any], field: str) -> None:
    r = api.post("/v1/objects", headers=auth(ADMIN_KEY), json=body)
    assert_validation(r, field)
    # nothing was stored
    if isinstance(body.get("id"), str):
        got = api.get(f"/v1/objects/{body['id']}", headers=auth(ADMIN_KEY))
        assert got.status_code == 404


@pytest.mark.parametrize("bad_id", BAD_IDS, ids=[ascii(i)[1:25] for i in BAD_IDS])
def test_register_rejects_bad_ids(api: TestClient, bad_id: str) -> None:
    r = api.post("/v1/objects", headers=auth(ADMIN_KEY), json=register_body(id=bad_id))
    assert_validation(r, "id")


def test_longest_id_is_fine_and_one_more_is_not(api: TestClient) -> None:
    oid = unique_id("long")
    oid = oid + "x" * (128 - len(oid))
    r = api.post("/v1/objects", headers=auth(ADMIN_KEY), json=register_body(id=oid))
    assert r.status_code == 201, r.text
    assert api.get(f"/v1/objects/{oid}", headers=auth(ADMIN_KEY)).status_code == 200
    r = api.post("/v1/objects", headers=auth(ADMIN_KEY), json=register_body(id=oid + "y"))
    assert_validation(r, "id")


def test_duplicate_id_is_409_and_keeps_the_first(api: TestClient) -> None:
    oid = unique_id("dup")
    first = register_body(id=oid, value={"x": 3, "disease": "covid"})
    assert api.post("/v1/objects", headers=auth(ADMIN_KEY), json=first).status_code == 201
    second = register_body(
        id=oid,
        domain=attrs({"name": "c", "type": "categorical", "values": [S, "b"]}),
        value={"c": S},
        budget={"epsilon": N / 1000},
    )
    r = api.post("/v1/objects", headers=auth(ADMIN_KEY), json=second)
    assert_problem(r, 409, "already-exists")
    assert S not in r.text
    assert N_TEXT not in r.text
    meta = api.get(f"/v1/objects/{oid}", headers=auth(ADMIN_KEY)).json()
    assert meta["domain"] == FINITE_DOMAIN
    assert meta["budget"] == {"epsilon": 1.0}
    # a retired id stays taken
    assert api.delete(f"/v1/objects/{oid}", headers=auth(ADMIN_KEY)).status_code == 200
    r = api.post("/v1/objects", headers=auth(ADMIN_KEY), json=first)
    assert_problem(r, 409, "already-exists")


# ------------------------------------------------------------------------------------------------
# Bad queries, on dry-run and on submit (a bad query never spends budget)
# ------------------------------------------------------------------------------------------------
def q(**changes: Any) -> dict[str, Any]:
    return with_(GRR, **changes)


QUERY_CASES: list[tuple[str, str, Any, str]] = [
    # the envelope
    ("missing-query", "finite", {"q": GRR}, "query"),
    ("extra-top-level", "finite", {"query": GRR, "extra": S}, "extra"),
    ("query-string", "finite", {"query": S}, "query"),
    ("query-list", "finite", {"query": [GRR]}, "query"),
    ("query-null", "finite", {"query": None}, "query"),
    # the mechanism
    ("mechanism-missing", "finite", {"query": q(mechanism=...)}, "query.mechanism"),
    ("mechanism-unknown", "finite", {"query": q(mechanism=S)}, "query.mechanism"),
    ("mechanism-laplace", "finite", {"query": q(mechanism="laplace")}, "query.mechanism"),
    ("mechanism-number", "finite", {"query": q(mechanism=NI)}, "query.mechanism"),
    ("mechanism-case", "finite", {"query": q(mechanism="GRR")}, "query.mechanism"),
    ("mechanism-list", "finite", {"query": q(mechanism=["grr"])}, "query.mechanism"),
    # grr
    ("grr-unknown-field", "finite", {"query": q(extra=S)}, "query.extra"),
    ("grr-attribute-unknown", "finite", {"query": q(attribute=S)}, "query.attribute"),
    ("grr-attribute-number", "finite", {"query": q(attribute=NI)}, "query.attribute"),
    ("grr-attribute-missing", "finite", {"query": q(attribute=...)}, "query.attribute"),
    ("grr-attribute-real", "cont", {"query": q(attribute="r")}, "query.attribute"),
    ("grr-epsilon-missing", "finite", {"query": q(epsilon=...)}, "query.epsilon"),
    ("grr-epsilon-string", "finite", {"query": q(epsilon="0.5")}, "query.epsilon"),
    ("grr-epsilon-bool", "finite", {"query": q(epsilon=True)}, "query.epsilon"),
    ("grr-epsilon-null", "finite", {"query": q(epsilon=None)}, "query.epsilon"),
    ("grr-epsilon-zero", "finite", {"query": q(epsilon=0)}, "query.epsilon"),
    ("grr-epsilon-negative", "finite", {"query": q(epsilon=-N)}, "query.epsilon"),
    ("grr-epsilon-huge", "finite", {"query": q(epsilon=N)}, "query.epsilon"),
    ("grr-epsilon-1e308", "finite", {"query": q(epsilon=1e308)}, "query.epsilon"),
    ("grr-epsilon-above-100", "finite", {"query": q(epsilon=100.5)}, "query.epsilon"),
    ("grr-epsilon-huge-int", "finite", {"query": q(epsilon=10**400)}, "query.epsilon"),
    ("grr-on-continuous", "cont", {"query": q(attribute="k")}, "query"),
    # binary_rr
    (
        "brr-predicate-missing",
        "finite",
        {"query": with_(BRR, predicate=...)},
        "query.predicate",
    ),
    ("brr-predicate-string", "finite", {"query": with_(BRR, predicate=S)}, "query.predicate"),
    (
        "brr-op-unknown",
        "finite",
        {"query": with_(BRR, predicate={"attribute": "x", "op": S, "value": 1})},
        "query.predicate.op",
    ),
    (
        "brr-op-list",
        "finite",
        {"query": with_(BRR, predicate={"attribute": "x", "op": ["<"], "value": 1})},
        "query.predicate.op",
    ),
    (
        "brr-attribute-unknown",
        "finite",
        {"query": with_(BRR, predicate={"attribute": S, "op": "==", "value": 1})},
        "query.predicate.attribute",
    ),
    (
        "brr-value-string-for-int",
        "finite",
        {"query": with_(BRR, predicate={"attribute": "x", "op": "==", "value": S})},
        "query.predicate.value",
    ),
    (
        "brr-order-on-categorical",
        "finite",
        {"query": with_(BRR, predicate={"attribute": "disease", "op": "<", "value": "flu"})},
        "query.predicate.op",
    ),
    (
        "brr-in-not-list",
        "finite",
        {"query": with_(BRR, predicate={"attribute": "x", "op": "in", "value": NI})},
        "query.predicate.value",
    ),
    (
        "brr-in-empty",
        "finite",
        {"query": with_(BRR, predicate={"attribute": "x", "op": "in", "value": []})},
        "query.predicate.value",
    ),
    (
        "brr-in-bad-item",
        "finite",
        {"query": with_(BRR, predicate={"attribute": "disease", "op": "in", "value": ["flu", S]})},
        "query.predicate.value[1]",
    ),
    (
        "brr-predicate-extra",
        "finite",
        {"query": with_(BRR, predicate={**BRR["predicate"], "extra": S})},
        "query.predicate.extra",
    ),
    ("brr-epsilon-negative", "finite", {"query": with_(BRR, epsilon=-1)}, "query.epsilon"),
    # unary encoding
    ("ue-variant-unknown", "finite", {"query": with_(UE, variant=S)}, "query.variant"),
    ("ue-variant-number", "finite", {"query": with_(UE, variant=NI)}, "query.variant"),
    ("ue-attribute-real", "cont", {"query": with_(UE, attribute="r")}, "query.attribute"),
    ("ue-attribute-unknown", "finite", {"query": with_(UE, attribute=S)}, "query.attribute"),
    ("ue-epsilon-zero", "finite", {"query": with_(UE, epsilon=0)}, "query.epsilon"),
    # matrix
    (
        "matrix-too-few-rows",
        "finite",
        {"query": with_(MATRIX, probabilities=[[0.5, 0.5]] * 11)},
        "query.probabilities",
    ),
    (
        "matrix-too-many-rows",
        "finite",
        {"query": with_(MATRIX, probabilities=[[0.5, 0.5]] * 13)},
        "query.probabilities",
    ),
    (
        "matrix-short-row",
        "finite",
        {"query": with_(MATRIX, probabilities=[[0.5, 0.5]] * 11 + [[1.0]])},
        "query.probabilities[11]",
    ),
    (
        "matrix-row-sum",
        "finite",
        {"query": with_(MATRIX, probabilities=[[0.5, 0.5]] * 11 + [[0.5, 0.6]])},
        "query.probabilities[11]",
    ),
    (
        "matrix-negative",
        "finite",
        {"query": with_(MATRIX, probabilities=[[1.5, -0.5]] + [[0.5, 0.5]] * 11)},
        "query.probabilities[0][1]",
    ),
    (
        "matrix-string-entry",
        "finite",
        {"query": with_(MATRIX, probabilities=[[S, 0.5]] + [[0.5, 0.5]] * 11)},
        "query.probabilities[0][0]",
    ),
    (
        "matrix-bool-entry",
        "finite",
        {"query": with_(MATRIX, probabilities=[[True, False]] + [[0.5, 0.5]] * 11)},
        "query.probabilities[0][0]",
    ),
    (
        "matrix-not-list",
        "finite",
        {"query": with_(MATRIX, probabilities=S)},
        "query.probabilities",
    ),
    (
        "matrix-partly-zero-column",
        "finite",
        {"query": with_(MATRIX, probabilities=[[1.0, 0.0]] + [[0.5, 0.5]] * 11)},
        "query.outputs[1]",
    ),
    ("matrix-outputs-empty", "finite", {"query": with_(MATRIX, outputs=[])}, "query.outputs"),
    (
        "matrix-outputs-duplicate",
        "finite",
        {"query": with_(MATRIX, outputs=[S, S])},
        "query.outputs[1]",
    ),
    (
        "matrix-outputs-object",
        "finite",
        {"query": with_(MATRIX, outputs=[{"k": S}, 1])},
        "query.outputs[0]",
    ),
    (
        "matrix-too-many-outputs",
        "finite",
        {"query": with_(MATRIX, outputs=list(range(4097)), probabilities=[])},
        "query.outputs",
    ),
    (
        "matrix-declared-epsilon-too-low",
        "finite",
        {"query": with_(MATRIX, probabilities=[[0.9, 0.1]] + [[0.1, 0.9]] * 11, epsilon=0.1)},
        "query.epsilon",
    ),
    ("matrix-on-continuous", "cont", {"query": MATRIX}, "query.mechanism"),
    # linear
    ("linear-weights-missing", "cont", {"query": with_(LINEAR, weights=...)}, "query.weights"),
    ("linear-weights-list", "cont", {"query": with_(LINEAR, weights=[S])}, "query.weights"),
    (
        "linear-weight-unknown-attribute",
        "cont",
        {"query": with_(LINEAR, weights={"zzz": 1})},
        "query.weights.zzz",
    ),
    (
        "linear-weight-categorical",
        "finite",
        {"query": with_(LINEAR, weights={"disease": 1}, truncate=True)},
        "query.weights.disease",
    ),
    (
        "linear-weight-string",
        "cont",
        {"query": with_(LINEAR, weights={"r": S})},
        "query.weights.r",
    ),
    (
        "linear-weight-huge",
        "cont",
        {"query": with_(LINEAR, weights={"r": 1e300}, truncate=True)},
        "query.weights",
    ),
    ("linear-range-missing", "cont", {"query": with_(LINEAR, range=...)}, "query.range"),
    ("linear-range-one", "cont", {"query": with_(LINEAR, range=[0])}, "query.range"),
    ("linear-range-three", "cont", {"query": with_(LINEAR, range=[0, 1, 2])}, "query.range"),
    (
        "linear-range-inverted",
        "cont",
        {"query": with_(LINEAR, range=[N, -N], truncate=True)},
        "query.range[1]",
    ),
    ("linear-range-strings", "cont", {"query": with_(LINEAR, range=[S, S])}, "query.range[0]"),
    ("linear-truncate-string", "cont", {"query": with_(LINEAR, truncate="yes")}, "query.truncate"),
    ("linear-intercept-string", "cont", {"query": with_(LINEAR, intercept=S)}, "query.intercept"),
    ("linear-epsilon-missing", "cont", {"query": with_(LINEAR, epsilon=...)}, "query.epsilon"),
    ("linear-epsilon-huge", "cont", {"query": with_(LINEAR, epsilon=N)}, "query.epsilon"),
    ("linear-unknown-field", "cont", {"query": with_(LINEAR, extra=S)}, "query.extra"),
    # logistic
    ("logistic-weights-missing", "cont", {"query": with_(LOGISTIC, weights=...)}, "query.weights"),
    (
        "logistic-weight-unknown",
        "cont",
        {"query": with_(LOGISTIC, weights={"zzz": 1})},
        "query.weights.zzz",
    ),
    ("logistic-range-given", "cont", {"query": with_(LOGISTIC, range=[0, 1])}, "query.range"),
    ("logistic-epsilon-negative", "cont", {"query": with_(LOGISTIC, epsilon=-1)}, "query.epsilon"),
    # queries that are valid elsewhere but not on these objects
    ("grr-on-missing-attribute", "cont", {"query": q(attribute="x")}, "query.attribute"),
]


@pytest.mark.parametrize("action", ["dry-run", "queries"])
@pytest.mark.parametrize(
    ("target", "body", "field"),
    [(t, b, f) for _, t, b, f in QUERY_CASES],
    ids=[name for name, _, _, _ in QUERY_CASES],
)
def test_bad_queries(
    api: TestClient,
    analyst: str,
    objects: dict[str, str],
    action: str,
    target: str,
    body: Any,
    field: str,
) -> None:
    oid = objects[target]
    r = api.post(
        f"/v1/objects/{oid}/{action}",
        headers={**auth(analyst), "Idempotency-Key": unique_id("k")},
        json=body,
    )
    assert_validation(r, field)
    odo = api.get(f"/v1/objects/{oid}/odometer", headers=auth(analyst)).json()
    assert odo["accepted"] == 0
    assert odo["realized_loss"]["upper"] == 0.0


@pytest.mark.parametrize("action", ["dry-run", "queries"])
def test_linear_query_leaving_its_range(
    api: TestClient, analyst: str, objects: dict[str, str], action: str
) -> None:
    """contract.md: rejected with 422 and the min/max the query reaches over the domain."""
    query = with_(LINEAR, weights={"r": 3.0}, intercept=0.25)
    r = api.post(
        f"/v1/objects/{objects['cont']}/{action}", headers=auth(analyst), json={"query": query}
    )
    assert_validation(r, "query.range")
    message = r.json()["errors"][0]["message"]
    assert "-2.75" in message
    assert "3.25" in message


def test_matrix_over_the_entry_limit(api: TestClient, analyst: str) -> None:
    """A matrix of a 10**6-point domain with 11 outputs has more than 10**7 entries."""
    oid = unique_id("big")
    r = api.post(
        "/v1/objects",
        headers=auth(ADMIN_KEY),
        json={
            "id": oid,
            "domain": attrs(int_attr("a", 0, 999), int_attr("b", 0, 999)),
            "value": {"a": 1, "b": 2},
            "budget": {"epsilon": 1},
        },
    )
    assert r.status_code == 201, r.text
    query = {"mechanism": "matrix", "outputs": list(range(11)), "probabilities": [[S]]}
    for action in ("dry-run", "queries"):
        r = api.post(f"/v1/objects/{oid}/{action}", headers=auth(analyst), json={"query": query})
        assert_validation(r, "query.probabilities")
    r = api.post(
        "/v1/loss",
        headers=auth(analyst),
        json={
            "domain": attrs(int_attr("a", 0, 999), int_attr("b", 0, 999)),
            "history": [{"query": query, "output": 0}],
        },
    )
    assert_validation(r, "history[0].query.probabilities")


def test_unary_encoding_with_too_many_bits(api: TestClient, analyst: str) -> None:
    oid = unique_id("wide")
    r = api.post(
        "/v1/objects",
        headers=auth(ADMIN_KEY),
        json={
            "id": oid,
            "domain": attrs(int_attr("a", 0, 5000)),
            "value": {"a": 1},
            "budget": {"epsilon": 1},
        },
    )
    assert r.status_code == 201, r.text
    query = {"mechanism": "unary_encoding", "attribute": "a", "epsilon": 1, "variant": "symmetric"}
    r = api.post(f"/v1/objects/{oid}/dry-run", headers=auth(analyst), json={"query": query})
    assert_validation(r, "query.attribute")


@pytest.mark.parametrize(
    "key",
    ["k" * 256, "x" * 10_000],
    ids=["256-chars", "10k-chars"],
)
def test_idempotency_key_too_long(
    api: TestClient, analyst: str, objects: dict[str, str], key: str
) -> None:
    r = api.post(
        f"/v1/objects/{objects['finite']}/queries",
        headers={**auth(analyst), "Idempotency-Key": key},
        json={"query": GRR},
    )
    assert_validation(r, None)
    assert key not in r.text
    assert r.json()["errors"][0]["field"].lower() == "idempotency-key"


def test_submit_to_retired_object_with_bad_query_is_4xx(api: TestClient, analyst: str) -> None:
    oid = unique_id("ret")
    assert (
        api.post("/v1/objects", headers=auth(ADMIN_KEY), json=register_body(id=oid)).status_code
        == 201
    )
    assert api.delete(f"/v1/objects/{oid}", headers=auth(ADMIN_KEY)).status_code == 200
    r = api.post(f"/v1/objects/{oid}/queries", headers=auth(analyst), json={"query": q(epsilon=S)})
    assert_problem(r, (409, 422))
    assert S not in r.text


# ------------------------------------------------------------------------------------------------
# The loss calculator
# ------------------------------------------------------------------------------------------------
def loss_body(**changes: Any) -> dict[str, Any]:
    base = {
        "domain": FINITE_DOMAIN,
        "history": [{"query": GRR, "output": 1}],
        "budget": 2.0,
        "candidate": GRR,
    }
    return with_(base, **changes)


LOSS_CASES: list[tuple[str, Any, str]] = [
    ("missing-domain", loss_body(domain=...), "domain"),
    ("missing-history", loss_body(history=...), "history"),
    ("unknown-field", loss_body(extra=S), "extra"),
    ("history-object", loss_body(history={"query": GRR}), "history"),
    ("history-item-string", loss_body(history=[S]), "history[0]"),
    ("history-item-no-output", loss_body(history=[{"query": GRR}]), "history[0].output"),
    ("history-item-no-query", loss_body(history=[{"output": 1}]), "history[0].query"),
    (
        "history-item-extra",
        loss_body(history=[{"query": GRR, "output": 1, "x": S}]),
        "history[0].x",
    ),
    (
        "history-output-out-of-range",
        loss_body(history=[{"query": GRR, "output": NI}]),
        "history[0].output",
    ),
    (
        "history-output-string",
        loss_body(history=[{"query": GRR, "output": S}]),
        "history[0].output",
    ),
    (
        "history-brr-output-2",
        loss_body(history=[{"query": BRR, "output": 2}]),
        "history[0].output",
    ),
    (
        "history-ue-output-short",
        loss_body(history=[{"query": UE, "output": [1, 0]}]),
        "history[0].output",
    ),
    (
        "history-ue-output-bits",
        loss_body(history=[{"query": UE, "output": [1, 0, NI]}]),
        "history[0].output[2]",
    ),
    (
        "history-matrix-output-unknown",
        loss_body(history=[{"query": MATRIX, "output": S}]),
        "history[0].output",
    ),
    (
        "history-bad-query",
        loss_body(history=[{"query": q(mechanism=S), "output": 1}]),
        "history[0].query.mechanism",
    ),
    ("candidate-without-budget", loss_body(budget=...), "budget"),
    ("candidate-bad", loss_body(candidate=q(epsilon=-N)), "candidate.epsilon"),
    ("candidate-string", loss_body(candidate=S), "candidate"),
    ("budget-negative", loss_body(budget=-N), "budget"),
    ("budget-huge", loss_body(budget=1e308), "budget"),
    ("budget-string", loss_body(budget=S), "budget"),
    ("options-string", loss_body(options=S), "options"),
    ("options-unknown", loss_body(options={"zzz": S}), "options.zzz"),
    ("options-tolerance-negative", loss_body(options={"tolerance": -N}), "options.tolerance"),
    ("options-tolerance-zero", loss_body(options={"tolerance": 0}), "options.tolerance"),
    ("options-time-limit-huge", loss_body(options={"time_limit": N}), "options.time_limit"),
    ("options-max-nodes-zero", loss_body(options={"max_nodes": 0}), "options.max_nodes"),
    ("options-max-nodes-huge", loss_body(options={"max_nodes": 10**12}), "options.max_nodes"),
    ("options-max-nodes-fraction", loss_body(options={"max_nodes": N}), "options.max_nodes"),
    ("options-grouping-zero", loss_body(options={"grouping": 0}), "options.grouping"),
    ("options-fast-string", loss_body(options={"fast": S}), "options.fast"),
    (
        "domain-huge",
        loss_body(domain=attrs(int_attr("a", 0, 99999), int_attr("b", 0, 999)), history=[]),
        "domain.attributes",
    ),
    (
        "continuous-grr-history",
        loss_body(
            domain=CONT_DOMAIN,
            history=[{"query": q(attribute="k"), "output": 1}],
            candidate=LINEAR,
        ),
        "history[0].query",
    ),
    (
        "continuous-linear-output",
        loss_body(
            domain=CONT_DOMAIN, history=[{"query": LINEAR, "output": 0.25}], candidate=LINEAR
        ),
        "history[0].output",
    ),
]


@pytest.mark.parametrize(
    ("body", "field"),
    [(b, f) for _, b, f in LOSS_CASES],
    ids=[name for name, _, _ in LOSS_CASES],
)
def test_loss_rejects(api: TestClient, analyst: str, body: Any, field: str) -> None:
    r = api.post("/v1/loss", headers=auth(analyst), json=body)
    assert_validation(r, field)


def test_loss_history_over_the_limit(sqlite_url: str) -> None:
    """The calculator is database-independent: one run (on SQLite) is enough."""
    item = {"query": GRR, "output": 1}
    settings = make_settings(sqlite_url)
    with TestClient(create_app(settings), raise_server_exceptions=False) as api:
        analyst = new_key(api, "analyst")
        r = api.post("/v1/loss", headers=auth(analyst), json=loss_body(history=[item] * 100_001))
    assert_validation(r, "history")


# ------------------------------------------------------------------------------------------------
# Query parameters, keys API, paths
# ------------------------------------------------------------------------------------------------
PARAM_CASES = [
    ("/v1/odometers", {"limit": 0}, "limit"),
    ("/v1/odometers", {"limit": 1001}, "limit"),
    ("/v1/odometers", {"limit": S}, "limit"),
    ("/v1/odometers", {"limit": "1.5"}, "limit"),
    ("/v1/odometers", {"offset": -1}, "offset"),
    ("/v1/odometers", {"offset": S}, "offset"),
    ("/v1/odometers", {"remaining_lt": S}, "remaining_lt"),
    ("/v1/odometers", {"remaining_gt": S}, "remaining_gt"),
    ("/v1/odometers", {"remaining_lt": "NaN"}, "remaining_lt"),
    ("/v1/odometers", {"remaining_gt": "nan"}, "remaining_gt"),
    ("/v1/odometers", {"include_retired": S}, "include_retired"),
    ("/v1/objects/{finite}/queries", {"limit": 0}, "limit"),
    ("/v1/objects/{finite}/queries", {"limit": 100_000}, "limit"),
    ("/v1/objects/{finite}/queries", {"after": -1}, "after"),
    ("/v1/objects/{finite}/queries", {"after": S}, "after"),
    ("/v1/objects/{finite}/odometer/history", {"limit": 0}, "limit"),
    ("/v1/objects/{finite}/odometer/history", {"limit": 10**6}, "limit"),
    ("/v1/objects/{finite}/odometer/history", {"after": "-5"}, "after"),
    ("/v1/objects/{finite}/odometer/history", {"after": "1e400"}, "after"),
]


@pytest.mark.parametrize(("url", "params", "field"), PARAM_CASES)
def test_bad_query_parameters(
    api: TestClient, objects: dict[str, str], url: str, params: dict[str, Any], field: str
) -> None:
    r = api.get(url.format(**objects), params=params, headers=auth(ADMIN_KEY))
    assert_validation(r, field)


KEY_CASES = [
    ({}, "role"),
    ({"role": S}, "role"),
    ({"role": "Admin"}, "role"),
    ({"role": NI}, "role"),
    ({"role": ["admin"]}, "role"),
    ({"role": None}, "role"),
    ({"role": "analyst", "label": NI}, "label"),
    ({"role": "analyst", "label": ""}, "label"),
    ({"role": "analyst", "label": S * 100}, "label"),
    ({"role": "analyst", "extra": S}, "extra"),
]


@pytest.mark.parametrize(("body", "field"), KEY_CASES)
def test_bad_key_requests(api: TestClient, body: dict[str, Any], field: str) -> None:
    r = api.post("/v1/keys", headers=auth(ADMIN_KEY), json=body)
    assert_validation(r, field)


@pytest.mark.parametrize(
    ("key_id", "status"),
    [(S, 422), ("1.5", 422), ("-1", 422), ("999999999", 404), ("0x10", 422)],
)
def test_bad_key_ids(api: TestClient, key_id: str, status: int) -> None:
    r = api.delete(f"/v1/keys/{key_id}", headers=auth(ADMIN_KEY))
    assert_problem(r, status)
    assert S not in r.text


@pytest.mark.parametrize(
    ("method", "url"),
    [
        ("GET", "/v1/objects/{id}"),
        ("DELETE", "/v1/objects/{id}"),
        ("POST", "/v1/objects/{id}/dry-run"),
        ("POST", "/v1/objects/{id}/queries"),
        ("GET", "/v1/objects/{id}/queries"),
        ("GET", "/v1/objects/{id}/odometer"),
        ("GET", "/v1/objects/{id}/odometer/history"),
    ],
)
@pytest.mark.parametrize(
    "object_id",
    ["%00", "a%00b", "%FF", "x" * 300, "%20", "%0A"],
    ids=["nul", "inner-nul", "latin1", "300-chars", "space", "newline"],
)
def test_odd_object_ids_in_paths_are_404(
    api: TestClient, analyst: str, method: str, url: str, object_id: str
) -> None:
    r = api.request(method, url.format(id=object_id), headers=auth(ADMIN_KEY), json={"query": GRR})
    assert_problem(r, 404, "not-found")


@pytest.mark.parametrize(
    ("url", "params"),
    [
        ("/v1/objects/{finite}/queries", {"after": 2**31}),
        ("/v1/objects/{finite}/queries", {"after": 2**63}),
        ("/v1/objects/{finite}/queries", {"after": 10**23}),
        ("/v1/objects/{finite}/odometer/history", {"after": 2**31}),
        ("/v1/objects/{finite}/odometer/history", {"after": 10**23}),
        ("/v1/odometers", {"offset": 2**31}),
        ("/v1/odometers", {"offset": 2**63}),
        ("/v1/odometers", {"offset": 10**23}),
    ],
    ids=lambda v: v if isinstance(v, str) else "-".join(f"{k}={x}" for k, x in v.items()),
)
def test_huge_integers_in_query_parameters(
    api: TestClient, objects: dict[str, str], url: str, params: dict[str, int]
) -> None:
    """Past the end of the data: an empty page (or a 422 naming the parameter), never a 500."""
    r = api.get(url.format(**objects), params=params, headers=auth(ADMIN_KEY))
    if r.status_code == 200:
        body = r.json()
        assert body.get("items", body.get("points")) == []
    else:
        assert_validation(r, next(iter(params)))


@pytest.mark.parametrize("key_id", [2**31, 2**63, 10**23])
def test_huge_key_ids(api: TestClient, key_id: int) -> None:
    r = api.delete(f"/v1/keys/{key_id}", headers=auth(ADMIN_KEY))
    assert_problem(r, (404, 422))


def test_nul_in_a_key_label(api: TestClient) -> None:
    r = api.post("/v1/keys", headers=auth(ADMIN_KEY), json={"role": "viewer", "label": "a\u0000b"})
    if r.status_code != 201:
        assert_validation(r, "label")


@pytest.mark.parametrize(
    "path",
    [
        "/v1/objects/" + "x" * 5000,
        "/v1/objects/..%2F..%2Fetc",
        "/v1/objects/%E9",
        "/v1/nope",
        "/v1/objects/a/b/c/d",
    ],
)
def test_unknown_paths_are_404_problems(api: TestClient, path: str) -> None:
    r = api.get(path, headers=auth(ADMIN_KEY))
    assert_problem(r, 404)


@pytest.mark.parametrize(
    ("method", "url"),
    [
        ("PUT", "/v1/objects/{finite}"),
        ("PATCH", "/v1/objects/{finite}"),
        ("GET", "/v1/loss"),
        ("DELETE", "/v1/odometers"),
        ("GET", "/v1/objects/{finite}/dry-run"),
        ("PUT", "/v1/keys"),
    ],
)
def test_wrong_methods_are_405_problems(
    api: TestClient, objects: dict[str, str], method: str, url: str
) -> None:
    r = api.request(method, url.format(**objects), headers=auth(ADMIN_KEY))
    assert_problem(r, 405)


# ------------------------------------------------------------------------------------------------
# Body size limit (413)
# ------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def small_client(database_url: str) -> Iterator[TestClient]:
    """The app on the same database with the smallest body limit (1 KiB)."""
    settings = make_settings(database_url, max_body_bytes=1024)
    with TestClient(create_app(settings), raise_server_exceptions=False) as c:
        yield c


def _big_register(size: int) -> bytes:
    body = register_body()
    body["domain"] = {
        "attributes": [int_attr(), {"name": "pad", "type": "categorical", "values": []}]
    }
    pad = size // 10
    body["domain"]["attributes"][1]["values"] = [f"v{i:05d}" for i in range(pad)]
    body["value"] = {"x": 1, "pad": "v00000"}
    return json.dumps(body).encode()


@pytest.mark.parametrize(
    "endpoint",
    ["/v1/objects", "/v1/objects/{finite}/dry-run", "/v1/objects/{finite}/queries", "/v1/loss"],
)
def test_body_over_the_limit_is_413(
    small_client: TestClient, objects: dict[str, str], endpoint: str
) -> None:
    raw = _big_register(4096)
    assert len(raw) > 1024
    r = small_client.post(
        endpoint.format(**objects),
        content=raw,
        headers={**auth(ADMIN_KEY), "Content-Type": "application/json"},
    )
    assert_problem(r, 413, "payload-too-large")


def test_body_just_under_the_limit_is_accepted(small_client: TestClient) -> None:
    body = json.dumps(register_body()).encode()
    assert len(body) <= 1024
    r = small_client.post(
        "/v1/objects", content=body, headers={**auth(ADMIN_KEY), "Content-Type": "application/json"}
    )
    assert r.status_code == 201, r.text


def test_chunked_body_over_the_limit_is_413(
    small_client: TestClient, objects: dict[str, str]
) -> None:
    """Without a Content-Length header (chunked transfer) the limit still holds."""
    raw = _big_register(64 * 1024)

    def chunks() -> Iterator[bytes]:
        for i in range(0, len(raw), 512):
            yield raw[i : i + 512]

    r = small_client.post(
        "/v1/objects",
        content=chunks(),
        headers={**auth(ADMIN_KEY), "Content-Type": "application/json"},
    )
    assert_problem(r, 413, "payload-too-large")


@pytest.mark.parametrize("length", ["abc", "-1", "1e9", "99999999999999999999"])
def test_bad_content_length_is_4xx(small_client: TestClient, length: str) -> None:
    r = small_client.post(
        "/v1/objects",
        content=b"{}",
        headers={**auth(ADMIN_KEY), "Content-Type": "application/json", "Content-Length": length},
    )
    assert 400 <= r.status_code < 500, r.text


def test_default_limit_is_16_mib(api: TestClient) -> None:
    raw = b'{"pad": "' + b"x" * (16 * 1024 * 1024) + b'"}'
    r = api.post(
        "/v1/loss", content=raw, headers={**auth(ADMIN_KEY), "Content-Type": "application/json"}
    )
    assert_problem(r, 413, "payload-too-large")


# ------------------------------------------------------------------------------------------------
# Regressions found by schemathesis (tests/service/test_schemathesis.py)
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("bad_filter", [["bayesian"], {"kind": "basic"}, 1, None])
def test_filter_of_the_wrong_type_is_422(api: TestClient, bad_filter: Any) -> None:
    """A list or object as ``filter`` was a TypeError (unhashable) and a 500; now 422 naming it."""
    body = {
        "id": unique_id("flt"),
        "domain": FINITE_DOMAIN,
        "value": FINITE_VALUE,
        "budget": {"epsilon": 1.0},
        "filter": bad_filter,
    }
    r = api.post("/v1/objects", json=body, headers=auth(ADMIN_KEY))
    assert_validation(r, "filter")


@pytest.mark.parametrize("object_id", ["\x00", "a\x00b", "x" * 300, " lead"])
def test_audit_object_id_filter_is_validated(api: TestClient, object_id: str) -> None:
    """``/v1/audit?object_id=%00`` reached PostgreSQL (which refuses NUL in text): a 500. An id
    that cannot have been registered is now a 422 naming the parameter, on every backend."""
    r = api.get("/v1/audit", params={"object_id": object_id}, headers=auth(ADMIN_KEY))
    assert_validation(r, "object_id")


@pytest.mark.parametrize("after", [2**31, 2**62, -1])
def test_audit_after_outside_the_id_range_is_422(api: TestClient, after: int) -> None:
    """``/v1/audit?after=2**31`` (allowed up to 2**62) overflowed PostgreSQL's 32-bit id
    column: a 500 that schemathesis found. ``after`` is now limited to the column's range."""
    r = api.get("/v1/audit", params={"after": after}, headers=auth(ADMIN_KEY))
    assert_validation(r, "after")


def test_audit_after_at_the_top_of_the_id_range_is_an_empty_page(api: TestClient) -> None:
    """The largest 32-bit id is accepted: no event has a larger id."""
    r = api.get("/v1/audit", params={"after": 2**31 - 1}, headers=auth(ADMIN_KEY))
    assert r.status_code == 200, r.text
    assert r.json()["events"] == []


def test_unknown_calculator_field_is_422_even_when_cached(api: TestClient, analyst: str) -> None:
    """The calculator's cache key ignored unknown fields, so a request equal to a cached one
    plus an unknown field got the cached 200 instead of the 422 an uncached one gets."""
    body = {
        "domain": FINITE_DOMAIN,
        "history": [{"query": GRR, "output": 1}],
        "budget": 2.0,
        "candidate": GRR,
    }
    first = api.post("/v1/loss", json=body, headers=auth(analyst))
    assert first.status_code == 200, first.text
    r = api.post("/v1/loss", json={**body, "extra": S}, headers=auth(analyst))
    assert_validation(r, "extra")
    item = {"query": GRR, "output": 1, "note": S}
    r = api.post("/v1/loss", json={**body, "history": [item]}, headers=auth(analyst))
    assert_validation(r, "history[0].note")
