"""Python client of ldp-gatekeeper: typed, retrying safely, surveys with progress.

>>> from ldp_gatekeeper_client import Client, GrrQuery
>>> with Client("http://127.0.0.1:8000", api_key="...") as gk:  # doctest: +SKIP
...     result = gk.objects.submit("patient-17", GrrQuery(attribute="disease", epsilon=0.5))

See README.md of this package for the quick start.
"""

from ldp_gatekeeper_client._async import AsyncClient, AsyncSurveyRun
from ldp_gatekeeper_client._core import DEFAULT_RETRY, NO_RETRY, RetryPolicy
from ldp_gatekeeper_client._sync import Client, SurveyRun
from ldp_gatekeeper_client._version import __version__
from ldp_gatekeeper_client.errors import (
    AlreadyExists,
    ApiError,
    BadRequest,
    BudgetExhausted,
    Conflict,
    ConnectionFailed,
    Forbidden,
    GatekeeperError,
    IdempotencyKeyReused,
    ImportFailed,
    InvalidCohort,
    LastAdminKey,
    LifetimeExhausted,
    NotFound,
    ObjectRetired,
    PayloadTooLarge,
    QuotaExhausted,
    RateLimited,
    ServerBusy,
    ServerError,
    SurveyFailed,
    Unauthorized,
    ValidationFailed,
    WaitTimeout,
)
from ldp_gatekeeper_client.models import (
    BinaryRrQuery,
    CategoricalAttribute,
    Domain,
    GrrQuery,
    IdsCohort,
    IntegerAttribute,
    LabelsCohort,
    LinearQuery,
    LogisticQuery,
    MatrixQuery,
    Predicate,
    RealAttribute,
    RegisterRequest,
    UnaryEncodingQuery,
)

__all__ = [
    "DEFAULT_RETRY",
    "NO_RETRY",
    "AlreadyExists",
    "ApiError",
    "AsyncClient",
    "AsyncSurveyRun",
    "BadRequest",
    "BinaryRrQuery",
    "BudgetExhausted",
    "CategoricalAttribute",
    "Client",
    "Conflict",
    "ConnectionFailed",
    "Domain",
    "Forbidden",
    "GatekeeperError",
    "GrrQuery",
    "IdempotencyKeyReused",
    "IdsCohort",
    "ImportFailed",
    "IntegerAttribute",
    "InvalidCohort",
    "LabelsCohort",
    "LastAdminKey",
    "LifetimeExhausted",
    "LinearQuery",
    "LogisticQuery",
    "MatrixQuery",
    "NotFound",
    "ObjectRetired",
    "PayloadTooLarge",
    "Predicate",
    "QuotaExhausted",
    "RateLimited",
    "RealAttribute",
    "RegisterRequest",
    "RetryPolicy",
    "ServerBusy",
    "ServerError",
    "SurveyFailed",
    "SurveyRun",
    "UnaryEncodingQuery",
    "Unauthorized",
    "ValidationFailed",
    "WaitTimeout",
    "__version__",
]
