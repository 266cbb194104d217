"""Members deciding alone, decided together: the batched engine road equals the per-member one.

A survey after an ``olh`` survey folds each member's pending entries
(:func:`app.engine.likelihood.fold_many`), decides them (:func:`app.engine.pipeline.evaluate_many`)
and computes the loss after each answer (``exact_losses_after``, vectorised for ``grr`` and
``binary_rr``) for a whole chunk at once. Each is checked here against the per-member functions
(:meth:`LikelihoodState.apply`, :func:`~app.engine.pipeline.evaluate`,
``with_term(...).loss()``) on thousands of random states: histories of ``olh``, ``grr``,
``binary_rr``, ``hadamard`` and unary encoding, float (non-exact) states, several ε's (up to the
33rd group), budgets at ties (the exact loss after the worst output, basic composition's sum)
and a hair around them, every filter.
"""

from __future__ import annotations

import random
from fractions import Fraction

import numpy as np
import pytest

import app.engine.likelihood as likelihood
from app.engine import exact as exact_module
from app.engine.domain import Domain
from app.engine.filters import FilterKind
from app.engine.likelihood import LikelihoodState, fold_many
from app.engine.mechanisms import Mechanism, parse_query
from app.engine.pipeline import (
    HistoryEntry,
    ObjectSnapshot,
    evaluate,
    evaluate_many,
    history_account,
)
from tests.engine.histories import KINDS, draw, random_history, random_query, vw_domain


@pytest.mark.parametrize("seed", range(4))
def test_fold_many_is_apply_bit_for_bit(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(seed)
    for _ in range(120):
        k = rng.choice([1, 2, 3, 5, 20])
        domain = vw_domain(k)
        base, _ = random_history(rng, domain, k, KINDS, 3)
        if rng.random() < 0.2:
            base.exact = None  # a float state: no exact form to carry
        members = rng.randint(1, 9)
        mechs = [
            parse_query(random_query(rng, k, rng.choice(KINDS)), domain)
            for _ in range(rng.randint(1, 4))
        ]
        outputs = [[draw(rng, m, k) for _ in range(members)] for m in mechs]
        # slices of one member, a few, or all: the same states
        monkeypatch.setattr(likelihood, "FOLD_ELEMENTS", rng.choice([1, 40, 1 << 22]))
        folded = fold_many(base, [m.terms_many(o) for m, o in zip(mechs, outputs, strict=True)])
        assert len(folded) == members
        for i, got in enumerate(folded):
            want = base.copy()
            for mech, drawn in zip(mechs, outputs, strict=True):
                want.apply(mech.term(drawn[i]))
            assert got.logp.tobytes() == want.logp.tobytes()
            assert (got.err, got.computed_loss) == (want.err, want.computed_loss)
            assert (got.exact is None) == (want.exact is None)
            if want.exact is not None and got.exact is not None:
                assert got.exact.groups == want.exact.groups
                assert got.exact.to_bytes() == want.exact.to_bytes()
                assert got.loss() == want.loss()


def test_fold_many_drops_the_exact_form_at_the_33rd_group() -> None:
    domain = vw_domain(4)
    base = LikelihoodState(domain)
    grr = [
        parse_query({"mechanism": "grr", "attribute": "v", "epsilon": 0.01 * (i + 1)}, domain)
        for i in range(34)
    ]
    steps = [m.terms_many([1, 2]) for m in grr]
    folded = fold_many(base, steps)
    want = base.copy()
    for m in grr:
        want.apply(m.term(1))
    assert want.exact is None
    assert folded[0].exact is None
    assert folded[0].logp.tobytes() == want.logp.tobytes()
    partial = fold_many(base, steps[:32])
    assert partial[1].exact is not None
    assert len(partial[1].exact.groups) == 32


@pytest.mark.parametrize("seed", range(4))
def test_exact_losses_after_grr_and_binary_rr_equal_with_term(seed: int) -> None:
    rng = random.Random(100 + seed)
    for _ in range(150):
        k = rng.choice([1, 2, 3, 5, 20, 64])
        domain = vw_domain(k)
        histories = []
        for _ in range(rng.randint(1, 12)):
            state, _ = random_history(rng, domain, k, ["grr", "grr_w", "olh", "binary_rr"], 5)
            assert state.exact is not None
            histories.append(state.exact)
        # olh's profiles (values, both stable orders, the other axes) computed for all at once
        copies = [exact_module.ExactLoss.from_bytes(h.shape, h.to_bytes()) for h in histories]
        group = exact_module.Group(Fraction(1, 2))
        for got_profile, history in zip(
            exact_module.subset_profiles(copies, 0, group), histories, strict=True
        ):
            want_profile = history._profile(0, group)
            assert (got_profile is None) == (want_profile is None)
            if got_profile is not None and want_profile is not None:
                assert (got_profile.denominator, got_profile.step, got_profile.others) == (
                    want_profile.denominator,
                    want_profile.step,
                    want_profile.others,
                )
                for name in ("base", "down", "up"):
                    assert np.array_equal(getattr(got_profile, name), getattr(want_profile, name))
        for kinds in (["grr"], ["binary_rr"], ["olh"]):
            mech = parse_query(random_query(rng, k, rng.choice(kinds)), domain)
            outputs = [draw(rng, mech, k) for _ in range(2 * len(histories))]
            owners = [rng.randrange(len(histories)) for _ in outputs]
            got = mech.exact_losses_after(histories, outputs, owners)
            want = [
                histories[o].with_term(mech.exact_term(y)).loss()  # type: ignore[arg-type]
                for y, o in zip(outputs, owners, strict=True)
            ]
            assert got == want
        fresh = [exact_module.ExactLoss.from_bytes(h.shape, h.to_bytes()) for h in histories]
        assert exact_module.losses_many(fresh) == [h.loss() for h in histories]


def _past_int64(domain: Domain) -> exact_module.ExactLoss:
    """A form on ``v`` whose values leave ``int64`` (computed alone, in Python integers)."""
    return exact_module.ExactLoss(
        domain.shape,
        (exact_module.Group(Fraction(1, 3)), exact_module.Group(Fraction(1, 7))),
        {0: np.array([[1 << 61, 0, 5], [0, 1, 2]], dtype=np.int64)},
    )


def test_exact_losses_after_past_int64_computes_alone() -> None:
    domain = vw_domain(3)
    huge = _past_int64(domain)
    small = LikelihoodState(domain).exact
    assert small is not None
    mech = parse_query({"mechanism": "grr", "attribute": "v", "epsilon": 0.5}, domain)
    got = mech.exact_losses_after([huge, small], [0, 2, 1], [0, 0, 1])
    want = [h.with_term(mech.exact_term(y)).loss() for h, y in ((huge, 0), (huge, 2), (small, 1))]
    assert got == want


@pytest.mark.parametrize("seed", range(3))
def test_exact_units_after_equal_with_term_and_kept(seed: int) -> None:
    """Every output's loss per history at once (a survey's losses ahead), kept on each history.

    Equal to ``with_term(...).loss()`` for every output; a second call answers from what was
    kept (the same tuples); ``evaluate_many`` keeps the same answer for the histories it decides;
    ``olh`` and unary encoding have none (their own shortcut, or none).
    """
    rng = random.Random(300 + seed)
    for _ in range(60):
        k = rng.choice([1, 2, 3, 5, 20])
        domain = vw_domain(k)
        histories = []
        states = []
        for _ in range(rng.randint(1, 12)):
            state, _ = random_history(rng, domain, k, ["grr", "grr_w", "olh", "binary_rr"], 5)
            assert state.exact is not None
            histories.append(state.exact)
            states.append(state)
        for kinds in (["grr"], ["binary_rr"], ["hadamard"], ["grr_w"]):
            mech = parse_query(random_query(rng, k, rng.choice(kinds)), domain)
            query = mech.exact_query()
            assert query is not None
            outputs = range(domain.shape[query.axis] if query.kind == "grr" else 0)
            if query.table is not None:
                outputs = range(query.table.shape[1])
            fresh = [exact_module.ExactLoss.from_bytes(h.shape, h.to_bytes()) for h in histories]
            got = mech.exact_units_after(fresh)
            assert got is not None
            for history, units in zip(histories, got, strict=True):
                assert units is not None
                row, denominator = units
                assert len(row) == len(outputs)
                for y in outputs:
                    want = history.with_term(mech.exact_term(y)).loss()  # type: ignore[arg-type]
                    assert Fraction(row[y], denominator) == want
            again = mech.exact_units_after(fresh)
            assert again is not None
            assert all(a is b for a, b in zip(again, got, strict=True))
            # a decision of these histories keeps the same losses on them
            copies = [LikelihoodState.from_bytes(domain, s.to_bytes(), s.err) for s in states]
            snapshots = [
                ObjectSnapshot(
                    domain,
                    0.01,  # basic composition refuses: the exact candidates decide
                    FilterKind.BAYESIAN,
                    Fraction(1),
                    copy,
                )
                for copy in copies
            ]
            evaluate_many(snapshots, mech)
            kept_any = False
            for copy, units in zip(copies, got, strict=True):
                assert copy.exact is not None
                assert units is not None
                kept = copy.exact._moved_units.get(query.key)
                if kept is not None:
                    kept_any = True
                    assert [Fraction(u, kept[1]) for u in kept[0]] == [
                        Fraction(u, units[1]) for u in units[0]
                    ]
            assert kept_any
        for kinds in (["olh"], ["ue"]):
            mech = parse_query(random_query(rng, k, rng.choice(kinds)), domain)
            assert mech.exact_units_after(histories) is None


def test_exact_units_after_past_int64_or_33rd_group_is_none() -> None:
    domain = vw_domain(3)
    huge = _past_int64(domain)
    full = exact_module.ExactLoss(
        domain.shape,
        tuple(exact_module.Group(Fraction(1, 100 + i)) for i in range(exact_module.MAX_GROUPS)),
        {},
    )
    small = LikelihoodState(domain).exact
    assert small is not None
    mech = parse_query({"mechanism": "grr", "attribute": "v", "epsilon": 0.5}, domain)
    got = mech.exact_units_after([huge, full, small])
    assert got is not None
    assert got[0] is None
    assert got[1] is None
    assert got[2] is not None
    terms = [mech.exact_term(y) for y in range(3)]
    want = [small.with_term(t).loss() for t in terms]  # type: ignore[arg-type]
    assert [Fraction(u, got[2][1]) for u in got[2][0]] == want


def _snapshots(rng: random.Random, k: int, candidate: Mechanism) -> list[ObjectSnapshot]:
    domain = candidate.domain
    found = []
    for _ in range(rng.randint(1, 10)):
        state, entries = random_history(rng, domain, k, ["grr", "olh", "binary_rr", "grr_w"], 5)
        basic = sum((mech.epsilon_exact for mech in entries), Fraction(0))
        if rng.random() < 0.15:
            state.exact = None
        kind = rng.choice(list(FilterKind))
        # ties and a hair around them: the worst output's exact loss, basic composition's sum
        worst = None
        if state.exact is not None and (query := candidate.exact_query()) is not None:
            worst = float(max(state.exact.candidate_losses(query)))
        after = float(basic + candidate.epsilon_exact)
        options = [0.5, 1.0, 1.5, 2.0, after, after - 1e-12, after + 1e-9]
        if worst is not None:
            options += [worst, worst - 1e-12, worst + 1e-12, worst - 1e-9]
        budget = max(0.05, rng.choice(options))
        delta = rng.choice([1e-6, 0.1]) if kind is FilterKind.APPROX_BAYESIAN else None
        snapshot = ObjectSnapshot(domain, budget, kind, basic, state, delta=delta)
        if delta is not None:
            account = history_account([HistoryEntry(m, 0) for m in entries], budget, delta, domain)
            snapshot = ObjectSnapshot(
                domain, budget, kind, basic, state, delta=delta, f0_account=account
            )
        found.append(snapshot)
    return found


@pytest.mark.parametrize("seed", range(6))
def test_evaluate_many_decides_as_evaluate(seed: int) -> None:
    rng = random.Random(200 + seed)
    counted = {"accepted": 0, "rejected": 0, "ties": 0, "batched": 0}
    for _ in range(80):
        k = rng.choice([1, 2, 3, 5, 20, 300])
        domain = vw_domain(k)
        candidate = parse_query(
            random_query(rng, k, rng.choice(["grr", "olh", "binary_rr", "grr_w"])), domain
        )
        snapshots = _snapshots(rng, k, candidate)
        got = evaluate_many(snapshots, candidate)
        assert len(got) == len(snapshots)
        for snapshot, decision in zip(snapshots, got, strict=True):
            want = evaluate(snapshot, candidate)
            assert decision.accepted == want.accepted
            assert decision.reason == want.reason
            assert decision.refusal == want.refusal
            assert decision.realized_loss == want.realized_loss
            assert decision.realized_loss.value == want.realized_loss.value
            assert decision.phase == want.phase
            assert decision.worst_case_after == want.worst_case_after
            assert decision.candidate.exact_worst == want.candidate.exact_worst
            assert decision.candidate.exact_charged == want.candidate.exact_charged
            assert decision.candidate.tight == want.candidate.tight
            # the batched evaluation lists the worst output; it is one the single one lists
            # with the same bounds, or both list every output
            if decision.candidate != want.candidate:
                counted["batched"] += 1
                assert len(decision.candidate.per_output) == 1
                listed = decision.candidate.per_output[0]
                assert listed.upper == decision.worst_case_after
                matching = [o for o in want.candidate.per_output if o.output == listed.output]
                assert not matching or (matching[0].lower, matching[0].upper) == (
                    listed.lower,
                    listed.upper,
                )
            counted["accepted" if want.accepted else "rejected"] += 1
            exact_worst = want.candidate.exact_worst
            if exact_worst is not None and float(exact_worst) == snapshot.budget:
                counted["ties"] += 1
    # both outcomes, exact ties, and the vectorised evaluation (not basic composition's) seen
    assert all(counted.values()), counted
