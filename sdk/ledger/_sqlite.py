"""The embedded engine: a ledger in one SQLite file (WAL mode, standard library only).

It implements :class:`~capseal.ledger.storage.Storage`. Writes go through one
connection, one transaction at a time (``write_lock``, held by the caller);
reads through another, so a reader never sees a half-built group, or, inside
:meth:`SQLiteStorage.snapshot`, through a private read-only connection per
thread holding one read transaction (WAL: every query sees the file as of
the first one). Every SQLite call runs under ``write_lock`` or ``read_lock``:
a fork takes both, so no call is under way in the copy (:mod:`._fork`).

Durability: ``synchronous=FULL`` in WAL mode, so a COMMIT returns once it is
fsynced; a process killed with SIGKILL loses nothing committed and leaves no
torn row. Append-only: triggers refuse UPDATE and DELETE.
"""

from __future__ import annotations

import os
import sqlite3
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ..errors import LedgerBusyError, LedgerClosedError, LedgerCorruptError, LedgerError
from . import _columns, _head, _scan
from ._evidence import EvidenceEntry
from ._fork import ForkGuard
from ._format import StoredEntry
from ._sqlite_open import LAYOUT, connect, is_busy, layout_of, readonly_uri
from ._sqlite_rows import EVIDENCE_COLUMNS, RECORD_COLUMNS, evidence_entry, stored
from ._sqlite_write import WRITE_LOCK_STEP, Heads, SQLiteTransaction
from .storage import RecordedHeads

__all__ = ["SQLiteStorage"]

_MAX_INTEGRITY = 10  # messages from SQLite's integrity check given one by one; the rest are counted
_HAS_ACTION_ID = f"SELECT 1 FROM records WHERE {_columns.ACTION_KEY} = ? LIMIT 1"
# a file of the first layout, read-only (so not migrated): its own indexes find the candidates
# (the body's at the id as json_extract cuts it, at a NUL; the column's), the key tells them apart
_HAS_ACTION_ID_1 = (f"SELECT 1 FROM records WHERE record_type = 'capsule' AND {_columns.ACTION_ID} = ?1 AND "
                    f"{_columns.ACTION_KEY} = ?2 UNION ALL "
                    "SELECT 1 FROM records WHERE action_id = ?3 AND record_type <> 'capsule' LIMIT 1")
_STATES = ("SELECT m.eid, m.leaf_index, CASE WHEN e.record_id IS NULL THEN NULL ELSE e.body END"
           " FROM records r JOIN evidence_members m ON m.record_seq = r.seq JOIN evidence e ON e.eid = m.eid"
           " WHERE r.record_id=? ORDER BY m.eid")


class SQLiteStorage:
    """A ledger file (see the module). Made closed; :meth:`open` connects.

    Args:
        path: the file.
        label: how the ledger names itself in messages.
        guard: the ledger's fork flag (every call is refused in a forked copy).
        readonly: open it for reading only.
        synchronous: SQLite's ``synchronous`` setting (FULL, EXTRA or NORMAL).
        lock_timeout: seconds to wait for another process's lock.
        lenient: read on past damage, and read the side file's heads as each
            snapshot begins (an audit).
        on_released: called when the last snapshot still open at
            :meth:`close` ends.
    """

    damage_errors: tuple[type[BaseException], ...] = (sqlite3.DatabaseError,)

    def __init__(self, path: Path, *, label: str, guard: ForkGuard, readonly: bool, synchronous: str,
                 lock_timeout: float, lenient: bool, on_released: Callable[[], None]) -> None:
        self.path = path
        self.name = path.name
        self.readonly = readonly
        # the file as SQLite resolves the path now (the current directory may change)
        self.location = os.path.realpath(path)
        self.write_lock = threading.Lock()
        self.read_lock = threading.Lock()
        self._label = label
        self._guard = guard
        self._synchronous = synchronous
        self._lock_timeout = lock_timeout
        self._lenient = lenient
        self._on_released = on_released
        self._db: sqlite3.Connection | None = None
        self._rdb: sqlite3.Connection | None = None
        self._layout = LAYOUT  # the file's layout, read once opened (a write-open brings it to this one)
        self._closed = False
        self._snap = threading.local()  # a thread's snapshot connection (see snapshot)
        self._snaps: set[sqlite3.Connection] = set()  # every thread's open snapshot connection (a fork inherits them)
        self._heads = Heads(self.location)
        # the side file's heads as the latest snapshot began (lenient only): read before its first
        # query, so they name no commit the snapshot cannot see (writers write it after each commit)
        self._side_heads: tuple[list[tuple[str, Any]], list[str]] = ([], [])

    def open(self) -> None:
        """Connect; the caller holds :attr:`write_lock` (a fork waits for the connections to be made).

        Raises:
            LedgerError (and its subclasses): see :func:`._sqlite_open.connect`.
        """
        try:
            self._db = connect(self.path, readonly=self.readonly, synchronous=self._synchronous,
                               lock_timeout=self._lock_timeout, lenient=self._lenient)
            if not self.readonly:  # its writes wait for another process's lock in short steps: see SQLiteTransaction
                self._db.execute(f"PRAGMA busy_timeout = {int(WRITE_LOCK_STEP * 1000)}")
            else:
                try:
                    self._layout = layout_of(self._db)
                except sqlite3.DatabaseError:  # the first layout's lookups are right for either (if slower)
                    self._layout = "1"
            # readers get their own connection: they never see a half-built group
            self._rdb = self._db if self.readonly else sqlite3.connect(
                str(self.path), isolation_level=None, check_same_thread=False, timeout=self._lock_timeout)
        except BaseException:
            if self._db is not None:
                self._db.close()
            self._closed = True  # closed under the write lock, as close() is: a fork skips it
            raise

    def connections(self) -> list[Any]:
        snaps = list(self._snaps)
        if self._closed:  # closed under the write lock: only snapshots still open
            return snaps
        db, rdb = self._db, self._rdb
        return [c for c in (db, None if rdb is db else rdb, *snaps) if c is not None]

    def close(self) -> bool:
        with self.read_lock:
            self._closed = True
            if self._rdb is not None and self._rdb is not self._db:
                self._rdb.close()
            # a snapshot still open on another thread keeps its connection (its
            # next query is refused) until it ends: the fork machinery must know
            # that connection until then, so the last one out says so
            released = not self._snaps
        if self._db is not None:
            self._db.close()
        self._heads.side.close()
        return released

    # ------------------------------------------------------------------ writing

    def write(self, what: str) -> SQLiteTransaction:
        if self.readonly:
            raise LedgerError(f"{self._label} is read-only")
        if self._guard.forked:
            raise self._guard.error("writing")
        db = self._db
        if self._closed or db is None:
            raise LedgerClosedError(f"{self._label} is closed")
        return SQLiteTransaction(db, self._heads, self.path, what, self._lock_timeout)

    # ------------------------------------------------------------------ reading

    @contextmanager
    def snapshot(self) -> Iterator[None]:
        if self._guard.forked:
            raise self._guard.error("reading")
        if getattr(self._snap, "db", None) is not None:
            yield
            return
        if self._lenient:
            self._side_heads = _head.side_heads(self.location)
        with self.read_lock:
            if self._closed:
                raise LedgerClosedError(f"{self._label} is closed")
            db = sqlite3.connect(readonly_uri(self.location), uri=True, isolation_level=None,
                                 check_same_thread=False, timeout=self._lock_timeout)
            self._snaps.add(db)
            if self._lenient:
                db.execute("PRAGMA writable_schema=ON")
        try:
            self._snap.db = db
            with self.read_lock:
                db.execute("BEGIN")
            yield
        finally:
            self._snap.db = None
            with self.read_lock:
                self._snaps.discard(db)
                forked = self._guard.forked
                if not forked:  # inherited through fork: the fork machinery lets go of it
                    db.close()
                last = self._closed and not self._snaps and not forked
            if last:  # close() ran meanwhile and left the fork machinery's list to us
                self._on_released()

    def _query(self, sql: str, args: tuple[Any, ...] = ()) -> list[Any]:
        if self._guard.forked:
            raise self._guard.error("reading")
        snap = getattr(self._snap, "db", None)
        with self.read_lock:  # a snapshot's queries too: a fork waits for every SQLite call on this ledger
            if self._closed:
                raise LedgerClosedError(f"{self._label} is closed")
            assert self._rdb is not None
            try:
                return (self._rdb if snap is None else snap).execute(sql, args).fetchall()
            except sqlite3.OperationalError as exc:
                if not is_busy(exc):
                    raise
                raise LedgerBusyError(f"reading {self.name} failed: another connection kept it locked for "
                                      f"{self._lock_timeout:g} s ({exc})") from None

    def count(self) -> int:
        return int(self._query("SELECT count(*) FROM records")[0][0])

    def record_rows(self, *, batch: int, damaged: list[str] | None) -> Iterator[StoredEntry]:
        sql = f"SELECT {RECORD_COLUMNS} FROM records WHERE seq > ? ORDER BY seq LIMIT ?"
        tolerant = damaged is not None
        for row in _scan.rows(self._query, sql, batch, damaged, "seq"):
            yield stored(row, tolerant=tolerant)

    def record_row(self, record_id: str) -> StoredEntry | None:
        rows = self._query(f"SELECT {RECORD_COLUMNS} FROM records WHERE record_id=?", (record_id,))
        return stored(rows[0]) if rows else None

    def has_record(self, record_id: str) -> bool:
        return bool(self._query("SELECT 1 FROM records WHERE record_id=? LIMIT 1", (record_id,)))

    def has_action_id(self, action_id: str) -> bool:
        key = _columns.action_key(action_id)
        if self._layout == LAYOUT:
            return bool(self._query(_HAS_ACTION_ID, (key,)))
        return bool(self._query(_HAS_ACTION_ID_1, (action_id.partition("\x00")[0], key, action_id)))

    def last_tagged(self, tag: str, stream: str) -> StoredEntry | None:
        if tag == _columns.BOUNDARY_TAG:
            rows = self._query(f"SELECT {RECORD_COLUMNS} FROM records WHERE {_columns.BOUNDARY} AND "
                               f"{_columns.STREAM} = ? ORDER BY seq DESC LIMIT 1", (stream,))
        else:
            rows = self._query(f"SELECT {RECORD_COLUMNS} FROM records WHERE tag=? AND stream=? "
                               "ORDER BY seq DESC LIMIT 1", (tag, stream))
        return stored(rows[0]) if rows else None

    def evidence_rows(self, *, batch: int, damaged: list[str] | None) -> Iterator[EvidenceEntry]:
        sql = f"SELECT {EVIDENCE_COLUMNS} FROM evidence WHERE eid > ? ORDER BY eid LIMIT ?"
        for row in _scan.rows(self._query, sql, batch, damaged, "evidence"):
            yield evidence_entry(row)

    def evidence_states(self, record_id: str, *, latest: bool) -> list[tuple[int, Any, Any]]:
        sql = _STATES.replace("ORDER BY m.eid", "ORDER BY m.eid DESC LIMIT 1") if latest else _STATES
        return [(row[0], row[1], row[2]) for row in self._query(sql, (record_id,))]

    def evidence_body(self, eid: int) -> Any:
        return self._query("SELECT body FROM evidence WHERE eid=?", (eid,))[0][0]

    def evidence_index(self) -> set[tuple[int, int, int]]:
        try:
            return {(r[0], r[1], r[2]) for r in self._query("SELECT record_seq, eid, leaf_index FROM evidence_members")}
        except sqlite3.DatabaseError as exc:
            raise LedgerCorruptError(str(exc)) from None

    def evidence_index_rows(self, *, batch: int) -> Iterator[tuple[int, int, int]]:
        sql = ("SELECT record_seq, eid, leaf_index FROM evidence_members WHERE (record_seq, eid) > (?, ?) "
               "ORDER BY record_seq, eid LIMIT ?")
        try:
            for r in _scan.pages(self._query, sql, batch, _scan.FIRST_MEMBER, _scan.member_key):
                yield (r[0], r[1], r[2])
        except sqlite3.DatabaseError as exc:
            raise LedgerCorruptError(str(exc)) from None

    def epoch_boundaries(self, *, batch: int) -> Iterator[StoredEntry]:
        sql = f"SELECT {RECORD_COLUMNS} FROM records WHERE {_columns.BOUNDARY} AND seq > ? ORDER BY seq LIMIT ?"
        for row in _scan.pages(self._query, sql, batch, _scan.FIRST_SEQ, _scan.seq_key):
            yield stored(row)

    # ------------------------------------------------------------------ checks

    def integrity_check(self) -> list[str]:
        rows: list[Any] | None = None
        error: sqlite3.DatabaseError | None = None
        for limit in (100, 10, 1):  # a check that goes on far enough into the damage can stop on it: fewer, then
            try:
                rows = self._query(f"PRAGMA integrity_check({limit})")
                break
            except sqlite3.DatabaseError as exc:
                if is_busy(exc):
                    raise
                error = exc
        if rows is None:
            return [f"SQLite's integrity check stopped on the damage: {error}"]
        messages = [line for row in rows for line in str(row[0]).splitlines()
                    if line != "ok" and not line.startswith("*** in database")]
        problems = [f"SQLite's integrity check: {m}" for m in messages[:_MAX_INTEGRITY]]
        if len(messages) > _MAX_INTEGRITY:
            problems.append(f"SQLite's integrity check: {len(messages) - _MAX_INTEGRITY} more problem(s)")
        return problems

    def recorded_heads(self) -> RecordedHeads:
        ident = _head.ledger_id(self._query)
        heads, damaged = _head.meta_heads(self._query)
        in_file, unreadable = self._side_heads if self._lenient else _head.side_heads(self.location)
        return RecordedHeads(heads + [head for owner, head in in_file if owner == ident], damaged, list(unreadable))
