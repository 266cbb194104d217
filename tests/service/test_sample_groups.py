"""A chunk's sampling bookkeeping (``survey_runs._sample_groups``), against its plain statement.

Each domain's accepted members are sampled by one ``sample_many`` call, with their values in
the chunk's order (whatever their groups: a replayed stream draws the same per member), and
each group's members come back by the output drawn for them, in the chunk's order. Checked on
chunks of one domain (its own path) and of several interleaved, with members of no accepted
group (refused, retired) left out.
"""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from app.services import survey_runs
from app.services.survey_groups import GroupAccepted
from app.store.surveys import GroupKey, MemberRow


class _Plain:
    """A cipher whose stored values are their plaintexts (only ``decrypt_many`` is read)."""

    def decrypt_many(self, stored: list[str]) -> list[str]:
        return list(stored)


class _Drawn:
    """A mechanism drawing from a seeded stream, recording the values of each call."""

    def __init__(self, seed: int) -> None:
        self.stream = random.Random(seed)
        self.calls: list[list[Any]] = []

    def sample_many(self, values: list[Any]) -> list[str]:
        self.calls.append(list(values))
        return [f"{value['v'] % 3}.{self.stream.randrange(2)}" for value in values]


def _key(domain: str) -> GroupKey:
    return GroupKey(
        domain, 4.0, "bayesian", "0", None, None, 0, 0.0, 0.0, None, "0", None, None, 0.0, 0.0
    )


def _chunk(
    domains: list[str], members: int, groups: int, seed: int
) -> tuple[list[survey_runs._Sampling], list[MemberRow], dict[str, _Drawn]]:
    """Members of ``domains`` at random, each in one of ``groups`` groups of its domain or in
    none (a third of them); the accepted groups in order of their first member."""
    rng = random.Random(seed)
    rows = [
        MemberRow(
            f"o{m:05d}",
            1,
            0,
            0,
            False,
            json.dumps({"v": rng.randrange(7)}),
            _key(rng.choice(domains)),
        )
        for m in range(members)
    ]
    mechs = {domain: _Drawn(seed + n) for n, domain in enumerate(domains)}
    by_group: dict[tuple[str, int], list[MemberRow]] = {}
    for row in rows:
        if rng.random() < 1 / 3:
            continue  # refused or retired: not sampled
        by_group.setdefault((row.key.domain, rng.randrange(groups)), []).append(row)
    accepted = [
        survey_runs._Sampling(
            _key(domain),
            GroupAccepted(mechs[domain], None, None),  # type: ignore[arg-type]
            found,
            None,
        )
        for (domain, _), found in by_group.items()
    ]
    return accepted, rows, mechs


def _plainly(
    accepted: list[survey_runs._Sampling], rows: list[MemberRow], mechs: dict[str, _Drawn]
) -> list[dict[str, list[MemberRow]]]:
    """What ``_sample_groups`` returns, member by member (``mechs``: fresh streams)."""
    group_of = {row.id: n for n, item in enumerate(accepted) for row in item.members}
    order: dict[str, list[MemberRow]] = {}
    for row in rows:
        if row.id in group_of:
            order.setdefault(row.key.domain, []).append(row)
    found: list[dict[str, list[MemberRow]]] = [{} for _ in accepted]
    for domain, members in order.items():
        outputs = mechs[domain].sample_many([json.loads(row.sealed) for row in members])
        for row, output in zip(members, outputs, strict=True):
            found[group_of[row.id]].setdefault(output, []).append(row)
    return found


@pytest.mark.parametrize(
    ("domains", "groups"),
    [(["d1"], 1), (["d1"], 40), (["d1"], 10_000), (["d1", "d2"], 30), (["d1", "d2", "d3"], 5)],
)
def test_sample_groups_is_its_plain_statement(domains: list[str], groups: int) -> None:
    for seed in range(3):
        accepted, rows, mechs = _chunk(domains, 600, groups, seed)
        found = survey_runs._sample_groups(accepted, _Plain(), rows)  # type: ignore[arg-type]
        expected = _plainly(accepted, rows, _chunk(domains, 600, groups, seed)[2])
        # the outputs in the order drawn (the chunk's answers follow it), each one's members
        assert [[(k, [r.id for r in v]) for k, v in d.items()] for d in found] == [
            [(k, [r.id for r in v]) for k, v in d.items()] for d in expected
        ]
        # one call per domain, its accepted members' values in the chunk's order
        sampled = {row.id for item in accepted for row in item.members}
        for domain, mech in mechs.items():
            members = [
                json.loads(row.sealed)
                for row in rows
                if row.key.domain == domain and row.id in sampled
            ]
            assert mech.calls == ([members] if members else [])


def test_sample_groups_of_nothing_accepted() -> None:
    _, rows, _ = _chunk(["d1"], 50, 3, 0)
    assert survey_runs._sample_groups([], _Plain(), rows) == []  # type: ignore[arg-type]
