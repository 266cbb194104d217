"""Canonical keys for bound computations.

Two requests get the same key exactly when they describe the same computation: the domain and
every query are re-serialised from their parsed, canonical form (so key order, ``1`` vs ``1.0``
and defaulted fields do not matter), and the history is a *multiset*: realized loss does not
depend on the order of the queries, so the entries are sorted.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from app.engine.calculator import OPTIONAL_FIELDS as CALCULATOR_OPTIONAL
from app.engine.domain import parse_domain
from app.engine.jsonfields import as_list, as_object, check_keys, path
from app.engine.limits import DEFAULT_LIMITS, HISTORY_LIMITS
from app.engine.mechanisms import parse_query

#: v2: exact ties of randomized-response histories and ``delta`` (issue #15) changed answers.
KEY_VERSION = "v2"


def _canonical(value: Any) -> str:
    # allow_nan: malformed numbers must reach the calculator's validation (422), not crash here
    return json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=True, default=repr)


def request_key(request: Mapping[str, Any]) -> str:
    """SHA-256 hex key of a calculator request (raises ``InvalidInput`` on malformed input)."""
    obj = as_object(request, "")
    # the same fields as the calculator (app.engine.calculator.compute): a request with an unknown
    # field must be a 422 even when the rest of it matches a cached answer
    check_keys(obj, "", required=("domain", "history"), optional=CALCULATOR_OPTIONAL)
    domain = parse_domain(obj.get("domain"), "domain")
    entries = []
    history = as_list(obj.get("history"), "history", max_len=DEFAULT_LIMITS.max_history)
    for i, item in enumerate(history):
        entry = as_object(item, path("history", i))
        check_keys(entry, path("history", i), required=("query", "output"))
        mech = parse_query(
            entry.get("query"), domain, path(path("history", i), "query"), limits=HISTORY_LIMITS
        )
        output = mech.parse_output(entry.get("output"), path(path("history", i), "output"))
        entries.append(_canonical([mech.to_json(), mech.output_json(output)]))
    entries.sort()
    candidate = None
    if "candidate" in obj:
        candidate = parse_query(obj["candidate"], domain, "candidate").to_json()
    material = {
        "version": KEY_VERSION,
        "domain": domain.to_json(),
        "history": entries,
        "candidate": candidate,
        "budget": obj.get("budget"),
        "delta": obj.get("delta"),
        "options": obj.get("options", {}),
    }
    return hashlib.sha256(_canonical(material).encode()).hexdigest()


def call_key(fn: Any, snapshot: Any, args: tuple[Any, ...], bnb: Any) -> str:
    """SHA-256 hex key of a typed engine call ``fn(snapshot, *args)`` with searches ``bnb``.

    Two calls get the same key exactly when they compute the same thing from the same public
    data: the function (and its bound keywords), the snapshot's domain, budget, filter, exact
    ``Σ ε``, its state's terms in history order (their order fixes the grouping of appendix B)
    and known bounds, the arguments (a mechanism by its canonical JSON) and the search settings
    except their wall-clock end. Cached bounds a snapshot carries are left out: they do not
    change the answer. Never reads a value (a snapshot holds none).
    """
    import pickle
    from dataclasses import replace

    keywords: dict[str, Any] = dict(getattr(fn, "keywords", {}) or {})
    target = getattr(fn, "func", fn)
    state = snapshot.state
    terms = getattr(state, "_terms", None)
    if terms is not None:
        fingerprint: Any = (
            [(t.theta.tobytes(), t.c, pickle.dumps(t.curve), t.excess) for t in terms],
            getattr(state, "_decided", None),
        )
    else:
        fingerprint = pickle.dumps(state)
    material = (
        KEY_VERSION,
        f"{target.__module__}.{target.__qualname__}",
        sorted(keywords.items()),
        _canonical(snapshot.domain.to_json()),
        snapshot.budget,
        str(snapshot.filter),
        str(snapshot.basic_total),
        repr(snapshot.limits),
        fingerprint,
        [_canonical(a.to_json()) if hasattr(a, "to_json") else repr(a) for a in args],
        repr(replace(bnb, stop_at=None)),
    )
    return hashlib.sha256(pickle.dumps(material, protocol=5)).hexdigest()
