"""The query types of the JSON contract and :func:`parse_query`, which dispatches on them."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from app.engine.domain import Domain
from app.engine.errors import InvalidInput
from app.engine.jsonfields import as_object, path
from app.engine.limits import DEFAULT_LIMITS, EngineLimits
from app.engine.mechanisms.base import CandidateLosses, Mechanism, Output
from app.engine.mechanisms.matrix import MatrixMechanism
from app.engine.mechanisms.oracles import HadamardResponse, OptimizedLocalHashing
from app.engine.mechanisms.randomized_response import BinaryRR, GeneralizedRR
from app.engine.mechanisms.regression import LinearQuery, LogisticQuery
from app.engine.mechanisms.unary_encoding import UnaryEncoding

#: Builds a mechanism from ``(raw query, domain, field path, limits)``.
MechanismFactory = Callable[[Mapping[str, Any], Domain, str, EngineLimits], Mechanism]

MECHANISMS: dict[str, MechanismFactory] = {
    GeneralizedRR.kind: GeneralizedRR,
    BinaryRR.kind: BinaryRR,
    UnaryEncoding.kind: UnaryEncoding,
    MatrixMechanism.kind: MatrixMechanism,
    LinearQuery.kind: LinearQuery,
    LogisticQuery.kind: LogisticQuery,
    OptimizedLocalHashing.kind: OptimizedLocalHashing,
    HadamardResponse.kind: HadamardResponse,
}

__all__ = ["MECHANISMS", "CandidateLosses", "Mechanism", "Output", "parse_query"]


def parse_query(
    raw: Any, domain: Domain, field: str = "query", *, limits: EngineLimits = DEFAULT_LIMITS
) -> Mechanism:
    """Validate a query of the JSON contract against ``domain`` and build its mechanism.

    The query names its type in ``"mechanism"`` (one of :data:`MECHANISMS`).

    Raises
    ------
    InvalidInput
        Naming the offending field (unknown mechanism, missing/unknown fields, bad types,
        attributes not in the domain, ε out of range, a declared ε below the real one, a
        ``linear`` range the query leaves without ``truncate``...).
    """
    obj = as_object(raw, field)
    kind_field = path(field, "mechanism")
    if "mechanism" not in obj:
        raise InvalidInput(kind_field, "is required")
    kind = obj["mechanism"]
    if not isinstance(kind, str) or kind not in MECHANISMS:
        raise InvalidInput(kind_field, "must be one of " + ", ".join(MECHANISMS))
    return MECHANISMS[kind](obj, domain, field, limits)
