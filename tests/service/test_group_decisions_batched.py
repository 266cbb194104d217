"""A chunk's decision groups decided together equal each group decided alone.

A survey chunk decides the decision groups new to its run in one engine call per domain
(``survey_runs._decide_groups``: snapshots built as ``decide_group`` builds them, decided by
``decide_snapshots`` — ``evaluate_many``, the filter code of ``evaluate``). Here, on random
finite group keys — stored arrays of ``grr``, ``binary_rr`` and ``olh`` histories (some without
an exact form), every filter, budgets at ties (the worst output's exact loss after the query,
basic composition's sum) and a hair around them, lifetime budgets likewise, δ_g for the
approximate filter, and a domain the query does not parse for — every group's decision must be
the one ``decide_group`` gives it: accepted or refused, and why, with the same realized loss,
worst case and exact charge.
"""

from __future__ import annotations

import json
import random
from fractions import Fraction
from typing import Any, cast

import pytest

from app.engine.domain import parse_domain
from app.engine.filters import FilterKind
from app.engine.likelihood import LikelihoodState, exact_bounds
from app.engine.limits import EngineLimits
from app.engine.mechanisms import parse_query
from app.services import survey_runs
from app.services.survey_groups import GroupAccepted, ParsedQuery, Refusal, decide_group
from app.store import Tx
from app.store.surveys import GroupKey, MemberRow
from app.worker.pool import BoundWorker

DOMAIN = {
    "attributes": [
        {"name": "v", "type": "integer", "low": 0, "high": 4},
        {"name": "w", "type": "integer", "low": 0, "high": 2},
    ]
}
#: ``grr`` on ``v`` refuses this domain (no attribute ``v``): the group is refused as invalid.
OTHER = {"attributes": [{"name": "x", "type": "integer", "low": 0, "high": 3}]}
QUERY = {"mechanism": "grr", "attribute": "v", "epsilon": 0.5}
HISTORY = [
    {"mechanism": "grr", "attribute": "v", "epsilon": 0.5},
    {"mechanism": "grr", "attribute": "w", "epsilon": 0.25},
    {
        "mechanism": "binary_rr",
        "predicate": {"attribute": "v", "op": ">=", "value": 2},
        "epsilon": 1.0,
    },
    {"mechanism": "olh", "attribute": "v", "epsilon": 0.5},
]


def _keys(rng: random.Random, parsed: ParsedQuery, count: int) -> list[GroupKey]:
    text = json.dumps(DOMAIN)
    domain = parse_domain(DOMAIN)
    candidate = parse_query(QUERY, domain)
    query = candidate.exact_query()
    assert query is not None
    keys = []
    for n in range(count):
        state = LikelihoodState(domain)
        basic = Fraction(0)
        for _ in range(rng.randint(0, 6)):
            mech = parse_query(rng.choice(HISTORY), domain)
            state.apply(mech.term(mech.sample({"v": rng.randrange(5), "w": rng.randrange(3)})))
            basic += mech.epsilon_exact
        if rng.random() < 0.15:
            state.exact = None
        state_hash = None
        if basic:
            state_hash = f"state-{n}"
            parsed.states[state_hash] = (state.to_bytes(), state.err)
        after = float(basic + candidate.epsilon_exact)
        options = [0.5, 1.0, 2.0, 3.0, after, after - 1e-12, after + 1e-9]
        if state.exact is not None:
            worst = float(max(state.exact.candidate_losses(query)))
            options += [worst, worst - 1e-12, worst + 1e-12, worst - 1e-9]
        budget = max(0.05, rng.choice(options))
        kind = rng.choice(list(FilterKind))
        loss = state.loss()
        lifetime: tuple[float | None, str | None, float, float] = (None, None, 0.0, 0.0)
        if rng.random() < 0.4:  # closed versions' losses, exact or bounds only
            closed = Fraction(rng.randrange(0, 5), 4)
            exact_closed = str(closed) if rng.random() < 0.7 else None
            room = rng.choice([budget + float(closed), budget + float(closed) - 1e-12, 10.0])
            lifetime = (max(0.05, room), exact_closed, float(closed), float(closed) + 0.01)
        keys.append(
            GroupKey(
                text if rng.random() < 0.95 else json.dumps(OTHER),
                budget,
                kind.value,
                str(basic),
                None,
                state_hash,
                0,
                loss.lower,
                loss.upper,
                rng.choice([1e-6, 0.1]) if kind is FilterKind.APPROX_BAYESIAN else None,
                "0",
                *lifetime,
            )
        )
    return keys


def _member(n: int, key: GroupKey) -> MemberRow:
    return MemberRow(f"m{n}", 1, 0, 0, False, "", key)


def _decided_together(
    rng: random.Random,
) -> tuple[ParsedQuery, list[GroupKey], survey_runs.RunCache]:
    """300 random groups (one member each) decided together, as a survey's chunk does."""
    parsed = ParsedQuery(EngineLimits(), QUERY)
    keys = _keys(rng, parsed, 300)
    by_group = {key: [_member(n, key)] for n, key in enumerate(keys)}
    cache = survey_runs.RunCache(parsed)
    conn, worker = cast(Tx, None), cast(BoundWorker, None)  # finite arrays: neither is read
    survey_runs._decide_groups(conn, by_group, cache, worker)
    return parsed, keys, cache


@pytest.mark.parametrize("seed", range(4))
def test_groups_decided_together_decide_as_each_alone(seed: int) -> None:
    rng = random.Random(900 + seed)
    parsed, keys, cache = _decided_together(rng)
    conn, worker = cast(Tx, None), cast(BoundWorker, None)  # finite arrays: neither is read
    counted = {"accepted": 0, "budget": 0, "lifetime": 0, "invalid": 0}
    for n, key in enumerate(keys):
        got = cache.decisions[key]
        want = decide_group(conn, key, (f"m{n}", 1, 0), parsed, worker)
        if isinstance(want, Refusal):
            assert got == want, key
            counted[
                {"budget-exhausted": "budget", "lifetime-exhausted": "lifetime"}.get(
                    want.value, "invalid"
                )
            ] += 1
            continue
        assert isinstance(got, GroupAccepted), (key, got)
        counted["accepted"] += 1
        a, b = got.decision, want.decision
        assert (a.accepted, a.reason, a.refusal, a.phase) == (
            b.accepted,
            b.reason,
            b.refusal,
            b.phase,
        )
        assert a.realized_loss == b.realized_loss
        assert a.realized_loss.value == b.realized_loss.value
        assert a.worst_case_after == b.worst_case_after
        assert a.candidate.exact_worst == b.candidate.exact_worst
        assert a.candidate.exact_charged == b.candidate.exact_charged
        assert _same_snapshot(got, want), key
    # every outcome seen: accepted, refused by the budget, by the lifetime, invalid
    assert all(counted.values()), counted


def _same_snapshot(got: GroupAccepted, want: GroupAccepted) -> bool:
    """The snapshots' public fields and their arrays' stored bytes are equal."""
    a: Any = got.snapshot
    b: Any = want.snapshot
    return (
        a.budget == b.budget
        and a.filter == b.filter
        and a.basic_total == b.basic_total
        and a.f0_account == b.f0_account
        and a.lifetime == b.lifetime
        and a.state.to_bytes() == b.state.to_bytes()
    )


@pytest.mark.parametrize("seed", range(3))
def test_losses_ahead_equal_each_output_alone(seed: int) -> None:
    """The exact loss after each (group, output), read from what each history keeps.

    Kept as its bounds (``exact_bounds``, the exact value among them). A group's losses after
    every output are computed once per run (or kept by its decision, ``evaluate_many``'s exact
    candidates) and read by each chunk that draws an output of it
    (``survey_runs._losses_ahead``): each must be ``with_term(...).loss()`` of that output, in
    the first chunk meeting the group (which learns every output's) and in a later one, whether
    the group was decided by basic composition (nothing kept) or by its exact candidates.
    """
    rng = random.Random(950 + seed)
    _, keys, cache = _decided_together(rng)
    numbered: dict[int, GroupAccepted] = {}  # a key drawn twice is one group
    domains: dict[int, str] = {}  # each group's domain text (_losses_ahead is per domain)
    for key in keys:
        group = cache.decisions[key]
        state = group.snapshot.state if isinstance(group, GroupAccepted) else None
        if isinstance(state, LikelihoodState) and state.exact is not None:
            numbered[cache.number(key)] = group  # type: ignore[assignment]
            domains[cache.number(key)] = key.domain
    accepted = list(numbered.items())
    assert len(accepted) > 20
    mech = accepted[0][1].mech
    query = mech.exact_query()
    assert query is not None
    kept = sum(query.key in g.snapshot.state.exact._moved_units for _, g in accepted)  # type: ignore[union-attr]
    assert 0 < kept < len(accepted)  # some decided by their exact candidates, some not
    outputs = list(range(5))
    firsts = [rng.sample(outputs, rng.randint(1, 3)) for _ in accepted]
    drawn_first = list(zip(accepted, firsts, strict=True))
    for domain in set(domains.values()):  # as _decide_rows: one call per domain
        survey_runs._losses_ahead(
            domain, [(n, g, drawn) for (n, g), drawn in drawn_first if domains[n] == domain], cache
        )
    for n, _ in accepted:  # the first chunk meeting a group knows every output's loss
        assert cache.after[n].complete
        assert sorted(cache.after[n].losses) == outputs
    for domain in set(domains.values()):
        survey_runs._losses_ahead(
            domain, [(n, g, outputs) for n, g in accepted if domains[n] == domain], cache
        )
    for n, group in accepted:
        exact = group.snapshot.state.exact  # type: ignore[union-attr]
        losses = cache.after[n].losses
        for y in outputs:
            want = exact.with_term(mech.exact_term(y))  # type: ignore[union-attr,arg-type]
            # kept as its bounds (the only use of the loss), the exact value among them
            assert losses[y] == exact_bounds(want.loss()), (n, y)
            assert losses[y].value == want.loss(), (n, y)


@pytest.mark.parametrize("seed", range(3))
def test_grouped_is_a_dict_of_lists_in_first_seen_order(seed: int) -> None:
    """``survey_runs._grouped`` (one ``setdefault`` per value) equals its definition.

    Its definition: a dict, keys in the order first met, each holding its values in order (the
    order a chunk's members are then sampled and answered in); no entry for a key never met.
    Keys are ``GroupKey`` s of a chunk's shape: many distinct, some repeated, equal but not
    identical objects.
    """
    rng = random.Random(seed)
    keys = [
        GroupKey(
            *("d", 4.0, "bayes", "1/2", None, f"s{rng.randrange(40)}", 0, 0.5, 0.6),
            *(None, "0", None, None, 0.0, 0.0),
        )
        for _ in range(300)
    ]
    pairs = [(GroupKey(*key), n) for n, key in enumerate(keys)]  # equal, not identical
    expected: dict[GroupKey, list[int]] = {}
    for key, value in pairs:
        if key not in expected:
            expected[key] = []
        expected[key].append(value)
    found = survey_runs._grouped(iter(pairs))
    assert type(found) is dict
    assert list(found.items()) == list(expected.items())
    assert survey_runs._grouped([]) == {}
