"""Jobs over the stored private values: encrypt legacy plaintext rows, rotate to a new key.

Run by ``gatekeeper encrypt-values`` and ``gatekeeper rotate-key``; the cipher itself is
:mod:`app.crypto`, the column type :class:`app.db.types.EncryptedText`.
"""

from __future__ import annotations

from sqlalchemy import Text, cast, select, update
from sqlalchemy.orm import Session

from app.crypto import PREFIX, active
from app.db.models import ProtectedObject


def encrypt_plaintext_rows(session: Session) -> int:
    """Encrypt values stored before encryption existed; returns how many rows it changed."""
    # CAST to plain text reads the stored string as is (no decryption)
    stored = select(ProtectedObject.id, cast(ProtectedObject.value, Text))
    changed = 0
    for object_id, text in session.execute(stored).all():
        if not str(text).startswith(PREFIX):
            session.execute(  # EncryptedText encrypts the value on the way in
                update(ProtectedObject).where(ProtectedObject.id == object_id).values(value=text)
            )
            changed += 1
    return changed


def rotate_rows(session: Session) -> int:
    """Re-encrypt every stored value with the first key; returns how many rows."""
    cipher = active()
    stored = select(ProtectedObject.id, cast(ProtectedObject.value, Text))
    rows = session.execute(stored).all()
    for object_id, text in rows:
        plaintext = cipher.decrypt(str(text))
        session.execute(
            update(ProtectedObject).where(ProtectedObject.id == object_id).values(value=plaintext)
        )
    return len(rows)
