"""API keys: creation, hashing, lookup and the bootstrap admin key.

Keys are ``gk_`` + 43 characters of ``secrets.token_urlsafe(32)`` (256 bits). Only their SHA-256
is stored; with that much entropy a fast hash is enough (there is nothing to brute-force).
"""

from __future__ import annotations

import hashlib
import logging
import secrets
from datetime import UTC, datetime
from enum import StrEnum

from sqlalchemy import select
from sqlalchemy.orm import Session

from app.db.models import ApiKey

log = logging.getLogger(__name__)


class Role(StrEnum):
    """What a key may do."""

    ADMIN = "admin"
    ANALYST = "analyst"
    VIEWER = "viewer"


def hash_key(secret: str) -> str:
    """SHA-256 hex of a key."""
    return hashlib.sha256(secret.encode()).hexdigest()


def generate_key() -> str:
    """A new random key."""
    return "gk_" + secrets.token_urlsafe(32)


def create_key(
    *, session: Session, role: Role, label: str | None = None, secret: str | None = None
) -> tuple[ApiKey, str]:
    """Store a new key (or the given ``secret``) and return its row and secret."""
    secret = secret or generate_key()
    row = ApiKey(key_hash=hash_key(secret), prefix=secret[:10], role=role.value, label=label)
    session.add(row)
    session.flush()
    return row, secret


def authenticate(*, session: Session, secret: str) -> ApiKey | None:
    """The active key row for ``secret``, or None."""
    row = session.scalar(select(ApiKey).where(ApiKey.key_hash == hash_key(secret)))
    if row is None or row.revoked_at is not None:
        return None
    return row


def ensure_bootstrap_admin(*, session: Session, secret: str) -> bool:
    """Make sure an admin key with ``secret`` exists; True if it was created now.

    A bootstrap key that was revoked (or repurposed) is left as it is: restarting the service
    must not undo a revocation.
    """
    existing = session.scalar(select(ApiKey).where(ApiKey.key_hash == hash_key(secret)))
    if existing is not None:
        if existing.revoked_at is not None:
            log.warning("the bootstrap admin key was revoked; it stays revoked")
        elif existing.role != Role.ADMIN.value:
            log.warning("the bootstrap admin key exists with another role; left unchanged")
        return False
    create_key(session=session, role=Role.ADMIN, label="bootstrap", secret=secret)
    return True


def revoke_key(*, session: Session, key_id: int) -> bool:
    """Revoke a key; False if it does not exist."""
    row = session.get(ApiKey, key_id)
    if row is None:
        return False
    row.revoked_at = datetime.now(UTC)
    return True
