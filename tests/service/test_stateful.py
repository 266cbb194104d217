"""Stateful property test of the submit protocol (hypothesis ``RuleBasedStateMachine``).

The machine drives the real app in-process (``TestClient``, SQLite and PostgreSQL) through
random sequences of: register an object (finite domain; bayesian, simplified or basic filter),
dry-run, submit with a fresh ``Idempotency-Key``, retry an earlier submit (same key and body),
replay an earlier key with a changed body, and exhaust an object (submit until 409). After every
step it checks, for every object it made:

* Bayesian filter: the stored realized-loss upper bound never exceeds the budget (read as the
  decimal written, like basic composition: at most the float just above it); basic filter: the
  basic-composition total never exceeds it; every filter: lower <= upper <= basic composition;
* a dry-run changes nothing (odometer and stored queries identical before and after), and its
  decision predicts the submit that follows it;
* a retry of an accepted submit never resamples: same body (query id, output, odometer),
  ``Idempotent-Replayed: true``, no new stored query; a retry of a rejected key gets its stored
  409 (also marked replayed) and counts nothing;
* a reused key with another body is 422 and stores nothing;
* the stored state equals a fresh recomputation from the stored history
  (:func:`app.services.verify.verify_object`, the check of ``gatekeeper verify``);
* ``accepted + rejected`` equals the fresh submits the machine sent, ``accepted`` equals the
  201 answers it got and the number of stored queries.

No draw and no precondition depends on a sampled output or a decision: objects and submits are
chosen by an index drawn with ``st.integers`` taken modulo the length of lists whose lengths
grow with the steps taken (never with what the service answered), so generation is
deterministic whatever the CSPRNG samples (hypothesis's ``FlakyStrategyDefinition``).
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, Phase, seed, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from app.engine.numerics import decimal_fraction, float_up
from app.services.verify import Report, verify_object
from app.store import reading
from app.store.verify import objects
from tests.service.conftest import ADMIN_KEY, auth, new_key, unique_id

DOMAINS: list[dict[str, Any]] = [
    {
        "attributes": [
            {"name": "x", "type": "integer", "low": 0, "high": 3},
            {"name": "c", "type": "categorical", "values": ["a", "b", "c"]},
        ]
    },
    {"attributes": [{"name": "b", "type": "integer", "low": 0, "high": 1}]},
]
VALUES: list[list[dict[str, Any]]] = [
    [{"x": 0, "c": "a"}, {"x": 2, "c": "c"}, {"x": 3, "c": "b"}],
    [{"b": 0}, {"b": 1}],
]
QUERIES: list[list[dict[str, Any]]] = [
    [
        {"mechanism": "grr", "attribute": "x", "epsilon": 0.7},
        {"mechanism": "grr", "attribute": "c", "epsilon": 0.45},
        {
            "mechanism": "binary_rr",
            "predicate": {"attribute": "x", "op": ">=", "value": 2},
            "epsilon": 0.9,
        },
        {"mechanism": "unary_encoding", "attribute": "c", "epsilon": 0.6, "variant": "optimized"},
    ],
    [
        {"mechanism": "grr", "attribute": "b", "epsilon": 0.8},
        {
            "mechanism": "binary_rr",
            "predicate": {"attribute": "b", "op": "==", "value": 1},
            "epsilon": 0.35,
        },
    ],
]
FILTERS = ["bayesian", "simplified", "basic"]
BUDGETS = [0.6, 1.5, 2.5]
#: ``exhaust`` gives up after this many accepted submits. Its slowest case is binary_rr at
#: ε = 0.35 on the binary domain with budget 2.5: the realized loss is 0.35·|S| for a walk S
#: that steps toward the true value with probability e^0.35/(1+e^0.35) ≈ 0.587, and the filter
#: rejects the next submit once |S| reaches 7. The walk stays inside |S| ≤ 6 for n steps with
#: probability 3.3e-3 at n = 150 (CI once hit it), 7.6e-6 at 300 and 3.4e-18 at 1,000 (the
#: killed chain's n-step mass, computed with numpy); the mean is about 40 steps.
EXHAUST_CAP = 1000
MAX_OBJECTS = 3


@dataclass
class Obj:
    """What the model knows about one registered object."""

    oid: str
    domain: int
    filter: str
    budget: float
    sent: int = 0  # fresh submits (not replays, not 422s) the machine sent
    accepted: int = 0  # of which answered 201


@dataclass
class Sent:
    """A submit the machine sent with its own Idempotency-Key."""

    obj: Obj
    key: str
    body: dict[str, Any]
    #: the 201 response body, when the key holds a stored query
    stored: dict[str, Any] | None = None
    #: the 409 problem, when the key holds a stored rejection
    rejected: dict[str, Any] | None = None
    changed: list[dict[str, Any]] = field(default_factory=list)


def _body(domain: int, index: int) -> dict[str, Any]:
    queries = QUERIES[domain]
    return {"query": queries[index % len(queries)]}


def make_machine(client: TestClient, analyst: str) -> type[RuleBasedStateMachine]:
    """The state machine class bound to ``client`` (one app, one database)."""
    admin = auth(ADMIN_KEY)
    runtime = client.app.state.runtime  # type: ignore[attr-defined]

    class SubmitProtocol(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.objects: list[Obj] = []
            self.sent: list[Sent] = []
            self.token = secrets.token_hex(4)
            self.keys = 0

        # ---------------------------------------------------------------- helpers
        def fresh_key(self) -> str:
            self.keys += 1
            return f"sm-{self.token}-{self.keys}"

        def post_submit(self, obj: Obj, key: str, body: dict[str, Any]) -> httpx.Response:
            return client.post(
                f"/v1/objects/{obj.oid}/queries",
                headers={**auth(analyst), "Idempotency-Key": key},
                json=body,
            )

        def snapshot(self, obj: Obj) -> tuple[dict[str, Any], list[dict[str, Any]]]:
            odo = client.get(f"/v1/objects/{obj.oid}/odometer", headers=admin)
            assert odo.status_code == 200, odo.text
            queries = client.get(
                f"/v1/objects/{obj.oid}/queries", params={"limit": 1000}, headers=admin
            )
            assert queries.status_code == 200, queries.text
            return odo.json(), queries.json()["items"]

        def fresh_submit(self, obj: Obj, body: dict[str, Any], entry: Sent) -> httpx.Response:
            """Send a submit the service has not stored; check the model's counts move."""
            r = self.post_submit(obj, entry.key, body)
            obj.sent += 1
            if r.status_code == 201:
                assert r.headers.get("Idempotent-Replayed") is None
                obj.accepted += 1
                assert r.json()["seq"] == obj.accepted
                entry.stored = r.json()
                entry.body = body
            else:
                assert r.status_code == 409, r.text
                assert r.headers["content-type"].startswith("application/problem+json")
                assert r.json()["type"] == "budget-exhausted"
                assert r.headers.get("Idempotent-Replayed") is None
                entry.rejected = r.json()
                entry.body = body
            return r

        def pick_object(self, index: int) -> Obj:
            return self.objects[index % len(self.objects)]

        # ---------------------------------------------------------------- rules
        @precondition(lambda self: len(self.objects) < MAX_OBJECTS)
        @rule(
            domain=st.integers(0, len(DOMAINS) - 1),
            value=st.integers(0, 10),
            filter_=st.sampled_from(FILTERS),
            budget=st.sampled_from(BUDGETS),
        )
        def create(self, domain: int, value: int, filter_: str, budget: float) -> None:
            obj = Obj(unique_id("sm"), domain, filter_, budget)
            r = client.post(
                "/v1/objects",
                headers=admin,
                json={
                    "id": obj.oid,
                    "domain": DOMAINS[domain],
                    "value": VALUES[domain][value % len(VALUES[domain])],
                    "budget": {"epsilon": budget},
                    "filter": filter_,
                },
            )
            assert r.status_code == 201, r.text
            self.objects.append(obj)

        @precondition(lambda self: self.objects)
        @rule(which=st.integers(0, 100), query=st.integers(0, 100))
        def dry_run(self, which: int, query: int) -> None:
            """A dry-run changes neither the odometer nor the stored queries."""
            obj = self.pick_object(which)
            before = self.snapshot(obj)
            r = client.post(
                f"/v1/objects/{obj.oid}/dry-run",
                headers=auth(analyst),
                json=_body(obj.domain, query),
            )
            assert r.status_code == 200, r.text
            assert r.json()["decision"] in ("accept", "reject")
            assert self.snapshot(obj) == before

        @precondition(lambda self: self.objects)
        @rule(which=st.integers(0, 100), query=st.integers(0, 100))
        def submit(self, which: int, query: int) -> None:
            """A fresh submit: the dry-run just before it predicts its answer."""
            obj = self.pick_object(which)
            body = _body(obj.domain, query)
            dry = client.post(f"/v1/objects/{obj.oid}/dry-run", headers=auth(analyst), json=body)
            assert dry.status_code == 200, dry.text
            entry = Sent(obj, self.fresh_key(), body)
            self.sent.append(entry)
            r = self.fresh_submit(obj, body, entry)
            expected = 201 if dry.json()["decision"] == "accept" else 409
            assert r.status_code == expected, (dry.json(), r.text)

        @precondition(lambda self: self.sent)
        @rule(which=st.integers(0, 1000))
        def retry(self, which: int) -> None:
            """Same key, same body: the stored answer, never a new sample."""
            entry = self.sent[which % len(self.sent)]
            obj = entry.obj
            if entry.stored is None:  # a rejection: its stored answer, counted once
                assert entry.rejected is not None
                before = self.snapshot(obj)
                r = self.post_submit(obj, entry.key, entry.body)
                assert r.status_code == 409, r.text
                assert r.headers.get("Idempotent-Replayed") == "true"
                assert r.json() == entry.rejected
                assert self.snapshot(obj) == before
                return
            _, queries_before = self.snapshot(obj)
            r = self.post_submit(obj, entry.key, entry.body)
            assert r.status_code == 201, r.text
            assert r.headers.get("Idempotent-Replayed") == "true"
            assert r.json() == entry.stored
            _, queries_after = self.snapshot(obj)
            assert queries_after == queries_before

        @precondition(lambda self: self.sent)
        @rule(which=st.integers(0, 1000), shift=st.integers(1, 100))
        def replay_changed(self, which: int, shift: int) -> None:
            """A stored key with another body is 422 and stores nothing."""
            entry = self.sent[which % len(self.sent)]
            obj = entry.obj
            queries = QUERIES[obj.domain]
            index = queries.index(entry.body["query"])
            other = {"query": queries[(index + 1 + shift % (len(queries) - 1)) % len(queries)]}
            assert other != entry.body
            before = self.snapshot(obj)
            r = self.post_submit(obj, entry.key, other)
            assert r.status_code == 422, r.text
            assert r.headers["content-type"].startswith("application/problem+json")
            assert "output" not in r.json()
            assert self.snapshot(obj)[1] == before[1]
            assert self.snapshot(obj)[0]["accepted"] == before[0]["accepted"]
            assert self.snapshot(obj)[0]["rejected"] == before[0]["rejected"]
            entry.changed.append(other)

        @precondition(lambda self: self.objects)
        @rule(which=st.integers(0, 100), query=st.integers(0, 100))
        def exhaust(self, which: int, query: int) -> None:
            """Fresh submits of one query until the filter answers 409 budget-exhausted."""
            obj = self.pick_object(which)
            body = _body(obj.domain, query)
            for _ in range(EXHAUST_CAP):
                entry = Sent(obj, self.fresh_key(), body)
                self.sent.append(entry)
                if self.fresh_submit(obj, body, entry).status_code == 409:
                    return
            raise AssertionError(f"{EXHAUST_CAP} submits of {body} never exhausted {obj}")

        # ---------------------------------------------------------------- invariants
        @invariant()
        def state_follows_from_history(self) -> None:
            for obj in self.objects:
                odo, queries = self.snapshot(obj)
                upper = odo["realized_loss"]["upper"]
                assert odo["realized_loss"]["lower"] <= upper
                if obj.filter == "bayesian":
                    # the budget is the decimal the user wrote (0.6 is 3/5, as in basic
                    # composition); a certified float bound of a loss of exactly 3/5 may be
                    # the next float above 0.6, never more
                    assert upper <= float_up(decimal_fraction(obj.budget)), odo
                if obj.filter == "basic":
                    assert odo["basic_composition"] <= obj.budget + 1e-12, odo
                assert upper <= odo["basic_composition"] + 1e-9, odo
                assert odo["accepted"] + odo["rejected"] == obj.sent, (odo, obj)
                assert odo["accepted"] == obj.accepted == len(queries), (odo, obj)
                assert [q["seq"] for q in queries] == list(range(1, obj.accepted + 1))
                report = Report()
                with reading(runtime.engine) as conn:
                    row = next(r for r in objects(conn) if r.id == obj.oid)
                    verify_object(conn, row, report)
                assert report.ok, report.problems

    return SubmitProtocol


#: Random sequences (hypothesis examples) on each backend, of ``stateful_step_count`` steps each.
EXAMPLES = 40
#: The sequences are run as this many tests of ``EXAMPLES // PARTS`` each (each with a seed of its
#: own: :func:`seeded_part`), so that ``pytest -n 3`` runs them at once instead of one process
#: holding a single test of one to two minutes (issue 27 item 5, CI time): as many sequences, the
#: same steps and checks.
PARTS = 2
assert EXAMPLES % PARTS == 0, "every part runs as many sequences"


def seeded_part(
    machine: type[RuleBasedStateMachine], part: int, *, derandomize: bool | None = None
) -> type[RuleBasedStateMachine]:
    """``machine`` with a seed of its own for ``part`` when hypothesis runs derandomized.

    With ``CI`` set, hypothesis loads its ``ci`` profile (``derandomize=True``): a derandomized
    test's seed is the digest of its function, and ``run_state_machine_as_test`` always runs the
    same inner function, so every part would draw the *same* sequences (``h/ci8`` found 20
    distinct sequences per backend where 40 were meant). Each part then gets a fixed seed of its
    own (reproducible, as the profile intends); outside CI every part draws at random as before.
    """
    if not (settings().derandomize if derandomize is None else derandomize):
        return machine
    return seed(0x5E9_0000 + part)(machine)


@pytest.mark.slow
@pytest.mark.parametrize("part", range(PARTS))
def test_submit_protocol_state_machine(client: TestClient, part: int) -> None:
    """Random create/dry-run/submit/retry/replay/exhaust sequences keep every invariant."""
    analyst = new_key(client, "analyst")
    machine = seeded_part(make_machine(client, analyst), part)
    run_state_machine_as_test(
        machine,
        settings=settings(
            max_examples=EXAMPLES // PARTS,
            stateful_step_count=20,
            deadline=None,
            # no shrinking: a failure that hangs on a sampled output does not replay (the CSPRNG
            # samples anew), so shrinking would only spend minutes to end in FlakyFailure; the
            # failing steps are printed as found
            phases=[Phase.explicit, Phase.reuse, Phase.generate],
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        ),
    )


def _drawn(part: int, *, seeded: bool) -> list[list[int]]:
    """The integers a one-rule machine draws as a derandomized ``part`` (each sequence a list)."""
    drawn: list[list[int]] = []

    class Steps(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            drawn.append([])

        @rule(n=st.integers(0, 10**6))
        def step(self, n: int) -> None:
            drawn[-1].append(n)

    run_state_machine_as_test(
        seeded_part(Steps, part, derandomize=True) if seeded else Steps,
        settings=settings(max_examples=5, stateful_step_count=5, derandomize=True, database=None),
    )
    return drawn


def test_parts_draw_different_sequences_even_derandomized() -> None:
    """Each part of the stateful test draws its own sequences with ``derandomize`` on, as CI's
    profile sets it; without :func:`seeded_part` every part draws the same ones."""
    assert _drawn(0, seeded=False) == _drawn(1, seeded=False)
    first, second = _drawn(0, seeded=True), _drawn(1, seeded=True)
    assert first
    assert second
    assert first != second
    assert _drawn(1, seeded=True) == second  # still reproducible, as the profile intends
