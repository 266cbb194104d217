"""Errors of the service layer; the API renders each as one problem+json shape."""

from __future__ import annotations

from typing import Any


class ServiceError(Exception):
    """A failure with an HTTP status, a problem type and a human title."""

    status = 500
    type = "internal-error"
    title = "Internal error"

    def __init__(self, detail: str, **extra: Any) -> None:
        super().__init__(detail)
        self.detail = detail
        self.extra = extra


class BadJson(ServiceError):
    """The request body is not JSON."""

    status, type, title = 400, "invalid-json", "Invalid JSON"


class BadHeader(ServiceError):
    """A request header is malformed (for example an empty ``Idempotency-Key``)."""

    status, type, title = 400, "invalid-header", "Invalid header"

    def __init__(self, header: str, message: str) -> None:
        super().__init__(
            f"header {header} {message}", errors=[{"field": header, "message": message}]
        )


class PayloadTooLarge(ServiceError):
    """The request body exceeds the configured limit."""

    status, type, title = 413, "payload-too-large", "Payload too large"


class NotFound(ServiceError):
    """The object (or key) does not exist."""

    status, type, title = 404, "not-found", "Not found"


class AlreadyExists(ServiceError):
    """An object with that id exists."""

    status, type, title = 409, "already-exists", "Already exists"


class Retired(ServiceError):
    """The object was retired; its history is kept but it answers no queries."""

    status, type, title = 409, "object-retired", "Object retired"


class BudgetExhausted(ServiceError):
    """The filter rejected the query."""

    status, type, title = 409, "budget-exhausted", "Budget exhausted"


class LifetimeExhausted(BudgetExhausted):
    """The version's filter accepted the query but the object's lifetime budget refused it."""

    status, type, title = 409, "lifetime-exhausted", "Lifetime budget exhausted"


class QuotaExhausted(BudgetExhausted):
    """The project's quota refused the query (the object's own filters accepted it)."""

    status, type, title = 409, "quota-exhausted", "Quota exhausted"


def refusal_error(refusal: str) -> type[BudgetExhausted]:
    """The error of a refused query by its problem type (``budget-exhausted`` by default)."""
    for error in (LifetimeExhausted, QuotaExhausted):
        if refusal == error.type:
            return error
    return BudgetExhausted


class LastAdminKey(ServiceError):
    """Revoking this key would leave no active admin key (nobody could manage keys)."""

    status, type, title = 409, "last-admin-key", "Last admin key"


class IdempotencyMismatch(ServiceError):
    """An Idempotency-Key was reused with a different request body."""

    status, type, title = 422, "idempotency-key-reused", "Idempotency key reused"


class Busy(ServiceError):
    """The object is being worked on elsewhere for too long; retry later."""

    status, type, title = 503, "busy", "Object busy"


class Unauthorized(ServiceError):
    """Missing or invalid API key."""

    status, type, title = 401, "unauthorized", "Unauthorized"


class Forbidden(ServiceError):
    """The key's role may not do this."""

    status, type, title = 403, "forbidden", "Forbidden"
