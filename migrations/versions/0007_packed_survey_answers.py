"""Survey answers packed per chunk of members (issue #13's 1 GB goal).

Until 0006 every member of a survey had a ``survey_members`` row and every accepted member also
had a history row in ``queries`` (``survey_id`` set): about 380 bytes per answer, so a survey of
a million objects wrote some 380 MB and a few surveys blew the 1 GB that issue #13 gives a
million-object study. The members of one chunk share almost everything — one query, a handful of
outputs, each with its loss bounds — so this revision stores a chunk's answers once, packed:

* ``survey_chunks`` (one row per survey and chunk of at most :data:`CHUNK_SIZE` members, in
  member-id order): ``members`` (the ids, sorted, joined by newlines), ``first_id``/``last_id``
  (``COLLATE "C"`` on PostgreSQL; indexed with ``survey_id``: an object's chunk in a survey is
  the last one starting at or before its id),
  and, once the chunk is decided, ``decided_at`` with three compact JSON lists — ``picks`` (per
  member: an index into ``variants`` when accepted, or a negative refusal code, see
  :data:`REFUSALS`), ``seqs`` (per member: the answer's sequence number in the object's history,
  0 when refused) and ``variants`` (the distinct history-row contents of the chunk's answers).
  A chunk is wholly pending (those four NULL) or wholly decided. That is about 10 bytes per
  member instead of about 380.
* An object's history is its single-submit ``queries`` rows merged by sequence number with
  its answers in the decided chunks whose ``[first_id, last_id]`` covers its id
  (``app.services.history``); nothing is added to the ``objects`` row, whose size a survey
  must not change (PostgreSQL then updates it in place, HOT).
* ``survey_members`` goes (with its PostgreSQL ``fillfactor``), and so do the surveys' history
  rows in ``queries`` (``survey_id`` not NULL); the ``queries.survey_id`` column stays.

The downgrade rebuilds ``survey_members`` and the history rows from the chunks; a history row
gets its chunk's ``decided_at`` as ``created_at`` (the latest of the chunk's rows before).

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-25
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Sequence
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

#: An object id compared bytewise, as Python sorts ids (``COLLATE "C"`` on PostgreSQL): an
#: object's chunk is found by comparing its id with the chunks' first and last ids.
BYTEWISE_ID = sa.String(128).with_variant(sa.String(128, collation="C"), "postgresql")

#: Members per chunk. A test may set ``config.attributes["survey_chunk_size"]`` on the Alembic
#: config to cut smaller chunks (:func:`_chunk_size`).
CHUNK_SIZE = 5000

#: ``picks`` code of each refusal reason (a refused member with another reason gets -1).
REFUSALS = {"budget-exhausted": -1, "invalid-for-domain": -2, "retired": -3}

#: ``survey_members.status`` values (app.services.survey_groups.MemberStatus before this).
PENDING, ACCEPTED, REFUSED = 0, 1, 2

#: Rows per batch of an UPDATE or INSERT with many parameter sets, and rows fetched per read.
BATCH = 1000

#: The fields of a variant, in the order they are written (also a ``queries`` row's columns).
VARIANT_FIELDS = (
    "query",
    "output",
    "epsilon",
    "epsilon_exact",
    "loss_lower",
    "loss_upper",
    "basic_after",
)

_TIMESTAMP = sa.DateTime(timezone=True)


def _dumps(value: Any) -> str:
    """Compact JSON (no spaces after separators)."""
    return json.dumps(value, separators=(",", ":"))


def _utc(value: datetime) -> datetime:
    """``value`` aware in UTC (SQLite returns naive timestamps, taken as UTC)."""
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def _chunk_size() -> int:
    """:data:`CHUNK_SIZE`, or the Alembic config's ``survey_chunk_size`` attribute (tests)."""
    config = op.get_context().config
    if config is not None and "survey_chunk_size" in config.attributes:
        return int(config.attributes["survey_chunk_size"])
    return CHUNK_SIZE


def upgrade() -> None:
    """Create ``survey_chunks``, pack every survey into it, drop the rest."""
    _check_history(op.get_bind())
    op.create_table(
        "survey_chunks",
        sa.Column("survey_id", sa.Integer(), sa.ForeignKey("surveys.id"), primary_key=True),
        sa.Column("chunk", sa.Integer(), primary_key=True),
        sa.Column("size", sa.Integer(), nullable=False),
        sa.Column("first_id", BYTEWISE_ID, nullable=False),
        sa.Column("last_id", BYTEWISE_ID, nullable=False),
        sa.Column("members", sa.Text(), nullable=False),
        sa.Column("decided_at", sa.DateTime(timezone=True)),
        sa.Column("picks", sa.Text()),
        sa.Column("seqs", sa.Text()),
        sa.Column("variants", sa.Text()),
    )
    op.create_index("ix_survey_chunks_first_id", "survey_chunks", ["survey_id", "first_id"])
    conn = op.get_bind()
    survey_ids = conn.execute(sa.text("SELECT id FROM surveys ORDER BY id")).scalars().all()
    for survey_id in survey_ids:
        _pack_survey(conn, int(survey_id))
    conn.execute(sa.text("DELETE FROM queries WHERE survey_id IS NOT NULL"))
    op.drop_table("survey_members")


def _check_history(conn: sa.Connection) -> None:
    """Refuse to start when an accepted member has no history row.

    The answer (output, seq, loss bounds) is only there; checked before any change because
    SQLite would keep the tables created before an error.
    """
    missing = conn.execute(
        sa.text(
            "SELECT m.survey_id, m.object_id FROM survey_members m WHERE m.status = :accepted "
            "AND NOT EXISTS (SELECT 1 FROM queries q WHERE q.object_id = m.object_id "
            "AND q.survey_id = m.survey_id) ORDER BY m.survey_id, m.object_id LIMIT 1"
        ),
        {"accepted": ACCEPTED},
    ).all()
    if missing:
        survey_id, object_id = missing[0]
        raise RuntimeError(_no_history(int(survey_id), str(object_id)))


def _no_history(survey_id: int, object_id: str) -> str:
    """The error of an accepted member without its history row."""
    return (
        f"survey {survey_id}: member {object_id!r} is accepted but has no history row in "
        "queries; the answers cannot be packed (restore the row or mark the member refused, "
        "then migrate again)"
    )


def _pack_survey(conn: sa.Connection, survey_id: int) -> None:
    """Write the chunks of one survey."""
    members = sorted(
        (str(object_id), int(status), reason)
        for object_id, status, reason in conn.execute(
            sa.text(
                "SELECT object_id, status, reason FROM survey_members WHERE survey_id = :s"
            ).execution_options(yield_per=BATCH),
            {"s": survey_id},
        )
    )
    # object id -> (seq, variant id in this survey, created_at); each variant's tuple is kept
    # once however many rows repeat it
    variant_ids: dict[tuple[Any, ...], int] = {}
    history: dict[str, tuple[int, int, datetime]] = {}
    rows = conn.execute(
        sa.text(
            "SELECT object_id, seq, query, output, epsilon, epsilon_exact, loss_lower, "
            "loss_upper, basic_after, created_at FROM queries WHERE survey_id = :s"
        )
        .columns(created_at=_TIMESTAMP)
        .execution_options(yield_per=BATCH),
        {"s": survey_id},
    )
    for row in rows:
        variant = (
            str(row.query),
            str(row.output),
            float(row.epsilon),
            str(row.epsilon_exact),
            float(row.loss_lower),
            float(row.loss_upper),
            float(row.basic_after),
        )
        vid = variant_ids.setdefault(variant, len(variant_ids))
        history[str(row.object_id)] = (int(row.seq), vid, _utc(row.created_at))
    variants = list(variant_ids)
    del variant_ids
    chunks: list[dict[str, Any]] = []
    for number, chunk in enumerate(_cut(members, _chunk_size())):
        chunks.append(_chunk_row(survey_id, number, chunk, history, variants))
        if len(chunks) >= 10:  # a chunk's row holds up to CHUNK_SIZE ids: write them in tens
            _insert_chunks(conn, chunks)
            chunks = []
    if chunks:
        _insert_chunks(conn, chunks)


def _cut(
    members: Sequence[tuple[str, int, str | None]], size: int
) -> Iterator[Sequence[tuple[str, int, str | None]]]:
    """Consecutive runs of at most ``size`` members, each wholly pending or wholly decided."""
    start = 0
    for end in range(1, len(members) + 1):
        if (
            end == len(members)
            or end - start == size
            or (members[end][1] == PENDING) != (members[start][1] == PENDING)
        ):
            yield members[start:end]
            start = end


def _chunk_row(
    survey_id: int,
    number: int,
    chunk: Sequence[tuple[str, int, str | None]],
    history: dict[str, tuple[int, int, datetime]],
    variants: Sequence[tuple[Any, ...]],
) -> dict[str, Any]:
    """The ``survey_chunks`` row of ``chunk`` (member id, status, reason), sorted by id."""
    row: dict[str, Any] = {
        "survey_id": survey_id,
        "chunk": number,
        "size": len(chunk),
        "first_id": chunk[0][0],
        "last_id": chunk[-1][0],
        "members": "\n".join(object_id for object_id, _, _ in chunk),
        "decided_at": None,
        "picks": None,
        "seqs": None,
        "variants": None,
    }
    if chunk[0][1] == PENDING:
        return row
    local: dict[int, int] = {}  # survey-wide variant id -> index in this chunk's variants
    picks: list[int] = []
    seqs: list[int] = []
    decided_at: datetime | None = None
    for object_id, status, reason in chunk:
        if status != ACCEPTED:
            picks.append(REFUSALS.get(reason or "", -1))
            seqs.append(0)
            continue
        if object_id not in history:
            raise RuntimeError(_no_history(survey_id, object_id))
        seq, vid, created_at = history[object_id]
        picks.append(local.setdefault(vid, len(local)))
        seqs.append(seq)
        decided_at = created_at if decided_at is None else max(decided_at, created_at)
    row["decided_at"] = decided_at if decided_at is not None else datetime.now(UTC)
    row["picks"] = _dumps(picks)
    row["seqs"] = _dumps(seqs)
    row["variants"] = _dumps(
        [dict(zip(VARIANT_FIELDS, variants[vid], strict=True)) for vid in local]
    )
    return row


def _insert_chunks(conn: sa.Connection, rows: Sequence[dict[str, Any]]) -> None:
    """Insert ``survey_chunks`` rows."""
    conn.execute(
        sa.text(
            "INSERT INTO survey_chunks (survey_id, chunk, size, first_id, last_id, members, "
            "decided_at, picks, seqs, variants) VALUES (:survey_id, :chunk, :size, :first_id, "
            ":last_id, :members, :decided_at, :picks, :seqs, :variants)"
        ).bindparams(sa.bindparam("decided_at", type_=_TIMESTAMP)),
        list(rows),
    )


def downgrade() -> None:
    """Rebuild ``survey_members`` and the surveys' history rows, drop the chunks."""
    op.create_table(
        "survey_members",
        sa.Column("survey_id", sa.Integer(), sa.ForeignKey("surveys.id"), primary_key=True),
        sa.Column("object_id", sa.String(128), primary_key=True),
        sa.Column("status", sa.SmallInteger(), nullable=False),
        sa.Column("reason", sa.String(32)),
        sa.Column("output", sa.Text()),
    )
    conn = op.get_bind()
    if conn.dialect.name == "postgresql":
        op.execute("ALTER TABLE survey_members SET (fillfactor = 50)")
    keys = conn.execute(
        sa.text(
            "SELECT c.survey_id, c.chunk, s.analyst_key_id FROM survey_chunks c "
            "JOIN surveys s ON s.id = c.survey_id ORDER BY c.survey_id, c.chunk"
        )
    ).all()
    for survey_id, number, analyst_key_id in keys:
        _unpack_chunk(conn, int(survey_id), int(number), analyst_key_id)
    op.drop_table("survey_chunks")


def _unpack_chunk(
    conn: sa.Connection, survey_id: int, number: int, analyst_key_id: int | None
) -> None:
    """The ``survey_members`` rows and ``queries`` history rows of one chunk."""
    chunk = conn.execute(
        sa.text(
            "SELECT members, decided_at, picks, seqs, variants FROM survey_chunks "
            "WHERE survey_id = :s AND chunk = :c"
        ).columns(decided_at=_TIMESTAMP),
        {"s": survey_id, "c": number},
    ).one()
    ids = str(chunk.members).split("\n")
    members: list[dict[str, Any]] = []
    history: list[dict[str, Any]] = []
    if chunk.picks is None:
        members = [
            {"s": survey_id, "o": object_id, "st": PENDING, "r": None, "out": None}
            for object_id in ids
        ]
    else:
        reasons = {code: reason for reason, code in REFUSALS.items()}
        variants = json.loads(chunk.variants)
        decided_at = _utc(chunk.decided_at)
        for object_id, pick, seq in zip(
            ids, json.loads(chunk.picks), json.loads(chunk.seqs), strict=True
        ):
            if pick < 0:
                members.append(
                    {
                        "s": survey_id,
                        "o": object_id,
                        "st": REFUSED,
                        "r": reasons.get(pick, "budget-exhausted"),
                        "out": None,
                    }
                )
                continue
            variant = variants[pick]
            members.append(
                {
                    "s": survey_id,
                    "o": object_id,
                    "st": ACCEPTED,
                    "r": None,
                    "out": variant["output"],
                }
            )
            history.append(
                {
                    "object_id": object_id,
                    "seq": seq,
                    **{field: variant[field] for field in VARIANT_FIELDS},
                    "analyst_key_id": analyst_key_id,
                    "survey_id": survey_id,
                    "created_at": decided_at,
                }
            )
    _execute_many(
        conn,
        sa.text(
            "INSERT INTO survey_members (survey_id, object_id, status, reason, output) "
            "VALUES (:s, :o, :st, :r, :out)"
        ),
        members,
    )
    _execute_many(
        conn,
        sa.text(
            "INSERT INTO queries (object_id, seq, query, output, epsilon, epsilon_exact, "
            "loss_lower, loss_upper, basic_after, analyst_key_id, idempotency_key, fingerprint, "
            "response, survey_id, created_at) VALUES (:object_id, :seq, :query, :output, "
            ":epsilon, :epsilon_exact, :loss_lower, :loss_upper, :basic_after, "
            ":analyst_key_id, NULL, NULL, NULL, :survey_id, :created_at)"
        ).bindparams(sa.bindparam("created_at", type_=_TIMESTAMP)),
        history,
    )


def _execute_many(conn: sa.Connection, statement: sa.TextClause, rows: Iterable[Any]) -> None:
    """Execute ``statement`` for each of ``rows``, :data:`BATCH` parameter sets at a time."""
    batch: list[Any] = []
    for row in rows:
        batch.append(row)
        if len(batch) >= BATCH:
            conn.execute(statement, batch)
            batch = []
    if batch:
        conn.execute(statement, batch)
