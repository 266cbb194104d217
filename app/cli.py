"""The ``gatekeeper`` command line: loss, serve, migrate, worker, keys, import, verify, encryption.

Every command that opens the database names it on standard error (a password masked). Only
``serve`` and ``migrate`` create or migrate a database (and the key file of the values at rest);
the others refuse a database that is missing or not at this version's migration, saying how to
fix it, instead of creating a fresh ``./data/gatekeeper.db`` wherever they are run.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

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
    # the engine (NumPy with it: ~0.1 s of CPU) is imported by the commands that use it, not
    # by every `gatekeeper` command and `--help` (docs/benchmarks.md, "Eighteenth session,
    # h/start")
    from app.engine.calculator import compute_loss

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


class Refused(Exception):
    """A command cannot run as configured; the message says why and how to fix it (exit 2)."""


def describe_database(url: str) -> str:
    """``url`` as commands print it: the password masked, a relative SQLite path made absolute.

    >>> describe_database("postgresql://gk:s3cret@db:5432/gatekeeper")
    'postgresql://gk:***@db:5432/gatekeeper'
    >>> describe_database("sqlite:////srv/gk.db")
    'sqlite:////srv/gk.db'
    """
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        parsed = make_url(url)
    except ArgumentError:
        return url.split("://", 1)[0] + "://…"  # unparsable: never echo what might be a password
    path = _sqlite_path(url)
    if path is not None:
        parsed = parsed.set(database=str(path.resolve()))
    return parsed.render_as_string(hide_password=True)


def _sqlite_path(url: str) -> Path | None:
    """The file of a SQLite URL (``None``: another database, or SQLite in memory)."""
    from sqlalchemy.engine import make_url

    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite" or parsed.database in (None, "", ":memory:"):
        return None
    return Path(parsed.database)


def _announce_database(settings: Any) -> None:
    """Name the database this command uses (standard error)."""
    from app.settings import DEFAULT_DATABASE_URL

    default = (
        " (the default, relative to the current directory: set DATABASE_URL to use another)"
        if settings.database_url == DEFAULT_DATABASE_URL
        else ""
    )
    print(
        f"gatekeeper: database {describe_database(settings.database_url)}{default}", file=sys.stderr
    )


_HOW_TO_MIGRATE = (
    "run `gatekeeper migrate` (or `gatekeeper serve` once) with this DATABASE_URL to create or "
    "upgrade it"
)


def _open_database(*, values: bool) -> Any:
    """The engine of a database at this version's migration, for commands other than ``serve``.

    Refuses (:class:`Refused`) a SQLite file that does not exist — creating nothing, neither
    the file, nor its folder, nor an encryption key — and a database not at the newest
    migration. With ``values`` the cipher of the values at rest is configured from the
    settings' keys or an existing key file (never a new one).
    """
    from app import crypto
    from app.db.migrate import migration_problem
    from app.db.session import make_engine, wait_for_database
    from app.settings import get_settings

    settings = get_settings()
    _announce_database(settings)
    name = describe_database(settings.database_url)
    path = _sqlite_path(settings.database_url)
    if path is not None and not path.is_file():
        raise Refused(
            f"no database at {path.resolve()}: run this command where the service's database is, "
            f"or point DATABASE_URL at it; to start a new one, {_HOW_TO_MIGRATE}"
        )
    engine = make_engine(settings.database_url)
    try:
        wait_for_database(engine, settings.database_wait_seconds)
        problem = migration_problem(engine)
    except BaseException:
        engine.dispose()
        raise
    if problem is not None:
        engine.dispose()
        raise Refused(f"the database {name} {problem}: {_HOW_TO_MIGRATE}")
    if values:
        crypto.configure(
            crypto.cipher_from_settings(
                settings.gatekeeper_encryption_keys,
                settings.gatekeeper_encryption_key_file,
                production=settings.is_production,
                create=False,
            )
        )
    return engine


def _prepare_database() -> tuple[Any, Any]:
    """Wait for the database and migrate it (the prestart steps); returns (settings, engine)."""
    from app.bootstrap import prepare_database
    from app.settings import get_settings

    settings = get_settings()
    _announce_database(settings)
    return prepare_database(settings)


def cmd_serve(args: argparse.Namespace) -> int:
    """Wait for the database, migrate it, then serve with uvicorn.

    With several workers their metrics are summed through a temporary directory
    (:func:`app.multiproc.metrics_directory`), removed when the server stops, and the workers
    are forked from this process once it imported the app's modules (:mod:`app.webfork`).
    """
    import uvicorn

    from app.logs import configure, uvicorn_log_config
    from app.multiproc import metrics_directory
    from app.settings import get_settings
    from app.webfork import forked_workers

    configure(get_settings().log_level)
    settings, engine = _prepare_database()
    _encrypt_legacy_values(engine)
    _fold_object_counts(engine)
    _collect_states(engine)
    engine.dispose()
    workers = args.workers or settings.web_workers
    print(
        f"gatekeeper: serving on http://{args.host or settings.host}:{args.port or settings.port}"
        f" with {workers} worker(s), database {settings.database_url.split('://')[0]}",
        file=sys.stderr,
    )
    # before the workers start: they read PROMETHEUS_MULTIPROC_DIR when importing prometheus
    # (so does the parent importing the app for its forked workers)
    with metrics_directory(workers) as metrics_dir, forked_workers(workers):
        if metrics_dir is not None:
            print(
                f"gatekeeper: metrics of all workers are summed in {metrics_dir}", file=sys.stderr
            )
        uvicorn.run(
            "app.bootstrap:app_factory",
            factory=True,
            host=args.host or settings.host,
            port=args.port or settings.port,
            workers=workers,
            timeout_worker_healthcheck=settings.worker_healthcheck_seconds,
            log_level=settings.log_level.lower(),
            log_config=uvicorn_log_config(settings.log_level),
        )
    return 0


def cmd_migrate(args: argparse.Namespace) -> int:
    """Create or upgrade the database to this version's schema: ``serve``'s steps, no serving.

    Like ``serve`` it creates the key file of the values at rest when none is configured
    (outside production) and encrypts values stored before encryption existed.
    """
    from app.db.migrate import current_revision

    _, engine = _prepare_database()
    _encrypt_legacy_values(engine)
    revision = current_revision(engine)
    engine.dispose()
    print(f"gatekeeper: database at migration {revision} (the newest)", file=sys.stderr)
    return 0


def _worker_fail(message: str) -> int:
    print(f"gatekeeper worker: {message}", file=sys.stderr)
    return 2


def cmd_worker(args: argparse.Namespace) -> int:
    """Run Celery worker nodes for bound computations and survey chunks (``app.node``)."""
    from app.logs import configure
    from app.node import QUEUES, run_worker
    from app.settings import get_settings

    settings = get_settings()
    configure(settings.log_level)
    if settings.broker_url is None:
        return _worker_fail(
            "BROKER_URL is not set: without a broker the service does all work in process "
            "(gatekeeper serve); set BROKER_URL=redis://... or amqp://... to run workers"
        )
    if args.concurrency < 1:
        return _worker_fail("--concurrency must be at least 1")
    queues = tuple(q.strip() for q in args.queues.split(",") if q.strip())
    if not queues or any(q not in QUEUES for q in queues):
        return _worker_fail(f"--queues takes a comma-separated subset of {','.join(QUEUES)}")
    return run_worker(settings, concurrency=args.concurrency, queues=queues)


def _encrypt_legacy_values(engine: Any) -> None:
    """Encrypt private values stored in plaintext before encryption at rest existed."""
    from app.services.encryption import encrypt_plaintext_rows
    from app.store import transaction

    with transaction(engine) as conn:
        changed = encrypt_plaintext_rows(conn)
    if changed:
        print(
            f"gatekeeper: encrypted {changed} private value(s) stored in plaintext", file=sys.stderr
        )


def _collect_states(engine: Any) -> int:
    """Delete the stored likelihood states no object names (:mod:`app.store.states`).

    :func:`app.services.snapshots.collect_states`'s transaction, called on the store: that
    module imports the engine, the schemas and the ORM models (~0.13 s of CPU with
    :func:`_fold_object_counts`'s), which a ``gatekeeper serve`` parent of several workers
    never uses (docs/benchmarks.md, "Nineteenth session, h/spawn").
    """
    from app.store import transaction
    from app.store.states import collect_unnamed

    with transaction(engine) as conn:
        collected = collect_unnamed(conn)
    if collected:
        print(
            f"gatekeeper: deleted {collected} likelihood state(s) no object names", file=sys.stderr
        )
    return collected


def cmd_states_collect(args: argparse.Namespace) -> int:
    """Delete the stored likelihood states no object names (safe beside a running service)."""
    engine = _open_database(values=False)
    collected = _collect_states(engine)
    engine.dispose()
    print(f"deleted {collected} likelihood state(s) no object names")
    return 0


def _fold_object_counts(engine: Any) -> None:
    """Fold the per-process rows of ``object_counts`` into one (PostgreSQL; sums unchanged).

    :func:`app.services.objects.fold_object_counts`'s transaction, called on the store without
    importing the services (see :func:`_collect_states`).
    """
    from app.store import transaction
    from app.store.objects import fold_counts

    with transaction(engine) as conn:
        folded = fold_counts(conn)
    if folded:
        print(f"gatekeeper: folded {folded} row(s) of object_counts into one", file=sys.stderr)


def cmd_encryption_new_key(args: argparse.Namespace) -> int:
    """Print a new Fernet key (for GATEKEEPER_ENCRYPTION_KEYS)."""
    from app.crypto import new_key

    print(new_key())
    return 0


def cmd_encryption_rotate(args: argparse.Namespace) -> int:
    """Re-encrypt every private value with the first key of GATEKEEPER_ENCRYPTION_KEYS."""
    from app.services.encryption import rotate_rows
    from app.store import transaction

    engine = _open_database(values=True)
    with transaction(engine) as conn:
        count = rotate_rows(conn)
    engine.dispose()
    print(f"re-encrypted {count} private value(s) with the first key")
    return 0


def cmd_keys_create(args: argparse.Namespace) -> int:
    """Create an API key (in ``--project``) and print it once; exit 2 naming a bad field."""
    from app.services.auth import create_key
    from app.services.schemas import Role

    engine = _open_database(values=False)
    try:
        _, secret = create_key(
            engine=engine, role=Role(args.role), label=args.label, project=args.project
        )
    except InvalidInput as exc:
        print(f"gatekeeper keys create: {exc.field}: {exc.message}", file=sys.stderr)
        return 2
    print(secret)
    return 0


def cmd_keys_list(args: argparse.Namespace) -> int:
    """Print every API key: id, role, label, created, revoked (never a secret)."""
    from app.services.auth import list_keys

    engine = _open_database(values=False)
    rows: list[dict[str, Any]] = []
    after = 0
    while True:
        page = list_keys(engine=engine, limit=1000, after=after)
        rows.extend(item.model_dump(mode="json") for item in page.items)
        if page.next_after is None:
            break
        after = page.next_after
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
    from app.services.auth import revoke_key
    from app.services.errors import LastAdminKey

    engine = _open_database(values=False)
    try:
        found = revoke_key(engine=engine, key_id=args.id)
    except LastAdminKey as exc:
        print(f"refused: {exc.detail}", file=sys.stderr)
        return 1
    if not found:
        print(f"no key with id {args.id}", file=sys.stderr)
        return 1
    _announce_revoked([args.id])
    print(f"key {args.id} revoked")
    return 0


def _announce_revoked(key_ids: list[int]) -> None:
    """Tell the running web workers to forget revoked keys (through Redis, if configured).

    With ``REDIS_URL`` they refuse ``key_ids`` as soon as the announcement reaches them; without
    it, within ``AUTH_CACHE_SECONDS``.
    """
    from app.settings import get_settings

    url = get_settings().redis_url
    if not url or not key_ids:
        return
    import redis

    from app.services.auth import announce_revoked

    client = redis.Redis.from_url(url, socket_timeout=1.0, socket_connect_timeout=1.0)
    try:
        announce_revoked(client, key_ids)
    finally:
        client.close()


def cmd_projects_delete(args: argparse.Namespace) -> int:
    """Delete a project by name (its keys revoked); an unknown or deleted one: exit 1."""
    from app.services.errors import NotFound
    from app.services.projects import delete_project

    engine = _open_database(values=False)
    try:
        revoked = delete_project(engine=engine, name=args.name, actor_key_id=None)
    except NotFound:
        print(f"no project named {args.name!r}", file=sys.stderr)
        return 1
    _announce_revoked(list(revoked))
    print(f"project {args.name} deleted; {len(revoked)} key(s) revoked")
    return 0


def cmd_audit_export(args: argparse.Namespace) -> int:
    """Write the audit log as NDJSON to standard output, oldest first (resumable with --after)."""
    from app.services.audit import export_lines, parse_since

    try:
        since = None if args.since is None else parse_since(args.since)
    except InvalidInput as exc:
        print(f"gatekeeper audit export: --{exc.field}: {exc.message}", file=sys.stderr)
        return 2
    engine = _open_database(values=False)
    try:
        out = sys.stdout.buffer
        for line in export_lines(engine=engine, after=args.after or 0, since=since):
            out.write(line)
    finally:
        engine.dispose()
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    """Recompute every object's state from its history; non-zero exit on any mismatch."""
    import time

    from tqdm import tqdm

    from app.services.verify import (
        Report,
        count_objects,
        split_ids,
        verify_objects,
        verify_shared,
    )

    if args.jobs < 1:
        raise Refused("--jobs: at least 1 process")
    engine = _open_database(values=True)
    started = time.monotonic()
    _fold_object_counts(engine)
    with tqdm(
        total=count_objects(engine),
        unit=" objects",
        desc="verify",
        disable=args.quiet,
        file=sys.stderr,
    ) as bar:
        if args.jobs == 1:
            report = verify_objects(engine, progress=bar.update)
        else:
            report = Report()
            for part in _verify_in_processes(engine, split_ids(engine, args.jobs), bar.update):
                report.checked += part.checked
                report.replays += part.replays
                report.problems.extend(part.problems)
        verify_shared(engine, report)
    engine.dispose()
    for line in report.problems:
        print(f"MISMATCH {line}")
    if report.unnamed_states:
        print(
            f"{report.unnamed_states} stored likelihood state(s) no object names: deleted by "
            "the next collection (gatekeeper states collect)"
        )
    print(
        f"verified {report.checked} object(s) and {report.surveys} survey(s) in "
        f"{time.monotonic() - started:.1f} s ({report.replays} distinct histories replayed): "
        + ("ok" if report.ok else f"{len(report.problems)} mismatch(es)")
    )
    return 0 if report.ok else 1


def _verify_in_processes(
    engine: Any, ranges: list[tuple[str | None, str | None]], progress: Callable[[int], object]
) -> list[Any]:
    """:func:`~app.services.verify.verify_objects` of each id range in its own process.

    The reports come back in range order (so mismatches are listed in id order); each page's
    count reaches ``progress`` as it is checked.
    """
    import multiprocessing
    import queue
    from concurrent.futures import ProcessPoolExecutor, wait

    url = engine.url.render_as_string(hide_password=False)
    context = multiprocessing.get_context("spawn")
    with context.Manager() as manager, ProcessPoolExecutor(len(ranges), mp_context=context) as pool:
        pages = manager.Queue()
        futures = [pool.submit(_verify_range, url, a, b, pages) for a, b in ranges]
        while True:
            done = wait(futures, timeout=0.2).not_done == set()
            while True:
                try:
                    progress(pages.get_nowait())
                except queue.Empty:
                    break
            if done:
                return [future.result() for future in futures]


def _verify_range(url: str, after: str | None, upto: str | None, pages: Any) -> Any:
    """A worker's job: verify the objects in ``(after, upto]`` on its own connection.

    Module level, so that a spawned process can run it.
    """
    from app.db.session import make_engine
    from app.services.verify import verify_objects

    engine = make_engine(url, pool_size=1, max_overflow=1)
    try:
        return verify_objects(engine, pages.put, after=after, upto=upto)
    finally:
        engine.dispose()


@contextmanager
def _ndjson_input(args: argparse.Namespace, desc: str) -> Iterator[tuple[IO[bytes], Any]]:
    """The import's input (``args.file``, ``-``: stdin) and a progress bar over its bytes."""
    from tqdm import tqdm

    source = sys.stdin.buffer if args.file == "-" else open(args.file, "rb")  # noqa: SIM115
    total_bytes = None if args.file == "-" else os.fstat(source.fileno()).st_size
    with (
        source,
        tqdm(
            total=total_bytes,
            unit="B",
            unit_scale=True,
            desc=desc,
            disable=args.quiet,
            file=sys.stderr,
        ) as bar,
    ):
        yield source, bar


def _bad_batch_options(args: argparse.Namespace, most: int) -> bool:
    """Whether ``import``'s batch options are unusable, after printing the first problem.

    ``--batch-size`` must be 1..*most*, ``--jobs`` and ``--jobs-min-lines`` 0 or more.
    """
    if not 1 <= args.batch_size <= most:
        problem = f"--batch-size must be 1..{most}"
    elif args.jobs < 0:
        problem = "--jobs must be 0 or more"
    elif args.jobs_min_lines < 0:
        problem = "--jobs-min-lines must be 0 or more"
    else:
        return False
    print(problem, file=sys.stderr)
    return True


def cmd_import(args: argparse.Namespace) -> int:
    """Register the objects of an NDJSON file (``-``: stdin) in batches, with a progress bar.

    Each batch is one all-or-nothing import (:mod:`app.services.imports`); objects already
    registered identically are counted as existing, so an interrupted import is resumed by
    running the same command again. A bad line stops the import with its line number; the
    batches before it stay stored. ``--jobs`` worker processes parse and validate the next
    batches while this process stores the current one (``--jobs 0``: all in this process); an
    input of at most ``--jobs-min-lines`` lines is parsed here, as with ``--jobs 0``
    (:func:`_jobs_worth_starting`).
    """
    from app.services.errors import ServiceError
    from app.services.imports import BadLine, import_objects
    from app.services.schemas import MAX_IMPORT

    if args.versions:
        return _import_versions(args)
    batch_size = args.batch_size
    if _bad_batch_options(args, MAX_IMPORT):
        return 2
    engine = _open_database(values=True)
    created = existing = 0
    with _ndjson_input(args, "import") as (source, bar):
        try:
            jobs, batches = _jobs_worth_starting(
                _numbered_batches(source, batch_size), args.jobs, args.jobs_min_lines
            )
            for (first, last, size), registrations in _parsed_batches(batches, jobs):
                try:
                    result = import_objects(
                        engine=engine,
                        registrations=registrations,
                        fingerprint="",
                        idempotency_key=None,
                        actor_key_id=None,
                    )
                except ServiceError as exc:
                    return _fail(f"lines {first}-{last}: {exc.detail}")
                created += result.body.created
                existing += result.body.existing
                bar.update(size)
                # as text: tqdm shows numbers in short form (created=2e+4)
                bar.set_postfix_str(f"created={created}, existing={existing}")
        except BadLine as exc:
            return _fail(str(exc))
    print(json.dumps({"created": created, "existing": existing}))
    return 0


def _import_versions(args: argparse.Namespace) -> int:
    """``gatekeeper import --versions FILE``: new values (``{"id", "value"}`` a line), batched.

    Each batch is one all-or-nothing bulk version request whose Idempotency-Key is the SHA-256
    of its numbered lines: running the same file again after an interruption replays the
    batches already stored (no second version) and carries on with the rest. On PostgreSQL
    ``--jobs`` worker processes parse, check and encrypt the next batches
    (:func:`~app.services.versions.seal_bulk`) while this process stores the current one; a
    batch they could not seal (a bad line, an unknown object) is parsed and checked again here,
    which names the first bad line. An input of at most ``--jobs-min-lines`` lines is parsed
    here, as with ``--jobs 0`` (:func:`_jobs_worth_starting`).
    """
    from app.services.errors import ServiceError
    from app.services.schemas import MAX_VERSIONS
    from app.services.versions import StaleSeal

    if _bad_batch_options(args, MAX_VERSIONS):
        return 2
    engine = _open_database(values=True)
    # SQLite encrypts values by the column type: nothing for workers to seal ahead
    jobs = args.jobs if engine.dialect.name == "postgresql" else 0
    created = replayed = 0
    with _ndjson_input(args, "versions") as (source, bar):
        jobs, batches = _jobs_worth_starting(
            _numbered_batches(source, args.batch_size), jobs, args.jobs_min_lines
        )
        for (first, last, size), numbered, sealed in _sealed_batches(batches, jobs, engine):
            flag: list[bool] = []
            try:
                try:
                    if sealed is None:
                        raise StaleSeal("not sealed ahead")
                    # a batch stored already comes as an empty SealedBatch: replayed by its key
                    body = _store_versions(engine, numbered, *sealed, flag)
                except StaleSeal:
                    body = _store_versions(engine, numbered, *_versions_batch(numbered), flag)
            except _BadBatch as exc:
                return _fail(exc.message)
            except ServiceError as exc:
                return _fail(f"lines {first}-{last}: {exc.detail}")
            if flag:
                replayed += body.created
            else:
                created += body.created
            bar.update(size)
            bar.set_postfix_str(f"created={created}, already={replayed}")
    print(json.dumps({"created": created, "already": replayed}))
    return 0


#: The Idempotency-Key of a batch of ``import --versions``: this and its lines' fingerprint.
_VERSIONS_KEY = "gatekeeper-import-versions:"


class _BadBatch(Exception):
    """A batch of ``import --versions`` that cannot be stored; ``message`` names the line."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def _store_versions(
    engine: Any, numbered: list[tuple[int, bytes]], fingerprint: str, items: Any, flag: list[bool]
) -> Any:
    """One batch as one bulk version request, its key the fingerprint of its numbered lines."""
    from app.engine.errors import InvalidInput
    from app.services.versions import create_versions

    try:
        return create_versions(
            engine=engine,
            locks=None,
            items=items,
            actor_key_id=None,
            bulk=True,
            fingerprint=fingerprint,
            idempotency_key=_VERSIONS_KEY + fingerprint,
            replayed=flag,
        )
    except InvalidInput as exc:
        raise _BadBatch(_line_of(exc.field, numbered, exc.errors[0].message)) from None


def _fingerprint(numbered: list[tuple[int, bytes]]) -> str:
    """A batch's fingerprint: the SHA-256 of its numbered lines (its key's second part)."""
    import hashlib

    digest = hashlib.sha256()
    for number, line in numbered:
        digest.update(f"{number}:".encode() + line.rstrip(b"\r\n") + b"\n")
    return digest.hexdigest()


def _versions_batch(numbered: list[tuple[int, bytes]]) -> tuple[str, Any]:
    """A batch's fingerprint and its parsed request items (:class:`_BadBatch` names a line)."""
    import orjson

    from app.engine.errors import InvalidInput
    from app.services.versions import parse_bulk

    items = []
    for number, line in numbered:
        try:
            items.append(orjson.loads(line))
        except orjson.JSONDecodeError:
            raise _BadBatch(f"line {number}: not valid JSON") from None
    try:
        return _fingerprint(numbered), parse_bulk({"versions": items})
    except InvalidInput as exc:
        raise _BadBatch(_line_of(exc.field, numbered, exc.errors[0].message)) from None


#: A worker process's database (``import --versions``), opened by its initializer.
_WORKER_ENGINE: Any = None


def _init_versions_worker(url: str) -> None:
    """A worker process of ``import --versions``: the values' cipher and a database engine."""
    global _WORKER_ENGINE
    from app.db.session import make_engine

    _init_import_worker()
    _WORKER_ENGINE = make_engine(url, pool_size=1, max_overflow=0)


def _seal_versions_batch(numbered: list[tuple[int, bytes]]) -> tuple[str, Any] | None:
    """A worker's job: a batch's fingerprint and its values checked and encrypted, or None.

    None when the batch cannot be sealed as it is (the storing process checks it again and
    names the first bad line). Module level, so that a spawned process can run it.
    """
    from app.services.versions import SealedBatch, answered, seal_bulk

    fingerprint = _fingerprint(numbered)
    if answered(_WORKER_ENGINE, key=_VERSIONS_KEY + fingerprint, fingerprint=fingerprint):
        # replayed by its key: nothing to parse, check nor encrypt (StaleSeal if the answer
        # is gone by the time it is stored)
        return fingerprint, SealedBatch(ids=[], domain_hashes=[], values=[])
    try:
        _, items = _versions_batch(numbered)
    except _BadBatch:
        return None
    sealed = seal_bulk(_WORKER_ENGINE, items)
    return None if sealed is None else (fingerprint, sealed)


def _sealed_batches(
    batches: Iterator[_Batch], jobs: int, engine: Any
) -> Iterator[tuple[tuple[int, int, int], list[tuple[int, bytes]], tuple[str, Any] | None]]:
    """Each batch with what ``jobs`` worker processes sealed of it ahead, in file order.

    ``jobs == 0``: nothing sealed (None: the batch is parsed and checked by the caller).
    """
    if jobs == 0:
        for report, batch in batches:
            yield report, batch, None
        return
    url = engine.url.render_as_string(hide_password=False)
    for (report, batch), sealed in _ahead(
        batches, jobs, _seal_versions_batch, _init_versions_worker, (url,)
    ):
        yield report, batch, sealed


def _ahead(
    batches: Iterator[_Batch],
    jobs: int,
    job: Callable[[list[tuple[int, bytes]]], Any],
    initializer: Callable[..., None],
    initargs: tuple[Any, ...] = (),
) -> Iterator[tuple[_Batch, Any]]:
    """Each batch with ``job``'s result on it, run by ``jobs`` processes ahead of the caller.

    In file order; at most ``2 * jobs`` batches are in flight, so memory stays bounded on a
    file of any size. A job's exception is raised when its batch's turn comes, so every batch
    before it has been handled.
    """
    import multiprocessing
    from collections import deque
    from concurrent.futures import Future, ProcessPoolExecutor

    pending: deque[tuple[_Batch, Future[Any]]] = deque()
    with ProcessPoolExecutor(
        jobs,
        mp_context=multiprocessing.get_context("spawn"),
        initializer=initializer,
        initargs=initargs,
    ) as pool:
        try:
            for item in batches:
                pending.append((item, pool.submit(job, item[1])))
                if len(pending) >= 2 * jobs:
                    done, future = pending.popleft()
                    yield done, future.result()
            while pending:
                done, future = pending.popleft()
                yield done, future.result()
        finally:
            for _, future in pending:
                future.cancel()


def _line_of(field: str, numbered: list[tuple[int, bytes]], message: str) -> str:
    """``versions[i].value.x: message`` as ``line N, field value.x: message``."""
    if field.startswith("versions["):
        index = int(field.split("[", 1)[1].split("]", 1)[0])
        rest = field.split("]", 1)[1].lstrip(".")
        return f"line {numbered[index][0]}" + (f", field {rest}" if rest else "") + f": {message}"
    return f"{field}: {message}"


#: A batch of numbered lines, and (first line, last line, bytes) to report it by.
_Batch = tuple[tuple[int, int, int], list[tuple[int, bytes]]]


def _numbered_batches(source: Any, size: int) -> Iterator[_Batch]:
    """The file's non-blank lines with their numbers, ``size`` at a time."""
    batch: list[tuple[int, bytes]] = []
    nbytes = 0
    for number, line in enumerate(source, start=1):
        nbytes += len(line)
        if line.strip():
            batch.append((number, line))
        if len(batch) >= size:
            yield (batch[0][0], batch[-1][0], nbytes), batch
            batch, nbytes = [], 0
    if batch:
        yield (batch[0][0], batch[-1][0], nbytes), batch


#: ``gatekeeper import``'s default ``--jobs-min-lines``: two batches of the default size. Below
#: it, starting the worker processes (each a new interpreter importing the app: about 1-2 s of
#: CPU, more on a busy machine) costs more than parsing the whole input in this process.
JOBS_MIN_LINES = 10_000


def _jobs_worth_starting(
    batches: Iterator[_Batch], jobs: int, min_lines: int
) -> tuple[int, Iterator[_Batch]]:
    """``jobs``, or 0 when the input has at most ``min_lines`` lines; and the same batches.

    Reads batches ahead until more than ``min_lines`` lines are read (then the worker
    processes are worth starting) or the input ends (then they are not: it is parsed in this
    process, as with ``--jobs 0``). The batches read are handed back in order before the rest,
    so at most ``min_lines`` lines plus a batch are held.
    """
    if jobs == 0:
        return 0, batches
    head: list[_Batch] = []
    lines = 0
    for batch in batches:
        head.append(batch)
        lines += len(batch[1])
        if lines > min_lines:
            return jobs, itertools.chain(head, batches)
    return 0, iter(head)


def _init_import_worker() -> None:
    """A worker process of ``gatekeeper import``: the values' cipher, from the same settings."""
    from app import crypto
    from app.settings import get_settings

    crypto.configure(get_settings().value_cipher())


def _parse_batch(batch: list[tuple[int, bytes]], seal: bool = True) -> list[Any]:
    """A worker's job: validate one batch and encrypt its values.

    Module level, so that a spawned process can run it.
    """
    from app.engine.limits import DEFAULT_LIMITS
    from app.services.imports import parse_lines

    return parse_lines(batch, DEFAULT_LIMITS, seal=seal)


def _parsed_batches(
    batches: Iterator[_Batch], jobs: int
) -> Iterator[tuple[tuple[int, int, int], list[Any]]]:
    """Each batch's registrations, in file order; ``jobs`` processes parse ahead of the caller.

    At most ``2 * jobs`` batches are in flight, so memory stays bounded on a file of any size.
    A bad line raises :class:`~app.services.imports.BadLine` when its batch's turn comes, so
    every batch before it has been stored.
    """
    if jobs == 0:
        for report, batch in batches:
            yield report, _parse_batch(batch, seal=False)  # encrypted in bulk by the import
        return
    for (report, _), registrations in _ahead(batches, jobs, _parse_batch, _init_import_worker):
        yield report, registrations


def _fail(message: str) -> int:
    print(f"gatekeeper import: {message}", file=sys.stderr)
    return 2


def _event_id(text: str) -> int:
    """An audit event id: an integer ≥ 0."""
    value = int(text)
    if value < 0:
        raise ValueError(text)
    return value


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
    migrate = sub.add_parser(
        "migrate",
        help="create or upgrade the database (what serve does first; the other commands "
        "refuse a database it has not migrated)",
    )
    migrate.set_defaults(func=cmd_migrate)
    worker = sub.add_parser(
        "worker",
        help="run distributed workers (Celery; needs BROKER_URL) for bounds and survey chunks",
    )
    worker.add_argument(
        "-c",
        "--concurrency",
        type=int,
        default=os.cpu_count() or 1,
        help="processes of each node (default: CPUs)",
    )
    worker.add_argument(
        "--queues",
        default="bounds,surveys",
        help="nodes to run, one per queue (default: bounds,surveys)",
    )
    worker.set_defaults(func=cmd_worker)
    keys = sub.add_parser("keys", help="manage API keys")
    keys_sub = keys.add_subparsers(dest="keys_command", required=True)
    create = keys_sub.add_parser("create", help="create a key and print it once")
    create.add_argument("--role", required=True, choices=["admin", "analyst", "viewer"])
    create.add_argument("--label", default=None)
    create.add_argument(
        "--project",
        default=None,
        help="a project's name: the key (analyst or viewer) inherits its scope and quota",
    )
    create.set_defaults(func=cmd_keys_create)
    listing = keys_sub.add_parser("list", help="list keys (id, role, created, revoked)")
    listing.add_argument("--json", action="store_true", help="one JSON object per line")
    listing.set_defaults(func=cmd_keys_list)
    revoke = keys_sub.add_parser("revoke", help="revoke a key (never the last active admin key)")
    revoke.add_argument("id", type=int, help="the key's id (see keys list)")
    revoke.set_defaults(func=cmd_keys_revoke)
    projects = sub.add_parser("projects", help="manage projects (create them with the API)")
    projects_sub = projects.add_subparsers(dest="projects_command", required=True)
    drop = projects_sub.add_parser(
        "delete", help="delete a project: its keys are revoked, its name and loss kept"
    )
    drop.add_argument("name", help="the project's name")
    drop.set_defaults(func=cmd_projects_delete)
    audit = sub.add_parser("audit", help="the audit log")
    audit_sub = audit.add_subparsers(dest="audit_command", required=True)
    export = audit_sub.add_parser(
        "export",
        help="write the audit log as NDJSON to standard output, oldest first "
        "(resume with --after the last line's id)",
    )
    start = export.add_mutually_exclusive_group()
    start.add_argument("--after", type=_event_id, default=None, help="start after this event id")
    start.add_argument(
        "--since", default=None, help="start at this RFC 3339 time, e.g. 2026-11-25T00:00:00Z"
    )
    export.set_defaults(func=cmd_audit_export)
    imports = sub.add_parser(
        "import", help="register the objects of an NDJSON file (resumable: re-run it)"
    )
    imports.add_argument("file", help="one registration per line, or - for standard input")
    imports.add_argument(
        "--versions",
        action="store_true",
        help='new values of existing objects, {"id", "value"} a line (resumable: re-run it)',
    )
    imports.add_argument(
        "--batch-size", type=int, default=5000, help="objects per transaction (max 10000)"
    )
    imports.add_argument("--quiet", action="store_true", help="no progress bar")
    imports.add_argument(
        "--jobs",
        type=int,
        default=min(2, os.cpu_count() or 1),
        help="worker processes validating (--versions: and encrypting) batches ahead of the one "
        "being stored "
        "(default: min(2, CPUs); 0: none)",
    )
    imports.add_argument(
        "--jobs-min-lines",
        type=int,
        default=JOBS_MIN_LINES,
        metavar="LINES",
        help="start the --jobs processes only for an input of more than LINES lines; a smaller "
        "one is parsed in this process, sooner than the processes would start "
        f"(default {JOBS_MIN_LINES:,}; 0: always start them)",
    )
    imports.set_defaults(func=cmd_import)
    states = sub.add_parser("states", help="the stored likelihood states")
    states_sub = states.add_subparsers(dest="states_command", required=True)
    collect = states_sub.add_parser(
        "collect",
        help="delete the stored states no object names (serve does it at start, a survey at "
        "its end; safe while the service runs)",
    )
    collect.set_defaults(func=cmd_states_collect)
    verify = sub.add_parser("verify", help="recompute every object's state from its history")
    verify.add_argument("--quiet", action="store_true", help="no progress bar")
    verify.add_argument(
        "--jobs",
        type=int,
        default=1,
        help="processes checking consecutive id ranges at once (default 1)",
    )
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
    args = build_parser().parse_args(argv)
    # after the parse: `--help` and a mistyped command exit in it without NumPy
    # (app.crypto's), pydantic and pydantic-settings (~0.2 s of a 0.35 s `gatekeeper --help`)
    from app.crypto import EncryptionKeyError
    from app.settings import SettingsError

    try:
        code = int(args.func(args))
        sys.stdout.flush()  # here, where a closed pipe is caught, not at the interpreter's exit
        return code
    except (SettingsError, EncryptionKeyError, Refused) as exc:
        print(f"gatekeeper: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        # the reader is gone (`gatekeeper keys list --json | head`): stop without a traceback;
        # standard output goes to /dev/null so that the exit's flush cannot fail again
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # 128 + SIGPIPE, what a shell reports for a command a closed pipe stopped


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
