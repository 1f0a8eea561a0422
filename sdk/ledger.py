"""The durable, append-only ledger (SQLite in WAL mode, standard library only).

What it promises:
  * **append-only**: triggers refuse UPDATE and DELETE; every row is hash-chained
    to the one before it, so an edit of a row's header or body made behind
    SQLite's back is detectable;
  * **a head it knows**: each chain's head (last seq or eid, and row hash) is
    kept in ``meta`` by the transaction that appends, and in a side file
    ``<ledger>-head`` after each commit (:mod:`._ledger_head`). Rows deleted
    from the end, a file cut short, and a ``-wal`` lost before it was
    checkpointed are found by ``verify_ledger``, and the next append is
    refused (LedgerCorruptError, nothing written) rather than cover the loss
    up. What no head kept beside the file shows: a deletion made together
    with a rewrite of both heads, a chain rebuilt with its heads, or a lost
    ``-wal`` whose side file went with it (the main file copied alone):
    those need a signed head kept elsewhere (e.g. a transparency receipt);
  * **lookups read the hashed body**: the ``action_id``, ``stream`` and
    ``tag`` columns are outside the row hash, so a capsule's action id, and
    the epoch boundaries of an operator and developer, are indexed from its
    body instead: an edit of those columns misleads no refusal, ``verify_ledger``
    reports it, and an import refuses it. (For other record types the
    ``action_id`` column is what the writer gave);
  * **damage is reported, never raised or passed**: ``check_chain`` and
    ``entries(damaged=…)`` read on past rows SQLite cannot read and columns of
    another type, each named; ``verify_ledger`` also runs SQLite's integrity
    check. Appends trust SQLite's indexes: a record-id index damaged so that
    it misses a record lets that record in again (a capsule is still refused
    by its action id), which ``check_chain`` and the integrity check report;
  * **its own files only**: a file that is neither a capseal ledger nor empty
    (another application's database, not SQLite at all) is refused with
    NotALedgerError before anything is written to it;
  * **durable on acknowledgement**: ``append`` returns only after the COMMIT that
    holds the row has been fsynced (WAL, ``synchronous=FULL``). A process killed
    with SIGKILL loses nothing it acknowledged and leaves no torn row;
  * **group commit**: concurrent writers (threads) share one transaction and
    one fsync (the head goes in that transaction; the side file is one write
    after it). The first waiting thread leads and commits everything queued;
    a lone writer pays no thread hand-off;
  * **one record per id**: ``record_id`` (the capsule id) and a capsule's
    ``action_id`` are unique; a duplicate is refused with DuplicateRecordError
    and does not disturb the other records of its group;
  * **a store header per record** (EL -00 §4): seq, record_id, record_type,
    epistemic_type, links and 128 bits of fresh randomness (``nonce``);
  * **evidence beside records**: hardware evidence is appended to its own
    hash-chained table, so the slot's earlier ``null`` state stays visible in
    history. A quote over a batch's Merkle root is stored ONCE (the shared
    quote members, the root and the batch's record ids in leaf order), with a
    small index row per record; each record's slot, inclusion proof included,
    is rebuilt from it on read (RFC 9162, :mod:`capseal.merkle`). Why: a slot
    is ~2.5 KB, almost all of it the same for every record of a batch, and
    writing it once per record cost the sealing path ~10 % of its throughput.

Export to JSON Lines and import back are byte-identical (``export_jsonl`` of an
imported ledger equals the file it was imported from). The format stays
``capseal-ledger/2``: the body-read indexes are added to an older file on its
first write-open, and a capseal without them reads and appends to it as before.

A Ledger belongs to the process that opened it. In a process forked from that
one without exec, every operation raises LedgerForkedError before it touches
SQLite or the queue, ``close()`` only marks that copy closed, and a new Ledger
opened there works normally, on the same file too (:mod:`._ledger_fork` says
what that takes).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import sqlite3
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from . import _ledger_columns, _ledger_fork, _ledger_head, _ledger_scan, merkle
from ._ledger_columns import row_columns
from .arguments import count, seconds
from .arguments import timeout as timeout_arg
from .canonical import hex_bytes, is_hex64
from .errors import (
    DuplicateRecordError,
    InputError,
    LedgerBusyError,
    LedgerClosedError,
    LedgerCorruptError,
    LedgerError,
    LedgerForkedError,
    LedgerFormatError,
    MalformedJSONError,
    NotALedgerError,
)
from .record import SealedRecord, dumps_canonical

__all__ = ["Ledger", "LedgerEntry", "StoredEntry", "EvidenceEntry", "LEDGER_FORMAT", "batch_root", "batch_slot", "row_columns"]

LEDGER_FORMAT = "capseal-ledger/2"
_GENESIS = bytes(32)
# the row-hash domain: unchanged since capseal-ledger/1, so a /1 export
# (records and slot rows are hashed the same way) imports into a /2 ledger
_DOMAIN = b"capseal-ledger/1\x00"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS records (
    seq INTEGER PRIMARY KEY,
    record_id TEXT NOT NULL UNIQUE,
    record_type TEXT NOT NULL,
    epistemic_type TEXT NOT NULL,
    links TEXT NOT NULL,
    nonce TEXT NOT NULL,
    action_id TEXT UNIQUE,
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
    record_seq INTEGER NOT NULL,  -- no REFERENCES: a foreign-key probe per row cost more than the row;
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
""" + _ledger_columns.INDEXES  # a capsule's lookups, read from its hashed body


@dataclass(frozen=True)
class LedgerEntry:
    """What a writer hands the ledger. ``body`` is canonical JSON bytes.

    ``action_id``, ``stream`` and ``tag`` are stored as given, outside the row
    hash; for a capsule (``record_type`` "capsule") they are what its body
    gives (a verifier and an import check that), and the ledger's lookups
    read the body, not them."""

    record_id: str
    record_type: str
    epistemic_type: str
    body: bytes
    links: tuple[dict[str, str], ...] = ()
    action_id: str | None = None
    stream: str | None = None
    tag: str | None = None


@dataclass(frozen=True)
class StoredEntry:
    """A row as stored: the store header, the body and the hash chain.

    ``damage`` (set only by a reading that goes on past damage, see
    :meth:`Ledger.entries`) says why the row is not one capseal writes (a
    column edited at the SQL level to another type); such a row's other
    members are placeholders (text members "", an empty body)."""

    seq: int
    record_id: str
    record_type: str
    epistemic_type: str
    links: tuple[dict[str, str], ...]
    nonce: str
    body: bytes
    prev_hash: str
    row_hash: str
    action_id: str | None = None
    stream: str | None = None
    tag: str | None = None
    damage: str | None = field(default=None, compare=False)

    def header(self) -> dict[str, Any]:
        """The EL -00 §4 store header of this record."""
        return {
            "seq": self.seq,
            "record_id": self.record_id,
            "record_type": self.record_type,
            "epistemic_type": self.epistemic_type,
            "links": [dict(link) for link in self.links],
            "nonce": self.nonce,
        }

    def record(self) -> dict[str, Any]:
        return json.loads(self.body)


@dataclass(frozen=True)
class EvidenceEntry:
    """An evidence row: one record's slot state (``record_id`` set), or a
    quoted batch (``record_id`` None; :meth:`slots` gives every record's).

    ``damage`` says why a row read from the file is not one capseal writes
    (a member edited at the SQL level to another type: an integer or text
    body, a blob record id); such a row's other members are placeholders,
    and :meth:`evidence` and :meth:`slots` raise LedgerCorruptError."""

    eid: int
    record_seq: int | None
    record_id: str | None
    body: bytes
    prev_hash: str
    row_hash: str
    damage: str | None = field(default=None, compare=False)

    @property
    def is_batch(self) -> bool:
        return self.record_id is None

    def header(self) -> dict[str, Any]:
        if self.record_id is None:
            return _batch_header(self.eid)
        assert self.record_seq is not None
        return _evidence_header(self.record_seq, self.record_id, self.eid)

    def evidence(self) -> dict[str, Any] | None:
        """A slot row's state (None: the slot was emptied again)."""
        self._refuse_damaged()
        if self.record_id is None:
            raise ValueError(f"evidence {self.eid} is a batch; its slots are in slots()")
        return _slot_state(self.body)

    def slots(self) -> list[tuple[str, dict[str, Any] | None]]:
        """``(record_id, slot)`` for every record this row gives a state."""
        self._refuse_damaged()
        if self.record_id is not None:
            return [(self.record_id, self.evidence())]
        batch = _Batch.parse(self.body)
        return [(rid, batch.slot(i)) for i, rid in enumerate(batch.leaves)]

    def _refuse_damaged(self) -> None:
        if self.damage is not None:
            raise LedgerCorruptError(f"evidence {self.eid} is damaged ({self.damage})")


def _sql_kind(value: Any) -> str:
    """The SQLite storage class of a value read back, for a message."""
    return {int: "an integer", float: "a real", str: "text", bytes: "a blob"}.get(type(value), "NULL")


def _stored_blob(value: Any, what: str) -> bytes:
    """A body as stored (a record's or an evidence row's): a blob, as capseal writes it. Anything else
    is an edit at the SQL level (LedgerCorruptError), never converted: an
    integer N would become N zero bytes (gigabytes for a large N), text its
    encoding, and neither is what was written."""
    if type(value) is not bytes:
        raise LedgerCorruptError(f"{what} is damaged (its body is stored as {_sql_kind(value)}, not a blob)")
    return value


def _record_damage(row: Sequence[Any]) -> str | None:
    """Why a record row read from the file is not one capseal writes (a
    member edited at the SQL level to another type), or None."""
    body = row[9]
    if type(body) is not bytes:
        return f"its body is stored as {_sql_kind(body)}, not a blob"
    text = ("record_id", 1), ("record_type", 2), ("epistemic_type", 3), ("nonce", 5), ("prev_hash", 10), ("row_hash", 11)
    bad = [f"{name} ({_sql_kind(row[i])})" for name, i in text if type(row[i]) is not str]
    bad += [f"{name} ({_sql_kind(row[i])})" for name, i in (("action_id", 6), ("stream", 7), ("tag", 8))
            if row[i] is not None and type(row[i]) is not str]
    return f"not stored as text: {', '.join(bad)}" if bad else None


def _evidence_entry(row: Sequence[Any]) -> EvidenceEntry:
    """An evidence row as read; a row whose members are not of the types
    capseal writes comes back with ``damage`` set, so one edited row fails
    on its own instead of stopping every reader of the file."""
    eid, seq, rid, body, prev, row_hash = row
    damage = None
    if type(body) is not bytes:
        damage = f"its body is stored as {_sql_kind(body)}, not a blob"
    elif not (seq is None and rid is None or type(seq) is int and type(rid) is str):
        damage = f"its record_seq and record_id are {_sql_kind(seq)} and {_sql_kind(rid)}, not an integer and text"
    elif type(prev) is not str or type(row_hash) is not str:
        damage = f"its prev_hash and row_hash are {_sql_kind(prev)} and {_sql_kind(row_hash)}, not text"
    if damage is None:
        return EvidenceEntry(eid, seq, rid, body, prev, row_hash)
    slot = type(seq) is int and type(rid) is str  # else neither is kept (placeholders: both None)
    return EvidenceEntry(eid, seq if slot else None, rid if slot else None, b"",
                         prev if type(prev) is str else "", row_hash if type(row_hash) is str else "", damage)


def _readonly_uri(path: str) -> str:
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


def _slot_state(body: bytes) -> dict[str, Any] | None:
    """A slot row's state: a filled object, or None (emptied again);
    LedgerCorruptError if the stored bytes are neither."""
    try:
        value = json.loads(body)
    except (ValueError, RecursionError) as exc:
        raise LedgerCorruptError(f"an evidence row is damaged (not JSON: {exc})") from None
    if value and not isinstance(value, dict):
        raise LedgerCorruptError("an evidence row is damaged (its slot is not an object)")
    return value or None


def batch_slot(
    shared: Mapping[str, Any], merkle_root: bytes, leaf_index: int, tree_size: int, proof: Sequence[bytes]
) -> dict[str, Any]:
    """The slot of the record at ``leaf_index`` of a quoted Merkle root (design
    §4): the batch's shared quote members plus this record's binding."""
    out = dict(shared)
    out["binding"] = {
        "merkle_root": merkle_root.hex(),
        "leaf_index": leaf_index,
        "tree_size": tree_size,
        "inclusion_proof": [p.hex() for p in proof],
    }
    return out


class _Batch:
    """A stored batch row's body: ``{"leaves": [capsule ids in leaf order],
    "merkle_root": hex, "shared": {quote members common to every slot}}``."""

    __slots__ = ("leaves", "root", "shared", "_proofs")

    def __init__(self, leaves: list[str], root: bytes, shared: dict[str, Any]) -> None:
        self.leaves, self.root, self.shared = leaves, root, shared
        self._proofs: tuple[tuple[bytes, ...], ...] | None = None

    @staticmethod
    def raw_leaves(record_ids: Sequence[str]) -> list[bytes]:
        """The raw leaves of a non-empty list of distinct capsule ids, or ValueError."""
        if not record_ids:
            raise ValueError("a batch names one or more records")
        if len(set(record_ids)) != len(record_ids):
            raise ValueError("a batch names each record once")
        try:
            leaves = [bytes.fromhex(rid) for rid in record_ids]
        except (TypeError, ValueError):
            raise ValueError("a batch's records are named by their hex capsule ids") from None
        if any(len(leaf) != 32 or rid != leaf.hex() for rid, leaf in zip(record_ids, leaves)):
            raise ValueError("a batch's records are named by their 64-hex-digit lowercase capsule ids")
        return leaves

    @staticmethod
    def check(record_ids: Sequence[str], merkle_root: bytes, shared: Any) -> None:
        """Refuse (ValueError) a batch that is not a non-empty list of distinct
        capsule ids whose RFC 9162 root is ``merkle_root``, with filled shared
        members that leave ``binding`` to each record."""
        if not isinstance(shared, Mapping) or not shared or "binding" in shared:
            raise ValueError("a batch's shared quote members are a filled object without 'binding'")
        last = _last_root
        if last is not None and last[1] == merkle_root and last[0] == tuple(record_ids):
            return  # these very ids were checked and hashed by batch_root()
        if merkle.root_and_path(_Batch.raw_leaves(record_ids))[0] != merkle_root:
            raise ValueError("the batch's records do not hash to its merkle_root (RFC 9162)")


    @classmethod
    def parse(cls, body: bytes) -> _Batch:
        """A stored batch body; LedgerCorruptError if it is not one (the file
        was edited: the writer checks every batch it stores)."""
        try:
            data = json.loads(body)
            leaves, shared = data["leaves"], data["shared"]
            if not isinstance(leaves, list) or not isinstance(shared, dict):
                raise ValueError("leaves must be an array and shared an object")
            _Batch.raw_leaves(leaves)
            root = hex_bytes(data["merkle_root"])  # digits only, as every hex capseal reads
            if root is None or len(root) != 32:
                raise ValueError("merkle_root is not 32 bytes in hex")
            return cls(leaves, root, shared)
        except (ValueError, KeyError, TypeError, RecursionError) as exc:
            raise LedgerCorruptError(f"an evidence batch row is damaged ({type(exc).__name__}: {exc})") from None

    def slot(self, leaf_index: int) -> dict[str, Any]:
        if type(leaf_index) is not int:  # an index row edited to text or a real: read from the file, never converted
            raise LedgerCorruptError(f"an evidence index row names leaf {str(leaf_index)[:40]!r} "
                                     f"({_sql_kind(leaf_index)}, not an integer)")
        if not 0 <= leaf_index < len(self.leaves):
            raise LedgerCorruptError(f"an evidence index row names leaf {leaf_index} of a batch of {len(self.leaves)}")
        if self._proofs is None:  # every proof at once: O(n log n), once per batch
            self._proofs = merkle.build([bytes.fromhex(rid) for rid in self.leaves]).proofs
        return batch_slot(self.shared, self.root, leaf_index, len(self.leaves), self._proofs[leaf_index])

    def drop_proofs(self) -> None:
        """Forget the built proofs (memory); slot() builds them again if asked."""
        self._proofs = None


# the ids and root of the latest batch_root() call: add_evidence_batch() then
# checks that batch without hashing it a second time (one tuple comparison)
_last_root: tuple[tuple[str, ...], bytes] | None = None


def batch_root(record_ids: Sequence[str]) -> tuple[bytes, tuple[bytes, ...]]:
    """The RFC 9162 root of a batch of capsule ids (in leaf order) and the
    first id's audit path: what a batch writer quotes and checks the quote
    with. Refuses (ValueError) ids that are not distinct lowercase capsule
    ids. :meth:`Ledger.add_evidence_batch` of the same ids and root reuses this
    hashing instead of repeating it."""
    global _last_root
    ids = tuple(record_ids)
    root, path = merkle.root_and_path(_Batch.raw_leaves(ids), 0)
    _last_root = (ids, root)
    return root, path


def _links(raw: Any) -> tuple[dict[str, str], ...]:
    """A row's links column. One that is not a JSON array of objects (edited
    behind SQLite's back) is kept as an unreadable marker, so that row's hash
    fails in check_chain, instead of making every other row unreadable too."""
    try:
        links = json.loads(raw)
        if isinstance(links, list) and all(isinstance(x, dict) for x in links):
            return tuple(links)
    except (ValueError, TypeError, RecursionError):
        pass
    return ({"unreadable": str(raw)[:64]},)


def _refused_with(p: PendingAppend) -> LedgerError | None:
    """Why ``p`` cannot be written, decided before its INSERT: the lead of its
    pair, or an append it needs (queued earlier, so decided already), was
    refused. None when nothing stands in its way."""
    for other, how in ((p.lead, "goes in with"), *((a, "needs") for a in p.after)):
        if other is not None and other.error is not None:
            return LedgerError(f"record {p.entry.record_id[:16]}… not written: it {how} "
                               f"{other.entry.record_id[:16]}…, which was refused ({other.error})")
    return None


_IMPORT_PREFIX = ".capseal-import-"
_IMPORT_GRACE = 10.0  # s: a temp file younger than this may belong to an import that has not locked it yet


def _sweep_abandoned_imports(directory: Path) -> None:
    """Delete what killed imports left in ``directory``: ``import_jsonl``
    builds under a hidden ``.capseal-import-*`` name, deleted when it ends;
    a kill (SIGKILL, power loss) skips that. An import holds an exclusive
    ``flock`` on its file while alive, so a file nobody locks is abandoned
    (and files younger than a few seconds are left alone: their import may
    not have taken its lock yet). Best effort: nothing here raises."""
    try:
        entries = [e for e in os.scandir(directory) if e.name.startswith(_IMPORT_PREFIX)]
    except OSError:
        return
    now = time.time()
    for entry in entries:
        with suppress(OSError):
            if now - entry.stat(follow_symlinks=False).st_mtime < _IMPORT_GRACE:
                continue
            if entry.name.endswith(("-wal", "-shm")):
                if not os.path.lexists(entry.path[:-4]):  # its import deletes the main file first
                    os.unlink(entry.path)
                continue
            fd = os.open(entry.path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # raises while its import is alive
                if os.fstat(fd).st_ino != os.stat(entry.path, follow_symlinks=False).st_ino:
                    continue
                for suffix in ("-wal", "-shm", ""):
                    with suppress(FileNotFoundError):
                        os.unlink(entry.path + suffix)
            finally:
                os.close(fd)


def _row_hash(prev_hex: str, header: dict[str, Any], body: bytes, extra: bytes = b"") -> str:
    h = hashlib.sha256(_DOMAIN)
    h.update(bytes.fromhex(prev_hex))
    h.update(hashlib.sha256(dumps_canonical(header)).digest())
    h.update(hashlib.sha256(body).digest())
    h.update(extra)
    return h.hexdigest()


def _evidence_header(record_seq: int, record_id: str, eid: int) -> dict[str, Any]:
    return {"eid": eid, "record_seq": record_seq, "record_id": record_id}


def _batch_header(eid: int) -> dict[str, Any]:
    return {"eid": eid, "kind": "batch"}


def _schema_objects(db: sqlite3.Connection) -> list[str]:
    """The names of (up to five of) the tables, indexes, views and triggers in the file."""
    return [str(r[0]) for r in db.execute("SELECT name FROM sqlite_master LIMIT 5").fetchall()]


def _sqlite_code(exc: sqlite3.Error) -> int:
    """SQLite's primary result code of ``exc`` (0 where this Python does not say)."""
    return int(getattr(exc, "sqlite_errorcode", 0)) & 0xFF


def _format_of(db: sqlite3.Connection) -> str | None:
    """The ``meta`` format of an existing ledger file, None for a new file."""
    try:
        row = db.execute("SELECT value FROM meta WHERE key='format'").fetchone()
    except sqlite3.OperationalError as exc:
        if _is_busy(exc):  # a lock says nothing about the file: not "a new file"
            raise
        return None  # no meta table yet
    return None if row is None else str(row[0])


# SQLITE_BUSY, SQLITE_LOCKED, SQLITE_PROTOCOL (sqlite3.h primary result codes; the
# last when WAL lock retries run out, e.g. while another process recovers the WAL)
_BUSY_CODES = (5, 6, 15)


def _is_busy(exc: sqlite3.Error) -> bool:
    """One of ``_BUSY_CODES`` (any extended code): another connection's lock, not damage."""
    return (getattr(exc, "sqlite_errorcode", 0) & 0xFF) in _BUSY_CODES


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
            if not _is_busy(exc) or time.monotonic() + pause > deadline:
                raise
            time.sleep(pause)
            pause = min(pause * 2, 0.05)
            continue
        if mode != "wal":
            raise LedgerError(f"SQLite kept the journal mode {mode!r} instead of WAL")
        return


def _insert_members(db: sqlite3.Connection, rows: Sequence[tuple[int, int, int]]) -> None:
    """Index rows ``(record_seq, eid, leaf_index)``, 300 per statement. Why
    not executemany: sqlite3 hands the GIL back around every statement step,
    and a row-by-row insert of a 1,000-record batch made 1,000 GIL hand-offs
    with the sealing thread, which showed up as the sealing thread's CPU."""
    for i in range(0, len(rows), 300):
        chunk = rows[i : i + 300]
        db.execute("INSERT INTO evidence_members(record_seq, eid, leaf_index) VALUES " + ",".join(["(?,?,?)"] * len(chunk)),
                   [v for row in chunk for v in row])


def _seqs_of(db: sqlite3.Connection, record_ids: Sequence[str]) -> dict[str, int]:
    """``record_id -> seq`` for those of ``record_ids`` the ledger holds."""
    seqs: dict[str, int] = {}
    for i in range(0, len(record_ids), 500):
        chunk = list(record_ids[i : i + 500])
        marks = ",".join("?" * len(chunk))
        seqs.update(db.execute(f"SELECT record_id, seq FROM records WHERE record_id IN ({marks})", chunk).fetchall())
    return seqs


_DOMAIN_HASH = hashlib.sha256(_DOMAIN)


def _evidence_row_hash(prev_hex: str, record_seq: int, record_id: str, eid: int, body: bytes) -> str:
    """``_row_hash(prev, _evidence_header(...), body)``, without building and
    serializing the header dict when the id needs no JSON escaping (a capsule
    id is hex): batch evidence writes one row per record."""
    if not (record_id.isascii() and record_id.isalnum()):
        return _row_hash(prev_hex, _evidence_header(record_seq, record_id, eid), body)
    sha = hashlib.sha256
    body_hash = sha()
    for i in range(0, len(body), 2000):  # pieces under 2048 bytes: hashlib keeps the GIL, so the
        body_hash.update(body[i : i + 2000])  # writer does not queue for it again after every row
    h = _DOMAIN_HASH.copy()
    h.update(bytes.fromhex(prev_hex)
             + sha(f'{{"eid":{int(eid)},"record_id":"{record_id}","record_seq":{int(record_seq)}}}'.encode()).digest()
             + body_hash.digest())
    return h.hexdigest()


class PendingAppend:
    """A record handed to the committer. ``result()`` returns the stored entry
    once its transaction is fsynced: that is the acknowledgement."""

    __slots__ = ("entry", "stored", "error", "done", "_ledger", "on_durable", "lead", "after")

    def __init__(self, entry: LedgerEntry, ledger: Ledger, on_durable: Callable[[StoredEntry], None] | None = None) -> None:
        self.entry = entry
        self.on_durable = on_durable
        self.stored: StoredEntry | None = None
        self.error: BaseException | None = None
        self.done = False
        self._ledger = ledger
        self.lead: PendingAppend | None = None  # submit_pair: the entry written with this one, or neither
        self.after: tuple[PendingAppend, ...] = ()  # entries queued before this one that must be written first

    def result(self, timeout: float | None = None) -> StoredEntry:
        self._ledger._wait([self], timeout)
        if self.error is not None:
            raise self.error
        assert self.stored is not None
        return self.stored


@dataclass
class _Stats:
    commits: int = 0
    records: int = 0
    largest_group: int = 0


class _StaleHead(Exception):
    """Our cached chain head is behind the file (another process appended)."""


class Ledger:
    """An append-only capseal ledger in one SQLite file.

    Thread-safe. Several processes may append to the same file (SQLite's write
    lock serializes them; each transaction reads the chain head under it),
    each through a Ledger it opened itself: one inherited through fork()
    refuses every call (LedgerForkedError).
    """

    # read on past damage (a file shorter than its header says, a damaged
    # schema): only the audit's read-only reader (capseal._ledger_audit) sets it
    _lenient_reads = False

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        readonly: bool = False,
        synchronous: str = "FULL",
        group_window: float = 0.008,
        group_max: int = 256,
        lock_timeout: float = 30.0,
    ) -> None:
        """``group_window`` (seconds) and ``group_max`` shape group commit for
        :meth:`submit`: the committer waits up to the window (or until
        ``group_max`` records are queued; default 8 ms) before one fsynced commit, since an
        fsync costs far more CPU than an insert. Synchronous :meth:`append`
        never waits for a window: its caller commits at once.
        ``lock_timeout`` (seconds) is how long opening or a commit waits for
        another process's lock on the file before LedgerBusyError."""
        self.path = Path(path)
        self.readonly = readonly
        self.group_window = seconds(group_window, "group_window")
        self.group_max = count(group_max, "group_max")
        self._lock_timeout = seconds(lock_timeout, "lock_timeout")
        if synchronous not in ("FULL", "NORMAL", "EXTRA"):
            raise InputError("synchronous must be FULL, EXTRA or NORMAL")
        self._mutex = threading.Lock()
        self._cond = threading.Condition(self._mutex)
        self._queue: list[PendingAppend] = []
        self._in_flight: list[PendingAppend] = []
        self._committer: threading.Thread | None = None
        self._head: tuple[int, str] | None = None
        self._write_lock = threading.Lock()  # one transaction at a time on self._db
        # evidence writers waiting for _write_lock: under a steady stream of
        # appends the committer would re-take the (non-FIFO) lock forever, so it
        # steps aside while one waits (see _side_write)
        self._side_writers = 0
        self._closing = False
        self._committing: int | None = None  # the thread inside _drain (it runs the callbacks)
        self._in_callbacks: int | None = None  # that thread, once its COMMIT/ROLLBACK is over (see _ledger_fork)
        self._closed = False
        self.stats = _Stats()
        self._read_lock = threading.Lock()
        self._snap = threading.local()  # a thread's snapshot connection (see snapshot)
        self._snaps: set[sqlite3.Connection] = set()  # every thread's open snapshot connection (a fork inherits them)
        self._batches: dict[int, _Batch] = {}  # recently read batch rows (see _state)
        self._commit_listeners: list[Callable[[list[StoredEntry]], object]] = []
        self._pid = os.getpid()  # the process that opened it (named in LedgerForkedError)
        self._forked = False  # set in a forked process (see _ledger_fork)
        # the file as SQLite resolves the path now (the current directory may change)
        self._real_path = os.path.realpath(self.path)
        self._side = _ledger_head.SideFile(self._real_path)  # written after each commit (see _ledger_head)
        self._ledger_id: str | None = None  # read with the chain head, before the first write
        _ledger_fork.before_opening(self._real_path)  # in a forked process: the parent's connections to it first
        try:
            with self._write_lock:  # a fork waits for the connections to be made (see _ledger_fork)
                _ledger_fork.register(self)
                try:
                    self._db = self._connect(synchronous)
                    # readers get their own connection: they never see a half-built group
                    self._rdb = self._db if readonly else sqlite3.connect(
                        str(self.path), isolation_level=None, check_same_thread=False, timeout=self._lock_timeout
                    )
                except BaseException:
                    if getattr(self, "_db", None) is not None:
                        self._db.close()
                    self._closed = True  # closed under its write lock, as close() does: a fork skips it
                    raise
        except BaseException:
            _ledger_fork.forget(self)  # outside the write lock: a fork holding the registry may wait on it
            raise

    # ------------------------------------------------------------------ opening

    def _connect(self, synchronous: str) -> sqlite3.Connection:
        if str(self.path) == ":memory:":
            # SQLite's name for a database that is gone when closed: nothing
            # sealed there would be durable (it failed later, as a journal mode)
            raise LedgerError("a ledger is a file: ':memory:' would keep nothing once closed; give a file path "
                              "(a temporary directory's, for a throwaway ledger)")
        if self.readonly and not self.path.exists():
            raise LedgerError(f"no ledger at {self.path}")
        try:
            if self.readonly:
                db = sqlite3.connect(_readonly_uri(str(self.path)), uri=True, isolation_level=None,
                                     check_same_thread=False, timeout=self._lock_timeout)
            else:
                db = sqlite3.connect(str(self.path), isolation_level=None, check_same_thread=False,
                                     timeout=self._lock_timeout)
        except sqlite3.Error as exc:  # a missing directory, a directory, no permission: the path, not sqlite3
            raise LedgerError(f"cannot open a ledger at {self.path} ({exc})",
                              hint="The ledger's directory must exist and be writable, and the path must "
                                   "name a file, not a directory.") from None
        try:
            if self._lenient_reads:  # an audit reads on past damage: a file shorter than its header says is still read
                db.execute("PRAGMA writable_schema=ON")
            # the objects first, then the format: a creator writes its schema and format row in one
            # transaction, so objects without a format row are another application's
            objects = _schema_objects(db)
            found = _format_of(db)
            if objects and found is None:
                raise NotALedgerError(
                    f"{self.path} is not a capseal ledger: it is an SQLite database of something else (it holds "
                    f"{', '.join(objects)}); nothing was written to it",
                    hint="Give capseal a new file, an empty one, or a capseal ledger.")
            if found is not None and found != LEDGER_FORMAT:  # refused before the schema below touches it
                raise LedgerFormatError(f"{self.path} is a {found} ledger; this capseal reads {LEDGER_FORMAT} "
                                        "(export it with the capseal that wrote it, then import the export)")
            if self.readonly and not objects:
                raise LedgerError(f"{self.path} holds no ledger yet (an empty file: one being created?)")
            if not self.readonly:
                _use_wal(db, time.monotonic() + self._lock_timeout)
                db.execute(f"PRAGMA synchronous={synchronous}")
                db.execute("PRAGMA foreign_keys=ON")
                if found is None:  # the schema and the format row in ONE transaction: a reader sees all or nothing
                    db.executescript("BEGIN IMMEDIATE;" + _SCHEMA +
                                     f"INSERT OR IGNORE INTO meta(key, value) VALUES ('format', '{LEDGER_FORMAT}');"
                                     f"INSERT OR IGNORE INTO meta(key, value) VALUES ('ledger_id', '{os.urandom(16).hex()}');"
                                     "COMMIT;")
                    # into the main file now: a -wal lost later still leaves the ledger's id, so its
                    # head file can tell what was lost (a busy checkpoint does nothing, and is harmless)
                    db.execute("PRAGMA wal_checkpoint(PASSIVE)")
                else:  # IF NOT EXISTS: writes nothing, unless an index or append-only trigger is missing
                    db.executescript(_SCHEMA)
        except sqlite3.DatabaseError as exc:
            db.close()
            raise self._open_failure(exc) from None
        except LedgerError:
            db.close()
            raise
        return db

    def _open_failure(self, exc: sqlite3.DatabaseError) -> LedgerError:
        """The typed error for an SQLite error met while opening the file."""
        if _is_busy(exc):
            return LedgerBusyError(
                f"{self.path} stayed locked by another connection for {self._lock_timeout:g} s ({exc}); "
                "nothing was opened or written: retry once the other process is done with it")
        if _sqlite_code(exc) == 26 or "file is not a database" in str(exc):  # SQLITE_NOTADB
            return NotALedgerError(f"{self.path} is not a capseal ledger: not an SQLite database, or its header "
                                   f"is damaged ({exc}); nothing was written to it")
        if "no such function" in str(exc):
            return LedgerError(f"{self.path}: this Python's SQLite {sqlite3.sqlite_version} lacks the JSON functions "
                               f"a capseal ledger's indexes use ({exc}); SQLite 3.38 or later has them built in")
        if isinstance(exc, sqlite3.IntegrityError):  # building the action-id index of an older file
            return LedgerCorruptError(f"{self.path} is damaged: two of its capsules carry one action_id ({exc}); "
                                      "nothing was written: `capseal verify` names them")
        return LedgerCorruptError(f"{self.path} is damaged ({exc})")

    def close(self) -> None:
        """Drain what was submitted (it becomes durable), then close.

        In a process forked from the one that opened it, only marks this copy
        closed: no SQLite call, no wait for the parent's committer (which does
        not exist here), nothing written; the parent's ledger is untouched.
        Why not raise: close() runs in ``with`` exits and ``finally`` blocks a
        forked child may pass through, where an error would hide the real one."""
        if self._forked:
            self._closed = True
            return
        self._refuse_inside_commit("close()")
        with self._mutex:
            if self._closed:
                return
            self._closing = True
            self._cond.notify_all()
            committer = self._committer
        if committer is not None:
            committer.join()
        with self._write_lock:
            self._drain()
            with self._mutex:
                self._closed = True
            with self._read_lock:
                if self._rdb is not self._db:
                    self._rdb.close()
                # a snapshot still open on another thread keeps its connection
                # (its next query is refused) until it ends: the fork machinery
                # must know that connection until then, so the last one out
                # takes the ledger off its list
                last = not self._snaps
            self._db.close()
            self._side.close()
        if last:
            _ledger_fork.forget(self)

    def __enter__(self) -> Ledger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Ledger({str(self.path)!r}{', readonly' if self.readonly else ''})"

    def _fork_locks(self) -> tuple[threading.Lock, threading.Lock]:
        """The locks every SQLite call on this ledger runs under (a fork takes them)."""
        return self._write_lock, self._read_lock

    def _connections(self) -> list[sqlite3.Connection]:
        """The connections made so far (a fork may come while they are made)."""
        snaps = list(getattr(self, "_snaps", ()))
        if getattr(self, "_closed", False):  # closed under its write lock: only snapshots still open
            return snaps
        db, rdb = getattr(self, "_db", None), getattr(self, "_rdb", None)
        return [c for c in (db, None if rdb is db else rdb, *snaps) if c is not None]

    def _fork_error(self, what: str) -> LedgerForkedError:
        """The refusal of ``what`` on a ledger inherited through fork() (callers
        test ``self._forked`` first: one attribute test on the hot path)."""
        return LedgerForkedError(
            f"{what}: the ledger {self.path} was opened by process {self._pid}, and this is process "
            f"{os.getpid()}, forked from it: its SQLite connections and threads belong to process {self._pid}. "
            "Open a new Ledger (or Producer) in this process; nothing was written")

    # ------------------------------------------------------------------ writing

    def append(self, entry: LedgerEntry) -> StoredEntry:
        """Append one record; returns once it is durable. Raises on refusal."""
        self._refuse_inside_commit("append()")  # before anything is queued
        pending = self._enqueue(entry, None, wake=False)
        self._wait([pending], None)
        if pending.error is not None:
            raise pending.error
        assert pending.stored is not None
        return pending.stored

    def append_many(self, entries: Sequence[LedgerEntry]) -> list[StoredEntry]:
        """Append records in order; durable on return. If any is refused, the
        others are still stored and the first refusal is raised after."""
        if entries:
            self._refuse_inside_commit("append_many()")  # before anything is queued
        pendings = [self._enqueue(e, None, wake=False) for e in entries]
        self._wait(pendings, None)
        errors = [p.error for p in pendings if p.error is not None]
        if errors:
            raise errors[0]
        return [p.stored for p in pendings if p.stored is not None]

    def add_commit_listener(self, listener: Callable[[list[StoredEntry]], object]) -> None:
        """Call ``listener(entries)`` on the committing thread after every
        commit, with the records it made durable, in seq order. Must not block;
        an error in it never undoes the commit. Why, beside ``on_durable``: a
        per-record callback is an object per record that lives until its group
        commits, and at full speed that allocator and GC churn cost the
        sealing thread about a tenth of its throughput."""
        self._commit_listeners.append(listener)

    def remove_commit_listener(self, listener: Callable[[list[StoredEntry]], object]) -> None:
        if listener in self._commit_listeners:
            self._commit_listeners.remove(listener)

    def submit(
        self, entry: LedgerEntry, on_durable: Callable[[StoredEntry], None] | None = None, *, wake: bool = True,
        after: tuple[PendingAppend, ...] = (),
    ) -> PendingAppend:
        """Queue a record and return at once; a committer thread writes queued
        records in groups (one fsync per group). The record is acknowledged —
        durable — only when ``result()`` returns. ``on_durable`` runs on the
        committing thread right after the commit (keep it short). With
        ``wake=False`` the caller commits it itself when it waits on ``result()``.
        ``after``: appends queued earlier (a chain parent, an epoch boundary)
        that this one needs: if one of them is refused, so is this one."""
        return self._enqueue(entry, on_durable, wake=wake, after=after)

    def submit_pair(
        self, lead: LedgerEntry, entry: LedgerEntry, on_lead: Callable[[StoredEntry], None] | None = None,
        on_durable: Callable[[StoredEntry], None] | None = None, *, wake: bool = True,
        after: tuple[PendingAppend, ...] = (),
    ) -> tuple[PendingAppend, PendingAppend]:
        """Queue ``lead`` and ``entry`` to be written together, in that order,
        or neither. Why: an epoch-boundary capsule goes in with the epoch's
        first record; one whose record was refused (a duplicate action id)
        would stand alone, and the epoch's real first record would then find
        it there. Both are committed in one group (the committer takes the
        whole queue), and a refusal of either undoes the other."""
        first = PendingAppend(lead, self, on_lead)
        second = PendingAppend(entry, self, on_durable)
        second.lead, second.after = first, after
        self._enqueue_all((first, second), wake=wake)
        return first, second

    def has_action_id(self, action_id: str) -> bool:
        """Whether a record with this action_id is already in the file: a
        capsule whose body carries it (the ``action_id`` column, outside the
        row hash, is not read for capsules), or another record given it.

        Args:
            action_id: the action id looked for.

        Returns:
            True when such a record is stored.

        Raises:
            LedgerBusyError, LedgerClosedError, LedgerForkedError: as every read.
        """
        return bool(self._query(
            f"SELECT 1 FROM records WHERE record_type = 'capsule' AND {_ledger_columns.ACTION_ID} = ?1 UNION ALL "
            "SELECT 1 FROM records WHERE action_id = ?1 AND record_type <> 'capsule' LIMIT 1", (action_id,)))

    def has_record(self, record_id: str) -> bool:
        """Whether a record with this id is already in the file (reads no body)."""
        return bool(self._query("SELECT 1 FROM records WHERE record_id=? LIMIT 1", (record_id,)))

    def _enqueue(self, entry: LedgerEntry, on_durable: Callable[[StoredEntry], None] | None, *, wake: bool,
                 after: tuple[PendingAppend, ...] = ()) -> PendingAppend:
        pending = PendingAppend(entry, self, on_durable)
        pending.after = after
        self._enqueue_all((pending,), wake=wake)
        return pending

    def _enqueue_all(self, pendings: tuple[PendingAppend, ...], *, wake: bool) -> None:
        if self._forked:  # before the mutex: a parent thread may have held it at the fork
            raise self._fork_error("appending a record")
        if self.readonly:
            raise LedgerError(f"{self} is read-only")
        with self._mutex:
            if self._closed or self._closing:
                raise LedgerClosedError(f"{self} is closed")
            self._queue.extend(pendings)
            if wake:
                if self._committer is None:
                    self._committer = threading.Thread(
                        target=self._commit_loop, name=f"capseal-ledger:{self.path.name}", daemon=True
                    )
                    self._committer.start()
                queued = len(self._queue)
                if queued == len(pendings) or queued >= self.group_max:  # wake the committer only when it matters
                    self._cond.notify_all()

    def flush(self, timeout: float | None = None) -> None:
        """Wait until everything submitted so far is durable (or refused)."""
        timeout = timeout_arg(timeout)
        if self._forked:
            raise self._fork_error("flush()")
        with self._mutex:
            pendings = list(self._queue) + list(self._in_flight)
        self._wait(pendings, timeout)

    def _unfinished(self) -> int:
        """Records submitted and not yet durable or refused (0 once closed)."""
        if self._forked:
            return 0
        with self._mutex:
            return 0 if self._closed else sum(not p.done for p in (*self._queue, *self._in_flight))

    def _wait(self, pendings: Sequence[PendingAppend], timeout: float | None) -> None:
        """Wait for ``pendings``; when nobody is writing, commit the queue on
        this thread (group-commit leader) instead of handing it to another."""
        if self._forked:  # the committer is not in this process: nobody would commit them
            raise self._fork_error("waiting for a record to be durable")
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            with self._mutex:
                if all(p.done for p in pendings):
                    return
            self._refuse_inside_commit("waiting for a record to be durable")  # durable ones never wait
            if not self._side_writers and self._write_lock.acquire(blocking=False):
                try:
                    self._drain()
                finally:
                    self._write_lock.release()
                continue
            with self._mutex:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    raise LedgerError(f"{self}: append not acknowledged within {timeout} s")
                self._cond.wait(0.05 if remaining is None else min(0.05, remaining))

    def _commit_loop(self) -> None:
        while not self._forked:  # a fork made in a commit callback carries on here: it must not commit
            with self._mutex:
                while not self._queue and not self._closing:
                    self._cond.wait()
                if not self._queue and self._closing:
                    return
                # group commit: let the group fill for up to group_window
                deadline = time.monotonic() + self.group_window
                while self._queue and len(self._queue) < self.group_max and not self._closing:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        break
                    self._cond.wait(remaining)
            while self._side_writers:  # let a waiting evidence writer in first
                time.sleep(0.0002)
            with self._write_lock:
                self._drain()

    @contextmanager
    def _side_write(self) -> Iterator[None]:
        """Hold _write_lock for a write beside the record stream (evidence),
        without being starved by the committer."""
        if self._forked:
            raise self._fork_error("writing evidence")
        self._refuse_inside_commit("writing evidence")  # the commit holds _write_lock
        with self._mutex:
            self._side_writers += 1
        try:
            self._write_lock.acquire()
        finally:
            with self._mutex:
                self._side_writers -= 1
        try:
            yield
        finally:
            self._write_lock.release()

    def _drain(self) -> None:
        """Commit everything queued right now. The caller holds _write_lock."""
        if self._forked:  # a fork made in a commit callback, carrying on: never through inherited connections
            raise self._fork_error("committing")
        self._committing = threading.get_ident()
        try:
            self._drain_batch()
        finally:
            self._committing = None

    def _refuse_inside_commit(self, what: str) -> None:
        """A callback run by a commit (an observer, a commit listener) that
        waits for a commit — flush, result(), seal(), append, close, an
        evidence write — would wait on the thread it runs on: refused with a
        clear error, before anything is queued, instead of hanging."""
        if self._committing == threading.get_ident():
            raise LedgerError(f"{what} from inside a commit of {self.path.name} (an observer or commit listener) "
                              "would wait on that commit; do it after the callback returns")

    def _drain_batch(self) -> None:
        with self._mutex:
            batch, self._queue = self._queue, []
            self._in_flight = batch
        if not batch:
            return
        interrupted: BaseException | None = None
        try:
            self._write(batch)
        except BaseException as exc:  # noqa: BLE001 - every waiter must learn the outcome
            self._head = None
            if isinstance(exc, LedgerError):
                failure = exc
            elif isinstance(exc, Exception):
                failure = LedgerError(f"append to {self.path.name} failed: {exc}")
            else:  # Ctrl-C or exit while this thread led the commit: nothing was written, and it goes on up
                failure, interrupted = LedgerError(f"append to {self.path.name} interrupted "
                                                   f"({type(exc).__name__}); nothing was written"), exc
            for p in batch:
                p.error, p.stored = failure, None
        self._in_callbacks = threading.get_ident()  # SQLite is between statements: a fork here is quiet
        try:
            for p in batch:
                if p.stored is not None and p.on_durable is not None:
                    try:
                        p.on_durable(p.stored)
                    except Exception:  # a callback never undoes a durable append
                        pass
            if self._commit_listeners:
                stored = [p.stored for p in batch if p.stored is not None]
                for listener in list(self._commit_listeners):
                    try:
                        listener(stored)
                    except Exception:  # a listener never undoes a durable append
                        pass
        finally:
            self._in_callbacks = None
        with self._mutex:
            for p in batch:
                p.done = True
                p.lead, p.after = None, ()  # decided: what it waited on may go (a chain would keep every body)
            self._in_flight = []
            self._cond.notify_all()
        if interrupted is not None:
            raise interrupted

    def _write(self, batch: list[PendingAppend]) -> None:
        db = self._db
        self._begin_write(db, "append to")
        try:
            if self._head is None:
                row = db.execute("SELECT seq, row_hash FROM records ORDER BY seq DESC LIMIT 1").fetchone()
                self._head = (row[0], row[1]) if row else (0, _GENESIS.hex())
                self._check_head(db, "records", self._head)
            seq, prev = self._head
            staged: list[tuple[PendingAppend, StoredEntry]] = []
            mark: tuple[int, str, int] | None = None  # (seq, prev, staged) before a pair's lead
            last = len(batch) - 1
            for i, p in enumerate(batch):
                e = p.entry
                lead = p.lead
                refusal = _refused_with(p)
                if refusal is None:
                    if i < last and batch[i + 1].lead is p:
                        db.execute("SAVEPOINT pair")
                        mark = (seq, prev, len(staged))
                    nonce = os.urandom(16).hex()
                    header = {"seq": seq + 1, "record_id": e.record_id, "record_type": e.record_type,
                              "epistemic_type": e.epistemic_type, "links": [dict(x) for x in e.links], "nonce": nonce}
                    row_hash = _row_hash(prev, header, e.body)
                    try:
                        db.execute(
                            "INSERT INTO records(seq, record_id, record_type, epistemic_type, links, nonce,"
                            " action_id, stream, tag, body, prev_hash, row_hash) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
                            (seq + 1, e.record_id, e.record_type, e.epistemic_type,
                             dumps_canonical(header["links"]).decode(), nonce, e.action_id, e.stream, e.tag, e.body,
                             prev, row_hash),
                        )
                    except sqlite3.IntegrityError as exc:
                        text = str(exc)
                        if "records.seq" in text:
                            # another process appended since our cached head: re-read and retry the group
                            raise _StaleHead from None
                        what = "action_id" if "action_id" in text else "record_id"
                        value = e.action_id if what == "action_id" else e.record_id
                        if value is None:  # the derived index: the action id its capsule's body carries
                            refusal = DuplicateRecordError(f"its capsule's action_id is already in {self.path.name} "
                                                           f"(record {e.record_id[:16]}…)")
                        else:
                            refusal = DuplicateRecordError(f"{what} {value!r} is already in {self.path.name}")
                if refusal is not None:
                    p.error = refusal
                    if mark is not None:  # a pair's lead (nothing to undo) or its follower (undo the lead)
                        if lead is not None:
                            db.execute("ROLLBACK TO pair")
                            seq, prev, kept = mark
                            del staged[kept:]
                            lead.error = refusal
                        db.execute("RELEASE pair")
                        mark = None
                    continue
                staged.append((p, StoredEntry(
                    seq=seq + 1, record_id=e.record_id, record_type=e.record_type, epistemic_type=e.epistemic_type,
                    links=e.links, nonce=nonce, body=e.body, prev_hash=prev, row_hash=row_hash,
                    action_id=e.action_id, stream=e.stream, tag=e.tag,
                )))
                seq, prev = seq + 1, row_hash
                if lead is not None and mark is not None:
                    db.execute("RELEASE pair")
                    mark = None
            if staged:  # the head commits with its rows (see _ledger_head)
                db.execute("INSERT OR REPLACE INTO meta(key, value) VALUES ('head', ?)", (f"{seq} {prev}",))
            db.execute("COMMIT")
        except _StaleHead:
            db.execute("ROLLBACK")
            self._head = None
            for p in batch:
                p.error = None
            self._write(batch)
            return
        except BaseException:
            self._head = None
            try:
                db.execute("ROLLBACK")
            except sqlite3.Error:
                pass
            raise
        self._head = (seq, prev)
        if staged:
            self._side.write("records", self._ledger_id, seq, prev)
        for p, stored in staged:
            p.stored = stored
        st = self.stats
        st.commits += 1
        st.records += len(staged)
        st.largest_group = max(st.largest_group, len(batch))

    def _check_head(self, db: sqlite3.Connection, kind: str, last: tuple[int, Any]) -> None:
        """Before the first write to a chain (in its transaction, under the
        write lock): refuse (LedgerCorruptError, nothing written) a chain that
        falls short of a head the ledger recorded, or whose last row hash is
        damaged: appending would cover the loss up."""
        def query(sql: str, args: tuple[Any, ...]) -> list[Any]:
            return db.execute(sql, args).fetchall()

        self._ledger_id = _ledger_head.ledger_id(query, create=True)
        problems = _ledger_head.problems_before_write(query, self._real_path, self._ledger_id, kind, last)
        if problems:
            raise LedgerCorruptError(
                f"{self.path}: {'; '.join(problems)}; nothing was written",
                hint=f"`capseal verify {self.path}` reports what is missing. Appending is refused because it would "
                     "hide the loss; to go on from what is left, export this ledger and import the export into a "
                     f"new file (if the loss is known and accepted, as after a restore from a backup, moving "
                     f"{self._side.path} aside is enough when only it records the lost rows).")

    def _begin_write(self, db: sqlite3.Connection, what: str) -> None:
        """BEGIN IMMEDIATE, waiting up to ``lock_timeout`` for another
        process's write; past it a typed LedgerBusyError (nothing begun)."""
        try:
            db.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as exc:
            if not _is_busy(exc):
                raise
            raise LedgerBusyError(f"{what} {self.path.name} failed: another connection kept it locked for "
                                  f"{self._lock_timeout:g} s ({exc}); nothing was written") from None

    def add_evidence(self, record_id: str, evidence: dict[str, Any] | None) -> EvidenceEntry:
        """Append an evidence state for ``record_id`` (a filled slot, or ``None``
        to record that the slot is empty again). The record's earlier states
        stay in history. Durable on return."""
        if evidence is not None and not evidence:
            raise ValueError("evidence is a filled object, never {}")
        return self._append_evidence([(record_id, dumps_canonical(evidence))])[0]

    def add_evidence_batch(self, record_ids: Sequence[str], merkle_root: bytes, shared: Mapping[str, Any]) -> EvidenceEntry:
        """Append ONE quote that covers many records: ``record_ids`` in leaf
        order, ``merkle_root`` their RFC 9162 root (the quote's
        qualifyingData), ``shared`` the quote members every slot carries. One
        row for the batch plus an index row per record, in one transaction: all
        the slots appear or none do. Refused as a whole (nothing written) if a
        record is unknown or the ids do not hash to ``merkle_root``. Each
        record's slot, with its inclusion proof, is rebuilt on read
        (:func:`batch_slot`); checking the quote is the writer's job
        (``capseal.attest``)."""
        record_ids = list(record_ids)
        _Batch.check(record_ids, merkle_root, shared)
        body = dumps_canonical({"leaves": record_ids, "merkle_root": merkle_root.hex(), "shared": dict(shared)})
        with self._evidence_transaction(record_ids) as (db, seqs, eid, prev):
            row_hash = _row_hash(prev, _batch_header(eid), body)
            db.execute("INSERT INTO evidence(eid, record_seq, record_id, body, prev_hash, row_hash) VALUES (?,NULL,NULL,?,?,?)",
                       (eid, body, prev, row_hash))
            _insert_members(db, sorted((seqs[rid], eid, i) for i, rid in enumerate(record_ids)))
        return EvidenceEntry(eid, None, None, body, prev, row_hash)

    def _append_evidence(self, bodies: list[tuple[str, bytes]]) -> list[EvidenceEntry]:
        """One transaction appending slot rows to the evidence hash chain."""
        rows: list[EvidenceEntry] = []
        with self._evidence_transaction([rid for rid, _ in bodies]) as (db, seqs, eid, prev):
            for record_id, body in bodies:
                seq = seqs[record_id]
                row_hash = _evidence_row_hash(prev, seq, record_id, eid, body)
                rows.append(EvidenceEntry(eid, seq, record_id, body, prev, row_hash))
                eid, prev = eid + 1, row_hash
            for i in range(0, len(rows), 100):  # multi-row INSERTs: fewer statement steps per batch
                group = rows[i : i + 100]
                db.execute(
                    "INSERT INTO evidence(eid, record_seq, record_id, body, prev_hash, row_hash) VALUES "
                    + ",".join(["(?,?,?,?,?,?)"] * len(group)),
                    [v for row in group for v in (row.eid, row.record_seq, row.record_id, row.body, row.prev_hash, row.row_hash)],
                )
            _insert_members(db, [(rseq, row.eid, -1) for row in rows if (rseq := row.record_seq) is not None])
        return rows

    @contextmanager
    def _evidence_transaction(self, record_ids: Sequence[str]) -> Iterator[tuple[sqlite3.Connection, dict[str, int], int, str]]:
        """BEGIN … COMMIT around an evidence write, beside the record stream:
        yields the connection, the seq of every named record (refusing the
        whole write if one is unknown), and the next eid and chain head."""
        with self._side_write():
            if self._closed or self._closing:
                raise LedgerClosedError(f"{self} is closed")
            db = self._db
            self._begin_write(db, "evidence write to")
            try:
                wanted = list(dict.fromkeys(record_ids))
                seqs = _seqs_of(db, wanted)
                missing = [rid for rid in wanted if rid not in seqs]
                if missing:
                    more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
                    raise LedgerError(f"no record {missing[0]}{more} in {self.path.name}; no evidence written")
                head = db.execute("SELECT eid, row_hash FROM evidence ORDER BY eid DESC LIMIT 1").fetchone()
                self._check_head(db, "evidence", (head[0], head[1]) if head else (0, _GENESIS.hex()))
                eid, prev = (head[0] + 1, head[1]) if head else (1, _GENESIS.hex())
                yield db, seqs, eid, prev
                last = db.execute("SELECT eid, row_hash FROM evidence ORDER BY eid DESC LIMIT 1").fetchone()
                db.execute("INSERT OR REPLACE INTO meta(key, value) VALUES ('evidence_head', ?)", (f"{last[0]} {last[1]}",))
                db.execute("COMMIT")
                self._side.write("evidence", self._ledger_id, last[0], last[1])
            except BaseException:
                try:
                    db.execute("ROLLBACK")
                except sqlite3.Error:
                    pass
                raise

    # ------------------------------------------------------------------ reading

    @contextmanager
    def snapshot(self) -> Iterator[None]:
        """``with ledger.snapshot():`` this thread's reads run in one read
        transaction of a private connection: every query sees the file as of
        the first one (WAL), so a walk over records, evidence and the index is
        consistent while other processes append. ``check_chain``,
        ``export_jsonl`` and ``verify_ledger`` use it; nesting reuses it."""
        if self._forked:
            raise self._fork_error("reading")
        if getattr(self._snap, "db", None) is not None:
            yield
            return
        with self._read_lock:
            if self._closed:
                raise LedgerClosedError(f"{self} is closed")
            db = sqlite3.connect(_readonly_uri(self._real_path), uri=True, isolation_level=None,
                                 check_same_thread=False, timeout=self._lock_timeout)
            self._snaps.add(db)
            if self._lenient_reads:
                db.execute("PRAGMA writable_schema=ON")
        try:
            self._snap.db = db
            with self._read_lock:
                db.execute("BEGIN")
            yield
        finally:
            self._snap.db = None
            with self._read_lock:
                self._snaps.discard(db)
                if not self._forked:  # inherited through fork: _ledger_fork lets go of it
                    db.close()
                last = self._closed and not self._snaps and not self._forked
            if last:  # close() ran meanwhile and left the fork machinery's list to us
                _ledger_fork.forget(self)

    def _query(self, sql: str, args: tuple[Any, ...] = ()) -> list[Any]:
        if self._forked:
            raise self._fork_error("reading")
        snap = getattr(self._snap, "db", None)
        with self._read_lock:  # a snapshot's queries too: a fork waits for every SQLite call on this ledger
            if self._closed:
                raise LedgerClosedError(f"{self} is closed")
            try:
                return (self._rdb if snap is None else snap).execute(sql, args).fetchall()
            except sqlite3.OperationalError as exc:
                if not _is_busy(exc):
                    raise
                raise LedgerBusyError(f"reading {self.path.name} failed: another connection kept it locked for "
                                      f"{self._lock_timeout:g} s ({exc})") from None

    @staticmethod
    def _stored(row: Sequence[Any], *, tolerant: bool = False) -> StoredEntry:
        """A record row as read. One whose columns are not of the types capseal
        writes is LedgerCorruptError naming it, or with ``tolerant`` an entry
        with ``damage`` set (placeholders for the rest)."""
        damage = _record_damage(row)
        if damage is not None:
            if not tolerant:
                raise LedgerCorruptError(f"record {row[0]} is damaged ({damage})")

            def text(value: Any) -> str:
                return value if type(value) is str else ""

            return StoredEntry(seq=row[0], record_id=text(row[1]), record_type=text(row[2]),
                               epistemic_type=text(row[3]), links=(), nonce=text(row[5]), body=b"",
                               prev_hash=text(row[10]), row_hash=text(row[11]), damage=damage)
        return StoredEntry(
            seq=row[0], record_id=row[1], record_type=row[2], epistemic_type=row[3],
            links=_links(row[4]), nonce=row[5], action_id=row[6], stream=row[7], tag=row[8],
            body=row[9], prev_hash=row[10], row_hash=row[11],
        )

    _COLS = "seq, record_id, record_type, epistemic_type, links, nonce, action_id, stream, tag, body, prev_hash, row_hash"

    def count(self) -> int:
        return int(self._query("SELECT count(*) FROM records")[0][0])

    def entries(self, *, batch: int = 2000, damaged: list[str] | None = None) -> Iterator[StoredEntry]:
        """Every record row in seq order.

        Args:
            batch: rows read per query.
            damaged: None (the default) to stop at damage; or a list, to read
                on past it (what a verifier needs): a row that is not one
                capseal writes then comes back with ``damage`` set, and each
                stretch of rows SQLite cannot read is skipped and described in
                the list.

        Returns:
            An iterator of StoredEntry.

        Raises:
            LedgerCorruptError: without ``damaged``, a row of other types.
            sqlite3.DatabaseError: without ``damaged``, a page SQLite cannot read.
            LedgerBusyError, LedgerClosedError, LedgerForkedError: as every read.
        """
        sql = f"SELECT {self._COLS} FROM records WHERE seq > ? ORDER BY seq LIMIT ?"
        for row in _ledger_scan.rows(self._query, sql, batch, damaged, "seq"):
            yield self._stored(row, tolerant=damaged is not None)

    def evidence_entries(self, *, batch: int = 500, damaged: list[str] | None = None) -> Iterator[EvidenceEntry]:
        """Every evidence row (slot rows and batch rows) in eid order.

        Args:
            batch: rows read per query.
            damaged: as for :meth:`entries` (a row of other types comes back
                with ``damage`` set either way).

        Returns:
            An iterator of EvidenceEntry.

        Raises:
            sqlite3.DatabaseError: without ``damaged``, a page SQLite cannot read.
            LedgerBusyError, LedgerClosedError, LedgerForkedError: as every read.
        """
        sql = "SELECT eid, record_seq, record_id, body, prev_hash, row_hash FROM evidence WHERE eid > ? ORDER BY eid LIMIT ?"
        for row in _ledger_scan.rows(self._query, sql, batch, damaged, "evidence"):
            yield _evidence_entry(row)

    def entry(self, record_id: str) -> StoredEntry | None:
        rows = self._query(f"SELECT {self._COLS} FROM records WHERE record_id=?", (record_id,))
        return self._stored(rows[0]) if rows else None

    _STATES = ("SELECT m.eid, m.leaf_index, CASE WHEN e.record_id IS NULL THEN NULL ELSE e.body END"
               " FROM records r JOIN evidence_members m ON m.record_seq = r.seq JOIN evidence e ON e.eid = m.eid"
               " WHERE r.record_id=? ORDER BY m.eid")

    def evidence_history(self, record_id: str) -> list[dict[str, Any] | None]:
        """Every evidence state of a record, oldest first, starting with the
        ``None`` it was sealed with."""
        history: list[dict[str, Any] | None] = [None]
        history += [self._state(*row) for row in self._query(self._STATES, (record_id,))]
        return history

    def current_evidence(self, record_id: str) -> dict[str, Any] | None:
        rows = self._query(self._STATES.replace("ORDER BY m.eid", "ORDER BY m.eid DESC LIMIT 1"), (record_id,))
        return self._state(*rows[0]) if rows else None

    def _state(self, eid: int, leaf_index: int, body: bytes | None) -> dict[str, Any] | None:
        if body is not None:  # a slot row
            return _slot_state(_stored_blob(body, f"evidence {eid}"))
        batch = self._batches.get(eid)
        if batch is None:
            stored = self._query("SELECT body FROM evidence WHERE eid=?", (eid,))[0][0]
            batch = _Batch.parse(_stored_blob(stored, f"evidence batch {eid}"))
            with self._read_lock:  # a few recent batches: readers walk records in order
                if len(self._batches) >= 8:
                    self._batches.pop(next(iter(self._batches)))
                self._batches[eid] = batch
        return batch.slot(leaf_index)

    def get(self, record_id: str) -> SealedRecord | None:
        """The sealed record with its current evidence slot, or None."""
        stored = self.entry(record_id)
        if stored is None or stored.record_type != "capsule":
            return None
        record = SealedRecord.from_json(stored.record(), seq=stored.seq)
        return record.with_evidence(self.current_evidence(record_id))

    def records(self) -> Iterator[SealedRecord]:
        """Every sealed capsule record in order, with its current evidence."""
        evidence: dict[str, dict[str, Any] | None | tuple[_Batch, int]] = {}
        for ev in self.evidence_entries():
            ev._refuse_damaged()
            if ev.record_id is not None:
                evidence[ev.record_id] = ev.evidence()
            else:  # each slot built when its record is reached
                batch = _Batch.parse(ev.body)
                for i, rid in enumerate(batch.leaves):
                    evidence[rid] = (batch, i)
        warm: list[_Batch] = []  # batches with built proofs: a few, so memory stays bounded
        for stored in self.entries():
            if stored.record_type == "capsule":
                rec = SealedRecord.from_json(stored.record(), seq=stored.seq)
                state = evidence.get(stored.record_id)
                if isinstance(state, tuple):
                    batch, index = state
                    if batch not in warm:
                        warm.append(batch)
                        if len(warm) > 4:
                            warm.pop(0).drop_proofs()
                    yield rec.with_evidence(batch.slot(index))
                else:
                    yield rec.with_evidence(state)

    def last_tagged(self, tag: str, stream: str) -> StoredEntry | None:
        """The last record given ``tag`` in ``stream``.

        Args:
            tag: the tag; for ``"epoch_boundary"``, the last epoch-boundary
                capsule whose body names the stream's operator and developer
                is found, never read from the tag and stream columns (outside
                the row hash).
            stream: ``operator`` U+001F ``developer``, as a Producer names its stream.

        Returns:
            The StoredEntry, or None.

        Raises:
            LedgerCorruptError: the row found is not one capseal writes.
            LedgerBusyError, LedgerClosedError, LedgerForkedError: as every read.
        """
        if tag == _ledger_columns.BOUNDARY_TAG:
            rows = self._query(f"SELECT {self._COLS} FROM records WHERE {_ledger_columns.BOUNDARY} AND {_ledger_columns.STREAM} = ? "
                               "ORDER BY seq DESC LIMIT 1", (stream,))
        else:
            rows = self._query(f"SELECT {self._COLS} FROM records WHERE tag=? AND stream=? ORDER BY seq DESC LIMIT 1",
                               (tag, stream))
        return self._stored(rows[0]) if rows else None

    # ------------------------------------------------------------------ integrity

    def check_chain(self) -> list[str]:
        """Recompute both hash chains, in one snapshot of the file.

        What the file holds never raises here: a row SQLite cannot read, a
        column of another type, a hash that is not hex or a record stored
        twice is a problem of its own, and the rows around it are still
        checked.

        Returns:
            The problems found, one sentence each (empty when intact).

        Raises:
            LedgerBusyError, LedgerClosedError, LedgerForkedError: as every read.
        """
        with self.snapshot():
            return self._check_chain()

    def _check_chain(self) -> list[str]:
        problems: list[str] = []
        damaged: list[str] = []
        prev, expected_seq = _GENESIS.hex(), 1
        seq_of: dict[str, int] = {}
        for stored in self.entries(damaged=damaged):
            if stored.seq != expected_seq:
                problems.append(f"seq {stored.seq}: expected {expected_seq} (gap or reorder)")
            prev, expected_seq, prev_hash = stored.row_hash, stored.seq + 1, prev
            if stored.damage is not None:  # this row only: the rest of the chain is still checked
                problems.append(f"seq {stored.seq}: damaged row ({stored.damage})")
                continue
            if stored.record_id in seq_of:  # the unique index let it in: it is damaged
                problems.append(f"seq {stored.seq}: record {stored.record_id[:16]}… is stored twice "
                                f"(first at seq {seq_of[stored.record_id]})")
            seq_of.setdefault(stored.record_id, stored.seq)
            if stored.prev_hash != prev_hash:
                problems.append(f"seq {stored.seq}: prev_hash does not match the previous row")
            if not (is_hex64(stored.prev_hash) and is_hex64(stored.row_hash)):
                problems.append(f"seq {stored.seq}: damaged row (its prev_hash or row_hash is not 64 hex digits)")
            elif _row_hash(stored.prev_hash, stored.header(), stored.body) != stored.row_hash:
                problems.append(f"seq {stored.seq}: row_hash does not match its header and body")
        problems += damaged
        damaged = []
        prev = _GENESIS.hex()
        members: set[tuple[int, int, int]] = set()
        for ev in self.evidence_entries(damaged=damaged):
            prev_hash, prev = prev, ev.row_hash
            if ev.damage is not None:  # this row only: the rest of the chain is still checked
                problems.append(f"evidence {ev.eid}: damaged row ({ev.damage})")
                if ev.record_seq is not None and ev.record_id is not None:
                    members.add((ev.record_seq, ev.eid, -1))
                continue
            if not (is_hex64(ev.prev_hash) and is_hex64(ev.row_hash)):
                problems.append(f"evidence {ev.eid}: damaged row (its prev_hash or row_hash is not 64 hex digits)")
            elif ev.prev_hash != prev_hash or _row_hash(ev.prev_hash, ev.header(), ev.body) != ev.row_hash:
                problems.append(f"evidence {ev.eid}: hash chain broken")
            if ev.record_id is not None:
                if seq_of.get(ev.record_id) != ev.record_seq:
                    problems.append(f"evidence {ev.eid}: record {ev.record_id} is not at seq {ev.record_seq}")
                members.add((ev.record_seq or 0, ev.eid, -1))
                continue
            try:
                batch = _Batch.parse(ev.body)
                _Batch.check(batch.leaves, batch.root, batch.shared)
            except (LedgerCorruptError, ValueError, KeyError, TypeError) as exc:
                problems.append(f"evidence {ev.eid}: not a valid batch ({exc})")
                continue
            unknown = [rid for rid in batch.leaves if rid not in seq_of]
            if unknown:
                problems.append(f"evidence {ev.eid}: names {len(unknown)} record(s) the ledger lacks")
            members.update((seq_of[rid], ev.eid, i) for i, rid in enumerate(batch.leaves) if rid in seq_of)
        problems += damaged
        try:
            indexed = {(r[0], r[1], r[2]) for r in self._query("SELECT record_seq, eid, leaf_index FROM evidence_members")}
        except sqlite3.DatabaseError as exc:
            problems.append(f"evidence index: cannot be read ({str(exc)[:200]})")
            return problems
        if indexed != members:
            problems.append(f"evidence index: {len(indexed - members)} row(s) not backed by the evidence chain, "
                            f"{len(members - indexed)} missing")
        return problems

    # ------------------------------------------------------------------ export / import

    def export_jsonl(self, out: IO[bytes]) -> int:
        """Write every row as one JSON line (records, then evidence). Returns lines.
        A page SQLite cannot read is LedgerCorruptError (what was written
        before it is no whole export: ``capseal verify`` says what is left)."""
        with self.snapshot():
            try:
                return self._export_jsonl(out)
            except sqlite3.DatabaseError as exc:
                raise LedgerCorruptError(f"{self.path} is damaged ({exc}); the export is not whole") from None

    def _export_jsonl(self, out: IO[bytes]) -> int:
        n = 0
        for stored in self.entries():
            header = {**stored.header(), "action_id": stored.action_id, "stream": stored.stream, "tag": stored.tag,
                      "prev_hash": stored.prev_hash, "row_hash": stored.row_hash}
            out.write(b'{"header":' + dumps_canonical(header) + b',"kind":"record","record":' + stored.body + b"}\n")
            n += 1
        for ev in self.evidence_entries():
            ev._refuse_damaged()  # an export is checked on import: a damaged row would only stop it there
            ev_header = dumps_canonical({**ev.header(), "prev_hash": ev.prev_hash, "row_hash": ev.row_hash})
            if ev.record_id is None:
                out.write(b'{"batch":' + ev.body + b',"header":' + ev_header + b',"kind":"evidence-batch"}\n')
            else:
                out.write(b'{"evidence":' + ev.body + b',"header":' + ev_header + b',"kind":"evidence"}\n')
            n += 1
        return n

    @classmethod
    def import_jsonl(cls, src: IO[bytes], path: str | os.PathLike[str]) -> Ledger:
        """Build a new ledger at ``path`` from an export, checking every hash.
        Refuses (and leaves no file) if any line is malformed or the chain breaks."""
        target = Path(path)
        if os.path.lexists(target):  # lexists: a dangling symlink is not a free name either
            raise LedgerError(f"{target} already exists; import builds a new ledger")
        # built under a private name, then linked into place (link() never
        # replaces a file): nobody sees a half-imported ledger, a failure or
        # a kill leaves no ledger at ``path``, and only files this call made
        # are ever deleted
        _sweep_abandoned_imports(target.parent)
        tmp = target.with_name(f"{_IMPORT_PREFIX}{os.getpid()}-{os.urandom(4).hex()}")  # short: any target name fits
        try:  # held until the temp files are gone: the sign that this import is alive
            alive = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644)
        except OSError as exc:
            raise LedgerError(f"cannot import into {target}: {exc.strerror} (building it aside in {target.parent}); "
                              "nothing was imported") from None
        ledger: Ledger | None = None
        try:
            fcntl.flock(alive, fcntl.LOCK_EX)
            ledger = cls(tmp)
            with ledger._write_lock:  # every SQLite call under one of the ledger's locks (a fork waits on them)
                ledger._import(src)
            ledger.close()  # the last connection: checkpoints, the -wal is gone
            try:
                os.link(tmp, target)
            except FileExistsError:
                raise LedgerError(f"{target} was created by another process during the import; "
                                  "import builds a new ledger") from None
            except OSError as exc:
                raise LedgerError(f"cannot put the imported ledger at {target}: {exc.strerror} (capseal builds an "
                                  "import aside and hard-links it into place; this filesystem or directory refused "
                                  "the link); nothing was imported") from None
        except BaseException:
            if ledger is not None:
                ledger.close()
            raise
        finally:
            for suffix in ("", "-wal", "-shm"):
                with suppress(OSError):  # never hides the error that got here
                    Path(str(tmp) + suffix).unlink()
            os.close(alive)
        return cls(target)

    def _import(self, src: IO[bytes]) -> None:
        db = self._db
        db.execute("BEGIN IMMEDIATE")
        prev, eprev = _GENESIS.hex(), _GENESIS.hex()
        last_seq = last_eid = 0
        try:
            for lineno, line in enumerate(src, 1):
                try:
                    item = json.loads(line)
                except ValueError as exc:
                    raise MalformedJSONError(f"line {lineno}: not JSON ({exc})") from None
                if not isinstance(item, dict) or item.get("kind") not in ("record", "evidence", "evidence-batch"):
                    raise MalformedJSONError(f"line {lineno}: not a capseal ledger line")
                h = item.get("header")
                if not isinstance(h, dict):
                    raise MalformedJSONError(f"line {lineno}: header missing")
                try:
                    if item["kind"] == "record":
                        body = dumps_canonical(item["record"])
                        header = {k: h[k] for k in ("seq", "record_id", "record_type", "epistemic_type", "links", "nonce")}
                        if h["prev_hash"] != prev or _row_hash(prev, header, body) != h["row_hash"]:
                            raise LedgerCorruptError(f"line {lineno}: hash chain broken at seq {h['seq']}")
                        columns = (h.get("action_id"), h.get("stream"), h.get("tag"))
                        if columns != _ledger_columns.row_columns(h["record_type"], item["record"]):
                            raise LedgerCorruptError(f"line {lineno}: seq {h['seq']}: its action_id, stream and tag "
                                                     "are not the ones its body gives")
                        db.execute(
                            f"INSERT INTO records({self._COLS}) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
                            (h["seq"], h["record_id"], h["record_type"], h["epistemic_type"],
                             dumps_canonical(h["links"]).decode(), h["nonce"], h.get("action_id"), h.get("stream"),
                             h.get("tag"), body, h["prev_hash"], h["row_hash"]),
                        )
                        prev, last_seq = h["row_hash"], h["seq"]
                    else:
                        batch = item["kind"] == "evidence-batch"
                        body = dumps_canonical(item["batch" if batch else "evidence"])
                        header = _batch_header(h["eid"]) if batch else _evidence_header(h["record_seq"], h["record_id"], h["eid"])
                        if h["prev_hash"] != eprev or _row_hash(eprev, header, body) != h["row_hash"]:
                            raise LedgerCorruptError(f"line {lineno}: evidence hash chain broken at {h['eid']}")
                        if batch:
                            parsed = _Batch.parse(body)
                            try:
                                _Batch.check(parsed.leaves, parsed.root, parsed.shared)
                            except ValueError as exc:
                                raise LedgerCorruptError(f"line {lineno}: evidence {h['eid']}: {exc}") from None
                            named = [(rid, i) for i, rid in enumerate(parsed.leaves)]
                        else:
                            named = [(h["record_id"], -1)]
                        seqs = _seqs_of(db, [rid for rid, _ in named])
                        if len(seqs) != len(named) or (not batch and seqs[h["record_id"]] != h["record_seq"]):
                            raise LedgerCorruptError(f"line {lineno}: evidence {h['eid']} names a record the ledger lacks")
                        members = sorted((seqs[rid], h["eid"], i) for rid, i in named)
                        db.execute(
                            "INSERT INTO evidence(eid, record_seq, record_id, body, prev_hash, row_hash) VALUES (?,?,?,?,?,?)",
                            (h["eid"], None if batch else h["record_seq"], None if batch else h["record_id"], body,
                             h["prev_hash"], h["row_hash"]),
                        )
                        _insert_members(db, members)
                        eprev, last_eid = h["row_hash"], h["eid"]
                except (KeyError, TypeError, ValueError) as exc:
                    raise MalformedJSONError(f"line {lineno}: missing or malformed field {exc}") from None
                except sqlite3.IntegrityError as exc:
                    raise LedgerCorruptError(f"line {lineno}: {exc}") from None
            for key, position, row_hash in (("head", last_seq, prev), ("evidence_head", last_eid, eprev)):
                if position:  # the heads, as appending them would have recorded (see _ledger_head)
                    db.execute("INSERT OR REPLACE INTO meta(key, value) VALUES (?, ?)", (key, f"{position} {row_hash}"))
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
