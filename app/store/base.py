"""Transactions, the dialect test and the errors services see (see the package docstring)."""

from __future__ import annotations

import os
import threading
import time
import weakref
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.pq import TransactionStatus
from sqlalchemy import Connection, Engine, event
from sqlalchemy.engine import ExceptionContext
from sqlalchemy.exc import IntegrityError as Conflict
from sqlalchemy.exc import OperationalError as Unavailable
from sqlalchemy.exc import SQLAlchemyError

from app.db.session import MADE_AT, pool_bounds

#: The database a service is handed (an engine with its pool).
Database = Engine
#: One open connection, inside a transaction when it came from :func:`transaction`.
Tx = Connection

__all__ = [
    "Conflict",
    "Database",
    "Tx",
    "Unavailable",
    "begin_writes",
    "is_postgres",
    "reading",
    "submitting",
    "transaction",
]


@contextmanager
def transaction(db: Database) -> Iterator[Tx]:
    """One transaction: committed when the block ends, rolled back if it raises."""
    _hand_back(db)
    with db.begin() as conn:
        yield conn


@contextmanager
def reading(db: Database) -> Iterator[Tx]:
    """A connection for reads only (nothing to commit; closed when the block ends)."""
    _hand_back(db)
    with db.connect() as conn:
        yield conn


def _hand_back(db: Database) -> None:
    """Before the calling thread checks out a connection: its idle kept one back to the pool.

    A thread never holds its kept connection idle while it uses another (:class:`_Kept`).
    """
    kept: _Kept | None = db.__dict__.get(_KEPT)
    if kept is not None:
        kept.hand_back()


@contextmanager
def submitting(db: Database) -> Iterator[Tx]:
    """A transaction whose ``BEGIN`` goes out with its first write (a single submit's).

    On PostgreSQL the connection runs in autocommit until :func:`begin_writes` opens the
    transaction (:mod:`app.store.submits` writes a submit's outcome as one round trip that is a
    transaction of its own, or sends ``BEGIN`` with it when more writes follow): the reads
    before it run each on its own, which
    under READ COMMITTED (the isolation every transaction here runs at) is what they were
    inside the transaction too — every statement takes its own snapshot, so the write must not
    trust them and does not (the compare-and-set on the object's version). ``BEGIN`` alone
    was a round trip of its own before the first read. The block's end commits what is still
    open and rolls it back if the block raises. Elsewhere (SQLite) this is :func:`transaction`.

    The connection is the calling thread's kept one (:class:`_Kept`): checked out of the pool
    once and used by the thread's blocks one after another, in autocommit all along — the
    pool's check-out, reset and check-in were ≈ 9% of a submit's CPU in a profile
    (docs/benchmarks.md, "h/lean"; "h/conn" for what keeping it saves). When the pool has no
    room to keep one more, or the thread is inside a block already, the block checks a
    connection out for itself and gives it back.
    """
    if db.dialect.name != "postgresql":
        with db.begin() as conn:
            yield conn
        return
    kept = _kept(db)
    entry = None if kept is None else kept.take(db)
    if entry is None:  # none may be kept (or none more): the block's own check-out
        conn = db.connect()
        try:
            raw = _psycopg(conn)
        except BaseException:
            conn.close()
            raise
        # psycopg's own switch (no round trip), not SQLAlchemy's isolation-level option,
        # whose bookkeeping on the way out and back to the pool cost more than the switch
        raw.autocommit = True
    else:
        conn, raw = entry.conn, entry.raw
    try:
        try:
            yield conn
        except BaseException:
            _end(conn, raw, commit=False)
            raise
        _end(conn, raw, commit=True)
    finally:
        if entry is None:
            _release(conn, raw, clean=True)
        else:
            assert kept is not None  # noqa: S101 - an entry comes from its keeper
            kept.give_back(entry)


def _psycopg(conn: Tx) -> psycopg.Connection[Any]:
    """The psycopg connection under ``conn`` (PostgreSQL is reached through psycopg 3)."""
    raw = conn.connection.driver_connection
    if not isinstance(raw, psycopg.Connection):
        raise TypeError("submitting needs a psycopg connection")
    return raw


@dataclass(eq=False)
class _Entry:
    """A thread's kept connection (in autocommit) and what its keeper knows of it."""

    conn: Tx
    raw: psycopg.Connection[Any]
    thread: threading.Thread
    #: When it was made (``time.monotonic``, :data:`app.db.session.MADE_AT`): it is closed
    #: once it is the pool's ``pool_recycle`` seconds old, the age at which the pool would
    #: recycle it (the pool checks the age at check-out only, and a kept one is not checked
    #: out again).
    since: float
    #: Inside a :func:`submitting` block of its thread.
    busy: bool = False
    #: Given up (by :meth:`_Kept.dispose`, its block, pool_recycle, :meth:`_Kept.hand_back`):
    #: closed or given back by whoever gave it up, or by its thread when its block ends
    #: (dispose() during a block).
    doomed: bool = False


class _Kept:
    """The connections an engine's threads keep checked out for :func:`submitting` blocks.

    Each thread keeps at most one, taken from the engine's pool, so the pool's size and
    overflow still bound what the process opens; at most half of them are kept, and an engine
    :func:`app.db.session.make_engine` did not pool (SQLite's, a bare ``create_engine``'s)
    keeps none. A thread holds its kept connection, idle, between its blocks, but not while
    it uses another: :func:`transaction` and :func:`reading` (a request's key lookup, a read
    of an object) give the thread's idle kept connection back to the pool before they check
    one out, and its next block keeps one again. So a thread holds one connection at a time
    outside a block, as before any was kept (inside a block, a block's own reads may take a
    second), and the other half of the pool stays for the process's other users: a survey's
    threads, housekeeping (with request threads each holding their kept connection idle and
    another for a read, the pool had none left 22-26% of the time under submits and reads
    beside a survey, docs/benchmarks.md "h/small"). None of the pool's users holds a
    connection while it waits for another, so every wait ends.
    A connection is dropped — closed for good — when its block leaves it broken, invalidated
    or in a transaction, and at its thread's first block after it is ``pool_recycle`` seconds
    old — counted from when it was made, as the pool counts (the pool would recycle it at its
    next check-out). It goes back to the pool when its thread has ended and another thread
    finds no room to keep one (until then it stays checked out). ``Engine.dispose()``
    closes them all (the ``engine_disposed`` event: idle ones at once, one in use when its
    block ends), and so does a disconnect met on any of the engine's connections (the
    ``handle_error`` event), as the pool then recycles every connection it had made. A child
    process (``os.fork``) never uses its parent's: they are set aside untouched — neither used
    nor closed, which would end the parent's sessions.
    """

    def __init__(self, limit: int, recycle: float) -> None:
        self.limit = limit
        self.recycle = recycle
        self._forked()
        _KEEPERS.add(self)

    def _forked(self) -> None:
        """Start with nothing kept (also in a child process, whatever the parent kept)."""
        self.entries: list[_Entry] = []
        self.reserved = 0  # check-outs under way, counted against the limit
        self.local = threading.local()
        self.lock = threading.Lock()

    def take(self, db: Database) -> _Entry | None:
        """The calling thread's kept connection, marked busy; None when none may be kept.

        None also inside a block of the thread's own: a block within a block gets a connection
        of its own, as before any was kept (one shared would commit the outer block's writes).
        """
        entry: _Entry | None = getattr(self.local, "entry", None)
        if entry is not None and entry.busy:  # only its own thread marks it busy
            return None
        if entry is not None:
            expired = self.recycle >= 0 and time.monotonic() - entry.since >= self.recycle
            with self.lock:  # decided with dispose() shut out: a doomed entry is its to close
                usable = not entry.doomed and not expired
                if usable:
                    entry.busy = True
                elif not entry.doomed:  # pool_recycle old: closed, as the pool would
                    entry.doomed = True
                    self.entries.remove(entry)
                else:
                    expired = False  # given up by dispose(), which closed it (it was idle)
            if usable:
                return entry
            self.local.entry = None
            if expired:  # the pool makes a new one in its place
                _release(entry.conn, entry.raw, clean=False)
        with self.lock:
            if len(self.entries) + self.reserved >= self.limit:
                self._prune()
            if len(self.entries) + self.reserved >= self.limit:
                return None
            self.reserved += 1
        try:
            conn = db.connect()
            try:
                raw = _psycopg(conn)
                raw.autocommit = True
            except BaseException:
                conn.invalidate()
                conn.close()
                raise
        finally:
            with self.lock:
                self.reserved -= 1
        made = conn.info.get(MADE_AT)  # set by make_engine's engines (the only ones keeping)
        since = time.monotonic() if made is None else made
        entry = _Entry(conn, raw, threading.current_thread(), since, busy=True)
        with self.lock:
            self.entries.append(entry)
        self.local.entry = entry
        return entry

    def hand_back(self) -> None:
        """Give the calling thread's kept connection back to the pool, unless it is in use.

        Its thread is about to check out another (:func:`_hand_back`); the thread's next block
        keeps one again (this one, when the pool hands it out again).
        """
        entry: _Entry | None = getattr(self.local, "entry", None)
        if entry is None or entry.busy:  # none kept, or inside a block: the block's own
            return
        with self.lock:
            disposed = entry.doomed  # idle: dispose() closed it already
            if not disposed:
                entry.doomed = True
                self.entries.remove(entry)
        self.local.entry = None
        if not disposed:
            _release(entry.conn, entry.raw, clean=True)

    def give_back(self, entry: _Entry) -> None:
        """End a block on ``entry``: kept if it is idle and sound, else dropped.

        What the pool's reset on return did for the block's check-in before (SQLAlchemy's is a
        ``ROLLBACK``, which psycopg sends only when a transaction is open): a connection left in
        a transaction or failed one, or whose state is unknown, is dropped, never rolled back
        and kept. Session state the reset never touched (a ``SET``, a temporary table, a
        prepared statement) outlives a block here as it outlived a check-in; no
        :func:`submitting` block leaves any but psycopg's prepared statements.
        """
        conn, raw = entry.conn, entry.raw
        clean = (
            not conn.invalidated
            and not (raw.closed or raw.broken)
            and _status(raw) == TransactionStatus.IDLE
        )
        if clean and conn.in_transaction():  # SQLAlchemy's own (autobegun) transaction
            try:
                conn.rollback()  # nothing to send: psycopg is idle in autocommit
            except Exception:
                clean = False
        with self.lock:
            entry.busy = False
            disposed = entry.doomed  # by dispose(), while the block ran: closed for good
            if not (disposed or clean):
                entry.doomed = True
                self.entries.remove(entry)
        if disposed or not clean:
            self.local.entry = None
            _release(entry.conn, entry.raw, clean=clean and not disposed)

    def _prune(self) -> None:
        """Give the connections of ended threads back (called with the lock held)."""
        for entry in [e for e in self.entries if not e.thread.is_alive()]:
            entry.doomed = True
            self.entries.remove(entry)
            _release(entry.conn, entry.raw, clean=True)

    def disconnected(self, context: ExceptionContext) -> None:
        """After a disconnect (a restarted server, say), drop every kept connection.

        The pool then recycles each connection it made before (at its next check-out), so the
        next users of the pool do not meet a dead one in turn; a kept connection is never
        checked out again, so the keeper does the same for its own: idle ones are closed at once,
        one in use when its block ends (as :meth:`dispose` does).
        """
        if context.is_disconnect and context.invalidate_pool_on_disconnect:
            self.dispose(None)

    def dispose(self, _engine: Engine | None) -> None:
        """Close every kept connection (``Engine.dispose()``); one in use, when its block ends."""
        with self.lock:
            idle = [e for e in self.entries if not e.busy]
            for entry in self.entries:
                entry.doomed = True
            self.entries = []
        for entry in idle:
            _release(entry.conn, entry.raw, clean=False)


def _release(conn: Tx, raw: psycopg.Connection[Any], *, clean: bool) -> None:
    """Give a block's connection back to its pool, or close it for good.

    ``clean``: back out of autocommit if it is sound (:func:`_restore`); otherwise, and on any
    error on the way, invalidated (the pool makes a new connection in its place).
    """
    try:
        if clean:
            _restore(conn, raw)
        else:
            conn.invalidate()
    except Exception:
        conn.invalidate()
    finally:
        conn.close()


#: Every engine's :class:`_Kept` (a child process sets theirs aside: :func:`_after_fork`).
_KEEPERS: weakref.WeakSet[_Kept] = weakref.WeakSet()
#: The kept connections a forked child inherited: referenced for its whole life, never used
#: or collected (a collected connection is reset or closed on its socket, the parent's).
_INHERITED: list[_Entry] = []


def _after_fork() -> None:
    global _MAKING  # held by a parent's thread at the fork, it would never be released here
    _MAKING = threading.Lock()
    for kept in list(_KEEPERS):
        _INHERITED.extend(kept.entries)
        kept._forked()


os.register_at_fork(after_in_child=_after_fork)


#: The engine attribute that holds its :class:`_Kept` (made by :func:`_kept` on first use).
_KEPT = "_gatekeeper_kept"


def _kept(db: Database) -> _Kept | None:
    """``db``'s keeper of connections (made on first use), None if its pool allows none.

    The pool's bounds are those :func:`app.db.session.make_engine` was given (the engines of
    :mod:`app.bootstrap`, from the settings): an engine made otherwise keeps none.
    """
    kept: _Kept | None = db.__dict__.get(_KEPT)
    if kept is not None:
        return kept
    bounds = pool_bounds(db)  # None: not pooled by make_engine (SQLite, a bare create_engine)
    if bounds is None:
        return None
    overflow = bounds.max_overflow
    limit = bounds.size if overflow < 0 else (bounds.size + overflow) // 2  # < 0: no bound
    if limit < 1:
        return None
    with _MAKING:
        kept = db.__dict__.get(_KEPT)
        if kept is None:
            kept = _Kept(limit, bounds.recycle)
            event.listen(db, "engine_disposed", kept.dispose)
            event.listen(db, "handle_error", kept.disconnected)
            db.__dict__[_KEPT] = kept
    return kept


_MAKING = threading.Lock()


def _status(raw: psycopg.Connection[Any]) -> int:
    """``raw.info.transaction_status`` without the info object and enum made on each call."""
    return raw.pgconn.transaction_status


def _end(conn: Tx, raw: Any, *, commit: bool) -> None:
    """COMMIT (or ROLLBACK) the transaction a :func:`submitting` block opened, if any is open."""
    status = _status(raw)
    if status == TransactionStatus.IDLE:
        return
    try:
        if commit and status == TransactionStatus.INTRANS:
            raw.commit()
        else:
            raw.rollback()
    except psycopg.IntegrityError as exc:
        raise Conflict("COMMIT", None, exc, hide_parameters=True) from exc
    except psycopg.Error as exc:
        if raw.broken or raw.closed:  # a disconnect (the dialect's test): as in a statement
            _disconnected(conn)
        raise Unavailable("COMMIT" if commit else "ROLLBACK", None, exc) from exc


def _disconnected(conn: Tx) -> None:
    """Handle a disconnect met outside SQLAlchemy (psycopg's ``COMMIT``) as SQLAlchemy does.

    A disconnect inside a statement goes through SQLAlchemy's error handling: the
    ``handle_error`` event (every keeper drops its kept connections, :meth:`_Kept.disconnected`),
    the pool recycles each connection it made before (at its next check-out) and the connection
    is invalidated. :func:`_end` sends ``COMMIT`` and ``ROLLBACK`` to psycopg straight, so their
    disconnect would only invalidate the one connection. A statement on the dead connection goes
    that same road: psycopg refuses it before sending anything (``the connection is lost``), and
    SQLAlchemy handles that as the disconnect it is. Nothing to do if SQLAlchemy has invalidated
    the connection already (the block's statement met the disconnect first).
    """
    if conn.invalidated:
        return
    with suppress(SQLAlchemyError):  # the disconnect's error, already on its way up as this one
        conn.exec_driver_sql("SELECT 1")
    if not conn.invalidated:  # not seen as a disconnect: the pool must not hand it out again
        conn.invalidate()


def _restore(conn: Tx, raw: psycopg.Connection[Any]) -> None:
    """Leave autocommit before ``conn`` goes back to the pool (or make the pool drop it).

    Every other user of the pool expects SQLAlchemy's transactions (``BEGIN`` sent by psycopg
    before a statement): a connection still in autocommit, or whose state is unknown (a statement
    interrupted, a failed ``COMMIT``), is invalidated instead of returned.
    """
    if conn.invalidated:
        return
    if not (raw.closed or raw.broken) and _status(raw) == TransactionStatus.IDLE:
        raw.autocommit = False
    else:
        conn.invalidate()


def begin_writes(conn: Tx) -> None:
    """Open a :func:`submitting` block's transaction before its writes (nothing elsewhere)."""
    if not is_postgres(conn):
        return
    raw = conn.connection.driver_connection
    if not isinstance(raw, psycopg.Connection):  # PostgreSQL is reached through psycopg 3
        raise TypeError("begin_writes needs a psycopg connection")
    if raw.autocommit and _status(raw) == TransactionStatus.IDLE:
        conn.exec_driver_sql("BEGIN")


def is_postgres(conn: Tx) -> bool:
    """Whether ``conn`` talks to PostgreSQL (else SQLite, the embedded default)."""
    return conn.dialect.name == "postgresql"
