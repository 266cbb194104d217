"""SQLAlchemy 2 typed models.

* :class:`ProtectedObject` — one protected object: its domain, budget, filter, the *private*
  value, the accounting state (finite domains: the ``log P`` array; all: cached loss bounds,
  exact basic-composition total, counts) and a ``version`` that every accepted query advances
  with a compare-and-set.
* :class:`QueryRecord` — one accepted query: sequence number, canonical query, output, ε, the
  loss bounds after it, the analyst key, the idempotency key with the request's fingerprint and
  the stored response replayed to retries.
* :class:`ApiKey` — hashed API keys with their role (and project, if any).
* :class:`Project` — a tenant: a label scope and an ε quota its keys inherit (issue 25).
* :class:`DomainRecord` — a domain's canonical JSON, stored once and named by its hash in every
  object registered with it (a million objects of one study share one ~250-byte text).
* :class:`LikelihoodStateRecord` — a finite likelihood array, stored once per content (exact
  histories: any order of the same outputs) or per (domain, history), and shared by every
  object with it (storage grows with distinct contents).
* :class:`ObjectVersion` and :class:`VersionBatch` — closed data versions: one row each (single
  versions), or packed per bulk request.
* :class:`Survey` and :class:`SurveyChunk` — a population survey, and its fixed membership cut
  into chunks, each holding its members' decisions and answers packed (issue #13).

The state of an object is always re-derivable from its query records (``gatekeeper verify``).
"""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    ColumnElement,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    ScalarSelect,
    String,
    Text,
    UniqueConstraint,
    false,
    text,
)
from sqlalchemy import select as _select
from sqlalchemy.orm import DeclarativeBase, Mapped, column_property, mapped_column

from app.db.types import EncryptedText, UTCDateTime


def utcnow() -> datetime:
    """Timezone-aware now."""
    return datetime.now(UTC)


class Base(DeclarativeBase):
    """Declarative base of all models."""


class ApiKey(Base):
    """An API key, stored as the SHA-256 of the secret (keys are 256-bit random)."""

    __tablename__ = "api_keys"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    key_hash: Mapped[str] = mapped_column(String(64), unique=True, nullable=False)
    prefix: Mapped[str] = mapped_column(String(16), nullable=False)
    role: Mapped[str] = mapped_column(String(16), nullable=False)
    label: Mapped[str | None] = mapped_column(String(200))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    #: The project the key belongs to (None: unscoped); fixed at creation.
    project_id: Mapped[int | None] = mapped_column(ForeignKey("projects.id"))


class Project(Base):
    """A tenant (issue 25): its keys see only objects carrying ``labels``, within ``quota``.

    ``labels`` is fixed at creation; ``quota`` (ε, the decimal as written) may be changed.
    """

    __tablename__ = "projects"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(64), unique=True, nullable=False)
    #: The scope: ``{name: value}`` labels an object must all carry (at least one).
    labels: Mapped[dict[str, str]] = mapped_column(JSON, nullable=False)
    quota: Mapped[float] = mapped_column(Float, nullable=False)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    #: When the project was deleted (its keys revoked; the row, name and loss kept). None: live.
    deleted_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)


class ProjectState(Base):
    """A project's sub-history of one object (issue 25): the outputs its keys have seen.

    Compact (no likelihood array): the count, the hash chain of the sub-history and its loss
    bounds and exact Σε after the last entry. Re-derivable from the stored history (a history
    row records its key, a key its project); ``gatekeeper verify`` recomputes it. A new data
    version of the object resets it (delete the rows of the object).
    """

    __tablename__ = "project_states"

    object_id: Mapped[str] = mapped_column(ForeignKey("objects.id"), primary_key=True)
    project_id: Mapped[int] = mapped_column(ForeignKey("projects.id"), primary_key=True)
    accepted: Mapped[int] = mapped_column(Integer, nullable=False)
    history_hash: Mapped[str] = mapped_column(String(32), nullable=False)
    loss_lower: Mapped[float] = mapped_column(Float, nullable=False)
    loss_upper: Mapped[float] = mapped_column(Float, nullable=False)
    basic_total: Mapped[str] = mapped_column(Text, nullable=False)


class DomainRecord(Base):
    """A domain's canonical JSON text, content-addressed (``app.store.domains.domain_hash``).

    Rows are never updated or deleted: a hash always names the same text, in every database.
    """

    __tablename__ = "domains"

    hash: Mapped[str] = mapped_column(String(32), primary_key=True)
    text: Mapped[str] = mapped_column(Text, nullable=False)


def domain_text_of(domain_hash: ColumnElement[str] | Mapped[str]) -> ScalarSelect[str]:
    """The ``domains.text`` named by ``domain_hash`` (a column), as a scalar subquery."""
    return _select(DomainRecord.text).where(DomainRecord.hash == domain_hash).scalar_subquery()


class ProtectedObject(Base):
    """A protected object and its accounting state.

    PostgreSQL stores it with ``fillfactor = 50`` (migration 0005): a survey updates every
    member's row in one transaction per chunk, and the room left in each page lets the new row
    versions stay in their page (HOT updates: no index entry, pruned without a vacuum), which
    keeps the table at twice its live size however many surveys run (measured: docs/benchmarks.md).
    """

    __tablename__ = "objects"
    __table_args__ = (
        # PostgreSQL: a search by id prefix (``LIKE 'p%'``) through an index whatever the
        # database's collation (migration 0011). SQLite's primary key answers it as a range; the
        # index exists there too only so that one schema matches the models on both databases
        Index("ix_objects_id_pattern", "id", postgresql_ops={"id": "varchar_pattern_ops"}),
    )

    id: Mapped[str] = mapped_column(String(128), primary_key=True)
    #: The domain, by the hash of its canonical JSON (:class:`DomainRecord`).
    domain_hash: Mapped[str] = mapped_column(ForeignKey("domains.hash"), nullable=False)
    #: The private value as JSON, encrypted at rest (:class:`app.db.types.EncryptedText`).
    value: Mapped[str] = mapped_column(EncryptedText, nullable=False)
    budget: Mapped[float] = mapped_column(Float, nullable=False)
    #: δ_g of an ``approx_bayesian`` object (None for the pure-ε filters).
    budget_delta: Mapped[float | None] = mapped_column(Float)
    filter: Mapped[str] = mapped_column(String(16), nullable=False)
    finite: Mapped[bool] = mapped_column(nullable=False)
    #: Public metadata ``{name: value}`` (strings), fixed at registration; selects cohorts.
    labels: Mapped[dict[str, str] | None] = mapped_column(JSON)
    #: Finite domains: the key of the likelihood array in ``likelihood_states`` (None: no
    #: accepted query yet, ``log P = 0``).
    state_hash: Mapped[str | None] = mapped_column(String(32))
    #: Finite domains: how many of the last accepted queries the array ``state_hash`` names does
    #: not hold yet (0: it holds the whole history). Survey answers whose state would be the
    #: member's alone (an ``olh`` seed) are not stored as arrays: the state is the stored one
    #: plus these last history entries, folded when the object is next decided.
    state_pending: Mapped[int] = mapped_column(
        Integer, default=0, server_default="0", nullable=False
    )
    #: Hash chain of the accepted history (``app.services.snapshots.next_history_hash``): equal
    #: for equal histories, which is how a survey groups continuous objects.
    history_hash: Mapped[str | None] = mapped_column(String(32))
    loss_lower: Mapped[float] = mapped_column(Float, default=0.0)
    loss_upper: Mapped[float] = mapped_column(Float, default=0.0)
    #: Exact Σε as a rational's text (unbounded: a sum's digits are not capped by a width).
    basic_total: Mapped[str] = mapped_column(Text, default="0")
    #: The account of Algorithm 4's output-independent filter F₀ (``approx_bayesian``; "0"
    #: otherwise), an exact rational's text (:mod:`app.engine.approx`).
    f0_account: Mapped[str] = mapped_column(Text, default="0", server_default="0")
    accepted: Mapped[int] = mapped_column(Integer, default=0)
    rejected: Mapped[int] = mapped_column(Integer, default=0)
    version: Mapped[int] = mapped_column(Integer, default=0, nullable=False)
    #: The data version the value and the accounting columns above belong to (1 at
    #: registration; ``POST /v1/objects/{id}/versions`` closes it and starts the next). Not
    #: ``version``, which is the compare-and-set counter.
    data_version: Mapped[int] = mapped_column(Integer, default=1, server_default="1")
    #: How many accepted queries (``seq``) the closed versions hold: the current version's
    #: history is ``seq > version_start`` and its count ``accepted - version_start``.
    version_start: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    #: ε_L, the lifetime budget over every version (None: none).
    lifetime_budget: Mapped[float | None] = mapped_column(Float)
    #: Σ of the closed versions' realized losses: the exact rational's text while every one
    #: was exact (None once one was not), and certified bounds (lower rounded down, upper up).
    lifetime_exact: Mapped[str | None] = mapped_column(Text, default="0", server_default="0")
    lifetime_lower: Mapped[float] = mapped_column(Float, default=0.0, server_default="0")
    lifetime_upper: Mapped[float] = mapped_column(Float, default=0.0, server_default="0")
    #: Where the closed versions packed by bulk versions are: the ids of the
    #: :class:`VersionBatch` rows holding them, comma-separated, oldest first (None: none). The
    #: row is rewritten by every new version anyway; a few bytes a packed version.
    packed_versions: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    retired_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    #: The domain's JSON text (read only: loaded with the row through ``domain_hash``).
    domain: Mapped[str] = column_property(domain_text_of(domain_hash))


class ObjectCount(Base):
    """Counts of the objects by status, kept by triggers on ``objects`` (migration 0014).

    Every statement that inserts, updates or deletes objects adds its change of each count to
    one row here, in its own transaction, whichever code path ran it (submits, surveys,
    imports, versions, retirement, a repair by hand). The counts are the sums over every row;
    on PostgreSQL a statement writes the row ``slot = pg_backend_pid()``: no two live
    connections share one, so concurrent transactions never wait for one another's row (nor
    deadlock through it); a row's counts alone can be negative. ``gatekeeper serve`` (at
    start-up) and ``gatekeeper verify`` fold the rows into ``slot = 0``
    (:func:`app.store.objects.fold_counts`), which connection churn would otherwise grow. The
    statuses are :mod:`app.store.objects`' conditions; ``gatekeeper verify`` compares the sums
    with a count of the objects.
    """

    __tablename__ = "object_counts"

    slot: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    active: Mapped[int] = mapped_column(BigInteger, nullable=False, server_default="0")
    retired: Mapped[int] = mapped_column(BigInteger, nullable=False, server_default="0")
    exhausted: Mapped[int] = mapped_column(BigInteger, nullable=False, server_default="0")
    near_exhaustion: Mapped[int] = mapped_column(BigInteger, nullable=False, server_default="0")
    #: Rejected submits of the active objects, and of all objects.
    rejected_active: Mapped[int] = mapped_column(BigInteger, nullable=False, server_default="0")
    rejected_all: Mapped[int] = mapped_column(BigInteger, nullable=False, server_default="0")


class ObjectVersion(Base):
    """A closed data version of an object: its value and its final accounting, compactly.

    The version's history is the object's accepted queries with ``seq_start < seq <= seq_end``
    (single submits and survey answers alike); its realized loss stays in the lifetime sums
    of the object's row. About 60 bytes of columns beyond the value's ciphertext.
    """

    __tablename__ = "object_versions"

    object_id: Mapped[str] = mapped_column(ForeignKey("objects.id"), primary_key=True)
    data_version: Mapped[int] = mapped_column(Integer, primary_key=True)
    #: The closed version's value, still encrypted as it was stored.
    value: Mapped[str] = mapped_column(EncryptedText, nullable=False)
    seq_start: Mapped[int] = mapped_column(Integer, nullable=False)
    seq_end: Mapped[int] = mapped_column(Integer, nullable=False)
    loss_lower: Mapped[float] = mapped_column(Float, nullable=False)
    loss_upper: Mapped[float] = mapped_column(Float, nullable=False)
    #: The exact loss's text when it was exact (randomized response), else None.
    loss_exact: Mapped[str | None] = mapped_column(Text)
    basic_total: Mapped[str] = mapped_column(Text, nullable=False)
    rejected: Mapped[int] = mapped_column(Integer, nullable=False)
    closed_at: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False)


class VersionBatch(Base):
    """The closed versions of one bulk version request, packed into one row (migration 0016).

    A batch of up to 10,000 objects' closed versions costs about 16 bytes per version beyond
    the value's ciphertext, where one :class:`ObjectVersion` row costs 126 (measured:
    docs/benchmarks.md, "Packed closed versions"). The format is :mod:`app.store.versions`':
    ``accounts`` JSON (the objects' ids in order, the distinct final accountings and each one's
    index into them), ``rejected`` (per position, comma-separated) and ``ciphertexts`` (per
    position, the closed value's ciphertext as it was stored, newline-separated). An object
    finds its packed versions through ``objects.packed_versions`` (no per-version index entry).
    Immutable once written, but for ``gatekeeper encryption rotate`` re-encrypting
    ``ciphertexts``.
    """

    __tablename__ = "version_batches"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    closed_at: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False)
    size: Mapped[int] = mapped_column(Integer, nullable=False)
    accounts: Mapped[str] = mapped_column(Text, nullable=False)
    rejected: Mapped[str] = mapped_column(Text, nullable=False)
    ciphertexts: Mapped[str] = mapped_column(Text, nullable=False)


class LikelihoodStateRecord(Base):
    """A finite history's ``log P`` array and its rounding error, by content or history hash.

    Kept while an object's ``state_hash`` names it; no count of those is stored (migration
    0017): rows no object names are deleted by :func:`app.store.states.collect_unnamed`.
    """

    __tablename__ = "likelihood_states"

    hash: Mapped[str] = mapped_column(String(32), primary_key=True)
    state: Mapped[bytes] = mapped_column(LargeBinary, nullable=False)
    err: Mapped[float] = mapped_column(Float, nullable=False)


class QueryRecord(Base):
    """An accepted query and its output."""

    __tablename__ = "queries"
    __table_args__ = (
        UniqueConstraint("object_id", "seq", name="uq_queries_object_seq"),
        # partial: a survey's rows (no key) take no entry — a million of them per survey
        Index(
            "uq_queries_object_idempotency",
            "object_id",
            "idempotency_key",
            unique=True,
            postgresql_where=text("idempotency_key IS NOT NULL"),
            sqlite_where=text("idempotency_key IS NOT NULL"),
        ),
        # ``"reuse": true`` finds an identical query's answer by (object, fingerprint), the
        # canonical query's hash (migration 0013; app.services.reuse)
        Index(
            "ix_queries_reuse",
            "object_id",
            "fingerprint",
            postgresql_where=text("fingerprint IS NOT NULL"),
            sqlite_where=text("fingerprint IS NOT NULL"),
        ),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    object_id: Mapped[str] = mapped_column(ForeignKey("objects.id"), nullable=False)
    seq: Mapped[int] = mapped_column(Integer, nullable=False)
    query: Mapped[str] = mapped_column(Text, nullable=False)
    output: Mapped[str] = mapped_column(Text, nullable=False)
    epsilon: Mapped[float] = mapped_column(Float, nullable=False)
    epsilon_exact: Mapped[str] = mapped_column(Text, nullable=False)
    loss_lower: Mapped[float] = mapped_column(Float, nullable=False)
    loss_upper: Mapped[float] = mapped_column(Float, nullable=False)
    basic_after: Mapped[float] = mapped_column(Float, nullable=False)
    analyst_key_id: Mapped[int | None] = mapped_column(ForeignKey("api_keys.id"))
    idempotency_key: Mapped[str | None] = mapped_column(String(255))
    #: Single submits: the request's fingerprint and stored answer (None for a survey's rows,
    #: which are replayed through the survey, never by key).
    fingerprint: Mapped[str | None] = mapped_column(String(64))
    response: Mapped[str | None] = mapped_column(Text)
    #: The survey that asked this query (None: a single submit).
    survey_id: Mapped[int | None] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class RejectionRecord(Base):
    """A rejected submit that carried an ``Idempotency-Key``: its stored 409 answer.

    A retry with the same key (and body) gets this answer back and changes nothing: the
    rejection is counted and audited once. Submits without a key leave no row.
    """

    __tablename__ = "rejections"
    __table_args__ = (
        UniqueConstraint("object_id", "idempotency_key", name="uq_rejections_object_idempotency"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    object_id: Mapped[str] = mapped_column(ForeignKey("objects.id"), nullable=False)
    idempotency_key: Mapped[str] = mapped_column(String(255), nullable=False)
    analyst_key_id: Mapped[int | None] = mapped_column(ForeignKey("api_keys.id"))
    fingerprint: Mapped[str] = mapped_column(String(64), nullable=False)
    #: JSON: the problem's ``detail`` and its extra fields (loss now, worst case, per output).
    response: Mapped[str] = mapped_column(Text, nullable=False)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class AuditEvent(Base):
    """One entry of the audit log (:mod:`app.services.audit`); never holds a private value."""

    __tablename__ = "audit_events"
    __table_args__ = (
        Index("ix_audit_object", "object_id", "id"),
        Index("ix_audit_kind", "kind", "id"),
        # an export ``since`` a time finds its first event without a scan (migration 0011)
        Index("ix_audit_at", "at"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    at: Mapped[datetime] = mapped_column(UTCDateTime, nullable=False)
    kind: Mapped[str] = mapped_column(String(32), nullable=False)
    #: The API key that acted (None: the command line or the start-up bootstrap).
    actor_key_id: Mapped[int | None] = mapped_column(Integer)
    object_id: Mapped[str | None] = mapped_column(String(128))
    #: JSON: what happened (query kind, ε, filter, loss bounds, role...), never a value.
    detail: Mapped[str] = mapped_column(Text, nullable=False)


class Survey(Base):
    """A population survey: one query to a fixed cohort, its progress and output tally."""

    __tablename__ = "surveys"
    __table_args__ = (
        UniqueConstraint("analyst_key_id", "idempotency_key", name="uq_surveys_idempotency"),
        # the surveys that asked a query, for ``"reuse": true`` (migration 0013)
        Index("ix_surveys_query_hash", "query_hash"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(200), nullable=False)
    #: The query as submitted (canonical JSON); parsed against each member's domain.
    query: Mapped[str] = mapped_column(Text, nullable=False)
    #: The cohort as submitted: ``{"labels": {...}}`` or ``{"ids": [...]}`` (JSON).
    cohort: Mapped[str] = mapped_column(Text, nullable=False)
    analyst_key_id: Mapped[int | None] = mapped_column(ForeignKey("api_keys.id"))
    idempotency_key: Mapped[str | None] = mapped_column(String(255))
    fingerprint: Mapped[str] = mapped_column(String(64), nullable=False)
    #: The hash of the query's canonical JSON (``app.services.reuse.query_hash``): how a
    #: ``"reuse": true`` request finds this survey's answers.
    query_hash: Mapped[str | None] = mapped_column(String(64))
    #: Whether members answer from a stored identical answer of their current version.
    reuse: Mapped[bool] = mapped_column(
        Boolean, default=False, server_default=false(), nullable=False
    )
    #: How many accepted members were answered by reuse (also counted in ``accepted``).
    reused: Mapped[int] = mapped_column(Integer, default=0, server_default="0", nullable=False)
    #: queued | running | done | cancelled | failed
    status: Mapped[str] = mapped_column(String(16), nullable=False)
    total: Mapped[int] = mapped_column(Integer, nullable=False)
    decided: Mapped[int] = mapped_column(Integer, default=0, nullable=False)
    accepted: Mapped[int] = mapped_column(Integer, default=0, nullable=False)
    #: JSON ``{reason: count}`` of refused members.
    refused: Mapped[str] = mapped_column(Text, default="{}", nullable=False)
    #: JSON ``{key: count}``: the accepted outputs (``app.engine.estimates.tally_keys``).
    tally: Mapped[str] = mapped_column(Text, default="{}", nullable=False)
    #: Distinct decision groups met so far (members deciding on identical public state).
    groups: Mapped[int] = mapped_column(Integer, default=0, nullable=False)
    #: The domain of the accepted members ("" once two differ: no estimate then).
    domain: Mapped[str | None] = mapped_column(Text)
    error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    #: Who runs it now (a process id) and until when: an expired lease is taken over.
    lease_owner: Mapped[str | None] = mapped_column(String(64))
    lease_until: Mapped[datetime | None] = mapped_column(UTCDateTime)


#: An object id compared bytewise (as Python sorts it), whatever the database's collation.
BYTEWISE_ID = String(128).with_variant(String(128, collation="C"), "postgresql")


class SurveyChunk(Base):
    """A chunk of a survey's members, decided together in one transaction (issue #13).

    Members are packed: a chunk of 5,000 members is one row whose texts PostgreSQL compresses,
    about 10 bytes a member instead of the ~380 a member row plus a history row took. The
    format is :mod:`app.store.chunks`'s: ``members`` in sorted order joined by
    newlines; once decided, ``picks`` (per member: an index into ``variants`` when accepted, a
    negative refusal code otherwise), ``seqs`` (per member: the answer's sequence number in its
    object's history, 0 when refused) and ``variants`` (the distinct history entries the
    chunk's answers are: query, output, ε, loss bounds after), all JSON. A chunk is wholly
    pending (``decided_at`` None) or wholly decided. An object's answers are found through the
    chunks whose ``[first_id, last_id]`` covers its id — on PostgreSQL one probe of
    ``ix_survey_chunks_first_id`` per survey — so a survey never changes the size of the
    object's row. Ids compare bytewise, as Python sorts them: the id columns are
    ``COLLATE "C"`` on PostgreSQL (SQLite compares bytewise by default).
    """

    __tablename__ = "survey_chunks"
    __table_args__ = (Index("ix_survey_chunks_first_id", "survey_id", "first_id"),)

    survey_id: Mapped[int] = mapped_column(ForeignKey("surveys.id"), primary_key=True)
    chunk: Mapped[int] = mapped_column(Integer, primary_key=True)
    size: Mapped[int] = mapped_column(Integer, nullable=False)
    first_id: Mapped[str] = mapped_column(BYTEWISE_ID, nullable=False)
    last_id: Mapped[str] = mapped_column(BYTEWISE_ID, nullable=False)
    members: Mapped[str] = mapped_column(Text, nullable=False)
    decided_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    picks: Mapped[str | None] = mapped_column(Text)
    seqs: Mapped[str | None] = mapped_column(Text)
    variants: Mapped[str | None] = mapped_column(Text)


class IdempotentRequest(Base):
    """The stored answer of a request that carried an ``Idempotency-Key`` (bulk imports).

    A retry by the same key's owner with the same body gets ``response`` back and changes
    nothing; with a different body it is refused.
    """

    __tablename__ = "idempotent_requests"
    __table_args__ = (
        UniqueConstraint("scope", "owner_key_id", "idempotency_key", name="uq_idempotent_requests"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    scope: Mapped[str] = mapped_column(String(32), nullable=False)
    owner_key_id: Mapped[int | None] = mapped_column(Integer)
    idempotency_key: Mapped[str] = mapped_column(String(255), nullable=False)
    fingerprint: Mapped[str] = mapped_column(String(64), nullable=False)
    response: Mapped[str] = mapped_column(Text, nullable=False)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
