"""Typed engine calls as plain JSON data: what a bound task carries and what it answers.

A worker process — a pool process or a Celery worker on another machine — receives numbers and
strings only and rebuilds the engine's objects from them, so a broker never delivers code (no
pickle) and a worker may run as any user, root included.

A *call request* is ``{"call", "object", "args", "bnb"}``:

- ``call``: ``"evaluate"`` (:func:`app.engine.pipeline.evaluate` with ``tight=True``, the
  argument a query's JSON) or ``"realized_loss"`` (:func:`app.engine.pipeline.realized_loss`);
- ``object``: the snapshot — domain, budget, filter, exact ``Σ ε`` and F₀'s account as
  fractions' text, limits, δ_g, and the continuous history's terms and known bounds
  (:meth:`~app.engine.continuous.state.ContinuousState.to_json`);
- ``bnb``: the searches' settings (the caller's time limit and wall-clock end).

Only continuous snapshots travel: finite ones are decided in the calling thread.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict
from fractions import Fraction
from typing import Any

from app.engine.continuous.branch_and_bound import BnBSettings
from app.engine.continuous.state import ContinuousLoss, ContinuousState
from app.engine.domain import parse_domain
from app.engine.filters import CandidateEvaluation, Decision, FilterKind, OutputLoss
from app.engine.likelihood import LossBounds
from app.engine.limits import EngineLimits, for_history
from app.engine.mechanisms import Mechanism, parse_query
from app.engine.pipeline import ObjectSnapshot, evaluate, realized_loss

#: Version of the request and answer shapes (a part of every call's key).
WIRE_VERSION = "w1"

EVALUATE = "evaluate"
REALIZED_LOSS = "realized_loss"


def snapshot_json(snapshot: ObjectSnapshot) -> dict[str, Any]:
    """A continuous snapshot as plain data (raises ``TypeError`` for any other state)."""
    state = snapshot.state
    if not isinstance(state, ContinuousState):
        raise TypeError("only continuous snapshots are sent to a bound worker")
    return {
        "domain": snapshot.domain.to_json(),
        "budget": snapshot.budget,
        "filter": snapshot.filter.value,
        "basic_total": str(snapshot.basic_total),
        "limits": asdict(snapshot.limits),
        "delta": snapshot.delta,
        "f0_account": str(snapshot.f0_account),
        "state": state.to_json(),
    }


def snapshot_from_json(data: dict[str, Any], bnb: BnBSettings) -> ObjectSnapshot:
    """The snapshot :func:`snapshot_json` described, its searches run with ``bnb``."""
    limits = EngineLimits(**data["limits"])
    domain = parse_domain(data["domain"], "domain", limits=limits)
    return ObjectSnapshot(
        domain,
        float(data["budget"]),
        FilterKind(data["filter"]),
        Fraction(data["basic_total"]),
        ContinuousState.from_json(domain, data["state"], bnb),
        limits,
        None if data["delta"] is None else float(data["delta"]),
        Fraction(data["f0_account"]),
    )


def bnb_json(bnb: BnBSettings) -> dict[str, Any]:
    """Search settings as plain data."""
    return asdict(bnb)


def evaluate_request(snapshot: ObjectSnapshot, mechanism: Mechanism) -> dict[str, Any]:
    """The request of ``evaluate(snapshot, mechanism, tight=True)``."""
    return _request(EVALUATE, snapshot, [mechanism.to_json()])


def realized_loss_request(snapshot: ObjectSnapshot) -> dict[str, Any]:
    """The request of ``realized_loss(snapshot)``."""
    return _request(REALIZED_LOSS, snapshot, [])


def _request(call: str, snapshot: ObjectSnapshot, args: list[Any]) -> dict[str, Any]:
    return {
        "call": call,
        "object": snapshot_json(snapshot),
        "args": args,
        "bnb": bnb_json(snapshot.bnb),
    }


def with_bnb(request: dict[str, Any], **changes: Any) -> dict[str, Any]:
    """``request`` whose search settings have ``changes`` (``time_limit``, ``stop_at``)."""
    return {**request, "bnb": {**request["bnb"], **changes}}


def call_key(request: dict[str, Any]) -> str:
    """SHA-256 hex key of a call request: equal exactly when the computation is the same.

    The searches' wall-clock end is left out (it differs between identical calls).
    """
    material = {"version": WIRE_VERSION, **with_bnb(request, stop_at=None)}
    text = json.dumps(material, sort_keys=True, separators=(",", ":"), allow_nan=True)
    return hashlib.sha256(text.encode()).hexdigest()


def run_call(request: dict[str, Any]) -> dict[str, Any]:
    """Worker side: rebuild the snapshot, run the call, answer with plain data."""
    bnb = BnBSettings(**request["bnb"])
    snapshot = snapshot_from_json(request["object"], bnb)
    call = request["call"]
    if call == EVALUATE:
        (raw_query,) = request["args"]
        limits = for_history(snapshot.limits)  # validated when it was asked
        mechanism = parse_query(raw_query, snapshot.domain, "query", limits=limits)
        return {"decision": decision_json(evaluate(snapshot, mechanism, tight=True))}
    if call == REALIZED_LOSS:
        return {"bounds": bounds_json(realized_loss(snapshot))}
    raise ValueError(f"unknown engine call {call!r}")


def bounds_json(bounds: LossBounds) -> dict[str, float]:
    """``{"lower", "upper"}``."""
    return {"lower": bounds.lower, "upper": bounds.upper}


def bounds_from_json(data: dict[str, Any]) -> LossBounds:
    """The bounds :func:`bounds_json` wrote."""
    return LossBounds(float(data["lower"]), float(data["upper"]))


def _fraction_text(value: Fraction | None) -> str | None:
    return None if value is None else str(value)


def _fraction(text: str | None) -> Fraction | None:
    return None if text is None else Fraction(text)


#: The fields :func:`decision_json` writes (a test compares them with the dataclasses').
DECISION_FIELDS = frozenset(
    {
        "filter",
        "accepted",
        "reason",
        "budget",
        "realized_loss",
        "basic_composition",
        "candidate",
        "delta",
        "phase",
        "refusal",
    }
)
CANDIDATE_FIELDS = frozenset(
    {
        "epsilon",
        "epsilon_exact",
        "per_output",
        "worst_case_upper",
        "complete",
        "tight",
        "searched",
        "exact_worst",
        "exact_charged",
    }
)


def decision_json(decision: Decision) -> dict[str, Any]:
    """Every field of a decision as plain data (exact fractions as text)."""
    c = decision.candidate
    return {
        "filter": decision.filter.value,
        "accepted": decision.accepted,
        "reason": decision.reason,
        "budget": decision.budget,
        "realized_loss": bounds_json(decision.realized_loss),
        "basic_composition": str(decision.basic_composition),
        "candidate": {
            "epsilon": c.epsilon,
            "epsilon_exact": str(c.epsilon_exact),
            "per_output": [[o.output, o.lower, o.upper] for o in c.per_output],
            "worst_case_upper": c.worst_case_upper,
            "complete": c.complete,
            "tight": c.tight,
            "searched": [[index, asdict(found)] for index, found in c.searched.items()],
            "exact_worst": _fraction_text(c.exact_worst),
            "exact_charged": _fraction_text(c.exact_charged),
        },
        "delta": decision.delta,
        "phase": decision.phase,
        "refusal": decision.refusal,
    }


def decision_from_json(data: dict[str, Any]) -> Decision:
    """The decision :func:`decision_json` wrote."""
    c = data["candidate"]
    candidate = CandidateEvaluation(
        epsilon=c["epsilon"],
        epsilon_exact=Fraction(c["epsilon_exact"]),
        per_output=tuple(OutputLoss(o, lo, up) for o, lo, up in c["per_output"]),
        worst_case_upper=c["worst_case_upper"],
        complete=c["complete"],
        tight=c["tight"],
        searched={int(i): ContinuousLoss(**found) for i, found in c["searched"]},
        exact_worst=_fraction(c["exact_worst"]),
        exact_charged=_fraction(c["exact_charged"]),
    )
    return Decision(
        filter=FilterKind(data["filter"]),
        accepted=data["accepted"],
        reason=data["reason"],
        budget=data["budget"],
        realized_loss=bounds_from_json(data["realized_loss"]),
        basic_composition=Fraction(data["basic_composition"]),
        candidate=candidate,
        delta=data["delta"],
        phase=data["phase"],
        refusal=data["refusal"],
    )
