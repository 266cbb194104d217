"""Packed closed versions: ``version_batches`` and ``objects.packed_versions`` (issue 24).

A bulk version request's closed versions are stored as one ``version_batches`` row, and each
object names its packed versions in ``objects.packed_versions`` (the batches' ids,
comma-separated, oldest first), instead of one ``object_versions`` row and primary-key entry
each: about 16 bytes per version beyond the value's ciphertext instead of 126
(docs/benchmarks.md, "Packed closed versions").

Upgrade packs every existing ``object_versions`` row: the rows closed at one instant (one bulk
request; a single version alone) become batches of at most 10,000, their values copied as
stored (never decrypted). Downgrade unpacks every batch into ``object_versions`` rows again.
Single versions written after this migration stay one row each.

The batch format is written out here as it was at this revision (``_encode_accounts``,
``_decode``), not imported from :mod:`app.store.versions`: a later change of the format comes
with a migration of its own and must not change what this one writes or reads.

Revision ID: 0016
Revises: 0015
Create Date: 2026-11-26
"""

from __future__ import annotations

from datetime import datetime
from itertools import pairwise
from typing import Any

import orjson
import sqlalchemy as sa
from alembic import op

from app.db.types import UTCDateTime

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None

#: Closed versions per batch, at most (a bulk request's largest).
BATCH = 10_000

#: A packed accounting, as this revision writes it: data_version, seq_start, seq_end,
#: loss_lower, loss_upper, loss_exact, basic_total.
_Account = tuple[int, int, int, float, float, str | None, str]
_ACCOUNT_COLUMNS = (
    "data_version",
    "seq_start",
    "seq_end",
    "loss_lower",
    "loss_upper",
    "loss_exact",
    "basic_total",
)

#: ``object_versions`` and ``version_batches`` as this migration reads and writes them: the
#: values as stored (ciphertexts; no column type decrypts them here).
_ROWS = sa.table(
    "object_versions",
    sa.column("object_id", sa.String),
    sa.column("data_version", sa.Integer),
    sa.column("value", sa.Text),
    sa.column("seq_start", sa.Integer),
    sa.column("seq_end", sa.Integer),
    sa.column("loss_lower", sa.Float),
    sa.column("loss_upper", sa.Float),
    sa.column("loss_exact", sa.Text),
    sa.column("basic_total", sa.Text),
    sa.column("rejected", sa.Integer),
    sa.column("closed_at", UTCDateTime),
)
_BATCHES = sa.table(
    "version_batches",
    sa.column("id", sa.Integer),
    sa.column("closed_at", UTCDateTime),
    sa.column("size", sa.Integer),
    sa.column("accounts", sa.Text),
    sa.column("rejected", sa.Text),
    sa.column("ciphertexts", sa.Text),
)


def upgrade() -> None:
    """Create the batches and the objects' references; pack every closed version's row."""
    op.create_table(
        "version_batches",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("closed_at", UTCDateTime(), nullable=False),
        sa.Column("size", sa.Integer(), nullable=False),
        sa.Column("accounts", sa.Text(), nullable=False),
        sa.Column("rejected", sa.Text(), nullable=False),
        sa.Column("ciphertexts", sa.Text(), nullable=False),
    )
    op.add_column("objects", sa.Column("packed_versions", sa.Text()))
    conn = op.get_bind()
    if conn.dialect.name == "postgresql":
        # the ciphertexts are random base64: not worth a compression attempt (TOAST stores
        # them out of line as they are)
        op.execute("ALTER TABLE version_batches ALTER COLUMN ciphertexts SET STORAGE EXTERNAL")
    refs: dict[str, list[tuple[int, int]]] = {}
    order = (_ROWS.c.closed_at, _ROWS.c.object_id, _ROWS.c.data_version)
    statement = sa.select(_ROWS).order_by(*order).limit(BATCH)
    # the rows in closing order a page at a time, each page starting after the last row packed
    # (keyset paging over a temporary index: a page costs its own rows, not a sort or a scan of
    # every row left, which made a large table's migration quadratic); all deleted at the end
    op.create_index("ix_0016_closing", "object_versions", [c.name for c in order])
    after: tuple[Any, ...] | None = None
    while page := list(
        conn.execute(statement if after is None else statement.where(sa.tuple_(*order) > after))
    ):
        groups = _groups(page)
        if len(page) == BATCH and len(groups) > 1:
            groups.pop()  # it may go on in the next page
        for rows in groups:
            batch = _insert_batch(conn, rows)
            for row in rows:
                refs.setdefault(row.object_id, []).append((row.data_version, batch))
        # the groups are a prefix of the page (in the database's order, which may not be
        # Python's: each group was sorted again)
        last = page[sum(map(len, groups)) - 1]
        after = (last.closed_at, last.object_id, last.data_version)
    op.drop_index("ix_0016_closing", table_name="object_versions")
    conn.execute(sa.delete(_ROWS))
    _write_refs(conn, refs)


def _groups(rows: list[Any]) -> list[list[Any]]:
    """Rows in closing order cut by closing instant (one request), no id twice in one."""
    groups: list[list[Any]] = []
    ids: set[str] = set()
    for row in rows:
        if not groups or row.closed_at != groups[-1][0].closed_at or row.object_id in ids:
            groups.append([])
            ids = set()
        groups[-1].append(row)
        ids.add(row.object_id)
    # a batch holds its objects in Python's id order (it is bisected), whatever the collation
    return [sorted(group, key=lambda row: str(row.object_id)) for group in groups]


def _encode_accounts(ids: list[str], accounts: list[_Account]) -> str:
    """A batch's ``accounts`` text: ids newline-joined, equal accountings once, one pick each."""
    if any(a >= b for a, b in pairwise(ids)):
        raise ValueError("a batch's ids must be sorted and distinct")
    variants: dict[tuple[Any, ...], int] = {}
    picks = []
    for n, start, end, lower, upper, exact, basic in accounts:
        key = (int(n), int(start), int(end), repr(float(lower)), repr(float(upper)), exact, basic)
        picks.append(variants.setdefault(key, len(variants)))
    body = {"ids": "\n".join(ids), "variants": [list(key) for key in variants], "picks": picks}
    return orjson.dumps(body).decode()


def _decode(batch: int, accounts: str, rejected: str) -> list[dict[str, Any]]:
    """A stored batch's rows (without their values), by position."""
    try:
        body = orjson.loads(accounts)
        ids = str(body["ids"]).split("\n")
        variants = [
            (int(n), int(s), int(e), float(lo), float(up), None if x is None else str(x), str(b))
            for n, s, e, lo, up, x, b in body["variants"]
        ]
        picks = [int(p) for p in body["picks"]]
        counts = [int(r) for r in rejected.split(",")]
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        raise RuntimeError(
            f"cannot downgrade below 0016: version batch {batch} is malformed "
            f"({type(exc).__name__})"
        ) from None
    if not len(ids) == len(picks) == len(counts) or any(not 0 <= p < len(variants) for p in picks):
        raise RuntimeError(f"cannot downgrade below 0016: version batch {batch} is malformed")
    return [
        {
            "object_id": oid,
            **dict(zip(_ACCOUNT_COLUMNS, variants[pick], strict=True)),
            "rejected": n,
        }
        for oid, pick, n in zip(ids, picks, counts, strict=True)
    ]


def _insert_batch(conn: Any, rows: list[Any]) -> int:
    accounts: list[_Account] = [
        (
            r.data_version,
            r.seq_start,
            r.seq_end,
            r.loss_lower,
            r.loss_upper,
            r.loss_exact,
            r.basic_total,
        )
        for r in rows
    ]
    inserted = conn.execute(
        sa.insert(_BATCHES)
        .values(
            closed_at=rows[0].closed_at,
            size=len(rows),
            accounts=_encode_accounts([r.object_id for r in rows], accounts),
            rejected=",".join(str(r.rejected) for r in rows),
            ciphertexts="\n".join(r.value for r in rows),
        )
        .returning(_BATCHES.c.id)
    )
    return int(inserted.scalar_one())


def _write_refs(conn: Any, refs: dict[str, list[tuple[int, int]]]) -> None:
    """Each object's ``packed_versions``, oldest first (set-based on PostgreSQL)."""
    items = [
        {"id": oid, "refs": ",".join(str(batch) for _, batch in sorted(found))}
        for oid, found in sorted(refs.items())
    ]
    for start in range(0, len(items), BATCH):
        part = items[start : start + BATCH]
        if conn.dialect.name == "postgresql":
            conn.execute(
                sa.text(
                    "UPDATE objects AS o SET packed_versions = v.refs FROM json_to_recordset("
                    "CAST(:rows AS json)) AS v(id text, refs text) WHERE o.id = v.id"
                ),
                {"rows": orjson.dumps(part).decode()},
            )
        else:
            conn.execute(sa.text("UPDATE objects SET packed_versions = :refs WHERE id = :id"), part)


def downgrade() -> None:
    """Unpack every batch into ``object_versions`` rows; drop the batches and the references."""
    conn = op.get_bind()
    ids = [int(i) for (i,) in conn.execute(sa.text("SELECT id FROM version_batches ORDER BY id"))]
    referenced = _references(conn)
    for batch in ids:
        closed_at, accounts, rejected, ciphertexts = conn.execute(
            sa.select(
                _BATCHES.c.closed_at,
                _BATCHES.c.accounts,
                _BATCHES.c.rejected,
                _BATCHES.c.ciphertexts,
            ).where(_BATCHES.c.id == batch)
        ).one()
        _unpack(conn, batch, closed_at, accounts, rejected, ciphertexts, referenced)
    op.drop_table("version_batches")
    if conn.dialect.name == "postgresql":
        op.drop_column("objects", "packed_versions")
    else:  # not a batch copy of ``objects``, which would lose its triggers (0014)
        op.execute("ALTER TABLE objects DROP COLUMN packed_versions")


def _references(conn: Any) -> set[tuple[str, int]]:
    """Every ``(object id, batch)`` the objects name."""
    found = set()
    statement = sa.text("SELECT id, packed_versions FROM objects WHERE packed_versions IS NOT NULL")
    for oid, text in conn.execute(statement):
        found.update((str(oid), int(batch)) for batch in text.split(",") if batch)
    return found


def _unpack(
    conn: Any,
    batch: int,
    closed_at: datetime,
    accounts: str,
    rejected: str,
    ciphertexts: str,
    referenced: set[tuple[str, int]],
) -> None:
    decoded = _decode(batch, accounts, rejected)
    values = ciphertexts.split("\n")
    if len(values) != len(decoded):
        raise RuntimeError(f"cannot downgrade below 0016: version batch {batch} is malformed")
    rows = []
    for version, value in zip(decoded, values, strict=True):
        if (version["object_id"], batch) not in referenced:
            raise RuntimeError(
                f"cannot downgrade below 0016: {version['object_id']} does not name its version "
                f"{version['data_version']} in batch {batch}"
            )
        rows.append({**version, "value": value, "closed_at": closed_at})
    for start in range(0, len(rows), BATCH):
        conn.execute(sa.insert(_ROWS), rows[start : start + BATCH])
