"""A survey names each new exact state by a per-domain hasher: the same keys (issue 27 item 3)."""

from __future__ import annotations

import random
from fractions import Fraction

import numpy as np

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


def test_a_group_form_is_handed_its_canonical_bytes_only_when_its_key_proves_them() -> None:
    """A survey cuts a group form's templates from its canonical bytes when its stored exact
    part is ``to_bytes``'s with the groups in ε order (``_hand_canonical``): the candidate (the
    shape, then the stored part) is kept only when its content key is the state's key. An
    older writer's spacing, groups out of ε order, a pending entry folded on or a key that is
    not the content key: nothing handed (the template is written as before)."""
    import json

    from app.engine.domain import parse_domain
    from app.engine.exact import MAGIC, ExactTerm, canonical_json
    from app.engine.likelihood import LikelihoodState
    from app.engine.limits import EngineLimits
    from app.engine.mechanisms import parse_query
    from app.services import survey_runs
    from app.services.snapshots import state_key
    from app.services.survey_groups import group_snapshot
    from app.store.surveys import GroupKey

    domain_json = {
        "attributes": [
            {"name": "age", "type": "integer", "low": 0, "high": 9},
            {"name": "region", "type": "categorical", "values": ["a", "b", "c"]},
        ]
    }
    text = json.dumps(domain_json)
    limits = EngineLimits()
    domain = parse_domain(domain_json, limits=limits)
    query = {"mechanism": "grr", "attribute": "age", "epsilon": 0.5}

    def history(*steps: tuple[str, object, float]) -> LikelihoodState:
        state = LikelihoodState(domain)
        for attribute, output, epsilon in steps:
            mech = parse_query(
                {"mechanism": "grr", "attribute": attribute, "epsilon": epsilon},
                domain,
                limits=limits,
            )
            state = state.applied(mech.term(mech.parse_output(output, "o")))
        return state

    def handed(
        data: bytes, err: float, *, key: str | None = None, pending: int = 0
    ) -> bytes | None:
        cache = survey_runs.new_run_cache(query, limits)
        form = LikelihoodState.from_bytes(domain, data, err).exact
        assert form is not None
        state_hash = key or canonical_content_key(text, form.canonical_bytes())
        cache.parsed.states[state_hash] = (data, err)
        group = GroupKey(
            text, 4.0, "bayesian", "3/2", None, state_hash, 0, 1.0, 1.0, None, "0", None, None, 0, 0
        )
        snapshot = group_snapshot(None, group, ("o1", 1, 0), cache.parsed)  # type: ignore[arg-type]
        if pending:  # as if the snapshot had folded pending entries on the stored state
            group = group._replace(state_pending=pending)
        survey_runs._hand_canonical(group, snapshot, cache)
        found = snapshot.state
        assert isinstance(found, LikelihoodState)
        assert found.exact is not None
        canonical = found.exact.kept.canonical
        # whatever was handed, the next state's name is the one with_term's form has
        for axis, size in enumerate(domain.shape):
            for group_of in found.exact.groups:
                coeff = np.zeros(size, dtype=np.int64)
                coeff[size - 1] = 1
                term = ExactTerm(axis, group_of, coeff)
                assert found.exact.canonical_after(term) == (
                    found.exact.with_term(term).canonical_bytes()
                )
        return canonical

    state = history(("age", 3, 0.5), ("region", "b", 0.5), ("age", 7, 0.5))
    assert state.exact is not None
    data = state.to_bytes()
    assert handed(data, state.err) == canonical_json(state.exact)
    array, _, stored = data.partition(MAGIC)
    spaced = array + MAGIC + json.dumps(json.loads(stored)).encode()  # an older writer's
    assert spaced != data
    assert handed(spaced, state.err) is None
    assert handed(data, state.err, pending=1) is None
    assert handed(data, state.err, key=state_key(text, "h")) is None
    # two ε's, stored in the history's order (1/2 before 1/4: not the ε order)
    mixed = history(("age", 3, 0.5), ("region", "b", 0.25), ("age", 7, 0.25))
    assert mixed.exact is not None
    assert [g.epsilon for g in mixed.exact.groups] == [Fraction(1, 2), Fraction(1, 4)]
    assert handed(mixed.to_bytes(), mixed.err) is None
    ordered = history(("age", 3, 0.25), ("region", "b", 0.5), ("age", 7, 0.5))
    assert ordered.exact is not None
    assert handed(ordered.to_bytes(), ordered.err) == canonical_json(ordered.exact)
