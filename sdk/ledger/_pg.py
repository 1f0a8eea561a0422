"""The server engine: a ledger in a PostgreSQL database, for fleets of producers.

It implements :class:`~capseal.ledger.storage.Storage` over psycopg 3: any
number of producers in any number of processes, on any number of hosts,
append to one ledger at once (:mod:`._pg_write` says how the chains stay
whole). Writes go through one connection, one transaction at a time
(``write_lock``, held by the caller); reads through another; a snapshot
through a connection of its own holding one ``REPEATABLE READ READ ONLY``
transaction. Every call runs under ``write_lock`` or ``read_lock``, as the
file engine's do, so the fork machinery (:mod:`._fork`) finds every
connection quiet; a forked copy never uses or closes one (closing it would
end the parent's session on the server).

Durability: ``synchronous_commit = on``: a COMMIT returns once the server
has flushed it to disk. Append-only: triggers refuse UPDATE, DELETE and
TRUNCATE. A connection the server dropped (a restart) is made again on the
next call; the records of a transaction that was lost get a typed error.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from ..canonical import is_hex64
from ..errors import LedgerClosedError, LedgerError, LedgerUnavailableError
from . import _columns, _pg_schema, _scan
from ._evidence import EvidenceEntry
from ._fork import ForkGuard
from ._format import StoredEntry
from ._pg_connect import connect, failure, is_lost, reason
from ._pg_rows import COLUMNS, FIRST_LAYOUT_COLUMNS, entry
from ._pg_url import DatabaseURL, psycopg_module
from ._pg_write import PGTransaction, WriteConnection
from ._sqlite_rows import EVIDENCE_COLUMNS, evidence_entry
from .storage import Head, RecordedHeads

__all__ = ["PGStorage"]

_STATES = ("SELECT m.eid, m.leaf_index, CASE WHEN e.record_id IS NULL THEN NULL ELSE e.body END"
           " FROM records r JOIN evidence_members m ON m.record_seq = r.seq JOIN evidence e ON e.eid = m.eid"
           " WHERE r.record_id = %s ORDER BY m.eid")
_IDLE_SNAPSHOTS = 2  # snapshot connections kept for the next snapshot (a new connection costs a server process)


class PGStorage:
    """A ledger in a PostgreSQL database (see the module). Made closed; :meth:`open` connects.

    Args:
        url: the database URL.
        label: how the ledger names itself in messages.
        guard: the ledger's fork flag.
        readonly: open it for reading only.
        synchronous: ``FULL``/``EXTRA`` (durable commits) or ``NORMAL`` (asynchronous commit).
        lock_timeout: seconds to wait for a lock, or for the server.
        on_released: called when the last snapshot still open at :meth:`close` ends.
    """

    def __init__(self, url: DatabaseURL, *, label: str, guard: ForkGuard, readonly: bool, synchronous: str,
                 lock_timeout: float, on_released: Callable[[], None]) -> None:
        psycopg = psycopg_module()
        self.url = url
        self.name = url.name
        self.location = url.name
        self.readonly = readonly
        self.write_lock = threading.Lock()
        self.read_lock = threading.Lock()
        self.damage_errors: tuple[type[BaseException], ...] = (psycopg.errors.DataCorrupted,
                                                                psycopg.errors.IndexCorrupted)
        self._label = label
        self._guard = guard
        self._synchronous = synchronous
        self._lock_timeout = lock_timeout
        self._on_released = on_released
        self._link = WriteConnection(url, synchronous=synchronous, lock_timeout=lock_timeout)
        self._rdb: Any = None
        self._closed = False
        self._snap = threading.local()
        self._snaps: set[Any] = set()
        self._idle: list[Any] = []
        self._layout = _pg_schema.LAYOUT  # the ledger's, once opened (a write-open brings it to this one)
        self._columns = COLUMNS  # what a record read selects (the layout's)

    def _connect(self) -> Any:
        return connect(self.url, readonly=True, synchronous=self._synchronous, lock_timeout=self._lock_timeout)

    def open(self) -> None:
        """Connect and check (or make) the ledger; the caller holds :attr:`write_lock`.

        Raises:
            NotALedgerError, LedgerFormatError, LedgerError, LedgerUnavailableError,
            LedgerAccessDeniedError, MissingExtraError: see :mod:`._pg_schema` and :mod:`._pg_connect`.
        """
        psycopg = psycopg_module()
        try:
            if self.readonly:
                self._rdb = self._connect()
                first = self._rdb
            else:
                first = self._link.get()
            try:
                self._layout = _pg_schema.prepare(first, self.name, readonly=self.readonly)
                self._columns = COLUMNS if self._layout == _pg_schema.LAYOUT else FIRST_LAYOUT_COLUMNS
            except psycopg.Error as exc:
                raise failure(exc, self.url, "opening") from None
            if self._rdb is None:
                self._rdb = self._connect()
        except BaseException:
            self._link.drop()
            if self._rdb is not None:
                self._rdb.close()
                self._rdb = None
            self._closed = True
            raise

    def connections(self) -> list[Any]:
        snaps = list(self._snaps) + list(self._idle)
        if self._closed:
            return snaps
        return [c for c in (self._link.conn, self._rdb, *snaps) if c is not None]

    def close(self) -> bool:
        with self.read_lock:
            self._closed = True
            for conn in [self._rdb, *self._idle]:
                if conn is not None:
                    conn.close()
            self._rdb, self._idle = None, []
            released = not self._snaps
        self._link.drop()
        return released

    # ------------------------------------------------------------------ writing

    def write(self, what: str) -> PGTransaction:
        if self.readonly:
            raise LedgerError(f"{self._label} is read-only")
        if self._guard.forked:
            raise self._guard.error("writing")
        if self._closed:
            raise LedgerClosedError(f"{self._label} is closed")
        return PGTransaction(self._link, what)

    def write_connection(self) -> WriteConnection:
        """The write connection (an import runs its own transaction on it)."""
        return self._link

    # ------------------------------------------------------------------ reading

    @contextmanager
    def snapshot(self) -> Iterator[None]:
        if self._guard.forked:
            raise self._guard.error("reading")
        if getattr(self._snap, "db", None) is not None:
            yield
            return
        with self.read_lock:
            if self._closed:
                raise LedgerClosedError(f"{self._label} is closed")
            db = self._idle.pop() if self._idle else None
        if db is None or db.closed or db.broken:
            db = self._connect()
        with self.read_lock:
            self._snaps.add(db)
        try:
            with self.read_lock:
                try:
                    db.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
                except psycopg_module().Error as exc:  # an idle connection the server dropped: once more, anew
                    if not is_lost(exc, db):
                        raise failure(exc, self.url, "reading") from None
                    self._snaps.discard(db)
                    db = self._connect()
                    self._snaps.add(db)
                    db.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
            self._snap.db = db
            yield
        finally:
            self._snap.db = None
            with self.read_lock:
                self._snaps.discard(db)
                forked = self._guard.forked
                keep = False
                if not forked and not db.closed and not db.broken:
                    try:
                        db.execute("ROLLBACK")
                        keep = not self._closed and len(self._idle) < _IDLE_SNAPSHOTS
                    except psycopg_module().Error:
                        pass
                if keep:
                    self._idle.append(db)
                elif not forked:  # inherited through fork: never closed here (it would end the parent's session)
                    db.close()
                last = self._closed and not self._snaps and not forked
            if last:
                self._on_released()

    def _query(self, sql: str, args: tuple[Any, ...] | list[Any] = (), *, binary: bool = False) -> list[Any]:
        if self._guard.forked:
            raise self._guard.error("reading")
        snap = getattr(self._snap, "db", None)
        psycopg = psycopg_module()
        with self.read_lock:
            if self._closed:
                raise LedgerClosedError(f"{self._label} is closed")
            for attempt in (1, 2):
                db = self._rdb if snap is None else snap
                try:
                    return list(db.execute(sql, args or None, binary=binary).fetchall())
                except psycopg.Error as exc:
                    if isinstance(exc, self.damage_errors):
                        raise
                    if not is_lost(exc, db):
                        raise failure(exc, self.url, "reading") from None
                    if snap is not None or attempt == 2:  # a snapshot cannot be carried over to a new connection
                        raise LedgerUnavailableError(f"reading {self.name} failed: the connection to the server was "
                                                     f"lost ({reason(exc, self.url)})") from None
                    db.close()
                    self._rdb = self._connect()
        raise AssertionError("unreachable")

    def count(self) -> int:
        return int(self._query("SELECT count(*) FROM records")[0][0])

    def _rows(self, sql: str, batch: int, damaged: list[str] | None, what: str) -> Iterator[Any]:
        last = 0
        while True:
            try:
                got = self._query(sql, (last, batch), binary=True)  # bodies as bytes, not hex text
            except self.damage_errors as exc:
                if damaged is None:
                    raise
                damaged.append(f"{what} {last}: the rows after it cannot be read ({reason(exc, self.url)})")
                return
            yield from got
            if len(got) < batch:
                return
            last = got[-1][0]

    def record_rows(self, *, batch: int, damaged: list[str] | None) -> Iterator[StoredEntry]:
        sql = f"SELECT {self._columns} FROM records WHERE seq > %s ORDER BY seq LIMIT %s"
        for row in self._rows(sql, batch, damaged, "seq"):
            yield entry(row, tolerant=damaged is not None)

    def record_row(self, record_id: str) -> StoredEntry | None:
        rows = self._query(f"SELECT {self._columns} FROM records WHERE record_id = %s", (record_id,))
        return entry(rows[0]) if rows else None

    def has_record(self, record_id: str) -> bool:
        return bool(self._query("SELECT 1 FROM records WHERE record_id = %s LIMIT 1", (record_id,)))

    def has_action_id(self, action_id: str) -> bool:
        if self._layout == _pg_schema.LAYOUT:
            return bool(self._query(f"SELECT 1 FROM records WHERE {_pg_schema.ACTION_KEY} = %s LIMIT 1",
                                    (_columns.action_key(action_id),)))
        if "\x00" in action_id:  # a first-layout ledger holds none (its text columns cannot)
            return False
        return bool(self._query(
            f"(SELECT 1 FROM records WHERE record_type = 'capsule' AND {_pg_schema.ACTION_ID} = %s LIMIT 1) UNION ALL "
            "(SELECT 1 FROM records WHERE action_id = %s AND record_type <> 'capsule' LIMIT 1)", (action_id, action_id)))

    def last_tagged(self, tag: str, stream: str) -> StoredEntry | None:
        if tag == "epoch_boundary":
            rows = self._query(f"SELECT {self._columns} FROM records WHERE {_pg_schema.BOUNDARY} AND "
                               f"{_pg_schema.STREAM} = %s ORDER BY seq DESC LIMIT 1", (stream,))
        else:
            rows = self._query(f"SELECT {self._columns} FROM records WHERE tag = %s AND stream = %s "
                               "ORDER BY seq DESC LIMIT 1", (tag, stream))
        return entry(rows[0]) if rows else None

    def evidence_rows(self, *, batch: int, damaged: list[str] | None) -> Iterator[EvidenceEntry]:
        sql = f"SELECT {EVIDENCE_COLUMNS} FROM evidence WHERE eid > %s ORDER BY eid LIMIT %s"
        for row in self._rows(sql, batch, damaged, "evidence"):
            yield evidence_entry(row)

    def evidence_states(self, record_id: str, *, latest: bool) -> list[tuple[int, Any, Any]]:
        sql = _STATES.replace("ORDER BY m.eid", "ORDER BY m.eid DESC LIMIT 1") if latest else _STATES
        return [(row[0], row[1], row[2]) for row in self._query(sql, (record_id,))]

    def evidence_body(self, eid: int) -> Any:
        return self._query("SELECT body FROM evidence WHERE eid = %s", (eid,))[0][0]

    def evidence_index(self) -> set[tuple[int, int, int]]:
        return {(r[0], r[1], r[2]) for r in self._query("SELECT record_seq, eid, leaf_index FROM evidence_members")}

    def evidence_index_rows(self, *, batch: int) -> Iterator[tuple[int, int, int]]:
        sql = ("SELECT record_seq, eid, leaf_index FROM evidence_members WHERE (record_seq, eid) > (%s, %s) "
               "ORDER BY record_seq, eid LIMIT %s")
        for r in _scan.pages(self._query, sql, batch, _scan.FIRST_MEMBER, _scan.member_key):
            yield (r[0], r[1], r[2])

    def epoch_boundaries(self, *, batch: int) -> Iterator[StoredEntry]:
        sql = f"SELECT {self._columns} FROM records WHERE {_pg_schema.BOUNDARY} AND seq > %s ORDER BY seq LIMIT %s"
        for row in _scan.pages(self._query, sql, batch, _scan.FIRST_SEQ, _scan.seq_key):
            yield entry(row)

    # ------------------------------------------------------------------ checks

    def integrity_check(self) -> list[str]:
        """What PostgreSQL can say of its own storage here: every append-only
        trigger and body-read index present and enabled (a superuser can
        drop or disable one, and then edit rows), and, where the ``amcheck``
        extension is installed in the database, its check of each index."""
        present = {str(r[0]) for r in self._query(_pg_schema.PRESENT_SQL)}
        problems = [f"PostgreSQL: {'the append-only trigger' if '_no_' in n else 'the index'} {n} is missing or "
                    "disabled (the rows can be changed behind capseal's back)"
                    for n in _pg_schema.OBJECTS if n not in present]
        if self._query("SELECT 1 FROM pg_extension WHERE extname = 'amcheck'"):
            indexes = self._query("SELECT c.relname FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
                                  "JOIN pg_class t ON t.oid = i.indrelid JOIN pg_namespace n ON n.oid = t.relnamespace "
                                  "WHERE n.nspname = current_schema() AND t.relname = ANY(%s)",
                                  (list(_pg_schema.TABLES),))
            for (index,) in indexes:
                try:
                    self._query("SELECT bt_index_check(%s::regclass)", (index,))
                except (LedgerError, psycopg_module().Error) as exc:
                    problems.append(f"PostgreSQL's amcheck: index {index}: {str(exc)[:200]}")
        return problems

    def recorded_heads(self) -> RecordedHeads:
        heads: list[Head] = []
        damaged: list[str] = []
        for chain, position, row_hash in self._query("SELECT chain, position, row_hash FROM heads ORDER BY chain"):
            if chain not in ("records", "evidence"):
                continue
            if not is_hex64(row_hash):
                damaged.append(f"the heads row of the {chain} chain is damaged ({str(row_hash)[:80]!r})")
            elif position > 0:
                heads.append(Head(chain, int(position), row_hash, "its heads table"))
        return RecordedHeads(heads, damaged, [])
