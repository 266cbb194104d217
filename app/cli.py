"""The ``gatekeeper`` command line: loss, serve, keys, import, verify, encryption."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from typing import Any

from app.engine.calculator import compute_loss
from app.engine.errors import InvalidInput, Unsupported
from app.engine.jsonfields import NotText, RepeatedKey, loads_strict


def _read_json(source: str) -> Any:
    if source == "-":
        return loads_strict(sys.stdin.read())
    with open(source, encoding="utf-8") as handle:
        return loads_strict(handle.read())


def _problem(kind: str, title: str, detail: str, field: str | None) -> dict[str, Any]:
    body: dict[str, Any] = {"type": kind, "title": title, "detail": detail}
    if field is not None:
        body["errors"] = [{"field": field, "message": detail}]
    return body


def cmd_loss(args: argparse.Namespace) -> int:
    """Print the calculator's JSON answer for FILE (``-`` for stdin); problems go to stderr."""
    try:
        request = _read_json(args.file)
    except FileNotFoundError:
        detail = f"no such file: {args.file}"
        print(
            json.dumps(_problem("file-not-found", "File not found", detail, None)),
            file=sys.stderr,
        )
        return 2
    except (RepeatedKey, NotText) as exc:
        detail = (
            "is given more than once"
            if isinstance(exc, RepeatedKey)
            else "holds a lone UTF-16 surrogate escape"
        )
        problem = _problem("invalid-json", "Invalid JSON", detail, exc.field)
        problem["detail"] = str(exc)
        print(json.dumps(problem), file=sys.stderr)
        return 2
    except json.JSONDecodeError as exc:
        detail = f"not valid JSON (line {exc.lineno}, column {exc.colno})"
        print(json.dumps(_problem("invalid-json", "Invalid JSON", detail, None)), file=sys.stderr)
        return 2
    try:
        answer = compute_loss(request)
    except InvalidInput as exc:
        print(
            json.dumps(_problem("validation-error", "Invalid input", exc.message, exc.field)),
            file=sys.stderr,
        )
        return 2
    except Unsupported as exc:
        print(
            json.dumps(_problem("unsupported", "Not supported", exc.message, exc.field)),
            file=sys.stderr,
        )
        return 3
    json.dump(answer, sys.stdout, indent=2 if args.pretty else None)
    sys.stdout.write("\n")
    return 0


def _prepare_database() -> tuple[Any, Any]:
    """Wait for the database and migrate it (the prestart steps); returns (settings, engine)."""
    from app import crypto
    from app.db.migrate import upgrade
    from app.db.session import make_engine, wait_for_database
    from app.settings import get_settings

    settings = get_settings()
    crypto.configure(settings.value_cipher())
    engine = make_engine(settings.database_url)
    wait_for_database(engine, settings.database_wait_seconds)
    upgrade(settings.database_url)
    return settings, engine


def cmd_serve(args: argparse.Namespace) -> int:
    """Wait for the database, migrate it, then serve with uvicorn.

    With several workers their metrics are summed through a temporary directory
    (:func:`app.multiproc.metrics_directory`), removed when the server stops.
    """
    import uvicorn

    from app.logs import configure, uvicorn_log_config
    from app.multiproc import metrics_directory
    from app.settings import get_settings

    configure(get_settings().log_level)
    settings, engine = _prepare_database()
    _encrypt_legacy_values(engine)
    engine.dispose()
    workers = args.workers or settings.web_workers
    print(
        f"gatekeeper: serving on http://{args.host or settings.host}:{args.port or settings.port}"
        f" with {workers} worker(s), database {settings.database_url.split('://')[0]}",
        file=sys.stderr,
    )
    # before the workers start: they read PROMETHEUS_MULTIPROC_DIR when importing prometheus
    with metrics_directory(workers) as metrics_dir:
        if metrics_dir is not None:
            print(
                f"gatekeeper: metrics of all workers are summed in {metrics_dir}", file=sys.stderr
            )
        uvicorn.run(
            "app.api.main:app_factory",
            factory=True,
            host=args.host or settings.host,
            port=args.port or settings.port,
            workers=workers,
            timeout_worker_healthcheck=settings.worker_healthcheck_seconds,
            log_level=settings.log_level.lower(),
            log_config=uvicorn_log_config(settings.log_level),
        )
    return 0


def _encrypt_legacy_values(engine: Any) -> None:
    """Encrypt private values stored in plaintext before encryption at rest existed."""
    from app.db.session import make_session_factory
    from app.services.encryption import encrypt_plaintext_rows

    with make_session_factory(engine)() as session, session.begin():
        changed = encrypt_plaintext_rows(session)
    if changed:
        print(
            f"gatekeeper: encrypted {changed} private value(s) stored in plaintext", file=sys.stderr
        )


def cmd_encryption_new_key(args: argparse.Namespace) -> int:
    """Print a new Fernet key (for GATEKEEPER_ENCRYPTION_KEYS)."""
    from app.crypto import new_key

    print(new_key())
    return 0


def cmd_encryption_rotate(args: argparse.Namespace) -> int:
    """Re-encrypt every private value with the first key of GATEKEEPER_ENCRYPTION_KEYS."""
    from app.db.session import make_session_factory
    from app.services.encryption import rotate_rows

    _, engine = _prepare_database()
    with make_session_factory(engine)() as session, session.begin():
        count = rotate_rows(session)
    engine.dispose()
    print(f"re-encrypted {count} private value(s) with the first key")
    return 0


def cmd_keys_create(args: argparse.Namespace) -> int:
    """Create an API key and print it once."""
    from app.db.session import make_session_factory
    from app.services.auth import Role, create_key

    _, engine = _prepare_database()
    with make_session_factory(engine)() as session, session.begin():
        _, secret = create_key(session=session, role=Role(args.role), label=args.label)
    print(secret)
    return 0


def cmd_keys_list(args: argparse.Namespace) -> int:
    """Print every API key: id, role, label, created, revoked (never a secret)."""
    from app.db.session import make_session_factory
    from app.services.auth import list_keys

    _, engine = _prepare_database()
    rows: list[dict[str, Any]] = []
    after = 0
    with make_session_factory(engine)() as session:
        while True:
            page = list_keys(session=session, limit=1000, after=after)
            rows.extend(page["items"])
            if page["next_after"] is None:
                break
            after = page["next_after"]
    if args.json:
        for row in rows:
            print(json.dumps(row))
        return 0
    print(f"{'ID':>6}  {'ROLE':<8} {'CREATED':<32} {'REVOKED':<32} LABEL")
    for row in rows:
        print(
            f"{row['id']:>6}  {row['role']:<8} {row['created_at']:<32} "
            f"{row['revoked_at'] or '-':<32} {row['label'] or ''}"
        )
    return 0


def cmd_keys_revoke(args: argparse.Namespace) -> int:
    """Revoke a key by id; refuses the last active admin key (exit 1)."""
    from app.db.session import make_session_factory
    from app.services.auth import revoke_key
    from app.services.errors import LastAdminKey

    _, engine = _prepare_database()
    try:
        with make_session_factory(engine)() as session, session.begin():
            found = revoke_key(session=session, key_id=args.id)
    except LastAdminKey as exc:
        print(f"refused: {exc.detail}", file=sys.stderr)
        return 1
    if not found:
        print(f"no key with id {args.id}", file=sys.stderr)
        return 1
    print(f"key {args.id} revoked")
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    """Recompute every object's state from its history; non-zero exit on any mismatch."""
    from app.db.session import make_session_factory
    from app.services.verify import verify_all

    _, engine = _prepare_database()
    report = verify_all(make_session_factory(engine))
    for line in report.problems:
        print(f"MISMATCH {line}")
    print(
        f"verified {report.checked} object(s): "
        + ("ok" if report.ok else f"{len(report.problems)} mismatch(es)")
    )
    return 0 if report.ok else 1


def cmd_import(args: argparse.Namespace) -> int:
    """Register the objects of an NDJSON file (``-``: stdin) in batches, with a progress bar.

    Each batch is one all-or-nothing import (:mod:`app.services.imports`); objects already
    registered identically are counted as existing, so an interrupted import is resumed by
    running the same command again. A bad line stops the import with its line number; the
    batches before it stay stored.
    """
    from tqdm import tqdm

    from app.engine.limits import DEFAULT_LIMITS
    from app.services.errors import ServiceError
    from app.services.imports import MAX_IMPORT, import_objects, parse_items

    batch_size = args.batch_size
    if not 1 <= batch_size <= MAX_IMPORT:
        print(f"--batch-size must be 1..{MAX_IMPORT}", file=sys.stderr)
        return 2
    _, engine = _prepare_database()
    source = sys.stdin.buffer if args.file == "-" else open(args.file, "rb")  # noqa: SIM115
    total_bytes = None if args.file == "-" else os.fstat(source.fileno()).st_size
    created = existing = 0
    items: list[Any] = []
    lines: list[int] = []

    def flush() -> None:
        nonlocal created, existing
        try:
            registrations = parse_items(items, DEFAULT_LIMITS)
        except InvalidInput as exc:
            index = int(exc.field.split("[", 1)[1].split("]", 1)[0])
            rest = exc.field.split("]", 1)[1].lstrip(".")
            where = f"line {lines[index]}" + (f", field {rest}" if rest else "")
            raise SystemExit(_fail(f"{where}: {exc.errors[0].message}")) from None
        try:
            result = import_objects(
                engine=engine,
                registrations=registrations,
                fingerprint="",
                idempotency_key=None,
                actor_key_id=None,
            )
        except ServiceError as exc:
            raise SystemExit(_fail(f"lines {lines[0]}-{lines[-1]}: {exc.detail}")) from None
        created += result.body["created"]
        existing += result.body["existing"]
        items.clear()
        lines.clear()

    with (
        source,
        tqdm(
            total=total_bytes,
            unit="B",
            unit_scale=True,
            desc="import",
            disable=args.quiet,
            file=sys.stderr,
        ) as bar,
    ):
        for number, line in enumerate(source, start=1):
            bar.update(len(line))
            if not line.strip():
                continue
            try:
                items.append(json.loads(line))
            except ValueError:
                return _fail(f"line {number}: not valid JSON")
            lines.append(number)
            if len(items) >= batch_size:
                flush()
                bar.set_postfix(created=created, existing=existing)
        if items:
            flush()
            bar.set_postfix(created=created, existing=existing)
    print(json.dumps({"created": created, "existing": existing}))
    return 0


def _fail(message: str) -> int:
    print(f"gatekeeper import: {message}", file=sys.stderr)
    return 2


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``gatekeeper`` command."""
    parser = argparse.ArgumentParser(
        prog="gatekeeper",
        description="ldp-gatekeeper: per-object privacy budgets under Local Differential "
        "Privacy. Every command reads the service's settings (DATABASE_URL, REDIS_URL, ...) "
        "from the environment.",
        epilog="Run 'gatekeeper COMMAND --help' for a command's options.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    loss = sub.add_parser("loss", help="realized privacy loss of a history (JSON in, JSON out)")
    loss.add_argument("file", help="request JSON file, or - for standard input")
    loss.add_argument(
        "--pretty", action="store_true", help="indent the JSON answer (2 spaces) for reading"
    )
    loss.set_defaults(func=cmd_loss)
    serve = sub.add_parser("serve", help="migrate the database, then start the HTTP service")
    serve.add_argument("--host", default=None, help="default: HOST or 127.0.0.1")
    serve.add_argument("--port", type=int, default=None, help="default: PORT or 8000")
    serve.add_argument(
        "--workers",
        type=int,
        default=None,
        help="uvicorn worker processes (default: WEB_WORKERS or 1)",
    )
    serve.set_defaults(func=cmd_serve)
    keys = sub.add_parser("keys", help="manage API keys")
    keys_sub = keys.add_subparsers(dest="keys_command", required=True)
    create = keys_sub.add_parser("create", help="create a key and print it once")
    create.add_argument("--role", required=True, choices=["admin", "analyst", "viewer"])
    create.add_argument("--label", default=None)
    create.set_defaults(func=cmd_keys_create)
    listing = keys_sub.add_parser("list", help="list keys (id, role, created, revoked)")
    listing.add_argument("--json", action="store_true", help="one JSON object per line")
    listing.set_defaults(func=cmd_keys_list)
    revoke = keys_sub.add_parser("revoke", help="revoke a key (never the last active admin key)")
    revoke.add_argument("id", type=int, help="the key's id (see keys list)")
    revoke.set_defaults(func=cmd_keys_revoke)
    imports = sub.add_parser(
        "import", help="register the objects of an NDJSON file (resumable: re-run it)"
    )
    imports.add_argument("file", help="one registration per line, or - for standard input")
    imports.add_argument(
        "--batch-size", type=int, default=5000, help="objects per transaction (max 10000)"
    )
    imports.add_argument("--quiet", action="store_true", help="no progress bar")
    imports.set_defaults(func=cmd_import)
    verify = sub.add_parser("verify", help="recompute every object's state from its history")
    verify.set_defaults(func=cmd_verify)
    encryption = sub.add_parser("encryption", help="keys of the private values at rest")
    encryption_sub = encryption.add_subparsers(dest="encryption_command", required=True)
    new_key = encryption_sub.add_parser("new-key", help="print a new key")
    new_key.set_defaults(func=cmd_encryption_new_key)
    rotate = encryption_sub.add_parser(
        "rotate", help="re-encrypt every value with the first key of GATEKEEPER_ENCRYPTION_KEYS"
    )
    rotate.set_defaults(func=cmd_encryption_rotate)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script."""
    from app.crypto import EncryptionKeyError
    from app.settings import SettingsError

    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except (SettingsError, EncryptionKeyError) as exc:
        print(f"gatekeeper: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
