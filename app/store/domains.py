"""Domains stored once, by the hash of their canonical JSON (table ``domains``).

A population registers a million objects with one domain; each object row names the domain by
its 32-hex-digit hash instead of carrying its ~250 bytes of JSON (at 10^6 objects: about 250 MB
of heap, rewritten by every survey's update of each member — docs/benchmarks.md). The hash is of
the canonical text the service itself writes (``json.dumps(domain.to_json())``), so equal domains
share one row and a hash names the same text in every database.

Reads go through :data:`DOMAIN_TEXT` (a scalar subquery labelled ``domain``), so a row read
with it has ``row.domain`` as before; writers store a text with :func:`store_domains` before
the rows naming it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from typing import cast

from sqlalchemy import Table, bindparam, select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from app.db.models import DomainRecord, ProtectedObject, domain_text_of
from app.store.base import Tx, is_postgres

_DOMAINS = cast(Table, DomainRecord.__table__)
_OBJECTS = cast(Table, ProtectedObject.__table__)

#: ``objects``' domain text, for Core statements selecting from ``objects``.
DOMAIN_TEXT = domain_text_of(_OBJECTS.c.domain_hash).label("domain")


def domain_hash(text: str) -> str:
    """The content address of a canonical domain text: 128 bits of its SHA-256, in hex.

    >>> h = domain_hash('{"attributes": []}')
    >>> len(h), h == domain_hash('{"attributes": []}'), h == domain_hash('{"attributes": [1]}')
    (32, True, False)
    """
    return hashlib.sha256(text.encode()).hexdigest()[:32]


#: ``INSERT ... ON CONFLICT (hash) DO NOTHING``, per dialect (built once).
_STORE = {
    postgres: insert(_DOMAINS).on_conflict_do_nothing(index_elements=["hash"])
    for postgres, insert in ((True, pg_insert), (False, sqlite_insert))
}


def store_domains(conn: Tx, texts: Iterable[str]) -> None:
    """Insert the domains not stored yet (concurrent writers of the same text both succeed)."""
    rows = [{"hash": domain_hash(t), "text": t} for t in sorted(set(texts))]
    if not rows:
        return
    conn.execute(_STORE[is_postgres(conn)], rows)


_TEXTS = select(_DOMAINS.c.hash, _DOMAINS.c.text).where(
    _DOMAINS.c.hash.in_(bindparam("hashes", expanding=True))
)


def domain_texts(conn: Tx, hashes: Iterable[str]) -> dict[str, str]:
    """The stored domains' texts by hash (a population's objects mostly share one)."""
    wanted = sorted(set(hashes))
    if not wanted:
        return {}
    return {str(h): str(t) for h, t in conn.execute(_TEXTS, {"hashes": wanted})}
