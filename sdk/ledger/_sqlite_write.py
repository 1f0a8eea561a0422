"""One write transaction on a ledger file (:class:`~.storage.Transaction`).

``BEGIN IMMEDIATE`` takes SQLite's write lock, so each transaction reads the
chain heads under it and several processes append to one file safely.

The rows of a group of appends are sent together, a few statements of many
rows each, when the transaction commits. Why: sqlite3 hands the GIL back
around every statement, and a thread sealing meanwhile keeps it for up to
the interpreter's switch interval, so a statement per record made the
committer wait that long per record. A key the file holds fails the whole
statement; the group is then written again (``DuplicateRow("seq")`` asks the
Ledger for it) unit by unit, a unit (one record, or a pair) under a
savepoint, so that a duplicate undoes that unit only. An import (which never
takes the chain's head) goes unit by unit throughout: its refusal names the
line. Each chain's head is recorded in ``meta`` by the transaction
that appends to it (updated in place), and in the side file after the COMMIT
(:mod:`._head`).
"""

from __future__ import annotations

import functools
import sqlite3
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..errors import LedgerBusyError, LedgerCorruptError
from . import _head
from ._evidence import EvidenceEntry
from ._format import GENESIS, StoredEntry
from ._sqlite_open import is_busy
from ._sqlite_rows import EVIDENCE_COLUMNS, RECORD_COLUMNS, evidence_values, record_values
from .storage import DuplicateRow

#: Seconds the write connection's busy timeout waits at a time (see SQLiteTransaction.__enter__)
WRITE_LOCK_STEP = 0.1

__all__ = ["Heads", "SQLiteTransaction"]

_ROW_MARKS = "(?,?,?,?,?,?,?,?,?,?,?,?)"
_INSERT_RECORD = f"INSERT INTO records({RECORD_COLUMNS}) VALUES {_ROW_MARKS}"
_ROWS_PER_INSERT = 64  # rows per statement (768 values); a group's rest goes in one statement of its size
_FLUSH_AT = 1024  # rows held before they are sent (a large group stays in bounded memory)


class Heads:
    """What a ledger file's writer keeps between transactions: the records
    chain's head as last committed (so a commit need not read it again), the
    ledger's id and its side file."""

    def __init__(self, real_path: str) -> None:
        self.records: tuple[int, str] | None = None  # None: read it (and check it) in the next transaction
        self.ledger_id: str | None = None  # read by the first head check
        self.side = _head.SideFile(real_path)
        self.real_path = real_path
        self.careful = False  # a group met a key the file holds: the next transaction goes unit by unit


class SQLiteTransaction:
    """A write transaction made by :meth:`SQLiteStorage.write`: ``with`` begins
    it (the caller holds the write lock), commits it when the block ends,
    and rolls it back if the block raises. A class, not a generator: it is
    on every commit's path."""

    def __init__(self, db: sqlite3.Connection, heads: Heads, path: Path, what: str, lock_timeout: float) -> None:
        self._db = db
        self._heads = heads
        self._path = path
        self._what = what
        self._lock_timeout = lock_timeout
        self._records: tuple[int, str] | None = None  # the records chain's head in this transaction
        self._checked = False  # records_head() read or took it (else, as in an import, nothing is kept of it)
        self._added = False
        self._evidence: tuple[int, str] | None = None  # the last evidence row added
        self._held: list[StoredEntry] = []  # record rows not sent yet (see the module)

    def __enter__(self) -> SQLiteTransaction:
        """BEGIN IMMEDIATE, waiting up to ``lock_timeout`` for another
        process's write; past it a typed LedgerBusyError (nothing begun).

        The wait is taken in steps of :data:`WRITE_LOCK_STEP` (the write
        connection's busy timeout), back in Python between them: SQLite's own
        wait runs in C, where a Ctrl-C is not seen until it returns."""
        deadline = time.monotonic() + self._lock_timeout
        while True:
            try:
                self._db.execute("BEGIN IMMEDIATE")
                return self
            except sqlite3.OperationalError as exc:
                if not is_busy(exc):
                    raise
                if time.monotonic() >= deadline:
                    raise LedgerBusyError(f"{self._what} {self._path.name} failed: another connection kept it locked "
                                          f"for {self._lock_timeout:g} s ({exc}); nothing was written") from None

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: Any) -> None:
        if exc_type is not None:
            self.rollback()
            return
        try:
            self.commit()
        except BaseException:
            self.rollback()
            raise

    def _query(self, sql: str, args: tuple[Any, ...]) -> list[Any]:
        return self._db.execute(sql, args).fetchall()

    def records_head(self) -> tuple[int, str]:
        if not self._checked:
            head = self._heads.records
            if head is None:
                row = self._db.execute("SELECT seq, row_hash FROM records ORDER BY seq DESC LIMIT 1").fetchone()
                head = (row[0], row[1]) if row else (0, GENESIS)
                self._check_head("records", head)
                self._heads.records = head
            self._records, self._checked = head, True
        assert self._records is not None
        return self._records

    def evidence_head(self) -> tuple[int, str]:
        if self._held:  # evidence rows name records: theirs go in first
            self._send()
        if self._evidence is not None:
            return self._evidence
        row = self._db.execute("SELECT eid, row_hash FROM evidence ORDER BY eid DESC LIMIT 1").fetchone()
        head = (row[0], row[1]) if row else (0, GENESIS)
        self._check_head("evidence", head)
        return head

    def _check_head(self, kind: str, last: tuple[int, Any]) -> None:
        """Before the first write to a chain (in its transaction, under the
        write lock): refuse (LedgerCorruptError, nothing written) a chain that
        falls short of a head the ledger recorded, or whose last row hash is
        damaged: appending would cover the loss up."""
        heads = self._heads
        heads.ledger_id = _head.ledger_id(self._query, create=True)
        problems = _head.problems_before_write(self._query, heads.real_path, heads.ledger_id, kind, last)
        if problems:
            path = self._path
            raise LedgerCorruptError(
                f"{path}: {'; '.join(problems)}; nothing was written",
                hint=f"`capseal verify {path}` reports what is missing. Appending is refused because it would "
                     "hide the loss; to go on from what is left, export this ledger and import the export into a "
                     f"new file (if the loss is known and accepted, as after a restore from a backup, moving "
                     f"{heads.side.path} aside is enough when only it records the lost rows).")

    def add_records(self, rows: Sequence[StoredEntry]) -> None:
        if self._checked and not self._heads.careful:  # a group of appends: sent together (see the module)
            self._held.extend(rows)
            if len(self._held) >= _FLUSH_AT:
                self._send()
        else:
            self._insert_unit(rows)
        if rows:
            self._records, self._added = (rows[-1].seq, rows[-1].row_hash), True

    def _send(self) -> None:
        """Insert the rows held, :data:`_ROWS_PER_INSERT` a statement.

        Raises:
            DuplicateRow: ``"seq"``: a row's key is in the file (the group is written again)."""
        rows, self._held = self._held, []
        db = self._db
        try:
            for i in range(0, len(rows), _ROWS_PER_INSERT):
                chunk = rows[i : i + _ROWS_PER_INSERT]
                db.execute(_INSERT_RECORD if len(chunk) == 1 else _insert_rows(len(chunk)),
                           [v for row in chunk for v in record_values(row)])
        except sqlite3.IntegrityError as exc:
            found = _duplicate(exc, 0)
            if found.column != "seq":  # another process took the seq: only the head was stale
                self._heads.careful = True
            raise DuplicateRow("seq", 0, f"{found.detail} (the group is written again, unit by unit)") from None

    def _insert_unit(self, rows: Sequence[StoredEntry]) -> None:
        """One unit now; a duplicate undoes this unit only (:class:`DuplicateRow` names it)."""
        db = self._db
        if len(rows) == 1:  # one statement is atomic on its own: no savepoint
            try:
                db.execute(_INSERT_RECORD, record_values(rows[0]))
            except sqlite3.IntegrityError as exc:
                raise _duplicate(exc, 0) from None
        else:
            db.execute("SAVEPOINT unit")
            for i, row in enumerate(rows):
                try:
                    db.execute(_INSERT_RECORD, record_values(row))
                except sqlite3.IntegrityError as exc:
                    db.execute("ROLLBACK TO unit")
                    db.execute("RELEASE unit")
                    raise _duplicate(exc, i) from None
            db.execute("RELEASE unit")

    def record_seqs(self, record_ids: Sequence[str]) -> dict[str, int]:
        if self._held:
            self._send()
        seqs: dict[str, int] = {}
        for i in range(0, len(record_ids), 500):
            chunk = list(record_ids[i : i + 500])
            marks = ",".join("?" * len(chunk))
            seqs.update(self._db.execute(f"SELECT record_id, seq FROM records WHERE record_id IN ({marks})",
                                         chunk).fetchall())
        return seqs

    def add_evidence(self, rows: Sequence[EvidenceEntry], members: Sequence[tuple[int, int, int]]) -> None:
        if self._held:
            self._send()
        db = self._db
        try:
            for i in range(0, len(rows), 100):  # multi-row INSERTs: fewer statement steps per batch
                group = rows[i : i + 100]
                db.execute(f"INSERT INTO evidence({EVIDENCE_COLUMNS}) VALUES " + ",".join(["(?,?,?,?,?,?)"] * len(group)),
                           [v for row in group for v in evidence_values(row)])
            _insert_members(db, members)
        except sqlite3.IntegrityError as exc:
            raise DuplicateRow("eid", 0, str(exc)) from None
        if rows:
            self._evidence = (rows[-1].eid, rows[-1].row_hash)

    def commit(self) -> None:
        """Record the heads of the chains written, then COMMIT (durable on
        return), then the side file (best effort: the rows are durable)."""
        db = self._db
        if self._held:
            self._send()
        records = self._records if self._added else None
        evidence = self._evidence
        if records is not None:
            _record_head(db, "head", records)
        if evidence is not None:
            _record_head(db, "evidence_head", evidence)
        db.execute("COMMIT")
        heads = self._heads
        heads.careful = False
        # a chain whose head this transaction never checked (an import, built under a temporary
        # name) leaves no head to go on from, and no side file: the next write reads and checks it
        if records is not None and self._checked:
            heads.records = records
            heads.side.write("records", heads.ledger_id, *records)
        if evidence is not None:
            heads.side.write("evidence", heads.ledger_id, *evidence)

    def rollback(self) -> None:
        """Undo everything; the head is read again by the next transaction."""
        self._heads.records = None
        try:
            self._db.execute("ROLLBACK")
        except sqlite3.Error:
            pass


@functools.lru_cache(maxsize=_ROWS_PER_INSERT)
def _insert_rows(n: int) -> str:
    """The INSERT of ``n`` record rows."""
    return f"INSERT INTO records({RECORD_COLUMNS}) VALUES " + ",".join([_ROW_MARKS] * n)


def _record_head(db: sqlite3.Connection, key: str, head: tuple[int, str]) -> None:
    """Set a chain's ``meta`` head. An UPDATE in place, not INSERT OR REPLACE:
    a replaced row moves, and its key's index entry with it (one page more in
    every commit); the row is made once, by a ledger's first commit."""
    value = f"{head[0]} {head[1]}"
    if db.execute(_SET_HEAD, (value, key)).rowcount == 0:
        db.execute("INSERT INTO meta(key, value) VALUES (?, ?)", (key, value))


_SET_HEAD = "UPDATE meta SET value = ? WHERE key = ?"


def _duplicate(exc: sqlite3.IntegrityError, index: int) -> DuplicateRow:
    text = str(exc)
    if "records.seq" in text:
        column = "seq"
    elif "action_id" in text:  # the action-id key's index (or a first-layout file's column index)
        column = "action_id"
    else:
        column = "record_id"
    return DuplicateRow(column, index, text)


def _insert_members(db: sqlite3.Connection, rows: Sequence[tuple[int, int, int]]) -> None:
    """Index rows ``(record_seq, eid, leaf_index)``, 300 per statement. Why
    not executemany: sqlite3 hands the GIL back around every statement step,
    so a row per step would hand it to the sealing thread and back once per
    record of a batch."""
    for i in range(0, len(rows), 300):
        chunk = rows[i : i + 300]
        db.execute("INSERT INTO evidence_members(record_seq, eid, leaf_index) VALUES " + ",".join(["(?,?,?)"] * len(chunk)),
                   [v for row in chunk for v in row])
