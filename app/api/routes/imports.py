"""``POST /v1/imports``: bulk registration (JSON or NDJSON), all-or-nothing per request."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header, Request, Response, status

from app.api import examples
from app.api.deps import AdminDep, RawBody, RuntimeDep, in_thread, parse_json
from app.api.openapi import WITH_BODY, answers, body_doc, problems
from app.engine.errors import InvalidInput
from app.engine.limits import EngineLimits
from app.services import imports as import_service
from app.services import schemas
from app.services import versions as version_service
from app.services.bodies import validated
from app.services.errors import BadHeader, BadJson
from app.services.objects import DomainCache, Registration

router = APIRouter(tags=["objects"])

NDJSON = "application/x-ndjson"


def ndjson_items(raw: bytes) -> list[Any]:
    """The registrations of an NDJSON body, one a line, parsed (each validated later).

    A line that is not JSON is a 400 naming its index (``objects[i]``, blank lines skipped and
    not counted).
    """
    items: list[Any] = []
    for line in raw.splitlines():
        if not line.strip():
            continue
        if len(items) >= schemas.MAX_IMPORT:
            raise InvalidInput("objects", f"at most {schemas.MAX_IMPORT} objects a request")
        try:
            items.append(parse_json(line))
        except BadJson as exc:
            raise BadJson(f"objects[{len(items)}] (an NDJSON line): {exc.detail}") from None
    return items


@dataclass(frozen=True)
class BulkBody:
    """A bulk request's raw body, its Idempotency-Key and the fingerprint a replay must match."""

    raw: bytes
    idempotency_key: str | None
    #: SHA-256 of the raw bytes (an NDJSON body is no JSON document to canonicalise).
    fingerprint: str


async def bulk_body(
    raw: RawBody,
    idempotency_key: Annotated[
        str | None,
        Header(
            max_length=255,
            description="A retry with the same key and body returns the stored answer "
            "(header Idempotent-Replayed: true) and changes nothing; without a key each "
            "request is a new one",
            json_schema_extra={"minLength": 1, "pattern": "[^ \t]"},
        ),
    ] = None,
) -> BulkBody:
    """The body of ``POST /v1/imports`` and ``/v1/versions``: a blank key or body is refused."""
    if idempotency_key is not None and not idempotency_key.strip(" \t"):
        raise BadHeader("Idempotency-Key", "must not be empty")
    if not raw.strip():
        raise InvalidInput("body", "is required")
    return BulkBody(raw, idempotency_key, hashlib.sha256(raw).hexdigest())


BulkDep = Annotated[BulkBody, Depends(bulk_body)]


def parse_import(raw: bytes, content_type: str, limits: EngineLimits) -> list[Registration]:
    """The registrations of an import body, ``{"objects": [...]}`` or NDJSON lines.

    The JSON document is a :class:`schemas.ImportRequest`; each NDJSON line a
    :class:`schemas.RegisterRequest`, validated line by line (the first bad line is reported).
    """
    if content_type.split(";")[0].strip().lower() == NDJSON:
        return import_service.parse_items(ndjson_items(raw), limits)
    domains = DomainCache()  # a domain repeated by the items is validated and parsed once
    body = validated(schemas.ImportRequest, parse_json(raw), context=domains.context)
    return import_service.registrations(body.objects, limits, domains=domains)


@router.post(
    "/v1/imports",
    status_code=status.HTTP_200_OK,
    **answers(schemas.ImportResult),
    # NDJSON bodies are accepted too (Content-Type: application/x-ndjson, one registration a
    # line) but not declared as a content type: a JSON Schema cannot say "each line is JSON"
    openapi_extra=body_doc(schemas.ImportRequest, examples.IMPORT),
    responses=problems(
        *WITH_BODY,
        409,
        s409="already-exists: an id is registered with a different registration (nothing stored)",
        s503="busy: concurrent imports of the same ids, or the database is unavailable",
    ),
)
async def import_objects(
    runtime: RuntimeDep,
    caller: AdminDep,
    request: Request,
    response: Response,
    body: BulkDep,
) -> schemas.ImportResult:
    """Register up to 10,000 objects (admin), all or nothing.

    The body is `{"objects": [registration, ...]}`, or NDJSON (`Content-Type:
    application/x-ndjson`, one registration a line). An id already registered identically
    counts as existing; registered differently, it is a 409 and nothing is stored.
    """
    # the body as raw bytes (NDJSON is no JSON document; the fingerprint is of the bytes), read
    # like typed_body's in a worker thread: 10,000 registrations take a while to validate
    registrations = await in_thread(
        runtime, parse_import, body.raw, request.headers.get("content-type", ""), runtime.limits
    )
    result = await in_thread(
        runtime,
        import_service.import_objects,
        engine=runtime.engine,
        registrations=registrations,
        fingerprint=body.fingerprint,
        idempotency_key=body.idempotency_key,
        actor_key_id=caller.key_id,
    )
    if result.replayed:
        response.headers["Idempotent-Replayed"] = "true"
    return result.body


@router.post(
    "/v1/versions",
    status_code=status.HTTP_200_OK,
    **answers(schemas.VersionsResult),
    openapi_extra=body_doc(schemas.VersionsRequest, examples.VERSIONS),
    responses=problems(
        *WITH_BODY,
        404,
        409,
        s404="not-found: an id names no object (the detail names versions[i].id; nothing stored)",
        s409="object-retired: a retired object takes no new version (nothing stored)",
        s503="busy: concurrent writers on the same objects, or the database is unavailable",
    ),
)
async def import_versions(
    runtime: RuntimeDep,
    caller: AdminDep,
    response: Response,
    body: BulkDep,
) -> schemas.VersionsResult:
    """New values for up to 10,000 objects (admin), all or nothing.

    The body is `{"versions": [{"id", "value"}, ...]}`. Each object's current version is
    closed (its history kept) and the new value answers from now on under a fresh per-version
    filter. A bad item is a 422 naming `versions[i].field`, never echoing a value.
    """
    items = version_service.parse_bulk(parse_json(body.raw))
    replayed: list[bool] = []

    def run() -> schemas.VersionsResult:
        return version_service.create_versions(
            engine=runtime.engine,
            locks=runtime.locks,
            items=items,
            actor_key_id=caller.key_id,
            bulk=True,
            fingerprint=body.fingerprint,
            idempotency_key=body.idempotency_key,
            replayed=replayed,
        )

    answer = await in_thread(runtime, run)
    if replayed:
        response.headers["Idempotent-Replayed"] = "true"
    return answer
