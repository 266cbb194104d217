"""Jobs over the stored private values: encrypt legacy plaintext rows, rotate to a new key.

Run by ``gatekeeper encrypt-values`` and ``gatekeeper rotate-key``; the cipher itself is
:mod:`app.crypto`, the column type ``EncryptedText`` (which encrypts what
:func:`app.store.objects.write_value` writes).
"""

from __future__ import annotations

from app.crypto import PREFIX, active
from app.store import Tx
from app.store.objects import stored_values, write_value
from app.store.versions import recrypt_closed_values


def encrypt_plaintext_rows(conn: Tx) -> int:
    """Encrypt values stored before encryption existed; returns how many rows it changed."""
    changed = 0
    for row in stored_values(conn):
        if not row.stored.startswith(PREFIX):
            write_value(conn, object_id=row.object_id, value=row.stored)
            changed += 1
    return changed


def rotate_rows(conn: Tx) -> int:
    """Re-encrypt every stored value with the first key; returns how many values.

    The objects' values and their closed versions' (one row each, or packed per bulk request:
    :func:`app.store.versions.recrypt_closed_values`).
    """
    cipher = active()
    rows = stored_values(conn)
    for row in rows:
        write_value(conn, object_id=row.object_id, value=cipher.decrypt(row.stored))
    closed = recrypt_closed_values(conn, lambda stored: cipher.encrypt(cipher.decrypt(stored)))
    return len(rows) + closed
