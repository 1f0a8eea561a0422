"""Opening a ledger file: the schema, the format check, WAL mode.

A file that is neither a capseal ledger nor empty (another application's
database, not SQLite at all) is refused with NotALedgerError before anything
is written to it; a ledger of another format with LedgerFormatError. A new
file gets the schema and its format row in one transaction, so a reader sees
all of it or nothing.

The layout (``meta`` key ``layout``): which indexes keep the refusals and
lookups. Layout 2 keys every action id in one index (:data:`._columns.ACTION_KEY`),
so a one-record commit touches the row's page, its record-id entry and its
action-id entry, and the ``meta`` head's page. A file of the first layout
(no ``layout`` row: a capsule's action id indexed twice, once from its body
and once from its column) is brought to layout 2 by its first write-open, in
one transaction under the write lock; its table keeps the column's own
unique index (dropping it would copy the whole table). Read-only, it is read
as it is.
"""

from __future__ import annotations

import os
import sqlite3
import time
import urllib.parse
from pathlib import Path

from ..errors import LedgerBusyError, LedgerCorruptError, LedgerError, LedgerFormatError, NotALedgerError
from . import _columns
from ._format import LEDGER_FORMAT

__all__ = ["SCHEMA", "LAYOUT", "connect", "layout_of", "readonly_uri", "is_busy"]

#: the layout this capseal writes (see the module)
LAYOUT = "2"

_TABLES = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS records (
    seq INTEGER PRIMARY KEY,
    record_id TEXT NOT NULL UNIQUE,
    record_type TEXT NOT NULL,
    epistemic_type TEXT NOT NULL,
    links TEXT NOT NULL,
    nonce TEXT NOT NULL,
    action_id TEXT,  -- unique through records_action_id_key (with a capsule's, read from its body)
    stream TEXT,
    tag TEXT,
    body BLOB NOT NULL,
    prev_hash TEXT NOT NULL,
    row_hash TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS records_tag ON records(tag, stream, seq) WHERE tag IS NOT NULL;
-- a slot row (one record's state: record_seq/record_id set) or a batch row
-- (one quote for many records: both NULL, the records are in the body)
CREATE TABLE IF NOT EXISTS evidence (
    eid INTEGER PRIMARY KEY,
    record_seq INTEGER REFERENCES records(seq),
    record_id TEXT,
    body BLOB NOT NULL,
    prev_hash TEXT NOT NULL,
    row_hash TEXT NOT NULL,
    CHECK ((record_seq IS NULL) = (record_id IS NULL))
);
-- which evidence rows hold a state of which record (leaf_index -1: a slot
-- row). An index only: check_chain rebuilds it from the hash-chained rows.
-- Keyed by the record's seq, not its id: a batch covers recent records, so
-- its rows land at the right edge of the B-tree (random capsule ids would
-- touch a page per row).
CREATE TABLE IF NOT EXISTS evidence_members (
    record_seq INTEGER NOT NULL,  -- no REFERENCES: a foreign-key probe per row costs more than the row;
    eid INTEGER NOT NULL,         -- the writer looked the records up already, check_chain re-checks all
    leaf_index INTEGER NOT NULL,
    PRIMARY KEY (record_seq, eid)
) WITHOUT ROWID;
CREATE TRIGGER IF NOT EXISTS records_no_update BEFORE UPDATE ON records
    BEGIN SELECT RAISE(ABORT, 'capseal ledger is append-only'); END;
CREATE TRIGGER IF NOT EXISTS records_no_delete BEFORE DELETE ON records
    BEGIN SELECT RAISE(ABORT, 'capseal ledger is append-only'); END;
CREATE TRIGGER IF NOT EXISTS evidence_no_update BEFORE UPDATE ON evidence
    BEGIN SELECT RAISE(ABORT, 'capseal ledger is append-only'); END;
CREATE TRIGGER IF NOT EXISTS evidence_no_delete BEFORE DELETE ON evidence
    BEGIN SELECT RAISE(ABORT, 'capseal ledger is append-only'); END;
CREATE TRIGGER IF NOT EXISTS evidence_members_no_update BEFORE UPDATE ON evidence_members
    BEGIN SELECT RAISE(ABORT, 'capseal ledger is append-only'); END;
CREATE TRIGGER IF NOT EXISTS evidence_members_no_delete BEFORE DELETE ON evidence_members
    BEGIN SELECT RAISE(ABORT, 'capseal ledger is append-only'); END;
"""
#: a ledger of this layout: its tables, triggers and indexes (each IF NOT EXISTS: run on an
#: existing file, it puts back only what is missing)
SCHEMA = _TABLES + _columns.INDEXES
# a file of the first layout brought to this one (whole, or not at all: in one transaction);
# IF EXISTS / IF NOT EXISTS and OR REPLACE, so that two processes doing it in turn do it once
_MIGRATE = (f"BEGIN IMMEDIATE;{SCHEMA}DROP INDEX IF EXISTS records_capsule_action_id;"
            f"INSERT OR REPLACE INTO meta(key, value) VALUES ('layout', '{LAYOUT}');COMMIT;")

# SQLITE_BUSY, SQLITE_LOCKED, SQLITE_PROTOCOL (sqlite3.h primary result codes; the
# last when WAL lock retries run out, e.g. while another process recovers the WAL)
_BUSY_CODES = (5, 6, 15)


def is_busy(exc: BaseException) -> bool:
    """One of ``_BUSY_CODES`` (any extended code): another connection's lock, not damage."""
    return (getattr(exc, "sqlite_errorcode", 0) & 0xFF) in _BUSY_CODES


def readonly_uri(path: str) -> str:
    """The SQLite URI that opens ``path`` read-only. Quoted: a '#', '?' or '%'
    in a path is no URI syntax.

    Why ``immutable=1`` sometimes: reading a WAL-mode file needs its ``-shm``
    beside it, which SQLite creates if missing; in a directory this user
    cannot write (an auditor verifying another user's ledger) that fails,
    though the file itself is readable. A missing ``-shm`` (and ``-wal``)
    means no connection has the ledger open and everything is in the main
    file, so it is then read as an immutable file (no locks, no ``-shm``)."""
    uri = f"file:{urllib.parse.quote(path)}?mode=ro"
    directory = os.path.dirname(path) or "."
    if not os.access(directory, os.W_OK) and not any(os.path.lexists(path + s) for s in ("-wal", "-shm")):
        uri += "&immutable=1"
    return uri


def connect(path: Path, *, readonly: bool, synchronous: str, lock_timeout: float, lenient: bool) -> sqlite3.Connection:
    """A checked connection to the ledger file at ``path`` (made a ledger if new and not read-only).

    Args:
        path: the file.
        readonly: open it for reading only (it must hold a ledger).
        synchronous: SQLite's ``synchronous`` setting for writes.
        lock_timeout: seconds to wait for another process's lock.
        lenient: read on past damage (a file shorter than its header says).

    Returns:
        The connection (autocommit mode: transactions are begun explicitly).

    Raises:
        LedgerError: no file can be opened there (a missing directory, ':memory:').
        NotALedgerError, LedgerFormatError, LedgerCorruptError, LedgerBusyError:
            the file is another's, of another format, damaged, or locked too long.
    """
    if str(path) == ":memory:":
        # SQLite's name for a database that is gone when closed: nothing
        # sealed there would be durable
        raise LedgerError("a ledger is a file: ':memory:' would keep nothing once closed; give a file path "
                          "(a temporary directory's, for a throwaway ledger)")
    if readonly and not path.exists():
        raise LedgerError(f"no ledger at {path}")
    try:
        if readonly:
            db = sqlite3.connect(readonly_uri(str(path)), uri=True, isolation_level=None,
                                 check_same_thread=False, timeout=lock_timeout)
        else:
            db = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False, timeout=lock_timeout)
    except sqlite3.Error as exc:  # a missing directory, a directory, no permission: the path, not sqlite3
        raise LedgerError(f"cannot open a ledger at {path} ({exc})",
                          hint="The ledger's directory must exist and be writable, and the path must "
                               "name a file, not a directory.") from None
    try:
        if lenient:  # an audit reads on past damage: a file shorter than its header says is still read
            db.execute("PRAGMA writable_schema=ON")
        _check_and_prepare(db, path, readonly=readonly, synchronous=synchronous, lock_timeout=lock_timeout)
    except sqlite3.DatabaseError as exc:
        db.close()
        raise _open_failure(exc, path, lock_timeout) from None
    except LedgerError:
        db.close()
        raise
    return db


def _check_and_prepare(db: sqlite3.Connection, path: Path, *, readonly: bool, synchronous: str,
                       lock_timeout: float) -> None:
    # the objects first, then the format: a creator writes its schema and format row in one
    # transaction, so objects without a format row are another application's
    objects = _schema_objects(db)
    found = _format_of(db)
    if objects and found is None:
        raise NotALedgerError(
            f"{path} is not a capseal ledger: it is an SQLite database of something else (it holds "
            f"{', '.join(objects)}); nothing was written to it",
            hint="Give capseal a new file, an empty one, or a capseal ledger.")
    if found is not None and found != LEDGER_FORMAT:  # refused before the schema below touches it
        raise LedgerFormatError(f"{path} is a {found} ledger; this capseal reads {LEDGER_FORMAT} "
                                "(export it with the capseal that wrote it, then import the export)")
    layout = layout_of(db) if found is not None else LAYOUT
    if layout not in ("1", LAYOUT):
        raise LedgerFormatError(f"{path} is a {found} ledger of layout {layout!r}, which a later capseal wrote; "
                                f"this capseal knows layouts 1 and {LAYOUT} (export it with the capseal that wrote "
                                "it, then import the export)")
    if readonly and not objects:
        raise LedgerError(f"{path} holds no ledger yet (an empty file: one being created?)")
    if readonly:
        return
    _use_wal(db, time.monotonic() + lock_timeout)
    db.execute(f"PRAGMA synchronous={synchronous}")
    db.execute("PRAGMA foreign_keys=ON")
    if found is None:  # the schema and the format row in ONE transaction: a reader sees all or nothing
        db.executescript("BEGIN IMMEDIATE;" + SCHEMA +
                         f"INSERT OR IGNORE INTO meta(key, value) VALUES ('format', '{LEDGER_FORMAT}');"
                         f"INSERT OR IGNORE INTO meta(key, value) VALUES ('ledger_id', '{os.urandom(16).hex()}');"
                         f"INSERT OR IGNORE INTO meta(key, value) VALUES ('layout', '{LAYOUT}');"
                         "COMMIT;")
        # into the main file now: a -wal lost later still leaves the ledger's id, so its
        # head file can tell what was lost (a busy checkpoint does nothing, and is harmless)
        db.execute("PRAGMA wal_checkpoint(PASSIVE)")
    elif layout != LAYOUT or _has_object(db, "records_capsule_action_id"):
        # the first layout (or an index of it, put back by an earlier capseal appending since)
        db.executescript(_MIGRATE)
    else:  # IF NOT EXISTS: writes nothing, unless an index or append-only trigger is missing
        db.executescript(SCHEMA)


def _open_failure(exc: sqlite3.DatabaseError, path: Path, lock_timeout: float) -> LedgerError:
    """The typed error for an SQLite error met while opening the file."""
    if is_busy(exc):
        return LedgerBusyError(
            f"{path} stayed locked by another connection for {lock_timeout:g} s ({exc}); "
            "nothing was opened or written: retry once the other process is done with it")
    if _sqlite_code(exc) == 26 or "file is not a database" in str(exc):  # SQLITE_NOTADB
        return NotALedgerError(f"{path} is not a capseal ledger: not an SQLite database, or its header "
                               f"is damaged ({exc}); nothing was written to it")
    if "no such function" in str(exc):
        return LedgerError(f"{path}: this Python's SQLite {sqlite3.sqlite_version} lacks the JSON functions "
                           f"a capseal ledger's indexes use ({exc}); SQLite 3.38 or later has them built in")
    if isinstance(exc, sqlite3.IntegrityError):  # building the action-id index of an older file
        return LedgerCorruptError(f"{path} is damaged: two of its capsules carry one action_id ({exc}); "
                                  "nothing was written: `capseal verify` names them")
    return LedgerCorruptError(f"{path} is damaged ({exc})")


def _schema_objects(db: sqlite3.Connection) -> list[str]:
    """The names of (up to five of) the tables, indexes, views and triggers in the file."""
    return [str(r[0]) for r in db.execute("SELECT name FROM sqlite_master LIMIT 5").fetchall()]


def _has_object(db: sqlite3.Connection, name: str) -> bool:
    """Whether the file's schema holds a table, index or trigger of this name."""
    return db.execute("SELECT 1 FROM sqlite_master WHERE name = ?", (name,)).fetchone() is not None


def layout_of(db: sqlite3.Connection) -> str:
    """The layout of a ledger file (see the module): its ``meta`` row, "1" for a file without one.

    Args:
        db: a connection to the file (it holds a ledger).

    Returns:
        The layout, as recorded.
    """
    row = db.execute("SELECT value FROM meta WHERE key='layout'").fetchone()
    return "1" if row is None else str(row[0])


def _sqlite_code(exc: sqlite3.Error) -> int:
    """SQLite's primary result code of ``exc`` (0 where this Python does not say)."""
    return int(getattr(exc, "sqlite_errorcode", 0)) & 0xFF


def _format_of(db: sqlite3.Connection) -> str | None:
    """The ``meta`` format of an existing ledger file, None for a new file."""
    try:
        row = db.execute("SELECT value FROM meta WHERE key='format'").fetchone()
    except sqlite3.OperationalError as exc:
        if is_busy(exc):  # a lock says nothing about the file: not "a new file"
            raise
        return None  # no meta table yet
    return None if row is None else str(row[0])


def _use_wal(db: sqlite3.Connection, deadline: float) -> None:
    """Put the file in WAL mode, which it keeps. Why a retry loop beside the
    busy timeout: two processes creating one ledger at once both hold a shared
    lock on the new (rollback-mode) file when they ask for the exclusive lock
    the switch needs; SQLite then answers one of them SQLITE_BUSY at once,
    without calling its busy handler (waiting would deadlock). Once the other
    has switched the file, the first read here sees WAL and changes nothing."""
    pause = 0.001
    while True:
        try:
            if str(db.execute("PRAGMA journal_mode").fetchone()[0]).lower() == "wal":
                return
            mode = str(db.execute("PRAGMA journal_mode=WAL").fetchone()[0]).lower()
        except sqlite3.OperationalError as exc:
            if not is_busy(exc) or time.monotonic() + pause > deadline:
                raise
            time.sleep(pause)
            pause = min(pause * 2, 0.05)
            continue
        if mode != "wal":
            raise LedgerError(f"SQLite kept the journal mode {mode!r} instead of WAL")
        return
