"""Submits' records: accepted queries (table ``queries``) and stored rejections (``rejections``).

Both are unique on ``(object, idempotency key)``, which is how a submit's retry finds its stored
answer (:mod:`app.services.queries`); ``queries`` is also unique on ``(object, seq)``. The
statements are built once at import time: a submit runs them on its hot path.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import cast

from sqlalchemy import ColumnElement, FromClause, Insert, Table, bindparam, insert, select

from app.db.models import QueryRecord, RejectionRecord
from app.store.base import Tx

QUERIES = cast(Table, QueryRecord.__table__)
_REJECTIONS = cast(Table, RejectionRecord.__table__)


@dataclass(frozen=True)
class StoredAnswer:
    """The answer stored under an Idempotency-Key: whose it is, for which body, what it said."""

    analyst_key_id: int | None
    fingerprint: str
    #: The response's JSON text.
    response: str
    #: The accepted query's id (None: a stored rejection).
    query_id: int | None = None


_ANSWER = select(
    QUERIES.c.id, QUERIES.c.analyst_key_id, QUERIES.c.fingerprint, QUERIES.c.response
).where(
    QUERIES.c.object_id == bindparam("object_id"),
    QUERIES.c.idempotency_key == bindparam("key"),
)
_REJECTION = select(
    _REJECTIONS.c.analyst_key_id, _REJECTIONS.c.fingerprint, _REJECTIONS.c.response
).where(
    _REJECTIONS.c.object_id == bindparam("object_id"),
    _REJECTIONS.c.idempotency_key == bindparam("key"),
)
_INSERT_QUERY = insert(QUERIES)
_INSERT_REJECTION = insert(_REJECTIONS)
#: The columns of a stored rejection's answer, after its ``object_id``.
REJECTION_COLUMNS = (
    "idempotency_key",
    "analyst_key_id",
    "fingerprint",
    "response",
    "created_at",
)


def insert_rejection_for(object_ids: ColumnElement[str], source: FromClause) -> Insert:
    """:func:`insert_rejection` for the object ids ``object_ids`` of ``source``'s rows.

    The answer's columns are bound parameters of their own names (:data:`REJECTION_COLUMNS`);
    :mod:`app.store.submits` inserts the answer only if the rejection's count was written.
    """
    return insert(_REJECTIONS).from_select(
        ["object_id", *REJECTION_COLUMNS],
        select(
            object_ids,
            *(bindparam(n, type_=_REJECTIONS.c[n].type) for n in REJECTION_COLUMNS),
        ).select_from(source),
    )


def find_accepted(conn: Tx, *, object_id: str, key: str) -> StoredAnswer | None:
    """The accepted submit stored under ``key``, if any."""
    found = conn.execute(_ANSWER, {"object_id": object_id, "key": key}).one_or_none()
    if found is None:
        return None
    return StoredAnswer(found.analyst_key_id, found.fingerprint, found.response, found.id)


def find_rejection(conn: Tx, *, object_id: str, key: str) -> StoredAnswer | None:
    """The rejected submit stored under ``key``, if any."""
    found = conn.execute(_REJECTION, {"object_id": object_id, "key": key}).one_or_none()
    if found is None:
        return None
    return StoredAnswer(found.analyst_key_id, found.fingerprint, found.response)


def insert_query(
    conn: Tx,
    *,
    object_id: str,
    seq: int,
    query: str,
    output: str,
    epsilon: float,
    epsilon_exact: str,
    loss_lower: float,
    loss_upper: float,
    basic_after: float,
    analyst_key_id: int | None,
    idempotency_key: str | None,
    fingerprint: str,
    response: str,
    created_at: datetime,
) -> int:
    """Record an accepted query; its id. :class:`~app.store.Conflict` if the seq or key is used."""
    inserted = conn.execute(
        _INSERT_QUERY,
        {
            "object_id": object_id,
            "seq": seq,
            "query": query,
            "output": output,
            "epsilon": epsilon,
            "epsilon_exact": epsilon_exact,
            "loss_lower": loss_lower,
            "loss_upper": loss_upper,
            "basic_after": basic_after,
            "analyst_key_id": analyst_key_id,
            "idempotency_key": idempotency_key,
            "fingerprint": fingerprint,
            "response": response,
            "created_at": created_at,
        },
    )
    return int(inserted.inserted_primary_key[0])  # type: ignore[index]


def insert_rejection(
    conn: Tx,
    *,
    object_id: str,
    idempotency_key: str,
    analyst_key_id: int | None,
    fingerprint: str,
    response: str,
    created_at: datetime,
) -> None:
    """Store a rejection's answer under its key (:class:`~app.store.Conflict` if it is used)."""
    conn.execute(
        _INSERT_REJECTION,
        {
            "object_id": object_id,
            "idempotency_key": idempotency_key,
            "analyst_key_id": analyst_key_id,
            "fingerprint": fingerprint,
            "response": response,
            "created_at": created_at,
        },
    )
