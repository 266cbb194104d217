"""An object's row as the engine's :class:`~app.engine.pipeline.ObjectSnapshot`.

Finite objects: the stored likelihood array. Continuous objects: the stored history's parsed
terms, seeded with the certified bounds stored on the row (a decision needs no search for the
history's own loss). Parsing costs about 0.4 ms a query, so parsed continuous histories are
kept in a process-wide LRU keyed by ``(object id, version)`` — every accepted query advances the
version, and objects are never deleted — and a submit puts the snapshot it committed there for
the next one.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from fractions import Fraction
from typing import Any, Protocol

from sqlalchemy import Connection, Engine, Table, bindparam, select

from app.db.models import QueryRecord
from app.engine.continuous.state import ContinuousState
from app.engine.domain import Domain
from app.engine.filters import FilterKind
from app.engine.likelihood import LikelihoodState, LossBounds
from app.engine.limits import EngineLimits
from app.engine.pipeline import (
    HistoryEntry,
    ObjectSnapshot,
    empty_state,
    fold_history,
    history_entry,
)

#: Continuous history terms kept in the cache, all objects together (a term is a few hundred
#: bytes: the default holds about 100 MB).
CACHED_TERMS = 250_000

_QUERIES: Table = QueryRecord.__table__  # type: ignore[assignment]
_HISTORY = (
    select(_QUERIES.c.query, _QUERIES.c.output)
    .where(_QUERIES.c.object_id == bindparam("object_id"))
    .order_by(_QUERIES.c.seq)
)


class SnapshotRow(Protocol):
    """The columns of an object a snapshot is built from (read only)."""

    @property
    def id(self) -> str: ...  # noqa: D102

    @property
    def budget(self) -> float: ...  # noqa: D102

    @property
    def filter(self) -> str: ...  # noqa: D102

    @property
    def state(self) -> bytes | None: ...  # noqa: D102

    @property
    def state_err(self) -> float: ...  # noqa: D102

    @property
    def loss_lower(self) -> float: ...  # noqa: D102

    @property
    def loss_upper(self) -> float: ...  # noqa: D102

    @property
    def basic_total(self) -> str: ...  # noqa: D102

    @property
    def version(self) -> int: ...  # noqa: D102


class HistoryCache:
    """Parsed continuous histories by ``(object id, version)``, bounded by their total terms."""

    def __init__(self, max_terms: int = CACHED_TERMS) -> None:
        self.max_terms = max_terms
        self._entries: OrderedDict[tuple[str, str, int], ContinuousState] = OrderedDict()
        self._terms = 0
        self._guard = threading.Lock()
        self.hits = 0
        self.misses = 0

    def get(self, database: str, object_id: str, version: int) -> ContinuousState | None:
        """The state stored for this version, if any (and mark it recently used)."""
        key = (database, object_id, version)
        with self._guard:
            found = self._entries.get(key)
            if found is None:
                self.misses += 1
                return None
            self.hits += 1
            self._entries.move_to_end(key)
            return found

    def put(self, database: str, object_id: str, version: int, state: ContinuousState) -> None:
        """Keep ``state`` as the history of ``object_id`` at ``version`` (only committed ones)."""
        weight = state.size + 1
        if weight > self.max_terms:
            return
        key = (database, object_id, version)
        with self._guard:
            old = self._entries.pop(key, None)
            if old is not None:
                self._terms -= old.size + 1
            self._entries[key] = state
            self._terms += weight
            while self._terms > self.max_terms:
                _, evicted = self._entries.popitem(last=False)
                self._terms -= evicted.size + 1

    def clear(self) -> None:
        """Forget every history."""
        with self._guard:
            self._entries.clear()
            self._terms = 0


#: The process's cache of parsed continuous histories.
HISTORIES = HistoryCache()


def stored_history(conn: Connection, object_id: str, domain: Domain) -> list[HistoryEntry]:
    """The object's accepted queries and outputs, parsed, in sequence order."""
    rows = conn.execute(_HISTORY, {"object_id": object_id}).all()
    return [history_entry(domain, json.loads(r.query), json.loads(r.output)) for r in rows]


def snapshot_of(
    conn: Connection, row: SnapshotRow, domain: Domain, limits: EngineLimits
) -> ObjectSnapshot:
    """The object's public state as the engine decides on it. Never reads the value."""
    state: LikelihoodState | ContinuousState
    if domain.is_finite:
        if row.state is None:  # no accepted query yet
            state = empty_state(domain)
        else:
            state = LikelihoodState.from_bytes(domain, row.state, row.state_err)
    else:
        database = database_of(conn.engine)
        cached = HISTORIES.get(database, row.id, row.version)
        if cached is None:
            folded, _ = fold_history(domain, stored_history(conn, row.id, domain))
            assert isinstance(folded, ContinuousState)  # noqa: S101 - a continuous domain
            cached = folded.seeded(LossBounds(row.loss_lower, row.loss_upper))
            HISTORIES.put(database, row.id, row.version, cached)
        state = cached
    return ObjectSnapshot(
        domain, row.budget, FilterKind(row.filter), Fraction(row.basic_total), state, limits
    )


def database_of(engine: Engine) -> str:
    """The cache's name for a database: its URL without the password."""
    return engine.url.render_as_string(hide_password=True)


def remember(engine: Engine, object_id: str, version: int, snapshot: ObjectSnapshot) -> None:
    """Keep a committed continuous snapshot's history for the object's next decision."""
    if isinstance(snapshot.state, ContinuousState) and snapshot.state.loss_known:
        HISTORIES.put(database_of(engine), object_id, version, snapshot.state)


def columns_of(snapshot: ObjectSnapshot) -> dict[str, Any]:
    """The ``objects`` columns that hold a snapshot's accounting (the row's new state)."""
    loss = snapshot.loss()
    state = snapshot.state
    return {
        "state": state.to_bytes() if isinstance(state, LikelihoodState) else None,
        "state_err": state.err if isinstance(state, LikelihoodState) else 0.0,
        "loss_lower": loss.lower,
        "loss_upper": loss.upper,
        "basic_total": str(snapshot.basic_total),
    }
