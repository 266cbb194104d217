"""Bulk registration: up to :data:`MAX_IMPORT` objects in one all-or-nothing transaction.

Every item is validated first (``objects[i].field`` names the first bad one; nothing is stored).
Ids already registered are compared with the item: an identical registration (domain, value,
budget, filter, labels) counts as ``existing`` — so an interrupted import can simply be sent
again — and a different one is a 409 naming the item. New objects are inserted with one
multi-row statement; one ``objects.imported`` audit event records the request. With an
``Idempotency-Key`` the answer is stored and a retry (same key, same body) gets it back.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

import orjson

from app import crypto
from app.engine.errors import InvalidInput
from app.engine.limits import EngineLimits
from app.services import audit, schemas
from app.services.errors import AlreadyExists, Busy, IdempotencyMismatch
from app.services.objects import (
    DomainCache,
    Registration,
    new_object_columns,
    parse_registration,
    registration_of,
)
from app.services.schemas import MAX_IMPORT, RegisterRequest
from app.store import Conflict, Database, Tx, transaction
from app.store import imports as store
from app.store.domains import store_domains
from app.store.imports import Registered

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ImportResult:
    """The answer of an import and whether it was replayed from an earlier request."""

    body: schemas.ImportResult
    replayed: bool


def parse_items(
    items: Sequence[Any], limits: EngineLimits, *, field: str = "objects"
) -> list[Registration]:
    """Validate every item (``objects[i].…`` names the first bad field) and refuse repeated ids.

    Each item is a :class:`~app.services.schemas.RegisterRequest`, its domain and value then
    parsed by the engine, item by item (the first bad item is the one reported).
    """
    if not items:
        raise InvalidInput(field, "must have at least 1 item")
    if len(items) > MAX_IMPORT:
        raise InvalidInput(field, f"at most {MAX_IMPORT} objects a request")
    domains = DomainCache()
    return _distinct(
        (
            parse_registration(item, f"{field}[{i}]", limits, domains)
            for i, item in enumerate(items)
        ),
        field,
    )


def registrations(
    requests: Sequence[RegisterRequest],
    limits: EngineLimits,
    *,
    field: str = "objects",
    domains: DomainCache | None = None,
) -> list[Registration]:
    """The registrations of a validated import (:class:`~app.services.schemas.ImportRequest`).

    ``domains``: the cache its validation used (:attr:`DomainCache.context`), if any.
    """
    domains = domains if domains is not None else DomainCache()
    return _distinct(
        (registration_of(r, f"{field}[{i}]", limits, domains) for i, r in enumerate(requests)),
        field,
    )


def _distinct(items: Iterable[Registration], field: str) -> list[Registration]:
    """``items`` as they come, or :class:`InvalidInput` at the first id that repeats."""
    first_index: dict[str, int] = {}
    found = []
    for i, registration in enumerate(items):
        if registration.id in first_index:
            raise InvalidInput(
                f"{field}[{i}].id", f"repeats the id of {field}[{first_index[registration.id]}]"
            )
        first_index[registration.id] = i
        found.append(registration)
    return found


class BadLine(Exception):
    """A line of an NDJSON file that cannot be registered (its number and why)."""

    def __init__(self, line: int, message: str, field: str = "") -> None:
        super().__init__(line, message, field)
        self.line = line
        self.message = message
        self.field = field

    def __str__(self) -> str:
        return (
            f"line {self.line}"
            + (f", field {self.field}" if self.field else "")
            + (f": {self.message}")
        )


def _registrations(
    numbered: Sequence[tuple[int, bytes]], items: list[Any], limits: EngineLimits
) -> list[Registration]:
    """``items`` (the first lines of ``numbered``, parsed) validated; :class:`BadLine` if not."""
    try:
        return parse_items(items, limits)
    except InvalidInput as exc:
        # objects[i].field (a batch is never empty nor above MAX_IMPORT: every error names an item)
        index = int(exc.field.split("[", 1)[1].split("]", 1)[0])
        rest = exc.field.split("]", 1)[1].lstrip(".")
        raise BadLine(numbered[index][0], exc.errors[0].message, rest) from None


def parse_lines(
    numbered: Sequence[tuple[int, bytes]], limits: EngineLimits, *, seal: bool = False
) -> list[Registration]:
    """Validate a batch of NDJSON lines ``(line number, bytes)``.

    :class:`BadLine` names the first bad one (and the field). With ``seal`` each value is also
    encrypted with the process's cipher (``Registration.sealed``): ``gatekeeper import`` runs
    this in worker processes, leaving only the database work to the importing process.
    """
    items = []
    for number, line in numbered:
        try:
            # orjson, faster than the standard decoder (docs/benchmarks.md, "Import: before and
            # after"); what it refuses (an integer over 64 bits, a lone surrogate) goes to the
            # standard decoder, so a line means what it meant before
            items.append(orjson.loads(line))
        except orjson.JSONDecodeError:
            try:
                items.append(json.loads(line))
            except ValueError:
                # the first bad line is the one reported: an earlier line may be invalid
                if items:
                    _registrations(numbered, items, limits)
                raise BadLine(number, "not valid JSON") from None
    registrations = _registrations(numbered, items, limits)
    if not seal:
        return registrations
    cipher = crypto.active()
    return [replace(r, sealed=cipher.encrypt(r.value_text)) for r in registrations]


def _same(registration: Registration, row: Registered) -> bool:
    """Whether a stored object is exactly what ``registration`` would register."""
    return (
        row.domain_hash == registration.domain_hash
        and row.value == registration.value_text
        and row.budget == registration.budget
        and row.budget_delta == registration.budget_delta
        and row.filter == registration.filter
        and (row.labels or None) == registration.labels
        and row.lifetime_budget == registration.lifetime_budget
    )


def _existing(conn: Tx, registrations: list[Registration]) -> set[str]:
    """The ids already registered identically; 409 :class:`AlreadyExists` for a different one."""
    wanted = {r.id: (i, r) for i, r in enumerate(registrations)}
    found: set[str] = set()
    for row in store.registered(conn, ids=list(wanted)):
        index, registration = wanted[row.id]
        if not _same(registration, row):
            raise AlreadyExists(
                f"objects[{index}]: an object with id {row.id!r} already exists with a "
                "different registration"
            )
        found.add(row.id)
    return found


def import_objects(
    *,
    engine: Database,
    registrations: list[Registration],
    fingerprint: str,
    idempotency_key: str | None,
    actor_key_id: int | None,
    attempts: int = 5,
) -> ImportResult:
    """Register the objects not yet registered, all in one transaction.

    Returns ``{"created": n, "existing": m}``. Raises :class:`AlreadyExists` (409) when an id is
    registered differently, :class:`IdempotencyMismatch` (422) when the key was used with
    another body, :class:`Busy` (503) when concurrent imports of the same ids keep colliding.
    """
    for _ in range(attempts):
        try:
            return _import_once(engine, registrations, fingerprint, idempotency_key, actor_key_id)
        except Conflict:  # a concurrent request registered one of the ids (or the key)
            log.info("import retried after a concurrent registration")
    raise Busy("concurrent imports of the same objects; retry later", retry_after=1)


def _import_once(
    engine: Database,
    registrations: list[Registration],
    fingerprint: str,
    key: str | None,
    actor_key_id: int | None,
) -> ImportResult:
    with transaction(engine) as conn:
        if key is not None:
            stored = store.stored_answer(conn, owner_key_id=actor_key_id, key=key)
            if stored is not None:
                if stored.fingerprint != fingerprint:
                    raise IdempotencyMismatch(
                        "this Idempotency-Key was used with a different request body"
                    )
                return ImportResult(
                    schemas.ImportResult.model_validate(json.loads(stored.response)), True
                )
        existing = _existing(conn, registrations)
        now = datetime.now(UTC)
        new = [r for r in registrations if r.id not in existing]
        store_domains(conn, {r.domain_text for r in new})
        sealed = [r.sealed for r in new if r.sealed is not None]
        store.insert_objects(
            conn,
            rows=[r.row() for r in new],
            sealed=sealed if len(sealed) == len(new) else None,
            constants=new_object_columns(now),
        )
        body = schemas.ImportResult(created=len(new), existing=len(existing))
        audit.record(
            conn,
            kind=audit.AuditKind.OBJECTS_IMPORTED,
            actor_key_id=actor_key_id,
            object_id=None,
            detail={
                "created": body.created,
                "existing": body.existing,
                "first_id": registrations[0].id,
                "last_id": registrations[-1].id,
            },
        )
        if key is not None:
            store.store_answer(
                conn,
                owner_key_id=actor_key_id,
                key=key,
                fingerprint=fingerprint,
                response=json.dumps(body.model_dump(mode="json")),
                at=now,
            )
    return ImportResult(body, False)
