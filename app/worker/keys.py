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
