"""Every operation of the API (v1) as a :class:`~._core.Call` or a :class:`~._core.Pager`.

Request bodies may be given as models or as plain mappings (sent as they are, for fields a
newer server accepts); each builder serializes the body once and, for the operations that take
one, generates the ``Idempotency-Key`` once.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any
from urllib.parse import quote

import httpx
from tqdm import tqdm

from ldp_gatekeeper_client import models
from ldp_gatekeeper_client._core import (
    NDJSON,
    Call,
    Pager,
    dump,
    encode,
    new_idempotency_key,
    parser,
)
from ldp_gatekeeper_client.errors import ImportFailed

#: A query: a model (``GrrQuery(attribute="disease", epsilon=0.5)``) or its JSON as a mapping.
QueryLike = (
    models.GrrQuery
    | models.BinaryRrQuery
    | models.UnaryEncodingQuery
    | models.MatrixQuery
    | models.LinearQuery
    | models.LogisticQuery
    | Mapping[str, Any]
)
RegistrationLike = models.RegisterRequest | Mapping[str, Any]
CohortLike = models.LabelsCohort | models.IdsCohort | Mapping[str, Any]

#: The server's largest import request (objects a request).
MAX_IMPORT = 10_000


def _obj(object_id: str) -> str:
    return "/v1/objects/" + quote(object_id, safe="")


def _key(given: str | None) -> str:
    if given is not None and not given.strip(" \t"):
        raise ValueError("an Idempotency-Key must not be empty or blank")
    return given if given is not None else new_idempotency_key()


# ------------------------------------------------------------------------------------ objects
def register(body: RegistrationLike) -> Call[models.ObjectView]:
    """``POST /v1/objects`` (admin). Not retried once sent: it carries no Idempotency-Key."""
    return Call(
        "POST", "/v1/objects", parser(models.ObjectView), content=encode(dump(body)), safe=False
    )


def registration(
    object_id: str | RegistrationLike,
    domain: models.Domain | Mapping[str, Any] | None,
    value: Mapping[str, models.Scalar] | None,
    budget: float | None,
    filter_: str,
    labels: Mapping[str, str] | None,
) -> RegistrationLike:
    """The body of ``objects.register``: built from an id and fields, or given whole."""
    if not isinstance(object_id, str):
        return object_id
    if domain is None or value is None or budget is None:
        raise TypeError("register(id, ...) needs domain=, value= and budget=")
    body: dict[str, Any] = {
        "id": object_id,
        "domain": dump(domain),
        "value": dict(value),
        "budget": {"epsilon": budget},
        "filter": filter_,
    }
    if labels is not None:
        body["labels"] = dict(labels)
    return body


def get_object(object_id: str) -> Call[models.ObjectView]:
    """``GET /v1/objects/{id}``."""
    return Call("GET", _obj(object_id), parser(models.ObjectView))


def retire(object_id: str) -> Call[models.ObjectView]:
    """``DELETE /v1/objects/{id}`` (admin); retiring a retired object changes nothing."""
    return Call("DELETE", _obj(object_id), parser(models.ObjectView))


def _query_body(query: QueryLike, reuse: bool) -> bytes:
    """``{"query": ...}``, with ``"reuse": true`` when asked (left out otherwise)."""
    return encode({"query": dump(query), **({"reuse": True} if reuse else {})})


def dry_run(object_id: str, query: QueryLike, reuse: bool = False) -> Call[models.Decision]:
    """``POST /v1/objects/{id}/dry-run``: changes nothing, so always safe to retry."""
    return Call(
        "POST",
        _obj(object_id) + "/dry-run",
        parser(models.Decision),
        content=_query_body(query, reuse),
    )


def submit(
    object_id: str, query: QueryLike, idempotency_key: str | None, reuse: bool = False
) -> Call[models.SubmitResult]:
    """``POST /v1/objects/{id}/queries`` with an Idempotency-Key (given, or a new one).

    ``reuse``: a stored identical answer of the current version is returned instead (200,
    ``reused``), charging nothing.
    """
    return Call(
        "POST",
        _obj(object_id) + "/queries",
        parser(models.SubmitResult),
        content=_query_body(query, reuse),
        idempotency_key=_key(idempotency_key),
    )


def _split_history(page: models.HistoryPage) -> tuple[list[models.HistoryItem], int | None]:
    return page.items, page.next_after


def history(
    object_id: str, page_size: int, version: int | None = None
) -> Pager[models.HistoryItem]:
    """``GET /v1/objects/{id}/queries``, page after page (``after`` = the last seq).

    ``version``: that data version's history (default: the current one's).
    """
    extra = [] if version is None else [("version", str(version))]
    return Pager(
        first=0,
        page=lambda after: Call(
            "GET",
            _obj(object_id) + "/queries",
            parser(models.HistoryPage),
            params=[("limit", str(page_size)), ("after", str(after)), *extra],
        ),
        split=_split_history,
    )


def odometer(object_id: str) -> Call[models.Odometer]:
    """``GET /v1/objects/{id}/odometer``."""
    return Call("GET", _obj(object_id) + "/odometer", parser(models.Odometer))


def _split_odometer_history(
    page: models.OdometerHistory,
) -> tuple[list[models.OdometerHistory], int | None]:
    return [page], page.next_after


def odometer_history(
    object_id: str, page_size: int, version: int | None = None
) -> Pager[models.OdometerHistory]:
    """``GET /v1/objects/{id}/odometer/history``: one item per page (merged by the client)."""
    return Pager(
        first=0,
        page=lambda after: Call(
            "GET",
            _obj(object_id) + "/odometer/history",
            parser(models.OdometerHistory),
            params=[
                ("limit", str(page_size)),
                ("after", str(after)),
                *([] if version is None else [("version", str(version))]),
            ],
        ),
        split=_split_odometer_history,
    )


def merge_odometer_history(pages: Sequence[models.OdometerHistory]) -> models.OdometerHistory:
    """One :class:`~.models.OdometerHistory` of every page's points and rejections."""
    first = pages[0]
    return models.OdometerHistory(
        object_id=first.object_id,
        budget=first.budget,
        version=first.version,
        points=[point for page in pages for point in page.points],
        rejections=[rejection for page in pages for rejection in page.rejections],
        next_after=None,
    )


def odometers(
    *,
    page_size: int,
    remaining_lt: float | None,
    remaining_gt: float | None,
    include_retired: bool,
    labels: Mapping[str, str] | None,
    id_prefix: str | None = None,
    status: models.OdometerStatus | None = None,
) -> Pager[models.OdometerSummary]:
    """``GET /v1/odometers`` in id order, each page after the last id of the one before."""
    params = [("limit", str(page_size)), ("include_retired", str(include_retired).lower())]
    if remaining_lt is not None:
        params.append(("remaining_lt", repr(float(remaining_lt))))
    if remaining_gt is not None:
        params.append(("remaining_gt", repr(float(remaining_gt))))
    if id_prefix is not None:
        params.append(("id_prefix", id_prefix))
    if status is not None:
        params.append(("status", status))
    params += [("label", f"{name}:{value}") for name, value in (labels or {}).items()]

    def split(page: models.OdometerPage) -> tuple[list[models.OdometerSummary], str | None]:
        # a full page may have a next one: ask after its last id (keyset, any depth)
        return page.items, (page.items[-1].id if len(page.items) == page_size else None)

    return Pager(
        first="",
        page=lambda after: Call(
            "GET",
            "/v1/odometers",
            parser(models.OdometerPage),
            params=[*params, *([("after", after)] if after else [])],
        ),
        split=split,
    )


def odometer_totals(
    *, labels: Mapping[str, str] | None, id_prefix: str | None, include_retired: bool
) -> Call[models.OdometerTotals]:
    """``GET /v1/odometers/totals``: counts by status of the objects a list would cover."""
    params = [("include_retired", str(include_retired).lower())]
    if id_prefix is not None:
        params.append(("id_prefix", id_prefix))
    params += [("label", f"{name}:{value}") for name, value in (labels or {}).items()]
    return Call("GET", "/v1/odometers/totals", parser(models.OdometerTotals), params=params)


# ------------------------------------------------------------------------------------ imports
def import_objects(
    content: bytes, content_type: str, idempotency_key: str | None
) -> Call[models.ImportResult]:
    """``POST /v1/imports`` (admin): one all-or-nothing batch, with an Idempotency-Key."""
    return Call(
        "POST",
        "/v1/imports",
        parser(models.ImportResult),
        content=content,
        content_type=content_type,
        idempotency_key=_key(idempotency_key),
    )


def import_json(
    registrations: Sequence[RegistrationLike], idempotency_key: str | None
) -> Call[models.ImportResult]:
    """An import of ``registrations`` as a JSON body ``{"objects": [...]}``."""
    body = encode({"objects": [dump(item) for item in registrations]})
    return import_objects(body, "application/json", idempotency_key)


@dataclass(frozen=True)
class Batch:
    """Lines ``first``..``last`` (1-based, blank lines skipped) of an NDJSON file."""

    first: int
    last: int
    nbytes: int
    content: bytes


def ndjson_batches(source: IO[bytes], batch_size: int) -> Iterator[Batch]:
    """The non-blank lines of ``source``, ``batch_size`` at a time, as NDJSON bodies."""
    if not 1 <= batch_size <= MAX_IMPORT:
        raise ValueError(f"batch_size must be 1..{MAX_IMPORT}")
    lines: list[bytes] = []
    first = nbytes = number = 0
    for number, line in enumerate(source, start=1):
        nbytes += len(line)
        if not line.strip():
            continue
        if not lines:
            first = number
        lines.append(line.rstrip(b"\r\n"))
        if len(lines) == batch_size:
            yield Batch(first, number, nbytes, b"\n".join(lines) + b"\n")
            lines, nbytes = [], 0
    if lines:
        yield Batch(first, number, nbytes, b"\n".join(lines) + b"\n")


@dataclass
class Upload:
    """What the batches of an NDJSON upload did so far, shown on its progress bar.

    ``created``, and ``existing`` (an import: objects already registered identically) or the
    batches' objects replayed (versions: ``already``), named ``second`` on the bar.
    """

    bar: Any
    second: str
    created: int = 0
    existing: int = 0

    def add(self, batch: Batch, *, created: int, existing: int) -> None:
        """Count a stored batch and move the bar past its bytes."""
        self.created += created
        self.existing += existing
        self.bar.update(batch.nbytes)
        self.bar.set_postfix({"created": self.created, self.second: self.existing})

    def failed(self, batch: Batch, error: Exception) -> ImportFailed:
        """The error of a refused batch: its lines, and what the batches before it did."""
        return ImportFailed(
            f"lines {batch.first}-{batch.last}: {error}",
            first_line=batch.first,
            last_line=batch.last,
            created=self.created,
            existing=self.existing,
        )


@contextmanager
def ndjson_upload(
    path: str | os.PathLike[str], batch_size: int, *, desc: str, second: str, progress: bool
) -> Iterator[tuple[Iterator[Batch], Upload]]:
    """The file's batches (:func:`ndjson_batches`) and the :class:`Upload` counting them."""
    with (
        Path(path).open("rb") as source,
        tqdm(
            total=os.fstat(source.fileno()).st_size,
            unit="B",
            unit_scale=True,
            desc=desc,
            disable=not progress,
        ) as bar,
    ):
        yield ndjson_batches(source, batch_size), Upload(bar, second)


def ndjson_import(batch: Batch) -> Call[models.ImportResult]:
    """The import of one NDJSON batch (a new Idempotency-Key for it)."""
    return import_objects(batch.content, NDJSON, None)


# ------------------------------------------------------------------------------------ versions
def new_version(object_id: str, value: Mapping[str, models.Scalar]) -> Call[models.VersionCreated]:
    """``POST /v1/objects/{id}/versions`` (admin), not retried once sent.

    A retry could make a second version: :func:`import_versions` takes a key to retry safely.
    """
    return Call(
        "POST",
        _obj(object_id) + "/versions",
        parser(models.VersionCreated),
        content=encode({"value": dict(value)}),
        safe=False,
    )


VersionLike = models.VersionItem | Mapping[str, Any]


def import_versions(
    items: Sequence[VersionLike], idempotency_key: str | None
) -> Call[models.VersionsResult]:
    """``POST /v1/versions`` (admin): up to 10,000 new values, all or nothing, with a key."""
    return versions_body(encode({"versions": [dump(item) for item in items]}), idempotency_key)


def versions_body(content: bytes, idempotency_key: str | None) -> Call[models.VersionsResult]:
    """``POST /v1/versions`` with a JSON body already encoded."""
    return Call(
        "POST",
        "/v1/versions",
        parser(models.VersionsResult),
        content=content,
        idempotency_key=_key(idempotency_key),
    )


def ndjson_versions(batch: Batch) -> Call[models.VersionsResult]:
    """The versions of one NDJSON batch (``{"id", "value"}`` a line), keyed by its content.

    The key is the SHA-256 of the batch's line numbers and lines: the same file sent again
    replays the batches already stored instead of making second versions.
    """
    items = [json.loads(line) for line in batch.content.splitlines() if line.strip()]
    digest = hashlib.sha256(f"{batch.first}-{batch.last}:".encode() + batch.content).hexdigest()
    return versions_body(encode({"versions": items}), "client-versions:" + digest)


# ------------------------------------------------------------------------------------ surveys
def survey_body(
    name: str,
    query: QueryLike,
    *,
    labels: Mapping[str, str] | None,
    ids: Sequence[str] | None,
    cohort: CohortLike | None,
    reuse: bool = False,
) -> bytes:
    """The body of a survey and of its dry-run: exactly one of labels, ids or cohort.

    ``reuse``: members with a stored identical answer of their current version get it.
    """
    given = [c for c in (labels, ids, cohort) if c is not None]
    if len(given) != 1:
        raise ValueError("give exactly one of labels=, ids= or cohort=")
    if labels is not None:
        chosen: Any = {"labels": dict(labels)}
    elif ids is not None:
        if isinstance(ids, str):
            raise TypeError("ids= takes a sequence of object ids, not one string")
        chosen = {"ids": list(ids)}
    else:
        assert cohort is not None  # noqa: S101 - exactly one was given
        chosen = dump(cohort)
    body = {"name": name, "query": dump(query), "cohort": chosen}
    return encode({**body, "reuse": True} if reuse else body)


def create_survey(body: bytes, idempotency_key: str | None) -> Call[models.SurveyView]:
    """``POST /v1/surveys`` (analyst) with an Idempotency-Key: a retry never makes a second."""
    return Call(
        "POST",
        "/v1/surveys",
        parser(models.SurveyView),
        content=body,
        idempotency_key=_key(idempotency_key),
    )


def survey_dry_run(body: bytes) -> Call[models.SurveyDryRun]:
    """``POST /v1/surveys/dry-run``: spends nothing."""
    return Call("POST", "/v1/surveys/dry-run", parser(models.SurveyDryRun), content=body)


def get_survey(survey_id: int) -> Call[models.SurveyView]:
    """``GET /v1/surveys/{id}``."""
    return Call("GET", f"/v1/surveys/{int(survey_id)}", parser(models.SurveyView))


def cancel_survey(survey_id: int) -> Call[models.SurveyView]:
    """``DELETE /v1/surveys/{id}``; cancelling a finished survey changes nothing."""
    return Call("DELETE", f"/v1/surveys/{int(survey_id)}", parser(models.SurveyView))


def _split_surveys(page: models.SurveyPage) -> tuple[list[models.SurveyView], int | None]:
    return page.items, page.next_before


def surveys(page_size: int) -> Pager[models.SurveyView]:
    """``GET /v1/surveys``, newest first (``before`` = the previous page's ``next_before``)."""

    def page(before: int | None) -> Call[models.SurveyPage]:
        params = [("limit", str(page_size))]
        if before is not None:
            params.append(("before", str(before)))
        return Call("GET", "/v1/surveys", parser(models.SurveyPage), params=params)

    return Pager(first=None, page=page, split=_split_surveys)


def _split_responses(
    page: models.SurveyResponsePage,
) -> tuple[list[models.SurveyResponse], str | None]:
    return page.items, page.next_after


def survey_responses(survey_id: int, page_size: int) -> Pager[models.SurveyResponse]:
    """``GET /v1/surveys/{id}/responses`` in object-id order."""

    def page(after: str | None) -> Call[models.SurveyResponsePage]:
        params = [("limit", str(page_size))]
        if after is not None:
            params.append(("after", after))
        return Call(
            "GET",
            f"/v1/surveys/{int(survey_id)}/responses",
            parser(models.SurveyResponsePage),
            params=params,
        )

    return Pager(first=None, page=page, split=_split_responses)


# ------------------------------------------------------------------------- keys, audit, misc
def create_key(role: str, label: str | None, project: str | None = None) -> Call[models.CreatedKey]:
    """``POST /v1/keys`` (admin); not retried once sent (a retry would make a second key)."""
    body: dict[str, Any] = {"role": role}
    if label is not None:
        body["label"] = label
    if project is not None:
        body["project"] = project
    return Call("POST", "/v1/keys", parser(models.CreatedKey), content=encode(body), safe=False)


# ------------------------------------------------------------------------------------ projects
def _project(name: str) -> str:
    return "/v1/projects/" + quote(name, safe="")


def create_project(name: str, labels: Mapping[str, str], quota: float) -> Call[models.ProjectView]:
    """``POST /v1/projects`` (admin); not retried once sent (a name is created once: 409)."""
    body = {"name": name, "scope": {"labels": dict(labels)}, "quota": {"epsilon": quota}}
    return Call(
        "POST", "/v1/projects", parser(models.ProjectView), content=encode(body), safe=False
    )


def get_project(name: str) -> Call[models.ProjectView]:
    """``GET /v1/projects/{name}`` (admin)."""
    return Call("GET", _project(name), parser(models.ProjectView))


def set_quota(name: str, quota: float) -> Call[models.ProjectView]:
    """``PATCH /v1/projects/{name}`` (admin): a new quota; safe to retry (the same result)."""
    body = {"quota": {"epsilon": quota}}
    return Call("PATCH", _project(name), parser(models.ProjectView), content=encode(body))


def _no_content(response: httpx.Response) -> None:
    """A ``204 No Content`` answer: nothing to parse."""


def delete_project(name: str) -> Call[None]:
    """``DELETE /v1/projects/{name}`` (admin): its keys are revoked; not retried once sent."""
    return Call("DELETE", _project(name), _no_content, safe=False)


def _split_projects(page: models.ProjectPage) -> tuple[list[models.ProjectView], int | None]:
    return page.items, page.next_after


def projects(page_size: int) -> Pager[models.ProjectView]:
    """``GET /v1/projects`` (admin), in creation order."""
    return Pager(
        first=0,
        page=lambda after: Call(
            "GET",
            "/v1/projects",
            parser(models.ProjectPage),
            params=[("limit", str(page_size)), ("after", str(after))],
        ),
        split=_split_projects,
    )


def _split_keys(page: models.KeyPage) -> tuple[list[models.KeyInfo], int | None]:
    return page.items, page.next_after


def keys(page_size: int) -> Pager[models.KeyInfo]:
    """``GET /v1/keys`` (admin), by id."""
    return Pager(
        first=0,
        page=lambda after: Call(
            "GET",
            "/v1/keys",
            parser(models.KeyPage),
            params=[("limit", str(page_size)), ("after", str(after))],
        ),
        split=_split_keys,
    )


def revoke_key(key_id: int) -> Call[models.RevokedKey]:
    """``DELETE /v1/keys/{id}`` (admin)."""
    return Call("DELETE", f"/v1/keys/{int(key_id)}", parser(models.RevokedKey), safe=False)


def _split_audit(page: models.AuditPage) -> tuple[list[models.AuditEvent], int | None]:
    return page.events, page.next_after


def audit(object_id: str | None, kind: str | None, page_size: int) -> Pager[models.AuditEvent]:
    """``GET /v1/audit`` (admin), oldest first."""
    params = [("limit", str(page_size))]
    if object_id is not None:
        params.append(("object_id", object_id))
    if kind is not None:
        params.append(("kind", kind))
    return Pager(
        first=0,
        page=lambda after: Call(
            "GET", "/v1/audit", parser(models.AuditPage), params=[*params, ("after", str(after))]
        ),
        split=_split_audit,
    )


def _events(response: httpx.Response) -> list[models.AuditEvent]:
    return [models.AuditEvent.model_validate_json(line) for line in response.text.splitlines()]


def audit_export(after: int | None, since: str | None) -> Call[list[models.AuditEvent]]:
    """``GET /v1/audit/export`` (admin): the log as NDJSON, oldest first, parsed line by line."""
    params = []
    if after is not None:
        params.append(("after", str(int(after))))
    if since is not None:
        params.append(("since", since))
    return Call("GET", "/v1/audit/export", _events, params=params)


def loss(body: models.LossRequest | Mapping[str, Any]) -> Call[models.LossResult]:
    """``POST /v1/loss``: the stateless calculator."""
    return Call("POST", "/v1/loss", parser(models.LossResult), content=encode(dump(body)))


def whoami() -> Call[models.WhoAmI]:
    """``GET /v1/whoami``."""
    return Call("GET", "/v1/whoami", parser(models.WhoAmI))


def health() -> Call[models.Health]:
    """``GET /healthz``."""
    return Call("GET", "/healthz", parser(models.Health))


def ready() -> Call[models.Ready]:
    """``GET /readyz``."""
    return Call("GET", "/readyz", parser(models.Ready))


def _info_version(response: httpx.Response) -> str:
    return str(json.loads(response.content)["info"]["version"])


def api_version() -> Call[str]:
    """The server's API version: ``info.version`` of ``/openapi.json``."""
    return Call("GET", "/openapi.json", _info_version)
