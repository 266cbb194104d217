"""API keys: creation, hashing, lookup and the bootstrap admin key.

Keys are ``gk_`` + 43 characters of ``secrets.token_urlsafe(32)`` (256 bits). Only their SHA-256
is stored; with that much entropy a fast hash is enough (there is nothing to brute-force).
"""

from __future__ import annotations

import contextlib
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


def revoked_channel(redis: Any) -> str:
    """The channel on which revocations are announced to every process's :class:`KeyCache`.

    Redis's channels are server-wide, not per database: the database number keeps deployments
    that share a server on separate databases apart.
    """
    db = redis.connection_pool.connection_kwargs.get("db", 0)
    return f"gatekeeper:keys:revoked:{db}"


class KeyCache:
    """Recently authenticated keys of this process, by key hash, for ``ttl`` seconds.

    Saves a database round trip per request. Revocation semantics: a revoked key stops working
    at once in the process that revoked it (:meth:`forget`) and, with Redis, in every other
    process (other uvicorn workers, other replicas, ``gatekeeper keys revoke``) as soon as the
    announcement (:func:`announce_revoked`) reaches its :class:`RevocationListener` — measured
    in milliseconds; a process not subscribed (no Redis, Redis unreachable) keeps a cached entry
    until it expires, so ``ttl`` bounds every case. ``ttl = 0`` disables the cache (every
    request reads the database). Only successful lookups are cached; an unknown or revoked key is
    looked up every time.

    A lookup that read the database before a revocation and stores its answer after the
    announcement arrived would keep the revoked key for ``ttl``: :meth:`put` with the
    :attr:`generation` read before the lookup stores nothing when a revocation came in between.
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
        #: Bumped by every :meth:`forget` and :meth:`clear` (see the class docstring).
        self.generation = 0

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

    def put(
        self,
        key_hash: str,
        key_id: int,
        role: Role,
        scope: Scope | None = None,
        *,
        generation: int | None = None,
    ) -> None:
        """Remember an active key (no-op when disabled).

        Nothing is stored when a revocation came in since ``generation`` was read.
        """
        if self.ttl <= 0:
            return
        with self._lock:
            if generation is not None and generation != self.generation:
                return
            if len(self._entries) >= self.max_entries:
                self._entries.clear()
            self._entries[key_hash] = (self._clock() + self.ttl, key_id, role, scope)

    def forget(self, key_id: int) -> None:
        """Drop a key (after revoking it here, or when another process announced it)."""
        with self._lock:
            self.generation += 1
            for digest in [d for d, e in self._entries.items() if e[1] == key_id]:
                del self._entries[digest]

    def clear(self) -> None:
        """Drop every key (announcements may have been missed)."""
        with self._lock:
            self.generation += 1
            self._entries.clear()


def announce_revoked(redis: Any, key_ids: list[int]) -> None:
    """Tell every process's :class:`KeyCache` (through Redis) to forget ``key_ids``.

    Called after the revocation committed. If Redis cannot be reached the revocation stands;
    other processes then trust their cached entries until they expire (``AUTH_CACHE_SECONDS``).
    """
    if not key_ids:
        return
    from redis.exceptions import RedisError

    try:
        redis.publish(revoked_channel(redis), ",".join(str(k) for k in key_ids))
    except RedisError as exc:
        log.warning(
            "revocation not announced (%s): other processes refuse the key within "
            "AUTH_CACHE_SECONDS",
            type(exc).__name__,
        )


class RevocationListener:
    """A daemon thread that makes ``cache`` forget the keys other processes revoke.

    It subscribes to :func:`revoked_channel`; each time it (re)subscribes it clears the cache,
    since announcements made while it was not subscribed are lost. When Redis is unreachable it
    retries every ``retry`` seconds; meanwhile the cache's TTL bounds how long a revoked key is
    trusted.
    """

    def __init__(self, redis: Any, cache: KeyCache, *, retry: float = 1.0) -> None:
        self.redis = redis
        self.cache = cache
        self.retry = retry
        #: Set while subscribed (tests wait for it).
        self.subscribed = threading.Event()
        self._stop = threading.Event()
        #: A channel of this listener's own: :meth:`stop` publishes on it to wake the thread from
        #: its wait for a message (each process's shutdown waited up to that 0.5 s otherwise).
        self._wake = f"{revoked_channel(redis)}:stop:{secrets.token_hex(8)}"
        self._thread = threading.Thread(target=self._run, name="key-revocations", daemon=True)

    def start(self) -> RevocationListener:
        """Start listening (returns self)."""
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop listening: at once, or within about a second when Redis is away."""
        self._stop.set()
        if self.subscribed.is_set():
            # from a thread of its own: with Redis hung the publish waits out the client's
            # timeouts and retries, and the listener still ends by its own wait's timeout
            threading.Thread(target=self._wake_up, name="key-revocations-stop", daemon=True).start()
        self._thread.join(timeout=5.0)

    def _wake_up(self) -> None:
        from redis.exceptions import RedisError

        with contextlib.suppress(RedisError, OSError):
            self.redis.publish(self._wake, b"")

    def _run(self) -> None:
        from redis.exceptions import RedisError

        while not self._stop.is_set():
            pubsub = self.redis.pubsub(ignore_subscribe_messages=True)
            try:
                # the wake-up is an empty message: no key id in it, nothing forgotten
                pubsub.subscribe(revoked_channel(self.redis), self._wake)
                self.cache.clear()
                self.subscribed.set()
                last_ping = time.monotonic()
                while not self._stop.is_set():
                    message = pubsub.get_message(timeout=0.5)
                    if message is not None and message.get("type") == "message":
                        for part in bytes(message["data"]).split(b","):
                            if part.strip().isdigit():
                                self.cache.forget(int(part))
                    if time.monotonic() - last_ping > 10.0:  # a dead connection shows here
                        pubsub.ping()
                        last_ping = time.monotonic()
            except (RedisError, OSError) as exc:
                if self.subscribed.is_set():
                    log.warning("key revocations: Redis lost (%s)", type(exc).__name__)
                self.subscribed.clear()
                self._stop.wait(self.retry)
            finally:
                with contextlib.suppress(Exception):
                    pubsub.close()
