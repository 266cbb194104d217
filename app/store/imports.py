"""What a bulk import reads and writes: registered ids, the new objects, stored answers."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, cast

from sqlalchemy import Table, bindparam, insert, select

from app.db.models import IdempotentRequest, ProtectedObject
from app.store import bulk
from app.store import ids as ids_
from app.store.base import Tx, is_postgres

#: Ids looked up per statement on SQLite (a parameter list well within its limits).
#: The scope of an import's stored answers among the idempotent requests.
_SCOPE = "imports"

_OBJECTS = cast(Table, ProtectedObject.__table__)
_REQUESTS = cast(Table, IdempotentRequest.__table__)
#: PostgreSQL types of a new object's columns (one statement per request: app.store.bulk).
_OBJECT_TYPES = {
    "id": "text",
    "domain_hash": "text",
    "value": "text",
    "budget": "float8",
    "budget_delta": "float8",
    "filter": "text",
    "finite": "boolean",
    "labels": "json",
    "state_hash": "text",
    "state_pending": "int",
    "history_hash": "text",
    "loss_lower": "float8",
    "loss_upper": "float8",
    "basic_total": "text",
    "f0_account": "text",
    "accepted": "int",
    "rejected": "int",
    "version": "int",
    "data_version": "int",
    "version_start": "int",
    "lifetime_budget": "float8",
    "lifetime_exact": "text",
    "lifetime_lower": "float8",
    "lifetime_upper": "float8",
    "created_at": "timestamptz",
    "updated_at": "timestamptz",
}


@dataclass(frozen=True)
class Registered:
    """What an object was registered with (compared with a repeated registration)."""

    id: str
    domain_hash: str
    #: The private value's JSON text (decrypted).
    value: str
    budget: float
    budget_delta: float | None
    filter: str
    labels: dict[str, str] | None
    lifetime_budget: float | None


@dataclass(frozen=True)
class StoredAnswer:
    """An earlier import's answer (JSON text) and the fingerprint of its request body."""

    fingerprint: str
    response: str


_REGISTERED = select(
    _OBJECTS.c.id,
    _OBJECTS.c.domain_hash,
    _OBJECTS.c.value,
    _OBJECTS.c.budget,
    _OBJECTS.c.budget_delta,
    _OBJECTS.c.filter,
    _OBJECTS.c.labels,
    _OBJECTS.c.lifetime_budget,
)
_EXISTING = ids_.where_among(_REGISTERED, _OBJECTS.c.id)
_STORED = select(_REQUESTS.c.fingerprint, _REQUESTS.c.response).where(
    _REQUESTS.c.scope == bindparam("scope"),
    # IS NOT DISTINCT FROM: the command line's requests have no owner key (NULL)
    _REQUESTS.c.owner_key_id.is_not_distinct_from(bindparam("owner")),
    _REQUESTS.c.idempotency_key == bindparam("key"),
)
_STORE = insert(_REQUESTS)


def registered(conn: Tx, *, ids: Sequence[str]) -> Iterator[Registered]:
    """The objects among ``ids`` that are registered (in no particular order)."""
    for row in ids_.rows_among(conn, _EXISTING, ids):
        yield Registered(*row)


def insert_objects(
    conn: Tx,
    *,
    rows: Sequence[Mapping[str, Any]],
    sealed: Sequence[str] | None,
    constants: Mapping[str, Any],
) -> None:
    """Insert new objects in one statement (``rows``: their own columns, value in plaintext).

    ``constants`` are the columns every new object starts with. ``sealed``: the values already
    encrypted, in ``rows``' order, by the workers that parsed them (``gatekeeper import``).
    PostgreSQL's bulk statement bypasses the column type, so it takes them as they are (or
    encrypts the plaintext here); SQLite's ``executemany`` goes through the column type, which
    encrypts the plaintext.
    """
    if is_postgres(conn) and sealed is not None:
        rows = [{**row, "value": value} for row, value in zip(rows, sealed, strict=True)]
        bulk.insert_rows(conn, _OBJECTS, rows, _OBJECT_TYPES, constants=constants)
    else:
        bulk.insert_rows(
            conn, _OBJECTS, rows, _OBJECT_TYPES, constants=constants, encrypted=("value",)
        )


def stored_answer(
    conn: Tx, *, owner_key_id: int | None, key: str, scope: str = _SCOPE
) -> StoredAnswer | None:
    """The answer stored for ``key`` of this key's imports (or ``scope``'s requests), or None."""
    row = conn.execute(_STORED, {"owner": owner_key_id, "key": key, "scope": scope}).one_or_none()
    return None if row is None else StoredAnswer(*row)


def store_answer(
    conn: Tx,
    *,
    owner_key_id: int | None,
    key: str,
    fingerprint: str,
    response: str,
    at: datetime,
    scope: str = _SCOPE,
) -> None:
    """Store an import's answer for ``key`` (a concurrent same key raises ``Conflict``)."""
    conn.execute(
        _STORE,
        {
            "scope": scope,
            "owner_key_id": owner_key_id,
            "idempotency_key": key,
            "fingerprint": fingerprint,
            "response": response,
            "created_at": at,
        },
    )
