"""A bulk import validates each distinct domain once (issue 27: the import's CPU).

Every line of an import usually writes the same domain, and validating it by the
``RegisterRequest`` model was about half of an item's validation (docs/benchmarks.md,
"Sixteenth session, the import"). The request's :class:`DomainCache` keeps each validated
domain by the ``repr`` of its JSON; these tests hold that nothing else changes: a refused domain
is refused on every line that writes it, the model's rules between fields still see the domain,
and the JSON and NDJSON bodies refuse alike.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from app.api.routes.imports import parse_import
from app.engine.errors import InvalidInput
from app.engine.limits import DEFAULT_LIMITS
from app.services.bodies import validated
from app.services.imports import parse_items
from app.services.objects import DomainCache
from app.services.schemas import RegisterRequest

FINITE = {"attributes": [{"name": "x", "type": "integer", "low": 0, "high": 3}]}
REAL = {"attributes": [{"name": "r", "type": "real", "low": 0, "high": 1}]}
BAD = {"attributes": [{"name": "x", "type": "integer", "low": 0, "high": "3"}]}


def item(oid: str, domain: dict[str, Any] = FINITE, **extra: Any) -> dict[str, Any]:
    value = {"r": 0.5} if domain is REAL else {"x": 1}
    body = {"id": oid, "domain": domain, "value": value, "budget": {"epsilon": 1.0}, **extra}
    return copy.deepcopy(body)  # each line decoded on its own: equal, never the same dict


def test_a_repeated_domain_is_validated_once_per_request() -> None:
    cache = DomainCache()
    first, second = (validated(RegisterRequest, item(oid), "", cache.context) for oid in ("a", "b"))
    assert first.domain is second.domain
    assert len(cache.models) == 1
    # the same domain with its keys in another order is other JSON: validated on its own
    reordered = {"attributes": [dict(reversed(FINITE["attributes"][0].items()))]}
    third = validated(RegisterRequest, item("c", reordered), "", cache.context)
    assert third.domain == first.domain
    assert third.domain is not first.domain
    assert len(cache.models) == 2
    # without a context (one registration) nothing is kept
    alone = (validated(RegisterRequest, item(oid)) for oid in ("d", "e"))
    assert next(alone).domain is not next(alone).domain


def test_a_refused_domain_is_refused_on_every_line() -> None:
    cache = DomainCache()
    messages = []
    for oid in ("a", "b"):
        with pytest.raises(InvalidInput) as caught:
            validated(RegisterRequest, item(oid, BAD), f"objects[{oid}]", cache.context)
        messages.append((caught.value.field, caught.value.message))
    assert messages[0][0] == "objects[a].domain.attributes[0].high"
    assert messages[1] == ("objects[b].domain.attributes[0].high", messages[0][1])
    assert cache.models == {}


def test_the_rules_between_fields_see_a_kept_domain() -> None:
    approx = {"filter": "approx_bayesian", "budget": {"epsilon": 1.0, "delta": 1e-6}}
    items = [item("a", REAL), {**item("b", REAL), **approx}]
    with pytest.raises(InvalidInput) as caught:
        parse_items(items, DEFAULT_LIMITS)
    assert caught.value.field == "objects[1].filter"
    assert "finite" in caught.value.message


@pytest.mark.parametrize(
    "items",
    [
        [item("a"), item("b"), item("c", BAD)],
        [
            item("a", REAL),
            item("b", REAL, filter="approx_bayesian", budget={"epsilon": 1.0, "delta": 1e-6}),
        ],
        [item("a"), item("b", value={"x": 9})],
    ],
    ids=["refused-domain-after-kept-one", "rule-between-fields", "value-outside-kept-domain"],
)
def test_json_and_ndjson_bodies_refuse_alike(items: list[dict[str, Any]]) -> None:
    document = json.dumps({"objects": items}).encode()
    lines = "\n".join(json.dumps(i) for i in items).encode()
    refusals = []
    for raw, kind in ((document, "application/json"), (lines, "application/x-ndjson")):
        with pytest.raises(InvalidInput) as caught:
            parse_import(raw, kind, DEFAULT_LIMITS)
        refusals.append((caught.value.field, caught.value.message))
    assert refusals[0] == refusals[1]
    assert refusals[0][0].startswith(f"objects[{len(items) - 1}]")


def test_an_import_reads_as_its_items_one_by_one() -> None:
    items = [item("a"), item("b", REAL), item("c"), item("d", labels={"k": "v"})]
    together = parse_items(items, DEFAULT_LIMITS)
    apart = [parse_items([i], DEFAULT_LIMITS)[0] for i in items]
    assert together == apart


def test_the_engine_parses_each_kept_domain_once() -> None:
    """The engine's parse is kept by the validated model: the items sharing it parse once; a
    model of an item's own (no context, or the same domain written in another key order) is
    parsed on its own, to the same stored text."""
    from app.services.imports import registrations

    reordered = {"attributes": [dict(reversed(FINITE["attributes"][0].items()))]}
    cache = DomainCache()
    requests = [
        validated(RegisterRequest, body, "", cache.context)
        for body in (item("a"), item("b"), item("c", REAL), item("d"), item("e", reordered))
    ]
    found = registrations(requests, DEFAULT_LIMITS, domains=cache)
    assert len(cache.models) == 3
    assert len(cache.parsed) == 3
    assert [r.domain_text for r in found] == [
        r.domain_text
        for r in parse_items(
            [
                item(r.id, d)
                for r, d in zip(found, (FINITE, FINITE, REAL, FINITE, reordered), strict=True)
            ],
            DEFAULT_LIMITS,
        )
    ]
    assert found[0].domain_text == found[4].domain_text  # the same domain, stored alike
    # validated without the context: a model per item, each parsed (the cache only grows)
    alone = [validated(RegisterRequest, item(oid)) for oid in ("f", "g")]
    registrations(alone, DEFAULT_LIMITS, domains=cache)
    assert len(cache.parsed) == 5
