"""A survey chunk's members grouped and their decisions looked up, two ways, side by side.

How to run (from the project root; no database)::

    git archive 5f3dc88 app | tar -x -C /tmp/numbered     # the numbered form (not on main)
    .venv/bin/python bench/group_numbers.py --candidate /tmp/numbered --baseline /work/wt/mainnow
    .venv/bin/python bench/group_numbers.py --candidate /tmp/numbered --converged --groups 15

Issue 27 item 3 (h/intern). The part of ``survey_runs._decide_rows`` that keys a chunk's dicts:
the members by decision group (``decision_key``), the groups' state hashes to load, the chunk's
groups (``work.keys``), ``_fold_pending`` (no pending entries here), ``_decide_groups`` (every
group decided already: a later chunk of the run), the decision of each group, and each accepted
group's number in the run (``RunCache.number``). ``old``: the baseline tree's
``app/services/survey_runs.py`` (loaded under another name; its lines of ``_decide_rows`` as
they are there), the dicts keyed by the 15-field ``GroupKey``; ``new``: the ``--candidate``
tree's (h/intern's ``5f3dc88``, not kept), keyed by the group's number (``_numbered``). Both
modules are loaded by path and import this tree's other modules (``survey_groups``,
``store.surveys``: the same in all three). The input is a diverged survey's chunk:
``--members`` members, each its own history hash, of ``--groups`` decision groups (finite
domain: the decision key drops the history hash), every key a separate tuple of separate
strings as the database rows give them. Both run on the same chunks, alternating which goes
first, each with its own warm run cache; printed: the medians and minima of the thread CPU per
chunk, and that both grouped the members alike. ``--converged``: a group's members share one
history hash (the public state repeats: an early survey's chunk).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import random
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from app.engine.limits import EngineLimits  # noqa: E402
from app.services.survey_groups import ParsedQuery, Refusal, decision_key  # noqa: E402
from app.store.surveys import GroupKey, MemberRow  # noqa: E402

DOMAIN = {
    "attributes": [
        {"name": "age", "type": "integer", "low": 0, "high": 9},
        {"name": "sex", "type": "integer", "low": 0, "high": 1},
        {"name": "region", "type": "categorical", "values": [f"r{i}" for i in range(15)]},
    ]
}
QUERY = {"mechanism": "grr", "attribute": "region", "epsilon": 0.5}


def load(tree: Path, name: str) -> ModuleType:
    """A tree's ``survey_runs`` under ``name`` (it imports this tree's other modules)."""
    spec = importlib.util.spec_from_file_location(name, tree / "app/services/survey_runs.py")
    assert spec is not None  # noqa: S101
    assert spec.loader is not None  # noqa: S101
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def fresh(text: str) -> str:
    """An equal string that is another object (its hash not computed yet), as a row's."""
    return text.encode().decode()


def chunk(
    rng: random.Random, members: int, groups: int, shift: int, converged: bool = False
) -> list[MemberRow]:
    """A diverged chunk: ``groups`` decision groups, every member its own history.

    ``converged``: the members of a group share their history hash (an early survey's chunk).
    """
    text = json.dumps(DOMAIN)
    rows = []
    histories: dict[int, str] = {}
    order = list(range(groups)) + [rng.randrange(groups) for _ in range(members - groups)]
    rng.shuffle(order)
    for n, g in enumerate(order):
        g += shift
        key = tuple.__new__(
            GroupKey,
            (
                text,
                2.5 + (g % 3),
                "bayesian",
                fresh(f"{(g % 7) + 1}/2"),
                fresh(
                    histories.setdefault(g, f"{rng.getrandbits(128):032x}")
                    if converged
                    else f"{rng.getrandbits(128):032x}"
                ),
                fresh(f"{g:064x}"),
                0,
                0.25 * (g % 11),
                0.25 * (g % 11) + 0.01 * (g % 5),
                None,
                fresh(f"{(g % 13) + 1}/4"),
                None,
                None,
                0.0,
                0.0,
            ),
        )
        rows.append(tuple.__new__(MemberRow, (f"m{n:06d}", 1, 3, 0, False, "", key)))
    return rows


ACCEPTED = object()  # a decision that is not a refusal (nothing reads it here)


def run_old(old: ModuleType, rows: list[MemberRow], cache: Any, work: Any) -> list[list[str]]:
    """Main's lines of ``_decide_rows`` up to the groups' numbers, with its functions."""
    parsed = cache.parsed
    keys: dict[GroupKey, GroupKey] = {}

    def keyed() -> Iterator[tuple[GroupKey, MemberRow]]:
        for row in rows:
            if row.retired:
                old._refuse(work, row, Refusal.RETIRED)
                continue
            key = keys.get(row.key)
            if key is None:
                key = keys[row.key] = decision_key(row.key, parsed)
            yield key, row

    by_group = old._grouped(keyed())
    states = parsed.states
    missing = {k.state_hash for k in by_group if k.state_hash and k.state_hash not in states}
    del missing
    by_group = old._fold_pending(None, by_group, cache, None)
    work.keys = set(by_group)
    old._decide_groups(None, by_group, cache, None)
    accepted = []
    for key, members in by_group.items():
        group = cache.decisions[key]
        if isinstance(group, Refusal):
            continue
        accepted.append((key, members))
    numbers = [cache.number(key) for key, _ in accepted]
    del numbers
    return [[r.id for r in members] for _, members in accepted]


def run_new(new: ModuleType, rows: list[MemberRow], cache: Any, work: Any) -> list[list[str]]:
    """The candidate's lines of ``_decide_rows`` doing the same."""
    by_group, keys = new._numbered(rows, cache, work)
    states = cache.parsed.states
    missing = {k.state_hash for k in keys.values() if k.state_hash and k.state_hash not in states}
    del missing
    by_group = new._fold_pending(None, by_group, keys, cache, None)
    work.keys = {keys[number] for number in by_group}
    new._decide_groups(None, by_group, keys, cache, None)
    accepted = []
    decisions = cache.decisions
    for number, members in by_group.items():
        group = decisions[number]
        if isinstance(group, Refusal):
            continue
        accepted.append((keys[number], number, members))
    return [[r.id for r in members] for _, _, members in accepted]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--baseline", type=Path, default=Path("/work/wt/mainnow"))
    parser.add_argument("--candidate", type=Path, required=True, help="a tree with _numbered")
    parser.add_argument("--members", type=int, default=5000)
    parser.add_argument("--groups", type=int, default=4000)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--seed", type=int, default=27)
    parser.add_argument(
        "--converged", action="store_true", help="a group's members share one history hash"
    )
    args = parser.parse_args()
    old = load(args.baseline, "old_survey_runs")
    new = load(args.candidate, "new_survey_runs")
    rng = random.Random(args.seed)
    parsed_old = ParsedQuery(EngineLimits(), QUERY)
    parsed_new = ParsedQuery(EngineLimits(), QUERY)
    cache_old = old.RunCache(parsed_old)
    cache_new = new.RunCache(parsed_new)
    # every group decided already (a later chunk of the run): the same decision in both caches
    for k in range(args.groups):
        for row in chunk(rng, 1, 1, k):
            dk = decision_key(row.key, parsed_old)
            cache_old.decisions[dk] = ACCEPTED
            cache_new.decisions[cache_new.number(dk)] = ACCEPTED
    runs: dict[str, list[float]] = {"old": [], "new": []}
    calls: dict[str, Callable[[list[MemberRow]], list[list[str]]]] = {
        "old": lambda rows: run_old(old, rows, cache_old, old._Chunk(1, 0, datetime.now(UTC))),
        "new": lambda rows: run_new(new, rows, cache_new, new._Chunk(1, 0, datetime.now(UTC))),
    }
    for n in range(args.rounds + 1):
        rows = chunk(rng, args.members, args.groups, 0, args.converged)
        # each side its own copy of the chunk: strings whose hashes neither computed yet
        copies = {
            name: [
                r._replace(
                    key=tuple.__new__(
                        GroupKey, tuple(fresh(f) if isinstance(f, str) else f for f in r.key)
                    )
                )
                for r in rows
            ]
            for name in runs
        }
        order = ["old", "new"] if n % 2 else ["new", "old"]
        found = {}
        for name in order:
            start = time.thread_time()
            found[name] = calls[name](copies[name])
            spent = time.thread_time() - start
            if n:  # the first round warms both
                runs[name].append(spent)
        assert found["old"] == found["new"], "the two groupings differ"  # noqa: S101
    print(
        f"{'converged' if args.converged else 'diverged'} chunk of {args.members} members, "
        f"{args.groups} decision groups, "
        f"{args.rounds} rounds (thread CPU ms per chunk)"
    )
    print("| form | median | min | max |")
    print("|---|---:|---:|---:|")
    for name, label in (("old", "GroupKey-keyed (baseline)"), ("new", "numbered (candidate)")):
        ms = [1e3 * t for t in runs[name]]
        print(f"| {label} | {statistics.median(ms):.2f} | {min(ms):.2f} | {max(ms):.2f} |")
    ratio = statistics.median(runs["new"]) / statistics.median(runs["old"])
    print(f"new / old (medians): {ratio:.2f}; groupings equal in every round")


if __name__ == "__main__":
    main()
