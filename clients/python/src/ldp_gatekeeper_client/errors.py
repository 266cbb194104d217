"""Typed errors: every ``application/problem+json`` answer of the server as an exception.

The server names each problem by a ``type`` slug (``budget-exhausted``, ``validation-error``,
``rate-limited``, ``busy``, ...) and never echoes a submitted value; :func:`error_from_response`
picks the most specific class by ``type``, then by status::

    GatekeeperError
    ├── ConnectionFailed                 the server could not be reached (after the retries)
    └── ApiError                         any problem answer: status, type, detail, problem
        ├── BadRequest (400)             invalid JSON, an empty Idempotency-Key header
        ├── Unauthorized (401)           missing, unknown or revoked API key
        ├── Forbidden (403)              the key's role may not do this
        ├── NotFound (404)               no such object, survey or key
        ├── Conflict (409)
        │   ├── BudgetExhausted          the filter refused: realized_loss, per_output bounds
        │   │   └── QuotaExhausted       the project's quota refused (its own sub-history)
        │   ├── AlreadyExists            an object with this id exists (registered differently)
        │   ├── ObjectRetired            the object answers no queries
        │   └── LastAdminKey             revoking it would leave no admin key
        ├── PayloadTooLarge (413)
        ├── ValidationFailed (422)       ``errors``: field paths and messages, never values
        │   └── InvalidCohort            ``unknown_ids``: cohort ids that are not registered
        ├── IdempotencyKeyReused (422)   the key was used with another body or by another key
        ├── RateLimited (429)            ``retry_after`` seconds
        └── ServerError (5xx)
            └── ServerBusy (503)         object busy or database unavailable; ``retry_after``
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any

import httpx

from ldp_gatekeeper_client.models import FieldError, LossBounds, OutputLoss, SurveyView


class GatekeeperError(Exception):
    """Base class of every error of this client."""


class ConnectionFailed(GatekeeperError):
    """The server could not be reached or dropped the connection, after every retry."""


class ApiError(GatekeeperError):
    """The server answered with an error (a problem+json document).

    Attributes
    ----------
    status:
        The HTTP status code.
    type:
        The problem's ``type`` slug (``budget-exhausted``, ``not-found``, ...).
    title, detail:
        Human-readable summary and explanation (never a submitted value).
    problem:
        The whole problem document, including members beyond the standard ones.
    request_id:
        The server's ``X-Request-Id`` of the request, for its logs.
    """

    def __init__(self, response: httpx.Response, problem: dict[str, Any]) -> None:
        self.status: int = response.status_code
        self.type: str = str(problem.get("type", "about:blank"))
        self.title: str = str(problem.get("title", response.reason_phrase))
        self.detail: str = str(problem.get("detail", ""))
        self.problem: dict[str, Any] = problem
        self.request_id: str | None = response.headers.get("x-request-id")
        self.replayed: bool = response.headers.get("idempotent-replayed") == "true"
        super().__init__(f"{self.status} {self.type}: {self.detail}")


class BadRequest(ApiError):
    """400: the body is not JSON, or a header is malformed."""


class Unauthorized(ApiError):
    """401: the API key is missing, unknown or revoked."""


class Forbidden(ApiError):
    """403: the key's role may not do this."""


class NotFound(ApiError):
    """404: no such object, survey or key."""


class Conflict(ApiError):
    """409: the request conflicts with the stored state."""


class BudgetExhausted(Conflict):
    """409 ``budget-exhausted``: the object's filter refused the query; nothing was spent.

    Attributes
    ----------
    realized_loss:
        Certified bounds of the object's realized loss now.
    worst_case_after:
        The largest upper bound of the loss over the query's possible outputs.
    per_output:
        The loss bounds after each possible output (the reason for the refusal).
    """

    def __init__(self, response: httpx.Response, problem: dict[str, Any]) -> None:
        super().__init__(response, problem)
        loss = problem.get("realized_loss")
        self.realized_loss: LossBounds | None = (
            LossBounds.model_validate(loss) if isinstance(loss, dict) else None
        )
        worst = problem.get("worst_case_after")
        self.worst_case_after: float | None = float(worst) if worst is not None else None
        self.per_output: list[OutputLoss] = [
            OutputLoss.model_validate(item) for item in problem.get("per_output") or []
        ]


class LifetimeExhausted(BudgetExhausted):
    """409 ``lifetime-exhausted``: the object's lifetime budget refused the query.

    The version's filter accepted it, but an output could take the loss summed over the
    object's data versions past its lifetime budget. A :class:`BudgetExhausted` (nothing was
    spent), with the same attributes.
    """


class AlreadyExists(Conflict):
    """409 ``already-exists``: an object with this id is registered (differently)."""


class ObjectRetired(Conflict):
    """409 ``object-retired``: the object was retired and answers no queries."""


class LastAdminKey(Conflict):
    """409 ``last-admin-key``: revoking this key would leave no active admin key."""


class PayloadTooLarge(ApiError):
    """413: the body exceeds the server's MAX_BODY_BYTES."""


class ValidationFailed(ApiError):
    """422: invalid input; ``errors`` names each field (``query.epsilon``) and what is wrong."""

    def __init__(self, response: httpx.Response, problem: dict[str, Any]) -> None:
        super().__init__(response, problem)
        self.errors: list[FieldError] = [
            FieldError.model_validate(item)
            for item in problem.get("errors") or []
            if isinstance(item, dict)
        ]

    @property
    def fields(self) -> list[str]:
        """The paths of the invalid fields, in the server's order."""
        return [error.field for error in self.errors]


class InvalidCohort(ValidationFailed):
    """422 ``invalid-cohort``: the cohort matches no object, names unknown ids, or is too big."""

    def __init__(self, response: httpx.Response, problem: dict[str, Any]) -> None:
        super().__init__(response, problem)
        self.unknown_ids: list[str] = [str(i) for i in problem.get("unknown_ids") or []]


class IdempotencyKeyReused(ApiError):
    """422 ``idempotency-key-reused``: the key was sent before with another body or API key."""


class RateLimited(ApiError):
    """429: the API key is over its rate limit; ``retry_after`` seconds until it is not."""

    def __init__(self, response: httpx.Response, problem: dict[str, Any]) -> None:
        super().__init__(response, problem)
        self.retry_after: float | None = retry_after_seconds(response)


class ServerError(ApiError):
    """5xx: the server failed to answer this request."""


class ServerBusy(ServerError):
    """503: the object is busy or the database unavailable; ``retry_after`` seconds."""

    def __init__(self, response: httpx.Response, problem: dict[str, Any]) -> None:
        super().__init__(response, problem)
        self.retry_after: float | None = retry_after_seconds(response)


class QuotaExhausted(BudgetExhausted):
    """409 ``quota-exhausted``: the project's quota refused the query; nothing was spent.

    The realized loss of the project's own sub-history would pass its quota; the object's own
    filter would have accepted. The loss fields are the sub-history's.
    """


_BY_TYPE: dict[str, type[ApiError]] = {
    "budget-exhausted": BudgetExhausted,
    "lifetime-exhausted": LifetimeExhausted,
    "quota-exhausted": QuotaExhausted,
    "already-exists": AlreadyExists,
    "object-retired": ObjectRetired,
    "last-admin-key": LastAdminKey,
    "invalid-cohort": InvalidCohort,
    "idempotency-key-reused": IdempotencyKeyReused,
    "rate-limited": RateLimited,
}
_BY_STATUS: dict[int, type[ApiError]] = {
    400: BadRequest,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    413: PayloadTooLarge,
    422: ValidationFailed,
    429: RateLimited,
    503: ServerBusy,
}


def retry_after_seconds(response: httpx.Response) -> float | None:
    """The ``Retry-After`` header in seconds (delta-seconds or an HTTP date), or None."""
    value = response.headers.get("retry-after")
    if value is None:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - datetime.now(UTC)).total_seconds())


def _problem_of(response: httpx.Response) -> dict[str, Any]:
    """The problem document of an error answer (a stand-in when the body is not one)."""
    try:
        body = json.loads(response.content)
    except ValueError:
        body = None
    if isinstance(body, dict):
        return body
    return {
        "type": "http-error",
        "title": response.reason_phrase,
        "status": response.status_code,
        "detail": f"HTTP {response.status_code} without a problem document",
    }


def error_from_response(response: httpx.Response) -> ApiError:
    """The typed error of an error answer (status >= 400)."""
    problem = _problem_of(response)
    kind = _BY_TYPE.get(str(problem.get("type"))) or _BY_STATUS.get(response.status_code)
    if kind is None:
        kind = ServerError if response.status_code >= 500 else ApiError
    return kind(response, problem)


class ImportFailed(GatekeeperError):
    """A batch of an NDJSON import was refused; the batches before it are stored.

    Importing the same file again resumes: objects already registered identically are counted
    as existing, not registered twice. ``__cause__`` is the server's error (for example a
    :class:`ValidationFailed` naming ``objects[i].field``, ``i`` counted within the batch).

    Attributes
    ----------
    first_line, last_line:
        The refused batch's lines in the file (1-based).
    created, existing:
        What the stored batches before it did.
    """

    def __init__(
        self, message: str, *, first_line: int, last_line: int, created: int, existing: int
    ) -> None:
        super().__init__(message)
        self.first_line = first_line
        self.last_line = last_line
        self.created = created
        self.existing = existing


class SurveyFailed(GatekeeperError):
    """A survey waited for ended with status ``failed``; ``survey`` is its last view."""

    def __init__(self, survey: SurveyView) -> None:
        super().__init__(f"survey {survey.id} failed")
        self.survey = survey


class WaitTimeout(GatekeeperError, TimeoutError):
    """A survey was still running when the wait's timeout ran out; ``survey``: its last view."""

    def __init__(self, survey: SurveyView, timeout: float) -> None:
        super().__init__(f"survey {survey.id} still {survey.status} after {timeout:g} s")
        self.survey = survey
