"""New data versions of objects, one or many (``POST /v1/versions``), all or nothing.

One: ``POST /v1/objects/{id}/versions``.

A new version closes the current one and opens a fresh per-version filter, in one transaction:

1. the objects' rows are read (one statement for a batch) and each distinct likelihood array
   once; a closed version's realized loss is its exact loss when the history is randomized
   response (:mod:`app.engine.exact`), else the certified bounds stored on the row;
2. the closed versions are written — a single version as one ``object_versions`` row, a bulk
   request's packed into one ``version_batches`` row (:mod:`app.store.versions`), each copying
   its value's ciphertext and its final accounting, set-based — and their losses folded into
   the object's lifetime sums (:func:`app.engine.lifetime.add_losses`: exact while every
   closed loss is, else bounds rounded outward);
3. each object gets its new value and an empty accounting (no likelihood state, loss 0, Σε 0,
   F₀'s account 0, no rejection) under the same compare-and-set on ``objects.version`` that a
   submit and a survey use, so a concurrent submit either lands in the closed version before the
   close or is retried against the new one — never recorded in a version that was closed.

The accepted-query count ``objects.accepted`` keeps counting across versions (a history's
``seq`` numbers stay unique per object); ``objects.version_start`` marks where the current
version's history begins.
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from fractions import Fraction
from typing import Any, Literal, overload

from app import metrics
from app.crypto import active
from app.engine.domain import Domain, parse_domain
from app.engine.errors import InvalidInput
from app.engine.jsonfields import path
from app.engine.lifetime import add_losses
from app.engine.likelihood import LikelihoodState, LossBounds, exact_bounds
from app.engine.limits import EngineLimits
from app.services import audit
from app.services.bodies import validated
from app.services.errors import Busy, IdempotencyMismatch, NotFound, Retired
from app.services.locks import ObjectLocks
from app.services.schemas import (
    ID_PATTERN,
    CreatedVersion,
    VersionCreated,
    VersionRequest,
    VersionsRequest,
    VersionsResult,
)
from app.services.snapshots import pending_entries
from app.store import Conflict, Database, Tx, Unavailable, reading, transaction
from app.store import imports as answers
from app.store import versions as store
from app.store.domains import domain_texts
from app.store.states import load_states
from app.store.versions import ClosingRow

log = logging.getLogger(__name__)

#: The scope of bulk versions' stored answers among the idempotent requests.
_SCOPE = "versions"

#: Stored domains were checked when they were registered: read them whatever the limits now.
_STORED = EngineLimits(max_attributes=2**31, max_points=2**63, max_values_per_attribute=2**63)


@functools.lru_cache(maxsize=1024)
def _domain(text: str) -> Domain:
    return parse_domain(json.loads(text), limits=_STORED)


@dataclass(frozen=True)
class NewValue:
    """One requested version: the object and its new value's raw JSON, and where it was asked."""

    object_id: str
    value: Any
    field: str


@dataclass(frozen=True)
class SealedBatch:
    """A bulk request checked and encrypted ahead, off the storing process.

    ``gatekeeper import --versions`` has worker processes run :func:`seal_bulk` on the next
    batches while it stores the current one: each value checked against its object's domain
    (``domain_hashes``, in the request's order) and its canonical JSON encrypted (``values``,
    ciphertexts). The storing transaction checks again that each object exists, is not
    retired and has that domain; the values are not parsed again.
    """

    ids: list[str]
    domain_hashes: list[str]
    values: list[str]


class StaleSeal(Exception):
    """A :class:`SealedBatch` cannot be stored as it is: check and encrypt the request here."""


class _LostRace(Exception):
    """Another writer advanced one of the objects first."""


def parse_single(object_id: str, body: VersionRequest) -> NewValue:
    """One object's new value (checked against its domain later; its value as written)."""
    if not ID_PATTERN.fullmatch(object_id):  # e.g. a NUL byte, which PostgreSQL refuses
        raise NotFound("no object with that id")
    return NewValue(object_id, body.written("value"), "value")


def parse_bulk(body: Any) -> list[NewValue]:
    """``{"versions": [{"id", "value"}, ...]}``, each value as written.

    The structure is :class:`~app.services.schemas.VersionsRequest`'s: at most
    :data:`~app.services.schemas.MAX_VERSIONS` items, ids not repeated.
    """
    request = validated(VersionsRequest, body)
    written = request.written("versions")
    return [
        NewValue(item.id, written[i]["value"], path(path("versions", i), "value"))
        for i, item in enumerate(request.versions)
    ]


def closing_loss(
    conn: Tx,
    row: ClosingRow,
    domain: Domain,
    states: dict[str, tuple[bytes, float]],
    known: dict[str, LossBounds] | None = None,
) -> LossBounds:
    """The realized loss of the object's current version as it closes.

    Exact for a randomized-response history (from its stored likelihood array's exact form,
    with the last ``state_pending`` entries an ``olh`` survey left unfolded folded on) or an
    empty one; otherwise the certified bounds stored on the row. ``known`` caches the exact
    losses by state key (objects with one history share one array; an array with pending
    entries is its object's alone and is not cached).
    """
    if row.accepted == row.version_start:
        return exact_bounds(Fraction(0))
    key = row.state_hash
    if domain.is_finite and row.state_pending:
        state = (
            LikelihoodState(domain)
            if key is None
            else LikelihoodState.from_bytes(domain, *states[key])
        )
        for entry in pending_entries(conn, row.id, row.state_pending, domain):
            state.apply(entry.mechanism.term(entry.output))
        if state.exact is not None:
            return exact_bounds(state.exact.loss())
        return LossBounds(row.loss_lower, row.loss_upper)
    if domain.is_finite and key is not None and key in states:
        if known is not None and key in known:
            return known[key]
        data, err = states[key]
        state = LikelihoodState.from_bytes(domain, data, err)
        if state.exact is not None:
            loss = exact_bounds(state.exact.loss())
            if known is not None:
                known[key] = loss
            return loss
    return LossBounds(row.loss_lower, row.loss_upper)


def seal_bulk(engine: Database, items: Sequence[NewValue]) -> SealedBatch | None:
    """Check each value against its object's domain and encrypt it (a worker's job).

    None when the request cannot be stored as it is (an unknown or retired object, a value
    outside its domain) or the database encrypts values by the column type (SQLite): the
    storing process then runs the whole check itself, which names the first bad item.
    """
    with reading(engine) as conn:
        if not store.seals_values(conn):
            return None
        rows = {row.id: row for row in store.closing_rows(conn, [i.object_id for i in items])}
        domains = domain_texts(conn, (row.domain_hash for row in rows.values()))
    try:
        texts = _checked_values(items, rows, domains, bulk=True)
    except (NotFound, Retired, InvalidInput):
        return None
    cipher = active()
    return SealedBatch(
        ids=[item.object_id for item in items],
        domain_hashes=[rows[item.object_id].domain_hash for item in items],
        values=[cipher.encrypt(text) for text in texts],
    )


@overload
def create_versions(
    *,
    engine: Database,
    locks: ObjectLocks | None,
    items: Sequence[NewValue],
    actor_key_id: int | None,
    bulk: Literal[False],
    fingerprint: str | None = None,
    idempotency_key: str | None = None,
    attempts: int = 5,
    replayed: list[bool] | None = None,
) -> VersionCreated: ...


@overload
def create_versions(
    *,
    engine: Database,
    locks: ObjectLocks | None,
    items: Sequence[NewValue] | SealedBatch,
    actor_key_id: int | None,
    bulk: Literal[True],
    fingerprint: str | None = None,
    idempotency_key: str | None = None,
    attempts: int = 5,
    replayed: list[bool] | None = None,
) -> VersionsResult: ...


def create_versions(
    *,
    engine: Database,
    locks: ObjectLocks | None,
    items: Sequence[NewValue] | SealedBatch,
    actor_key_id: int | None,
    bulk: bool,
    fingerprint: str | None = None,
    idempotency_key: str | None = None,
    attempts: int = 5,
    replayed: list[bool] | None = None,
) -> VersionCreated | VersionsResult:
    """Close each object's current version and open the next with its new value, all or none.

    A single version: :class:`VersionCreated`; bulk: :class:`VersionsResult` (replayed for a
    repeated ``Idempotency-Key`` with the same body, which appends True to ``replayed``).
    Raises ``NotFound`` (404) / ``Retired`` (409) for an unknown or retired object (bulk: naming
    ``versions[i].id``), ``InvalidInput`` (422) for a value outside the domain, never echoing it.
    ``items`` may be a :class:`SealedBatch` (bulk only): :class:`StaleSeal` if it cannot be
    stored as it is.
    """
    ids = items.ids if isinstance(items, SealedBatch) else [item.object_id for item in items]
    # the lock of a single object only saves wasted work (the compare-and-set is what counts)
    hold = locks.hold(ids[0]) if locks is not None and not bulk else _nothing()
    with hold:
        for _ in range(attempts):
            try:
                return _create_once(
                    engine, items, actor_key_id, bulk, fingerprint, idempotency_key, replayed
                )
            except (_LostRace, Conflict):
                log.info("new versions retried after a concurrent write")
            except Unavailable as exc:
                log.warning("new versions retried after a database conflict: %s", type(exc))
    raise Busy("concurrent writers on these objects; retry later", retry_after=1)


class _nothing:  # noqa: N801 - a context manager that holds nothing
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def _create_once(
    engine: Database,
    items: Sequence[NewValue] | SealedBatch,
    actor_key_id: int | None,
    bulk: bool,
    fingerprint: str | None,
    key: str | None,
    replayed_flag: list[bool] | None,
) -> VersionCreated | VersionsResult:
    with transaction(engine) as conn:
        if bulk and key is not None:
            replayed = _stored(conn, actor_key_id, key, fingerprint)
            if replayed is not None:
                if replayed_flag is not None:
                    replayed_flag.append(True)
                return replayed
        sealed = isinstance(items, SealedBatch)
        ids = items.ids if isinstance(items, SealedBatch) else [i.object_id for i in items]
        rows = {row.id: row for row in store.closing_rows(conn, ids)}
        domains = domain_texts(conn, (row.domain_hash for row in rows.values()))
        if isinstance(items, SealedBatch):
            values = _sealed_values(conn, items, rows)
        else:
            values = _checked_values(items, rows, domains, bulk)
        now = datetime.now(UTC)
        created = _close_and_open(
            conn, [rows[i] for i in ids], values, domains, now, sealed=sealed, packed=bulk
        )
        metrics.VERSIONS_CREATED.inc(len(created))
        if not bulk:
            object_id, version = created[0]
            audit.record(
                conn,
                kind=audit.AuditKind.VERSION_CREATED,
                actor_key_id=actor_key_id,
                object_id=object_id,
                detail={"version": version},
            )
            return VersionCreated(object_id=object_id, version=version)
        body = VersionsResult(
            created=len(created),
            versions=[CreatedVersion(id=oid, version=v) for oid, v in created],
        )
        audit.record(
            conn,
            kind=audit.AuditKind.VERSIONS_IMPORTED,
            actor_key_id=actor_key_id,
            object_id=None,
            detail={"created": len(created), "first_id": created[0][0], "last_id": created[-1][0]},
        )
        if key is not None and fingerprint is not None:
            answers.store_answer(
                conn,
                owner_key_id=actor_key_id,
                key=key,
                fingerprint=fingerprint,
                response=json.dumps(body.model_dump(mode="json")),
                at=now,
                scope=_SCOPE,
            )
        return body


def _checked_values(
    items: Sequence[NewValue], rows: dict[str, ClosingRow], domains: dict[str, str], bulk: bool
) -> list[str]:
    """Each new value's canonical JSON, checked against its object's domain (text by hash)."""
    values = []
    # a population's values repeat: each distinct (domain, value) is parsed once (the key is
    # the repr of decoded JSON, equal exactly for equal JSON, as in app.services.objects)
    parsed: dict[tuple[str, str], str] = {}
    for i, item in enumerate(items):
        row = rows.get(item.object_id)
        where = f"versions[{i}].id: " if bulk else ""
        if row is None:
            raise NotFound(f"{where}no object with that id")
        if row.retired_at is not None:
            raise Retired(f"{where}the object is retired and takes no new version")
        key = (row.domain_hash, repr(item.value))
        text = parsed.get(key)
        if text is None:
            domain = _domain(domains[row.domain_hash])
            text = json.dumps(domain.parse_value(item.value, item.field))
            parsed[key] = text
        values.append(text)
    return values


def _stored(
    conn: Tx, actor_key_id: int | None, key: str, fingerprint: str | None
) -> VersionsResult | None:
    """The answer stored for this key's earlier request with the same body, or None."""
    stored = answers.stored_answer(conn, owner_key_id=actor_key_id, key=key, scope=_SCOPE)
    if stored is None:
        return None
    if stored.fingerprint != fingerprint:
        raise IdempotencyMismatch("this Idempotency-Key was used with a different request body")
    return VersionsResult.model_validate(json.loads(stored.response))


def answered(engine: Database, *, key: str, fingerprint: str) -> bool:
    """Whether bulk versions under ``key`` (of no API key: the CLI's) are stored already.

    A worker of ``import --versions`` asks before sealing a batch: a batch already stored is
    replayed by its key, and its values need not be checked nor encrypted again.
    """
    with reading(engine) as conn:
        stored = answers.stored_answer(conn, owner_key_id=None, key=key, scope=_SCOPE)
    return stored is not None and stored.fingerprint == fingerprint


def _sealed_values(conn: Tx, batch: SealedBatch, rows: dict[str, ClosingRow]) -> list[str]:
    """A sealed batch's ciphertexts, once each object is found live with the domain checked."""
    if not store.seals_values(conn):
        raise StaleSeal("this database encrypts values by the column type")
    if not batch.ids:  # sealed as already stored, and no answer is stored
        raise StaleSeal("an empty batch")
    for i, (object_id, domain_hash) in enumerate(zip(batch.ids, batch.domain_hashes, strict=True)):
        row = rows.get(object_id)
        if row is None:
            raise NotFound(f"versions[{i}].id: no object with that id")
        if row.retired_at is not None:
            raise Retired(f"versions[{i}].id: the object is retired and takes no new version")
        if row.domain_hash != domain_hash:
            raise StaleSeal(f"versions[{i}]: checked against another domain")
    return batch.values


@functools.lru_cache(maxsize=4096)
def _lifetime_after(
    exact: str | None,
    lower: float,
    upper: float,
    loss_lower: float,
    loss_upper: float,
    loss_value: Fraction | None,
) -> LossBounds:
    """The lifetime sums after a version of loss ``[loss_lower, loss_upper]`` closes.

    ``loss_value``: the exact loss, when it is. Cached: a population's objects mostly share them.
    """
    closed = exact_bounds(Fraction(exact)) if exact is not None else LossBounds(lower, upper)
    return add_losses(closed, LossBounds(loss_lower, loss_upper, loss_value))


def _close_and_open(
    conn: Tx,
    rows: Sequence[ClosingRow],
    values: Sequence[str],
    domains: dict[str, str],
    now: datetime,
    *,
    sealed: bool = False,
    packed: bool = False,
) -> list[tuple[str, int]]:
    """Close every row's version and open the next with its value; ``[(id, new version)]``.

    ``values``: the new values' canonical JSON, or their ciphertexts when ``sealed``.
    ``packed``: the closed versions go into one batch row (a bulk request), else a row each.

    The closing loss and the lifetime sums after it are computed once per distinct accounting
    (a population's objects mostly share one: no history yet, or one survey's); an object
    with pending survey entries has its own.
    """
    states = load_states(conn, {r.state_hash for r in rows if r.state_hash is not None})
    new: list[store.NewVersion] = []
    known: dict[str, LossBounds] = {}
    # (loss lower, upper, exact text, lifetime exact text, lower, upper) by accounting
    accounts: dict[tuple[Any, ...], tuple[float, float, str | None, str | None, float, float]] = {}
    for row, value in zip(rows, values, strict=True):
        account = (
            row.domain_hash,
            row.state_hash,
            row.accepted == row.version_start,
            row.loss_lower,
            row.loss_upper,
            row.lifetime_exact,
            row.lifetime_lower,
            row.lifetime_upper,
        )
        found = accounts.get(account) if row.state_pending == 0 else None
        if found is None:
            loss = closing_loss(conn, row, _domain(domains[row.domain_hash]), states, known)
            life = _lifetime_after(
                row.lifetime_exact,
                row.lifetime_lower,
                row.lifetime_upper,
                loss.lower,
                loss.upper,
                loss.value,
            )
            found = (
                loss.lower,
                loss.upper,
                None if loss.value is None else str(loss.value),
                None if life.value is None else str(life.value),
                life.lower,
                life.upper,
            )
            if row.state_pending == 0:
                accounts[account] = found
        new.append(store.NewVersion(row.id, row.version, value, *found))
    closing = rows if packed else None
    if store.replace_versions(conn, new, now=now, sealed=sealed, packed=closing) != len(new):
        raise _LostRace
    return [(row.id, row.data_version + 1) for row in rows]
