"""API keys: creation, hashing, lookup and the bootstrap admin key.

Keys are ``gk_`` + 43 characters of ``secrets.token_urlsafe(32)`` (256 bits). Only their SHA-256
is stored; with that much entropy a fast hash is enough (there is nothing to brute-force).
"""

from __future__ import annotations

import hashlib
import logging
import secrets
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from app.services import audit
from app.services.errors import LastAdminKey
from app.services.schemas import Role
from app.store import Database, Tx, reading, transaction
from app.store import keys as store
from app.store.keys import KeyRow

log = logging.getLogger(__name__)


def hash_key(secret: str) -> str:
    """SHA-256 hex of a key."""
    return hashlib.sha256(secret.encode()).hexdigest()


def generate_key() -> str:
    """A new random key."""
    return "gk_" + secrets.token_urlsafe(32)


def create_key(
    *,
    engine: Database,
    role: Role,
    label: str | None = None,
    actor_key_id: int | None = None,
) -> tuple[int, str]:
    """Store a new random key and return its id and secret."""
    with transaction(engine) as conn:
        return _create(conn, role, label, generate_key(), actor_key_id)


def _create(
    conn: Tx, role: Role, label: str | None, secret: str, actor_key_id: int | None
) -> tuple[int, str]:
    """Store the key ``secret`` with its audit event in ``conn``'s transaction."""
    key_id = store.insert_key(
        conn, key_hash=hash_key(secret), prefix=secret[:10], role=role.value, label=label
    )
    audit.record(
        conn,
        kind=audit.AuditKind.KEY_CREATED,
        actor_key_id=actor_key_id,
        object_id=None,
        detail={"key_id": key_id, "role": role.value, "label": label},
    )
    return key_id, secret


def authenticate(*, engine: Database, secret: str) -> KeyRow | None:
    """The active key for ``secret``, or None (one statement: it runs on every uncached call)."""
    with reading(engine) as conn:
        row = store.by_hash(conn, key_hash=hash_key(secret))
    if row is None or row.revoked_at is not None:
        return None
    return row


def ensure_bootstrap_admin(*, engine: Database, secret: str) -> bool:
    """Make sure an admin key with ``secret`` exists; True if it was created now.

    A bootstrap key that was revoked (or repurposed) is left as it is: restarting the service
    must not undo a revocation. Raises :class:`app.store.Conflict` when another process stored
    it at the same moment.
    """
    with transaction(engine) as conn:
        existing = store.by_hash(conn, key_hash=hash_key(secret))
        if existing is None:
            _create(conn, Role.ADMIN, "bootstrap", secret, None)
            return True
    if existing.revoked_at is not None:
        log.warning("the bootstrap admin key was revoked; it stays revoked")
    elif existing.role != Role.ADMIN.value:
        log.warning("the bootstrap admin key exists with another role; left unchanged")
    return False


def revoke_key(*, engine: Database, key_id: int, actor_key_id: int | None = None) -> bool:
    """Revoke a key; False if it does not exist (revoking a revoked key changes nothing).

    Raises :class:`~app.services.errors.LastAdminKey` when the key is the last active admin
    key: revoking it answered 200 and then 401 to everyone, recoverable only from a shell.
    Race-free (:func:`app.store.keys.revoke`).
    """
    with transaction(engine) as conn:
        revoked = store.revoke(conn, key_id=key_id, at=datetime.now(UTC))
        row = store.by_id(conn, key_id=key_id)
        if row is None:
            return False
        if revoked:
            audit.record(
                conn,
                kind=audit.AuditKind.KEY_REVOKED,
                actor_key_id=actor_key_id,
                object_id=None,
                detail={"key_id": key_id, "role": row.role},
            )
    if not revoked and row.revoked_at is None:
        raise LastAdminKey(
            "this is the last active admin key: create another admin key before revoking it"
        )
    return True


def list_keys(*, engine: Database, limit: int, after: int) -> dict[str, Any]:
    """API keys in id order (id, role, label, created, revoked — never a secret or hash)."""
    with reading(engine) as conn:
        rows = store.page(conn, after=after, limit=limit)
    items = [
        {
            "id": row.id,
            "role": row.role,
            "label": row.label,
            "created_at": row.created_at.isoformat(),
            "revoked_at": row.revoked_at.isoformat() if row.revoked_at else None,
        }
        for row in rows
    ]
    return {"items": items, "next_after": items[-1]["id"] if len(items) == limit else None}


class KeyCache:
    """Recently authenticated keys of this process, by key hash, for ``ttl`` seconds.

    Saves a database round trip per request. Revocation semantics: a revoked key stops working
    at once in the process that revoked it (:meth:`forget`) and within ``ttl`` seconds in every
    other process (other uvicorn workers, other replicas), which keep using their cached entry
    until it expires. ``ttl = 0`` disables the cache (every request reads the database). Only
    successful lookups are cached; an unknown or revoked key is looked up every time.
    """

    def __init__(
        self,
        ttl: float,
        max_entries: int = 10_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.ttl = ttl
        self.max_entries = max_entries
        self._clock = clock
        self._entries: dict[str, tuple[float, int, Role]] = {}
        self._lock = threading.Lock()

    def get(self, key_hash: str) -> tuple[int, Role] | None:
        """``(key id, role)`` if cached and not expired."""
        entry = self._entries.get(key_hash)
        if entry is None:
            return None
        if entry[0] <= self._clock():
            with self._lock:
                self._entries.pop(key_hash, None)
            return None
        return entry[1], entry[2]

    def put(self, key_hash: str, key_id: int, role: Role) -> None:
        """Remember an active key (no-op when disabled)."""
        if self.ttl <= 0:
            return
        with self._lock:
            if len(self._entries) >= self.max_entries:
                self._entries.clear()
            self._entries[key_hash] = (self._clock() + self.ttl, key_id, role)

    def forget(self, key_id: int) -> None:
        """Drop a key (after revoking it here)."""
        with self._lock:
            for digest in [d for d, e in self._entries.items() if e[1] == key_id]:
                del self._entries[digest]
