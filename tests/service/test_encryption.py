"""Private values are encrypted at rest; keys come from settings; rotation works end to end.

What is checked: the stored ``objects.value`` is a Fernet token (no trace of the value) on SQLite
and PostgreSQL while the service still samples from the right value; the embedded default creates
its key file with mode 0600 (once, even when several processes race), says so in the log without
the key, and production refuses to generate one; a value encrypted with one key cannot be read
with another; rows stored in plaintext before encryption existed are encrypted by the start-up
pass; and ``gatekeeper encryption rotate`` moves every value to a new key, after which the old key
can be dropped.
"""

from __future__ import annotations

import json
import logging
import re
import stat
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Text, cast, select, update
from sqlalchemy.orm import Session

from app import crypto
from app.bootstrap import create_app
from app.db.migrate import upgrade
from app.db.models import ProtectedObject
from app.db.session import make_engine
from app.services.encryption import encrypt_plaintext_rows
from app.settings import Environment, Settings
from tests.conftest import TEST_ENCRYPTION_KEY
from tests.service.conftest import ADMIN_KEY, auth, make_settings, new_key, unique_id
from tests.service.factories import run_cli

#: A value no other text of the test contains.
SENTINEL = 77
DOMAIN = {"attributes": [{"name": "x", "type": "integer", "low": 0, "high": 100}]}


@pytest.fixture(autouse=True)
def _restore_test_cipher() -> Iterator[None]:
    """Apps built here configure other keys process-wide; put the suite's key back after."""
    yield
    crypto.configure(crypto.cipher_from_settings(TEST_ENCRYPTION_KEY, "", production=False))


def stored_text(database_url: str, object_id: str) -> str:
    """``objects.value`` as stored (no decryption)."""
    engine = make_engine(database_url)
    try:
        with Session(engine, expire_on_commit=False) as session:
            query = select(cast(ProtectedObject.value, Text)).where(ProtectedObject.id == object_id)
            return str(session.execute(query).scalar_one())
    finally:
        engine.dispose()


def register(client: TestClient, value: int = SENTINEL) -> str:
    """An object whose true value is ``value`` (as the bootstrap admin)."""
    object_id = unique_id("enc")
    body = {
        "id": object_id,
        "domain": DOMAIN,
        "value": {"x": value},
        "budget": {"epsilon": 100.0},
        "filter": "basic",
    }
    response = client.post("/v1/objects", json=body, headers=auth(ADMIN_KEY))
    assert response.status_code == 201, response.text
    return object_id


def reports_truth(client: TestClient, object_id: str, analyst: str) -> int:
    """Submit ``binary_rr`` 'x == SENTINEL' at ε = 30: the output is the truth w.p. 1 - 1e-13."""
    query = {
        "mechanism": "binary_rr",
        "epsilon": 30.0,
        "predicate": {"attribute": "x", "op": "==", "value": SENTINEL},
    }
    response = client.post(
        f"/v1/objects/{object_id}/queries", json={"query": query}, headers=auth(analyst)
    )
    assert response.status_code == 201, response.text
    return int(response.json()["output"])


def test_values_are_stored_encrypted_and_still_used(database_url: str) -> None:
    with TestClient(create_app(make_settings(database_url))) as client:
        object_id = register(client)
        analyst = new_key(client, "analyst")
        assert reports_truth(client, object_id, analyst) == 1
    raw = stored_text(database_url, object_id)
    # the whole stored text is one Fernet token (URL-safe base64): no plaintext beside it. The
    # value's digits alone may occur in random base64 by chance ("C77q..."): not checked.
    assert re.fullmatch(re.escape(crypto.PREFIX) + r"[A-Za-z0-9_-]+={0,2}", raw), raw
    assert json.loads(crypto.active().decrypt(raw)) == {"x": SENTINEL}


def test_key_file_is_created_once_with_mode_0600_and_logged_without_the_key(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "data" / "encryption.key"
    keys: list[bytes] = []

    def load() -> None:
        keys.append(crypto.load_key_file(path, create=True))

    with caplog.at_level(logging.WARNING, logger="gatekeeper"):
        threads = [threading.Thread(target=load) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert len(set(keys)) == 1, "racing processes must end up with one key"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    generated = [r for r in caplog.records if "generated an encryption key" in r.getMessage()]
    assert len(generated) == 1
    assert str(path) in generated[0].getMessage()
    assert keys[0].decode() not in caplog.text
    crypto.ValueCipher(keys)  # a valid Fernet key


def test_production_never_generates_a_key(tmp_path: Path) -> None:
    missing = tmp_path / "encryption.key"
    settings = Settings(
        gatekeeper_env=Environment.PRODUCTION,
        database_url="postgresql://u@h/db",
        gatekeeper_encryption_keys=None,
        gatekeeper_encryption_key_file=str(missing),
    )
    with pytest.raises(crypto.EncryptionKeyError, match="GATEKEEPER_ENCRYPTION_KEYS"):
        settings.value_cipher()
    assert not missing.exists()


def test_bad_keys_are_refused_without_echoing_them() -> None:
    bad = "not-a-fernet-key-but-secret"
    with pytest.raises(crypto.EncryptionKeyError) as info:
        crypto.cipher_from_settings(bad, "", production=False)
    assert bad not in str(info.value)


def test_another_key_cannot_read_a_value() -> None:
    token = crypto.ValueCipher([crypto.new_key().encode()]).encrypt('{"x": 1}')
    other = crypto.ValueCipher([crypto.new_key().encode()])
    with pytest.raises(crypto.EncryptionKeyError, match="does not decrypt"):
        other.decrypt(token)
    tampered = token[:-4] + ("AAAA" if not token.endswith("AAAA") else "BBBB")
    with pytest.raises(crypto.EncryptionKeyError):
        crypto.ValueCipher([crypto.new_key().encode()]).decrypt(tampered)


def test_plaintext_rows_from_before_encryption_are_encrypted(sqlite_url: str) -> None:
    with TestClient(create_app(make_settings(sqlite_url))) as client:
        object_id = register(client)
    engine = make_engine(sqlite_url)
    table = ProtectedObject.__table__
    try:
        with Session(engine, expire_on_commit=False) as session, session.begin():
            # write the row as version 0.1.0 did: plain JSON (Core on the bare table column
            # would encrypt, so write through a plain-text cast of the statement's value)
            session.execute(
                update(table)
                .where(table.c.id == object_id)
                .values({table.c.value: cast('{"x": 77}', Text)})
            )
        assert stored_text(sqlite_url, object_id) == '{"x": 77}'
        with engine.begin() as conn:
            assert encrypt_plaintext_rows(conn) >= 1
        with engine.begin() as conn:
            assert encrypt_plaintext_rows(conn) == 0  # idempotent
    finally:
        engine.dispose()
    raw = stored_text(sqlite_url, object_id)
    assert raw.startswith(crypto.PREFIX)
    assert json.loads(crypto.active().decrypt(raw)) == {"x": SENTINEL}


def _cli(database_url: str, keys: str, *args: str) -> subprocess.CompletedProcess[str]:
    return run_cli(*args, database_url=database_url, GATEKEEPER_ENCRYPTION_KEYS=keys)


def test_rotation_moves_every_value_to_the_new_key(tmp_path: Path) -> None:
    """On a database of its own: rotation refuses to skip a value it cannot read."""
    database_url = f"sqlite:///{tmp_path / 'rotate.db'}"
    upgrade(database_url)
    old, new = crypto.new_key(), crypto.new_key()
    with TestClient(
        create_app(make_settings(database_url, gatekeeper_encryption_keys=old))
    ) as client:
        object_id = register(client)
        analyst = new_key(client, "analyst")
    rotated = _cli(database_url, f"{new},{old}", "encryption", "rotate")
    assert rotated.returncode == 0, rotated.stderr
    assert "re-encrypted" in rotated.stdout
    assert old not in rotated.stdout + rotated.stderr
    assert new not in rotated.stdout + rotated.stderr
    raw = stored_text(database_url, object_id)
    with pytest.raises(crypto.EncryptionKeyError):
        crypto.ValueCipher([old.encode()]).decrypt(raw)
    assert json.loads(crypto.ValueCipher([new.encode()]).decrypt(raw)) == {"x": SENTINEL}
    # a key list that cannot read some value makes rotation fail, never skip it
    stranger = _cli(database_url, crypto.new_key(), "encryption", "rotate")
    assert stranger.returncode == 2
    assert "does not decrypt" in stranger.stderr
    # the old key dropped: the service reads (and samples from) the value with the new key alone
    with TestClient(
        create_app(make_settings(database_url, gatekeeper_encryption_keys=new))
    ) as client:
        assert reports_truth(client, object_id, analyst) == 1


def test_new_key_command_prints_a_usable_key() -> None:
    result = _cli("sqlite:///:memory:", TEST_ENCRYPTION_KEY, "encryption", "new-key")
    assert result.returncode == 0, result.stderr
    crypto.ValueCipher([result.stdout.strip().encode()])
