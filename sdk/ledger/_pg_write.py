"""One write transaction on a PostgreSQL ledger (:class:`~.storage.Transaction`).

**The order of appends.** Every writer, on any host, takes its chain's head
row (``heads``) with ``SELECT ... FOR UPDATE`` inside the transaction that
appends, after the records were signed, and keeps it to COMMIT: writers take
turns per chain for the few milliseconds of an insert and a commit, never
across signing, and each group is hash-chained to the row the previous
holder committed. The chain's last row is read by a second statement, once
the lock is held (a statement that waited for the lock would otherwise read
the rows as they were before it waited).

**Group commit.** The rows of a group are buffered and inserted by one
statement at COMMIT (one round trip, one WAL flush for the group). A key the
store has (another host's record with the same action id) fails that
statement; the transaction is then written again unit by unit, each under a
savepoint, so that only the duplicate is refused (:class:`DuplicateRow`).

**The head lock and the flush.** A durable writer's COMMIT does not wait
for the WAL flush (``synchronous_commit`` off for that transaction), so the
head lock goes at once; the writer then waits for the flush with a second,
tiny transaction that writes one WAL record (a transactional logical-decoding
message) and commits synchronously. PostgreSQL flushes WAL in order, so that
flush covers the COMMIT before it, and writers on many hosts waiting at once
share one flush. Records are acknowledged only after it. A row another
writer chained to, if its COMMIT never reaches the disk, can only be lost
together with that writer's later rows, which the same order puts after it.

**A server that goes away.** A transaction the server loses before COMMIT
leaves nothing (PostgreSQL keeps none of an uncommitted transaction), and
its records get LedgerUnavailableError. A connection lost *during* COMMIT
or during the wait for its flush leaves the outcome unknown: the writer
reconnects, takes the head lock (waiting out a transaction still alive on
the server), looks for the last row it wrote and, when it is there, waits
for its flush again; only a row that is there and flushed is acknowledged.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from ..canonical import is_hex64
from ..errors import LedgerCorruptError, LedgerError, LedgerUnavailableError
from ._evidence import EvidenceEntry
from ._format import GENESIS, StoredEntry
from ._head import shortfall
from ._pg_connect import connect, failure, is_lost, reason
from ._pg_rows import COLUMNS, row_values
from ._pg_url import DatabaseURL, psycopg_module
from ._sqlite_rows import EVIDENCE_COLUMNS, evidence_values
from .storage import DuplicateRow, Head

__all__ = ["WriteConnection", "PGTransaction"]

_RECORD_TYPES = "bigint, text, text, text, text, text, text, text, text, bytea, text, text, text".split(", ")
_INSERT_RECORDS = (f"INSERT INTO records ({COLUMNS}) SELECT * FROM unnest("
                   + ", ".join(f"%s::{t}[]" for t in _RECORD_TYPES) + ")")
_INSERT_RECORD = f"INSERT INTO records ({COLUMNS}) VALUES ({', '.join(['%s'] * len(_RECORD_TYPES))})"
_INSERT_EVIDENCE = (f"INSERT INTO evidence ({EVIDENCE_COLUMNS}) SELECT * FROM unnest("
                    "%s::bigint[], %s::bigint[], %s::text[], %s::bytea[], %s::text[], %s::text[])")
_INSERT_MEMBERS = ("INSERT INTO evidence_members (record_seq, eid, leaf_index) "
                   "SELECT * FROM unnest(%s::bigint[], %s::bigint[], %s::integer[])")
# one WAL record in a transaction of its own, committed synchronously: its flush covers every commit before it
_WAIT_FOR_FLUSH = "SELECT pg_logical_emit_message(true, 'capseal', '')"
_FLUSH_AT = 1000  # rows buffered before they are sent (an import of any size stays in bounded memory)
_TABLE = {"records": ("records", "seq"), "evidence": ("evidence", "eid")}
_COLUMN_OF = {"records_pkey": "seq", "records_record_id_key": "record_id", "records_action_id_key": "action_id",
              "records_capsule_action_id": "action_id"}


class WriteConnection:
    """A ledger's write connection, made again when the server dropped it,
    and what its writes learnt (``careful``: the next transaction inserts
    unit by unit, a duplicate having been met).

    Args:
        url: the ledger's URL.
        synchronous: as for :func:`._pg_connect.connect`.
        lock_timeout: seconds to wait for a lock or a connection.
    """

    def __init__(self, url: DatabaseURL, *, synchronous: str, lock_timeout: float) -> None:
        self.url = url
        self.synchronous = synchronous
        self.lock_timeout = lock_timeout
        self.conn: Any = None
        self.careful = False

    def get(self) -> Any:
        """The connection, connected again if it was lost.

        Raises:
            LedgerUnavailableError, LedgerAccessDeniedError, LedgerError: as :func:`._pg_connect.connect`.
        """
        conn = self.conn
        if conn is None or conn.closed or conn.broken:
            self.drop()
            self.conn = conn = connect(self.url, readonly=False, synchronous=self.synchronous,
                                       lock_timeout=self.lock_timeout)
        return conn

    def drop(self) -> None:
        """Let go of the connection (closed quietly)."""
        conn, self.conn = self.conn, None
        if conn is not None:
            try:
                conn.close()
            except Exception:  # noqa: BLE001 - a broken connection may fail to close; it is gone either way
                pass


class PGTransaction:
    """A write transaction made by :meth:`PGStorage.write`: ``with`` begins it
    (the caller holds the write lock), commits it when the block ends, and
    rolls it back if the block raises.

    Args:
        link: the write connection.
        what: what the write does, for messages ("append to").
        outer: the caller began the transaction and commits it (an import):
            ``with`` neither begins nor commits; :meth:`finish` sends the rest.
    """

    def __init__(self, link: WriteConnection, what: str, *, outer: bool = False) -> None:
        self._link = link
        self._url = link.url
        self._what = what
        self._outer = outer
        self._conn: Any = link.conn if outer else None
        self._careful = link.careful
        self._rows: list[StoredEntry] = []
        self._evidence_rows: list[EvidenceEntry] = []
        self._members: list[tuple[int, int, int]] = []
        self._records: tuple[int, str] | None = None  # the records chain's head in this transaction
        self._evidence: tuple[int, str] | None = None
        self._added = False
        self._last_record: str | None = None  # the last record id written: what a lost COMMIT is looked up by

    # ------------------------------------------------------------------ the transaction

    def __enter__(self) -> PGTransaction:
        if self._outer:
            return self
        for attempt in (1, 2):  # a connection the server dropped while idle is made again, once
            conn = self._link.get()
            try:
                conn.execute("BEGIN")
                self._conn = conn
                return self
            except psycopg_module().Error as exc:
                self._link.drop()
                if attempt == 2 or not is_lost(exc, conn):
                    raise self._failed(exc) from None
        raise AssertionError("unreachable")

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: Any) -> None:
        if self._outer:
            return
        if exc_type is not None:
            self.rollback()
            return
        try:
            self.commit()
        except BaseException:
            self.rollback()
            raise

    def _failed(self, exc: BaseException) -> LedgerError:
        if is_lost(exc, self._conn):
            return LedgerUnavailableError(f"{self._what} {self._url.name} failed: the connection to the server was "
                                          f"lost ({reason(exc, self._url)}); nothing was written",
                                          hint="The ledger reconnects on its next call.")
        return failure(exc, self._url, self._what, lock_timeout=self._link.lock_timeout)

    def _run(self, sql: str, args: Sequence[Any] | None = None) -> Any:
        try:
            return self._conn.execute(sql, args)
        except psycopg_module().errors.UniqueViolation:
            raise
        except psycopg_module().Error as exc:
            if is_lost(exc, self._conn):
                self._link.drop()
            raise self._failed(exc) from None

    # ------------------------------------------------------------------ heads

    def records_head(self) -> tuple[int, str]:
        if self._records is None:
            self._records = self._head("records")
        return self._records

    def evidence_head(self) -> tuple[int, str]:
        if self._evidence is None:
            self._flush()
            self._evidence = self._head("evidence")
        return self._evidence

    def _head(self, kind: str) -> tuple[int, str]:
        """Lock the chain's head row, then read its last row (a second
        statement: it sees what the previous holder committed)."""
        row = self._run("SELECT position, row_hash FROM heads WHERE chain = %s FOR UPDATE", (kind,)).fetchone()
        table, key = _TABLE[kind]
        if row is None:
            raise LedgerCorruptError(f"{self._url.name}: the heads table lacks the {kind} chain's row (it was edited); "
                                     "nothing was written")
        position, recorded = row
        last_row = self._run(f"SELECT {key}, row_hash, (SELECT row_hash FROM {table} WHERE {key} = %s) FROM {table} "
                             f"ORDER BY {key} DESC LIMIT 1", (position,)).fetchone()
        last = (int(last_row[0]), str(last_row[1])) if last_row else (0, GENESIS)
        at_head = last_row[2] if last_row else None
        problems = []
        if not is_hex64(last[1]):
            problems.append(f"the last row's row_hash is damaged ({last[1][:70]!r})")
        if not is_hex64(recorded):
            problems.append(f"the heads row of the {kind} chain is damaged ({str(recorded)[:80]!r})")
        elif position > 0:
            found = shortfall(Head(kind, int(position), recorded, "its heads table"), last[0],
                              lambda n: at_head if n == position else None)
            if found is not None:
                problems.append(found[1])
        if problems:
            raise LedgerCorruptError(
                f"{self._url.name}: {'; '.join(problems)}; nothing was written",
                hint="`capseal verify` of the ledger reports what is missing. Appending is refused because it would "
                     "hide the loss; to go on from what is left, export this ledger and import the export into an "
                     "empty database.")
        return last

    # ------------------------------------------------------------------ rows

    def add_records(self, rows: Sequence[StoredEntry]) -> None:
        if not rows:
            return
        if self._careful:
            self._insert_unit(rows)
        else:
            self._rows.extend(rows)
            if len(self._rows) >= _FLUSH_AT:
                self._flush()
        self._records, self._added = (rows[-1].seq, rows[-1].row_hash), True
        self._last_record = rows[-1].record_id

    def _insert_unit(self, rows: Sequence[StoredEntry]) -> None:
        """One unit under a savepoint: a duplicate undoes this unit only."""
        unique = psycopg_module().errors.UniqueViolation
        self._run("SAVEPOINT unit")
        for i, row in enumerate(rows):
            try:
                self._run(_INSERT_RECORD, row_values(row))
            except unique as exc:
                self._run("ROLLBACK TO SAVEPOINT unit")
                self._run("RELEASE SAVEPOINT unit")
                raise _duplicate(exc, i, self._url) from None
        self._run("RELEASE SAVEPOINT unit")

    def _flush(self) -> None:
        """Send the buffered rows, one statement per table. A duplicate fails
        the statement (and the transaction): the next try of the group goes
        unit by unit (``DuplicateRow("seq")`` asks the Ledger for it)."""
        rows, self._rows = self._rows, []
        try:
            if rows:
                self._run(_INSERT_RECORDS, [list(column) for column in zip(*map(row_values, rows))])
            evidence, members = self._evidence_rows, self._members
            self._evidence_rows, self._members = [], []
            if evidence:
                self._run(_INSERT_EVIDENCE, [list(column) for column in zip(*map(evidence_values, evidence))])
            if members:
                self._run(_INSERT_MEMBERS, [list(column) for column in zip(*members)])
        except psycopg_module().errors.UniqueViolation as exc:
            found = _duplicate(exc, 0, self._url)
            if found.column == "eid":
                raise found from None
            self._link.careful = True
            raise DuplicateRow("seq", 0, f"{found.detail} (the group is written again, record by record)") from None

    def record_seqs(self, record_ids: Sequence[str]) -> dict[str, int]:
        self._flush()
        rows = self._run("SELECT record_id, seq FROM records WHERE record_id = ANY(%s)", (list(record_ids),)).fetchall()
        return {str(r[0]): int(r[1]) for r in rows}

    def add_evidence(self, rows: Sequence[EvidenceEntry], members: Sequence[tuple[int, int, int]]) -> None:
        self._evidence_rows.extend(rows)
        self._members.extend(members)
        if len(self._evidence_rows) + len(self._members) >= _FLUSH_AT:
            self._flush()
        if rows:
            self._evidence = (rows[-1].eid, rows[-1].row_hash)

    # ------------------------------------------------------------------ the end

    def finish(self) -> None:
        """Send what is buffered and record the heads of the chains written
        (everything but the COMMIT)."""
        self._flush()
        if self._added and self._records is not None:
            self._run("UPDATE heads SET position = %s, row_hash = %s WHERE chain = 'records'", self._records)
        if self._evidence is not None:
            self._run("UPDATE heads SET position = %s, row_hash = %s WHERE chain = 'evidence'", self._evidence)

    def commit(self) -> None:
        """Everything, then COMMIT (durable on return: ``synchronous_commit``).

        Raises:
            DuplicateRow: ``"seq"``: a duplicate was met (written again unit by unit).
            LedgerUnavailableError: the server went away; nothing is acknowledged.
            LedgerError: the server refused the transaction.
        """
        self.finish()
        durable = self._link.synchronous != "NORMAL"
        # the head lock goes with the COMMIT; the flush is waited for after it
        ran = self._end("SET LOCAL synchronous_commit = off; COMMIT" if durable else "COMMIT",
                        "the COMMIT", "nothing was written")
        self._link.careful = False
        if ran and durable:  # (a lost COMMIT found committed: that check waited for the flush already)
            self._end(_WAIT_FOR_FLUSH, "the rows were on disk", "they are not stored")

    def _end(self, sql: str, before: str, lost: str) -> bool:
        """Run a statement that ends the write: the COMMIT, or the wait for the
        WAL flush covering a COMMIT that did not wait for it.

        Args:
            sql: the statement.
            before: what the server going away came before, for the error.
            lost: what that means for the rows, for the error.

        Returns:
            True once it ran; False when the connection was lost and the rows
            were found committed and flushed after all.

        Raises:
            LedgerUnavailableError: the server went away and the rows are not
                known to be there and flushed: they are not acknowledged.
            LedgerError: the server refused the statement.
        """
        try:
            self._conn.execute(sql)
            return True
        except psycopg_module().Error as exc:
            if not is_lost(exc, self._conn):
                raise self._failed(exc) from None
            self._link.drop()
            if not self._committed_after_all(exc):
                raise LedgerUnavailableError(f"{self._what} {self._url.name} failed: the server went away before "
                                             f"{before} ({reason(exc, self._url)}); {lost}",
                                             hint="The ledger reconnects on its next call.") from None
            return False

    def _committed_after_all(self, lost: BaseException) -> bool:
        """After a connection lost during COMMIT: whether the transaction was
        committed. Reconnects (for up to the lock timeout), waits for the head
        lock (a transaction still running on the server holds it) and looks
        for the last row this one wrote."""
        deadline = time.monotonic() + max(2.0, self._link.lock_timeout)
        while True:
            try:
                conn = self._link.get()
                break
            except LedgerError:
                if time.monotonic() >= deadline:
                    raise LedgerUnavailableError(
                        f"{self._what} {self._url.name}: the connection was lost during COMMIT "
                        f"({reason(lost, self._url)}) and the server cannot be reached again: the rows may or may "
                        "not be stored; they are NOT acknowledged (`capseal verify` shows what is there)") from None
                time.sleep(0.2)
        chains = [k for k, done in (("records", self._added), ("evidence", self._evidence is not None)) if done]
        try:
            with conn.transaction():
                conn.execute("SELECT 1 FROM heads WHERE chain = ANY(%s) FOR UPDATE", (chains,))
                found = False
                if self._added and self._last_record is not None:
                    found = conn.execute("SELECT 1 FROM records WHERE record_id = %s",
                                         (self._last_record,)).fetchone() is not None
                elif self._evidence is not None:
                    found = conn.execute("SELECT 1 FROM evidence WHERE eid = %s AND row_hash = %s",
                                         self._evidence).fetchone() is not None
            if found and self._link.synchronous != "NORMAL":
                conn.execute(_WAIT_FOR_FLUSH)  # it may be committed and not yet on disk
            return found
        except psycopg_module().Error as exc:
            self._link.drop()
            raise LedgerUnavailableError(f"{self._what} {self._url.name}: the connection was lost during COMMIT and "
                                         f"again while looking for its rows ({reason(exc, self._url)}): they may or "
                                         "may not be stored; they are NOT acknowledged") from None

    def rollback(self) -> None:
        """Undo everything (a connection the server dropped undid it already)."""
        conn = self._conn
        if self._outer or conn is None or conn.closed or conn.broken:
            return
        try:
            conn.execute("ROLLBACK")
        except Exception:  # noqa: BLE001 - the server ends a transaction whose connection fails
            self._link.drop()


def _duplicate(exc: Any, index: int, url: DatabaseURL) -> DuplicateRow:
    constraint = getattr(getattr(exc, "diag", None), "constraint_name", None) or ""
    column = _COLUMN_OF.get(constraint, "eid" if constraint.startswith("evidence") else "record_id")
    return DuplicateRow(column, index, reason(exc, url))
