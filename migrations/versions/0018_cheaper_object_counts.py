"""Object-count triggers without a NUMERIC cast per row where floats decide; lz4 states (issue 27).

The statement triggers of revision 0014 add each written row's share of the counts
(:data:`app.store.objects.ROW_COUNTS`) over their transition tables. Two shares compare in
NUMERIC — exhausted: ``0.000001 > budget - loss_upper``, near exhaustion:
``0.1 * budget > budget - loss_upper``, each ``double precision`` cast to ``NUMERIC`` — and
those casts were nearly all the triggers' cost: a cast formats the float with 15 significant
digits and parses the text (``float8_numeric``). On 5,000 rows shaped like a survey chunk's the
six sums took ~70 ms with them and ~5 ms without (docs/benchmarks.md, "h/plans").

Here each of the two shares is decided by ``double precision`` comparisons where they cannot
disagree with the NUMERIC ones, and by the NUMERIC expression of 0014 everywhere else. Write
``N(x)`` for the cast (``x`` rounded to 15 significant digits, so ``|N(x) - x| <= 5e-15 |x|``;
it keeps the sign and the order, and maps ±infinity to ±Infinity), ``B`` for the budget and
``L`` for ``loss_upper``, and take ``1e-4 < B < 1e6`` (a NaN budget fails ``B < 1e6``; any
other budget keeps the NUMERIC expression). The float products and differences below are
rounded by at most ``2^-53`` of their value, so:

* exhausted (``N(B) - N(L) < 1e-6``) is **false** when ``L < B - 1e-5``: then
  ``B - L > 1e-5 - 1.2e-10`` and ``N(B) - N(L) >= (B - L) - 5e-15 (B + |L|)`` exceeds
  ``1e-6`` (for ``L < 0`` even ``N(B) - N(L) >= N(B)``; ``L = -inf`` gives ``+Infinity``);
  it is **true** when ``L >= B`` and ``L`` is no NaN: ``N(L) >= N(B)`` (order kept; ``B`` is
  finite, so no ``Infinity - Infinity``).
* near exhaustion (``N(L) > 0.9 N(B)``) is **false** when ``L < 0.89 B``
  (``N(L) < 0.8901 B < 0.9 N(B)``; for ``L < 0``, ``N(L) <= 0 < 0.9 N(B)``) and **true** when
  ``L > 0.91 B`` and ``L`` is no NaN (``N(L) > 0.9099 B > 0.9 N(B)``; ``+inf`` included).

A NaN ``L`` fails every float comparison that decides (``NaN`` sorts above every number in
PostgreSQL, hence ``L < 'NaN'`` where a "true" needs it), and so does every ``L`` in
``[0.89 B, 0.91 B]`` or ``[B - 1e-5, B)``: those rows, and budgets outside the range, get the
NUMERIC expression, unchanged. A share that is "true" is 1 only for an active row, as before.
The products are inside ``CASE`` branches taken only within the budget's range, so a tiny
budget stored before budgets had a floor (``5e-324``) never meets a float product that would
underflow (the reason the comparisons are in NUMERIC: :data:`app.store.objects._REMAINING`).

**And the states' arrays compressed with lz4** (PostgreSQL, when the server has it): a
survey stores each new state's ``log P`` array (2,505 bytes on average after seven diverging
surveys), which TOAST compressed with pglz to ~170 bytes; with lz4 inserting 2,000 of them took
75 ms of PostgreSQL's CPU instead of 125 ms (median of 6, interleaved, load ~7), stored in ~398
bytes. The states table grows ~2.3 times (45.8 MiB after the seventh survey at 10^6 would be
~105 MiB); arrays stored before keep pglz (both are read alike).

The functions are replaced (``CREATE OR REPLACE``); the triggers, the table, SQLite's row
triggers and every other count are as 0014 made them. The shares are for the definitions of
0014 (``MIN_EPSILON`` 1e-6, ``NEAR_EXHAUSTION_FRACTION`` 0.1): the upgrade checks them, and
a later change of a definition needs a revision of its own, as 0014 says. Downgrade restores
0014's functions.

Revision ID: 0018
Revises: 0017
Create Date: 2026-11-26
"""

from __future__ import annotations

from decimal import Decimal

from alembic import op

from app.engine.limits import MIN_EPSILON, NEAR_EXHAUSTION_FRACTION
from app.store.objects import ROW_COUNTS, row_counts_sql

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None

_NAMES = list(ROW_COUNTS)
_COLUMNS = ", ".join(_NAMES)
_FLOAT = "DOUBLE PRECISION"
#: The budgets whose shares floats may decide (outside: the NUMERIC expression).
_LOW, _HIGH = "0.0001", "1000000"


def _in_range(row: str) -> str:
    return f"{row}.budget > CAST({_LOW} AS {_FLOAT}) AND {row}.budget < CAST({_HIGH} AS {_FLOAT})"


def _decided(row: str, exact: str, false_when: str, true_when: str) -> str:
    """``exact`` (a 0/1 share), decided by floats where ``false_when``/``true_when`` hold."""
    active = f"CASE WHEN {row}.retired_at IS NULL THEN 1 ELSE 0 END"
    return (
        f"CASE WHEN {_in_range(row)} THEN (CASE WHEN {false_when} THEN 0 "
        f"WHEN {true_when} AND {row}.loss_upper < CAST('NaN' AS {_FLOAT}) THEN {active} "
        f"ELSE {exact} END) ELSE {exact} END"
    )


def fast_shares(exact: dict[str, str], row: str) -> dict[str, str]:
    """The shares of ``row`` (a transition table's alias), two of them decided by floats.

    Exhausted and near exhaustion are decided by floats where these agree with the NUMERIC
    ``exact`` ones (the module docstring's proof), and are ``exact`` elsewhere.
    """
    budget, loss = f"{row}.budget", f"{row}.loss_upper"
    found = dict(exact)
    found["exhausted"] = _decided(
        row,
        exact["exhausted"],
        f"{loss} < {budget} - CAST(0.00001 AS {_FLOAT})",
        f"{loss} >= {budget}",
    )
    found["near_exhaustion"] = _decided(
        row,
        exact["near_exhaustion"],
        f"{loss} < CAST(0.89 AS {_FLOAT}) * {budget}",
        f"{loss} > CAST(0.91 AS {_FLOAT}) * {budget}",
    )
    return found


def postgres_function(event: str, *, fast: bool) -> str:
    """The function the statement trigger of ``event`` runs (``fast`` False: 0014's own text)."""
    dialect = op.get_bind().dialect
    new, old = row_counts_sql(dialect, "n"), row_counts_sql(dialect, "o")
    if fast:
        new, old = fast_shares(new, "n"), fast_shares(old, "o")
    parts = []
    if event in {"insert", "update"}:
        parts.append("SELECT " + ", ".join(f"{new[k]} AS {k}" for k in _NAMES) + " FROM n")  # noqa: S608
    if event in {"update", "delete"}:
        parts.append("SELECT " + ", ".join(f"-({old[k]}) AS {k}" for k in _NAMES) + " FROM o")  # noqa: S608
    sums = ", ".join(f"sum(d.{k})" for k in _NAMES)
    changed = " OR ".join(f"sum(d.{k}) <> 0" for k in _NAMES)
    add = ", ".join(f"{k} = c.{k} + excluded.{k}" for k in _NAMES)
    create = "CREATE OR REPLACE FUNCTION" if fast else "CREATE FUNCTION"
    return f"""
{create} gatekeeper_object_counts_{event}() RETURNS trigger LANGUAGE plpgsql AS $body$
BEGIN
    INSERT INTO object_counts AS c (slot, {_COLUMNS})
    SELECT pg_backend_pid(), {sums}
    FROM ({" UNION ALL ".join(parts)}) AS d
    HAVING {changed}
    ON CONFLICT (slot) DO UPDATE SET {add};
    RETURN NULL;
END
$body$"""  # noqa: S608 - names and expressions from the models


def _check_definitions() -> None:
    """The proof is for 0014's thresholds: 1e-6 remaining, a tenth of the budget."""
    if Decimal(repr(MIN_EPSILON)) != Decimal("0.000001") or NEAR_EXHAUSTION_FRACTION != 0.1:
        raise RuntimeError("revision 0018's shares assume MIN_EPSILON 1e-6 and a fraction of 0.1")


def lz4_available() -> bool:
    """Whether the PostgreSQL server can compress with lz4 (built with it; PostgreSQL 14+)."""
    found = op.get_bind().exec_driver_sql(
        "SELECT 'lz4' = ANY(enumvals) FROM pg_settings WHERE name = 'default_toast_compression'"
    )
    return bool(found.scalar())


def upgrade() -> None:
    """Replace the PostgreSQL functions, compress new states with lz4 (SQLite: nothing)."""
    if op.get_bind().dialect.name != "postgresql":
        return  # SQLite's row triggers compare each row once: nothing to gain
    _check_definitions()
    for event in ("insert", "update", "delete"):
        op.execute(postgres_function(event, fast=True))
    if lz4_available():
        op.execute("ALTER TABLE likelihood_states ALTER COLUMN state SET COMPRESSION lz4")


def downgrade() -> None:
    """Restore 0014's PostgreSQL functions and the server's default compression of states."""
    if op.get_bind().dialect.name != "postgresql":
        return
    if lz4_available():
        op.execute("ALTER TABLE likelihood_states ALTER COLUMN state SET COMPRESSION DEFAULT")
    for event in ("insert", "update", "delete"):
        op.execute(
            postgres_function(event, fast=False).replace(
                "CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1
            )
        )
