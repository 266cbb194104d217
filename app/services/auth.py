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

from app.engine.errors import InvalidInput
from app.services import audit
from app.services.errors import LastAdminKey
from app.services.projects import project_for_key, scope_by_id
from app.services.schemas import KeyInfo, KeyPage, Role
from app.services.scope import Scope
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
    project: str | None = None,
) -> tuple[int, str]:
    """Store a new random key (in the project named ``project``); its id and secret.

    A project key is an analyst or viewer key (an admin key is unscoped by definition: 422
    naming ``role``); an unknown project is a 422 naming ``project``.
    """
    with transaction(engine) as conn:
        project_id = None
        if project is not None:
            if role is Role.ADMIN:
                raise InvalidInput("role", "must be analyst or viewer for a key in a project")
            project_id = project_for_key(conn, project, "project").id
        return _create(conn, role, label, generate_key(), actor_key_id, project_id)


def _create(
    conn: Tx,
    role: Role,
    label: str | None,
    secret: str,
    actor_key_id: int | None,
    project_id: int | None = None,
) -> tuple[int, str]:
    """Store the key ``secret`` with its audit event in ``conn``'s transaction."""
    key_id = store.insert_key(
        conn,
        key_hash=hash_key(secret),
        prefix=secret[:10],
        role=role.value,
        label=label,
        project_id=project_id,
    )
    detail: dict[str, Any] = {"key_id": key_id, "role": role.value, "label": label}
    if project_id is not None:
        detail["project_id"] = project_id
    audit.record(
        conn,
        kind=audit.AuditKind.KEY_CREATED,
        actor_key_id=actor_key_id,
        object_id=None,
        detail=detail,
    )
    return key_id, secret


def authenticate(*, engine: Database, secret: str) -> tuple[KeyRow, Scope | None] | None:
    """The active key for ``secret`` and its project's scope, or None.

    One statement for an unscoped key (it runs on every uncached call), two for a project key.
    """
    with reading(engine) as conn:
        row = store.by_hash(conn, key_hash=hash_key(secret))
        if row is None or row.revoked_at is not None:
            return None
        scope = None if row.project_id is None else scope_by_id(conn, row.project_id)
        if row.project_id is not None and scope is None:  # pragma: no cover - foreign key
            return None
    return row, scope


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


def list_keys(*, engine: Database, limit: int, after: int) -> KeyPage:
    """API keys in id order (id, role, label, created, revoked — never a secret or hash)."""
    with reading(engine) as conn:
        rows = store.page(conn, after=after, limit=limit)
        names = {
            p: scope.project
            for p in {r.project_id for r in rows if r.project_id is not None}
            if (scope := scope_by_id(conn, p)) is not None
        }
    items = [
        KeyInfo(
            id=row.id,
            role=Role(row.role),
            label=row.label,
            created_at=row.created_at.isoformat(),
            revoked_at=row.revoked_at.isoformat() if row.revoked_at else None,
            project=names.get(row.project_id) if row.project_id is not None else None,
        )
        for row in rows
    ]
    return KeyPage(items=items, next_after=items[-1].id if len(items) == limit else None)


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
        self._entries: dict[str, tuple[float, int, Role, Scope | None]] = {}
        self._lock = threading.Lock()

    def get(self, key_hash: str) -> tuple[int, Role] | None:
        """``(key id, role)`` if cached and not expired."""
        found = self.lookup(key_hash)
        return None if found is None else (found[0], found[1])

    def lookup(self, key_hash: str) -> tuple[int, Role, Scope | None] | None:
        """``(key id, role, scope)`` if cached and not expired (a scope never changes)."""
        entry = self._entries.get(key_hash)
        if entry is None:
            return None
        if entry[0] <= self._clock():
            with self._lock:
                self._entries.pop(key_hash, None)
            return None
        return entry[1], entry[2], entry[3]

    def put(self, key_hash: str, key_id: int, role: Role, scope: Scope | None = None) -> None:
        """Remember an active key (no-op when disabled)."""
        if self.ttl <= 0:
            return
        with self._lock:
            if len(self._entries) >= self.max_entries:
                self._entries.clear()
            self._entries[key_hash] = (self._clock() + self.ttl, key_id, role, scope)

    def forget(self, key_id: int) -> None:
        """Drop a key (after revoking it here)."""
        with self._lock:
            for digest in [d for d, e in self._entries.items() if e[1] == key_id]:
                del self._entries[digest]
