"""The stateless loss calculator of contract.md (``POST /v1/loss`` and ``gatekeeper loss``).

Request::

    {"domain": {...}, "history": [{"query": {...}, "output": ...}, ...], "budget": 4.0,
     "candidate": {...optional query...}, "options": {"tolerance": 1e-4}}

Answer::

    {"realized_loss": {"lower", "upper", "exact"}, "basic_composition": Σε, "status": "ok",
     "reason": "...only with status limit...",
     "candidate": {"per_output": [{"output", "lower", "upper", "exact"}], "worst_case_upper",
                   "accepted": {"bayesian", "simplified", "basic"}, ...}}

``exact`` is true where the loss is computed exactly (randomized response, every ε as written):
``lower`` and ``upper`` are then both the nearest double of the exact loss.

``candidate`` appears only when one was sent, and then ``budget`` is required.

Extension (issue #15): ``"delta": δ_g`` (with ``budget``) also decides with the
``approx_bayesian`` filter (Algorithm 4): ``accepted`` gains ``"approx_bayesian"`` and the answer
gains ``"approx": {"delta", "f0_account", "f0_threshold", "phase"}`` — F₀'s account of the
history (:mod:`app.engine.approx`), its threshold and the phase the history is in.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from app.engine.approx import NEEDS_FINITE_DOMAIN, parse_delta_value
from app.engine.continuous.branch_and_bound import BnBSettings
from app.engine.continuous.state import ContinuousState
from app.engine.domain import parse_domain
from app.engine.errors import InvalidInput
from app.engine.filters import FilterKind
from app.engine.jsonfields import (
    as_bool,
    as_integer,
    as_object,
    as_positive_number,
    check_keys,
)
from app.engine.limits import DEFAULT_LIMITS, MAX_BUDGET, EngineLimits
from app.engine.mechanisms import parse_query
from app.engine.numerics import DECISION_MARGIN
from app.engine.pipeline import (
    ObjectSnapshot,
    candidate_bounds,
    decisions_by_filter,
    f0_filter,
    fold_history,
    history_account,
    parse_history,
)

#: The default ``options.tolerance``: the branch-and-bound's own default, one number for the
#: service, the calculator and the benchmarks.
DEFAULT_TOLERANCE = BnBSettings.tolerance
#: The largest ``options.time_limit`` (seconds), ``max_nodes`` and ``grouping`` a request may ask
#: (app/services/schemas.py's ``LossOptions`` documents these, not copies).
MAX_TIME_LIMIT = 600
MAX_NODES = 10_000_000
MAX_GROUPING = 10_000
#: The optional top-level fields of a calculator request (``domain`` and ``history`` are required).
OPTIONAL_FIELDS = ("budget", "delta", "candidate", "options")


def _options(raw: Any) -> tuple[float, BnBSettings, bool]:
    options = as_object(raw, "options")
    check_keys(
        options,
        "options",
        required=(),
        optional=("tolerance", "time_limit", "max_nodes", "grouping", "fast"),
    )
    tolerance = DEFAULT_TOLERANCE
    if "tolerance" in options:
        tolerance = as_positive_number(options["tolerance"], "options.tolerance")
    settings = BnBSettings(tolerance=tolerance)
    if "time_limit" in options:
        settings = replace(
            settings,
            time_limit=as_positive_number(
                options["time_limit"], "options.time_limit", maximum=MAX_TIME_LIMIT
            ),
        )
    if "max_nodes" in options:
        nodes = as_integer(options["max_nodes"], "options.max_nodes")
        if not 1 <= nodes <= MAX_NODES:
            raise InvalidInput("options.max_nodes", f"must be between 1 and {MAX_NODES}")
        settings = replace(settings, max_nodes=nodes)
    if "grouping" in options:
        size = as_integer(options["grouping"], "options.grouping")
        if not 1 <= size <= MAX_GROUPING:
            raise InvalidInput("options.grouping", f"must be between 1 and {MAX_GROUPING}")
        settings = replace(settings, grouping=size)
    fast = as_bool(options.get("fast", False), "options.fast")
    return tolerance, settings, fast


def compute_loss(
    request: Any, *, limits: EngineLimits = DEFAULT_LIMITS, stop_at: float | None = None
) -> dict[str, Any]:
    """Answer a loss-calculator request (see the module docstring for the shapes).

    ``options`` may also carry ``time_limit`` (seconds per search), ``max_nodes`` and
    ``grouping`` (appendix B group size; off by default) for continuous domains, and ``fast``:
    stop at a cheap sound bound when it already decides the candidate under ``budget`` (the
    per-output bounds may then be loose; used by the service's filter decisions). ``status`` is
    ``"limit"`` when ``upper - lower`` exceeds the tolerance (a search hit a limit, or the
    tolerance is below the rounding bound), and then ``reason`` says which
    (:func:`limit_reason`); the bounds are sound either way. ``stop_at``
    (wall-clock, ``time.time()``) ends every search then, whatever ``time_limit`` says
    (:attr:`BnBSettings.stop_at`).

    Raises
    ------
    InvalidInput
        For any malformed field, naming it.
    Unsupported
        For queries not yet supported on continuous domains.
    """
    obj = as_object(request, "")
    check_keys(obj, "", required=("domain", "history"), optional=OPTIONAL_FIELDS)
    domain = parse_domain(obj["domain"], "domain", limits=limits)
    tolerance, settings, fast = _options(obj.get("options", {}))
    if stop_at is not None:
        settings = replace(settings, stop_at=stop_at)
    budget = None
    if "budget" in obj:
        budget = as_positive_number(
            obj["budget"], "budget", maximum=MAX_BUDGET, minimum=limits.min_epsilon or None
        )
    if "candidate" in obj and budget is None:
        raise InvalidInput("budget", "is required when a candidate is given")
    delta = None
    if "delta" in obj:
        delta = parse_delta_value(obj["delta"], "delta")
        if budget is None:
            raise InvalidInput("budget", "is required when a delta is given")
        if not domain.is_finite:
            raise InvalidInput("delta", NEEDS_FINITE_DOMAIN)
    entries = parse_history(domain, obj["history"], limits=limits)
    state, basic = fold_history(domain, entries, bnb=settings)
    snapshot = ObjectSnapshot(
        domain,
        budget or MAX_BUDGET,
        FilterKind.BAYESIAN if delta is None else FilterKind.APPROX_BAYESIAN,
        basic,
        state,
        limits,
        delta,
        history_account(entries, budget or MAX_BUDGET, delta, domain),
    )
    loss = snapshot.loss()
    answer: dict[str, Any] = {
        "realized_loss": loss.to_json(),
        "basic_composition": float(basic),
        "status": "ok" if loss.upper - loss.lower <= tolerance else "limit",
    }
    if delta is not None and budget is not None:
        answer["approx"] = {
            "delta": delta,
            "f0_account": float(snapshot.f0_account),
            "f0_threshold": float(f0_filter(budget, delta, domain).threshold),
            "phase": snapshot.phase,
        }
    if "candidate" in obj:
        assert budget is not None  # noqa: S101 - checked above
        mechanism = parse_query(obj["candidate"], domain, "candidate", limits=limits)
        target = budget - DECISION_MARGIN if fast else None
        evaluation = candidate_bounds(snapshot, mechanism, target=target, field_path="candidate")
        gaps = [o.upper - o.lower for o in evaluation.per_output]
        if evaluation.complete and gaps and max(gaps) > tolerance:
            answer["status"] = "limit"
        answer["candidate"] = {
            **evaluation.to_json(),
            "accepted": decisions_by_filter(snapshot, evaluation),
        }
    if answer["status"] == "limit":
        answer["reason"] = limit_reason(snapshot.state, settings)
    return answer


#: What each way of stopping short means, for the answer's ``reason``.
_REASONS = {
    "time-limit": "a search reached options.time_limit ({time_limit:g} s per search)",
    "node-limit": "a search reached options.max_nodes ({max_nodes} nodes)",
    "precision-limit": "rounding-error bounds of float64 evaluations exceed the tolerance",
}


def limit_reason(state: object, settings: BnBSettings) -> str:
    """Why ``upper - lower`` exceeds the tolerance (the answer's ``reason`` with ``"limit"``).

    The searches of a continuous state record how they stopped short
    (``ContinuousState.limits_hit``); anything else is the rounding bound of the exact
    computations.
    """
    hit = sorted(state.limits_hit) if isinstance(state, ContinuousState) else []
    names = hit or ["precision-limit"]
    return "; ".join(
        _REASONS.get(name, name).format(
            time_limit=settings.time_limit, max_nodes=settings.max_nodes
        )
        for name in names
    )
