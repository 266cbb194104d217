"""A survey names each new exact state by a per-domain hasher: the same keys (issue 27 item 3)."""

from __future__ import annotations

import random

from app.services.snapshots import canonical_content_key, canonical_content_keys


def test_the_per_domain_content_key_is_the_content_key() -> None:
    rng = random.Random(5)
    for n in range(200):
        domain = '{"attributes":[' + "x" * rng.randrange(400) + f"{n}]}}"
        keyed = canonical_content_keys(domain)
        for _ in range(5):
            canonical = bytes(rng.randrange(256) for _ in range(rng.randrange(300)))
            assert keyed(canonical) == canonical_content_key(domain, canonical)
    # a domain's key function never depends on an earlier call's bytes
    keyed = canonical_content_keys("d")
    assert keyed(b"a") == canonical_content_key("d", b"a")
    assert keyed(b"") == canonical_content_key("d", b"")
    assert keyed(b"a") != keyed(b"b")


def test_a_group_snapshot_neither_reads_nor_keeps_the_process_forms() -> None:
    """A survey decodes each group's stored state once per run: its exact form is parsed (the
    same form as the process cache's) and not kept in :data:`EXACT_FORMS`."""
    import json

    from app.engine.domain import parse_domain
    from app.engine.likelihood import LikelihoodState
    from app.engine.limits import EngineLimits
    from app.engine.mechanisms import parse_query
    from app.services.snapshots import EXACT_FORMS
    from app.services.survey_groups import ParsedQuery, group_snapshot
    from app.store.surveys import GroupKey

    domain_json = {
        "attributes": [
            {"name": "age", "type": "integer", "low": 0, "high": 9},
            {"name": "region", "type": "categorical", "values": ["a", "b", "c"]},
        ]
    }
    limits = EngineLimits()
    domain = parse_domain(domain_json, limits=limits)
    state = LikelihoodState(domain)
    for attribute, output in (("age", 3), ("region", "b"), ("age", 7)):
        mech = parse_query(
            {"mechanism": "grr", "attribute": attribute, "epsilon": 0.5}, domain, limits=limits
        )
        state = state.applied(mech.term(mech.parse_output(output, "o")))
    data = state.to_bytes()
    parsed = ParsedQuery(limits, {"mechanism": "grr", "attribute": "age", "epsilon": 0.5})
    parsed.states["s"] = (data, state.err)
    text = json.dumps(domain_json)
    key = GroupKey(
        text, 4.0, "bayesian", "3/2", None, "s", 0, 1.0, 1.0, None, "0", None, None, 0, 0
    )
    EXACT_FORMS.clear()
    before = (EXACT_FORMS.hits, EXACT_FORMS.misses)
    snapshot = group_snapshot(None, key, ("o1", 1, 0), parsed)  # type: ignore[arg-type]
    assert (EXACT_FORMS.hits, EXACT_FORMS.misses) == before
    tail = data[8 * 30 :]
    assert tail.startswith(b"\x00EXACT2\x00")
    assert EXACT_FORMS.get(domain.shape, tail[8:]) is None
    found = snapshot.state
    assert isinstance(found, LikelihoodState)
    assert found.exact is not None
    assert state.exact is not None
    assert found.exact.canonical_bytes() == state.exact.canonical_bytes()
    assert found.to_bytes() == data
    assert found.exact.loss() == state.exact.loss()
