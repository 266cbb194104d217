"""The stateless loss calculator of DESIGN.md (``POST /v1/loss`` and ``gatekeeper loss``).

Request::

    {"domain": {...}, "history": [{"query": {...}, "output": ...}, ...], "budget": 4.0,
     "candidate": {...optional query...}, "options": {"tolerance": 1e-4}}

Answer::

    {"realized_loss": {"lower", "upper"}, "basic_composition": Σε, "status": "ok",
     "candidate": {"per_output": [{"output", "lower", "upper"}], "worst_case_upper",
                   "accepted": {"bayesian", "simplified", "basic"}, ...}}

``candidate`` appears only when one was sent, and then ``budget`` is required.
"""

from __future__ import annotations

from typing import Any

from app.engine.domain import Domain, parse_domain
from app.engine.errors import InvalidInput, Unsupported
from app.engine.filters import FilterKind, decide, evaluate_candidate
from app.engine.jsonfields import as_list, as_object, as_positive_number, check_keys, path
from app.engine.likelihood import LikelihoodState
from app.engine.limits import DEFAULT_LIMITS, EngineLimits
from app.engine.mechanisms import parse_query

DEFAULT_TOLERANCE = 1e-4
MAX_BUDGET = 10_000.0


def replay_history(
    domain: Domain,
    raw_history: Any,
    field: str = "history",
    *,
    limits: EngineLimits = DEFAULT_LIMITS,
) -> tuple[LikelihoodState, Any]:
    """Validate a history and fold it into a likelihood state.

    Returns the state and the exact basic-composition total (a ``Fraction``).
    """
    from fractions import Fraction

    items = as_list(raw_history, field, max_len=limits.max_history)
    state = LikelihoodState(domain)
    basic = Fraction(0)
    for i, item in enumerate(items):
        item_field = path(field, i)
        obj = as_object(item, item_field)
        check_keys(obj, item_field, required=("query", "output"))
        mechanism = parse_query(obj["query"], domain, path(item_field, "query"), limits=limits)
        output = mechanism.parse_output(obj["output"], path(item_field, "output"))
        state.apply(mechanism.term(output))
        basic += mechanism.epsilon_exact
    return state, basic


def compute_loss(request: Any, *, limits: EngineLimits = DEFAULT_LIMITS) -> dict[str, Any]:
    """Answer a loss-calculator request (see the module docstring for the shapes).

    Raises
    ------
    InvalidInput
        For any malformed field, naming it.
    Unsupported
        For continuous domains, until the continuous-domain bounds land.
    """
    obj = as_object(request, "")
    check_keys(obj, "", required=("domain", "history"), optional=("budget", "candidate", "options"))
    domain = parse_domain(obj["domain"], "domain", limits=limits)
    options = as_object(obj.get("options", {}), "options")
    check_keys(options, "options", required=(), optional=("tolerance",))
    tolerance = DEFAULT_TOLERANCE
    if "tolerance" in options:
        tolerance = as_positive_number(options["tolerance"], "options.tolerance")
    budget = None
    if "budget" in obj:
        budget = as_positive_number(obj["budget"], "budget", maximum=MAX_BUDGET)
    if not domain.is_finite:
        raise Unsupported(
            "domain", "realized loss over continuous domains (real attributes) is not supported yet"
        )
    state, basic = replay_history(domain, obj["history"], limits=limits)
    loss = state.loss(basic)
    answer: dict[str, Any] = {
        "realized_loss": loss.to_json(),
        "basic_composition": float(basic),
        # finite domains are exact up to rounding; a tolerance below the rounding bound is a limit
        "status": "ok" if loss.upper - loss.lower <= tolerance else "limit",
    }
    if "candidate" in obj:
        if budget is None:
            raise InvalidInput("budget", "is required when a candidate is given")
        mechanism = parse_query(obj["candidate"], domain, "candidate", limits=limits)
        evaluation = evaluate_candidate(
            state, mechanism, max_listed=limits.max_listed_outputs, basic_total=basic
        )
        accepted = {
            kind.value: decide(
                kind=kind,
                budget=budget,
                loss_now=state.loss(basic),
                basic_total=basic,
                candidate=evaluation,
            ).accepted
            for kind in FilterKind
        }
        answer["candidate"] = {**evaluation.to_json(), "accepted": accepted}
    return answer
