"""The durable, append-only ledger (SQLite in WAL mode, standard library only).

What it promises:
  * **append-only**: triggers refuse UPDATE and DELETE; every row is hash-chained
    to the one before it, so an edit made behind SQLite's back is detectable;
  * **durable on acknowledgement**: ``append`` returns only after the COMMIT that
    holds the row has been fsynced (WAL, ``synchronous=FULL``). A process killed
    with SIGKILL loses nothing it acknowledged and leaves no torn row;
  * **group commit**: concurrent writers (threads) share one transaction and
    one fsync. The first waiting thread leads and commits everything queued;
    a lone writer pays no thread hand-off;
  * **one record per id**: ``record_id`` (the capsule id) and a capsule's
    ``action_id`` are unique; a duplicate is refused with DuplicateRecordError
    and does not disturb the other records of its group;
  * **a store header per record** (EL -00 §4): seq, record_id, record_type,
    epistemic_type, links and 128 bits of fresh randomness (``nonce``);
  * **evidence beside records**: hardware evidence is appended to its own
    table, so the slot's earlier ``null`` state stays visible in history.

Export to JSON Lines and import back are byte-identical (``export_jsonl`` of an
imported ledger equals the file it was imported from).
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from .errors import DuplicateRecordError, LedgerClosedError, LedgerCorruptError, LedgerError, MalformedJSONError
from .record import SealedRecord, dumps_canonical

__all__ = ["Ledger", "LedgerEntry", "StoredEntry", "EvidenceEntry", "LEDGER_FORMAT"]

LEDGER_FORMAT = "capseal-ledger/1"
_GENESIS = bytes(32)
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
CREATE TABLE IF NOT EXISTS evidence (
    eid INTEGER PRIMARY KEY,
    record_seq INTEGER NOT NULL REFERENCES records(seq),
    record_id TEXT NOT NULL,
    body BLOB NOT NULL,
    prev_hash TEXT NOT NULL,
    row_hash TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS evidence_record ON evidence(record_id, eid);
CREATE TRIGGER IF NOT EXISTS records_no_update BEFORE UPDATE ON records
    BEGIN SELECT RAISE(ABORT, 'capseal ledger is append-only'); END;
CREATE TRIGGER IF NOT EXISTS records_no_delete BEFORE DELETE ON records
    BEGIN SELECT RAISE(ABORT, 'capseal ledger is append-only'); END;
CREATE TRIGGER IF NOT EXISTS evidence_no_update BEFORE UPDATE ON evidence
    BEGIN SELECT RAISE(ABORT, 'capseal ledger is append-only'); END;
CREATE TRIGGER IF NOT EXISTS evidence_no_delete BEFORE DELETE ON evidence
    BEGIN SELECT RAISE(ABORT, 'capseal ledger is append-only'); END;
"""


@dataclass(frozen=True)
class LedgerEntry:
    """What a writer hands the ledger. ``body`` is canonical JSON bytes."""

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
    """A row as stored: the store header, the body and the hash chain."""

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
    eid: int
    record_seq: int
    record_id: str
    body: bytes
    prev_hash: str
    row_hash: str

    def evidence(self) -> dict[str, Any] | None:
        value = json.loads(self.body)
        return value if value else None


def _row_hash(prev_hex: str, header: dict[str, Any], body: bytes, extra: bytes = b"") -> str:
    h = hashlib.sha256(_DOMAIN)
    h.update(bytes.fromhex(prev_hex))
    h.update(hashlib.sha256(dumps_canonical(header)).digest())
    h.update(hashlib.sha256(body).digest())
    h.update(extra)
    return h.hexdigest()


def _evidence_header(record_seq: int, record_id: str, eid: int) -> dict[str, Any]:
    return {"eid": eid, "record_seq": record_seq, "record_id": record_id}


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

    __slots__ = ("entry", "stored", "error", "done", "_ledger", "on_durable")

    def __init__(self, entry: LedgerEntry, ledger: Ledger, on_durable: Callable[[StoredEntry], None] | None = None) -> None:
        self.entry = entry
        self.on_durable = on_durable
        self.stored: StoredEntry | None = None
        self.error: BaseException | None = None
        self.done = False
        self._ledger = ledger

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
    lock serializes them; each transaction reads the chain head under it).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        readonly: bool = False,
        synchronous: str = "FULL",
        group_window: float = 0.008,
        group_max: int = 256,
    ) -> None:
        """``group_window`` (seconds) and ``group_max`` shape group commit for
        :meth:`submit`: the committer waits up to the window (or until
        ``group_max`` records are queued; default 8 ms) before one fsynced commit, since an
        fsync costs far more CPU than an insert. Synchronous :meth:`append`
        never waits for a window: its caller commits at once."""
        self.path = Path(path)
        self.readonly = readonly
        if group_window < 0 or group_max < 1:
            raise ValueError("group_window >= 0 and group_max >= 1")
        self.group_window = group_window
        self.group_max = group_max
        if synchronous not in ("FULL", "NORMAL", "EXTRA"):
            raise ValueError("synchronous must be FULL, EXTRA or NORMAL")
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
        self._closed = False
        self.stats = _Stats()
        self._db = self._connect(synchronous)
        # readers get their own connection: they never see a half-built group
        self._rdb = self._db if readonly else sqlite3.connect(
            str(self.path), isolation_level=None, check_same_thread=False, timeout=30.0
        )
        self._read_lock = threading.Lock()

    # ------------------------------------------------------------------ opening

    def _connect(self, synchronous: str) -> sqlite3.Connection:
        if self.readonly:
            if not self.path.exists():
                raise LedgerError(f"no ledger at {self.path}")
            uri = f"file:{self.path}?mode=ro"
            db = sqlite3.connect(uri, uri=True, isolation_level=None, check_same_thread=False)
        else:
            db = sqlite3.connect(str(self.path), isolation_level=None, check_same_thread=False, timeout=30.0)
        try:
            if not self.readonly:
                db.execute("PRAGMA journal_mode=WAL")
                db.execute(f"PRAGMA synchronous={synchronous}")
                db.execute("PRAGMA foreign_keys=ON")
                db.executescript(_SCHEMA)
                row = db.execute("SELECT value FROM meta WHERE key='format'").fetchone()
                if row is None:
                    db.execute("INSERT OR IGNORE INTO meta(key, value) VALUES ('format', ?)", (LEDGER_FORMAT,))
                    row = db.execute("SELECT value FROM meta WHERE key='format'").fetchone()
            else:
                row = db.execute("SELECT value FROM meta WHERE key='format'").fetchone()
        except sqlite3.DatabaseError as exc:
            db.close()
            raise LedgerCorruptError(f"{self.path} is not a capseal ledger ({exc})") from None
        if row is None or row[0] != LEDGER_FORMAT:
            db.close()
            raise LedgerCorruptError(f"{self.path} is not a {LEDGER_FORMAT} ledger")
        return db

    def close(self) -> None:
        """Drain what was submitted (it becomes durable), then close."""
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
            self._db.close()

    def __enter__(self) -> Ledger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Ledger({str(self.path)!r}{', readonly' if self.readonly else ''})"

    # ------------------------------------------------------------------ writing

    def append(self, entry: LedgerEntry) -> StoredEntry:
        """Append one record; returns once it is durable. Raises on refusal."""
        pending = self._enqueue(entry, None, wake=False)
        self._wait([pending], None)
        if pending.error is not None:
            raise pending.error
        assert pending.stored is not None
        return pending.stored

    def append_many(self, entries: Sequence[LedgerEntry]) -> list[StoredEntry]:
        """Append records in order; durable on return. If any is refused, the
        others are still stored and the first refusal is raised after."""
        pendings = [self._enqueue(e, None, wake=False) for e in entries]
        self._wait(pendings, None)
        errors = [p.error for p in pendings if p.error is not None]
        if errors:
            raise errors[0]
        return [p.stored for p in pendings if p.stored is not None]

    def submit(
        self, entry: LedgerEntry, on_durable: Callable[[StoredEntry], None] | None = None, *, wake: bool = True
    ) -> PendingAppend:
        """Queue a record and return at once; a committer thread writes queued
        records in groups (one fsync per group). The record is acknowledged —
        durable — only when ``result()`` returns. ``on_durable`` runs on the
        committing thread right after the commit (keep it short). With
        ``wake=False`` the caller commits it itself when it waits on ``result()``."""
        return self._enqueue(entry, on_durable, wake=wake)

    def _enqueue(self, entry: LedgerEntry, on_durable: Callable[[StoredEntry], None] | None, *, wake: bool) -> PendingAppend:
        if self.readonly:
            raise LedgerError(f"{self} is read-only")
        pending = PendingAppend(entry, self, on_durable)
        with self._mutex:
            if self._closed or self._closing:
                raise LedgerClosedError(f"{self} is closed")
            self._queue.append(pending)
            if wake:
                if self._committer is None:
                    self._committer = threading.Thread(
                        target=self._commit_loop, name=f"capseal-ledger:{self.path.name}", daemon=True
                    )
                    self._committer.start()
                queued = len(self._queue)
                if queued == 1 or queued >= self.group_max:  # wake the committer only when it matters
                    self._cond.notify_all()
        return pending

    def flush(self, timeout: float | None = None) -> None:
        """Wait until everything submitted so far is durable (or refused)."""
        with self._mutex:
            pendings = list(self._queue) + list(self._in_flight)
        self._wait(pendings, timeout)

    def _wait(self, pendings: Sequence[PendingAppend], timeout: float | None) -> None:
        """Wait for ``pendings``; when nobody is writing, commit the queue on
        this thread (group-commit leader) instead of handing it to another."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            with self._mutex:
                if all(p.done for p in pendings):
                    return
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
        while True:
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
        with self._mutex:
            batch, self._queue = self._queue, []
            self._in_flight = batch
        if not batch:
            return
        try:
            self._write(batch)
        except BaseException as exc:  # noqa: BLE001 - every waiter must learn the outcome
            self._head = None
            failure = exc if isinstance(exc, LedgerError) else LedgerError(f"append to {self.path.name} failed: {exc}")
            for p in batch:
                p.error, p.stored = failure, None
        for p in batch:
            if p.stored is not None and p.on_durable is not None:
                try:
                    p.on_durable(p.stored)
                except Exception:  # a callback never undoes a durable append
                    pass
        with self._mutex:
            for p in batch:
                p.done = True
            self._in_flight = []
            self._cond.notify_all()

    def _write(self, batch: list[PendingAppend]) -> None:
        db = self._db
        db.execute("BEGIN IMMEDIATE")
        try:
            if self._head is None:
                row = db.execute("SELECT seq, row_hash FROM records ORDER BY seq DESC LIMIT 1").fetchone()
                self._head = (row[0], row[1]) if row else (0, _GENESIS.hex())
            seq, prev = self._head
            staged: list[tuple[PendingAppend, StoredEntry]] = []
            for p in batch:
                e = p.entry
                nonce = os.urandom(16).hex()
                header = {"seq": seq + 1, "record_id": e.record_id, "record_type": e.record_type,
                          "epistemic_type": e.epistemic_type, "links": [dict(x) for x in e.links], "nonce": nonce}
                row_hash = _row_hash(prev, header, e.body)
                try:
                    db.execute(
                        "INSERT INTO records(seq, record_id, record_type, epistemic_type, links, nonce,"
                        " action_id, stream, tag, body, prev_hash, row_hash) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
                        (seq + 1, e.record_id, e.record_type, e.epistemic_type, dumps_canonical(header["links"]).decode(),
                         nonce, e.action_id, e.stream, e.tag, e.body, prev, row_hash),
                    )
                except sqlite3.IntegrityError as exc:
                    text = str(exc)
                    if "records.seq" in text:
                        # another process appended since our cached head: re-read and retry the group
                        raise _StaleHead from None
                    what = "action_id" if "action_id" in text else "record_id"
                    value = e.action_id if what == "action_id" else e.record_id
                    p.error = DuplicateRecordError(f"{what} {value!r} is already in {self.path.name}")
                    continue
                staged.append((p, StoredEntry(
                    seq=seq + 1, record_id=e.record_id, record_type=e.record_type, epistemic_type=e.epistemic_type,
                    links=e.links, nonce=nonce, body=e.body, prev_hash=prev, row_hash=row_hash,
                    action_id=e.action_id, stream=e.stream, tag=e.tag,
                )))
                seq, prev = seq + 1, row_hash
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
        for p, stored in staged:
            p.stored = stored
        st = self.stats
        st.commits += 1
        st.records += len(staged)
        st.largest_group = max(st.largest_group, len(batch))

    def add_evidence(self, record_id: str, evidence: dict[str, Any] | None) -> EvidenceEntry:
        """Append an evidence state for ``record_id`` (a filled slot, or ``None``
        to record that the slot is empty again). The record's earlier states
        stay in history. Durable on return."""
        if evidence is not None and not evidence:
            raise ValueError("evidence is a filled object, never {}")
        return self._append_evidence([(record_id, dumps_canonical(evidence))])[0]

    def add_evidence_many(self, items: Sequence[tuple[str, dict[str, Any] | bytes]]) -> int:
        """Append the evidence states of several records in ONE transaction
        (one fsync): all are written or none are (a batch quote's slots are
        never half-written). Refused as a whole if any record is unknown.

        An item's evidence may be given already serialized (``bytes`` equal to
        ``dumps_canonical`` of a non-empty object) so a batch writer can build
        the shared part of many slots once instead of once per record.
        Returns the number of evidence rows written."""
        bodies: list[tuple[str, bytes]] = []
        for record_id, evidence in items:
            if isinstance(evidence, (bytes, bytearray)):
                body = bytes(evidence)
                if not body.startswith(b"{") or body == b"{}":
                    raise ValueError("serialized evidence is a filled JSON object, never {}")
            elif not evidence:
                raise ValueError("evidence is a filled object, never {} or None")
            else:
                body = dumps_canonical(evidence)
            bodies.append((record_id, body))
        return len(self._append_evidence(bodies)) if bodies else 0

    def _append_evidence(self, bodies: list[tuple[str, bytes]]) -> list[EvidenceEntry]:
        """One transaction appending evidence rows to the evidence hash chain."""
        with self._side_write():
            if self._closed or self._closing:
                raise LedgerClosedError(f"{self} is closed")
            db = self._db
            db.execute("BEGIN IMMEDIATE")
            try:
                seqs: dict[str, int] = {}
                wanted = list(dict.fromkeys(rid for rid, _ in bodies))
                for i in range(0, len(wanted), 500):
                    chunk = wanted[i : i + 500]
                    marks = ",".join("?" * len(chunk))
                    seqs.update(db.execute(f"SELECT record_id, seq FROM records WHERE record_id IN ({marks})", chunk).fetchall())
                head = db.execute("SELECT eid, row_hash FROM evidence ORDER BY eid DESC LIMIT 1").fetchone()
                eid, prev = (head[0] + 1, head[1]) if head else (1, _GENESIS.hex())
                rows: list[EvidenceEntry] = []
                for record_id, body in bodies:
                    seq = seqs.get(record_id)
                    if seq is None:
                        raise LedgerError(f"no record {record_id} in {self.path.name}")
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
                db.execute("COMMIT")
            except BaseException:
                try:
                    db.execute("ROLLBACK")
                except sqlite3.Error:
                    pass
                raise
        return rows

    # ------------------------------------------------------------------ reading

    def _query(self, sql: str, args: tuple[Any, ...] = ()) -> list[Any]:
        with self._read_lock:
            if self._closed:
                raise LedgerClosedError(f"{self} is closed")
            return self._rdb.execute(sql, args).fetchall()

    @staticmethod
    def _stored(row: Sequence[Any]) -> StoredEntry:
        return StoredEntry(
            seq=row[0], record_id=row[1], record_type=row[2], epistemic_type=row[3],
            links=tuple(json.loads(row[4])), nonce=row[5], action_id=row[6], stream=row[7], tag=row[8],
            body=bytes(row[9]), prev_hash=row[10], row_hash=row[11],
        )

    _COLS = "seq, record_id, record_type, epistemic_type, links, nonce, action_id, stream, tag, body, prev_hash, row_hash"

    def count(self) -> int:
        return int(self._query("SELECT count(*) FROM records")[0][0])

    def entries(self, *, batch: int = 2000) -> Iterator[StoredEntry]:
        """Every record row in seq order."""
        last = 0
        while True:
            rows = self._query(f"SELECT {self._COLS} FROM records WHERE seq > ? ORDER BY seq LIMIT ?", (last, batch))
            if not rows:
                return
            for row in rows:
                yield self._stored(row)
            last = rows[-1][0]

    def evidence_entries(self) -> Iterator[EvidenceEntry]:
        for row in self._query("SELECT eid, record_seq, record_id, body, prev_hash, row_hash FROM evidence ORDER BY eid"):
            yield EvidenceEntry(row[0], row[1], row[2], bytes(row[3]), row[4], row[5])

    def entry(self, record_id: str) -> StoredEntry | None:
        rows = self._query(f"SELECT {self._COLS} FROM records WHERE record_id=?", (record_id,))
        return self._stored(rows[0]) if rows else None

    def evidence_history(self, record_id: str) -> list[dict[str, Any] | None]:
        """Every evidence state of a record, oldest first, starting with the
        ``None`` it was sealed with."""
        rows = self._query("SELECT body FROM evidence WHERE record_id=? ORDER BY eid", (record_id,))
        history: list[dict[str, Any] | None] = [None]
        history += [json.loads(r[0]) or None for r in rows]
        return history

    def current_evidence(self, record_id: str) -> dict[str, Any] | None:
        rows = self._query("SELECT body FROM evidence WHERE record_id=? ORDER BY eid DESC LIMIT 1", (record_id,))
        return (json.loads(rows[0][0]) or None) if rows else None

    def get(self, record_id: str) -> SealedRecord | None:
        """The sealed record with its current evidence slot, or None."""
        stored = self.entry(record_id)
        if stored is None or stored.record_type != "capsule":
            return None
        record = SealedRecord.from_json(stored.record(), seq=stored.seq)
        return record.with_evidence(self.current_evidence(record_id))

    def records(self) -> Iterator[SealedRecord]:
        """Every sealed capsule record in order, with its current evidence."""
        evidence: dict[str, dict[str, Any] | None] = {}
        for ev in self.evidence_entries():
            evidence[ev.record_id] = ev.evidence()
        for stored in self.entries():
            if stored.record_type == "capsule":
                rec = SealedRecord.from_json(stored.record(), seq=stored.seq)
                yield rec.with_evidence(evidence.get(stored.record_id))

    def last_tagged(self, tag: str, stream: str) -> StoredEntry | None:
        rows = self._query(
            f"SELECT {self._COLS} FROM records WHERE tag=? AND stream=? ORDER BY seq DESC LIMIT 1", (tag, stream)
        )
        return self._stored(rows[0]) if rows else None

    # ------------------------------------------------------------------ integrity

    def check_chain(self) -> list[str]:
        """Recompute both hash chains; returns problems (empty when intact)."""
        problems: list[str] = []
        prev, expected_seq = _GENESIS.hex(), 1
        for stored in self.entries():
            if stored.seq != expected_seq:
                problems.append(f"seq {stored.seq}: expected {expected_seq} (gap or reorder)")
            if stored.prev_hash != prev:
                problems.append(f"seq {stored.seq}: prev_hash does not match the previous row")
            if _row_hash(stored.prev_hash, stored.header(), stored.body) != stored.row_hash:
                problems.append(f"seq {stored.seq}: row_hash does not match its header and body")
            prev, expected_seq = stored.row_hash, stored.seq + 1
        prev = _GENESIS.hex()
        for ev in self.evidence_entries():
            if ev.prev_hash != prev or _row_hash(ev.prev_hash, _evidence_header(ev.record_seq, ev.record_id, ev.eid), ev.body) != ev.row_hash:
                problems.append(f"evidence {ev.eid}: hash chain broken")
            prev = ev.row_hash
        return problems

    # ------------------------------------------------------------------ export / import

    def export_jsonl(self, out: IO[bytes]) -> int:
        """Write every row as one JSON line (records, then evidence). Returns lines."""
        n = 0
        for stored in self.entries():
            header = {**stored.header(), "action_id": stored.action_id, "stream": stored.stream, "tag": stored.tag,
                      "prev_hash": stored.prev_hash, "row_hash": stored.row_hash}
            out.write(b'{"header":' + dumps_canonical(header) + b',"kind":"record","record":' + stored.body + b"}\n")
            n += 1
        for ev in self.evidence_entries():
            header = {**_evidence_header(ev.record_seq, ev.record_id, ev.eid), "prev_hash": ev.prev_hash, "row_hash": ev.row_hash}
            out.write(b'{"evidence":' + ev.body + b',"header":' + dumps_canonical(header) + b',"kind":"evidence"}\n')
            n += 1
        return n

    @classmethod
    def import_jsonl(cls, src: IO[bytes], path: str | os.PathLike[str]) -> Ledger:
        """Build a new ledger at ``path`` from an export, checking every hash.
        Refuses (and leaves no file) if any line is malformed or the chain breaks."""
        target = Path(path)
        if target.exists():
            raise LedgerError(f"{target} already exists; import builds a new ledger")
        ledger = cls(target)
        try:
            ledger._import(src)
        except BaseException:
            ledger.close()
            for suffix in ("", "-wal", "-shm"):
                Path(str(target) + suffix).unlink(missing_ok=True)
            raise
        return ledger

    def _import(self, src: IO[bytes]) -> None:
        db = self._db
        db.execute("BEGIN IMMEDIATE")
        prev, eprev = _GENESIS.hex(), _GENESIS.hex()
        try:
            for lineno, line in enumerate(src, 1):
                try:
                    item = json.loads(line)
                except ValueError as exc:
                    raise MalformedJSONError(f"line {lineno}: not JSON ({exc})") from None
                if not isinstance(item, dict) or item.get("kind") not in ("record", "evidence"):
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
                        db.execute(
                            f"INSERT INTO records({self._COLS}) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
                            (h["seq"], h["record_id"], h["record_type"], h["epistemic_type"],
                             dumps_canonical(h["links"]).decode(), h["nonce"], h.get("action_id"), h.get("stream"),
                             h.get("tag"), body, h["prev_hash"], h["row_hash"]),
                        )
                        prev = h["row_hash"]
                    else:
                        body = dumps_canonical(item["evidence"])
                        header = _evidence_header(h["record_seq"], h["record_id"], h["eid"])
                        if h["prev_hash"] != eprev or _row_hash(eprev, header, body) != h["row_hash"]:
                            raise LedgerCorruptError(f"line {lineno}: evidence hash chain broken at {h['eid']}")
                        db.execute(
                            "INSERT INTO evidence(eid, record_seq, record_id, body, prev_hash, row_hash) VALUES (?,?,?,?,?,?)",
                            (h["eid"], h["record_seq"], h["record_id"], body, h["prev_hash"], h["row_hash"]),
                        )
                        eprev = h["row_hash"]
                except (KeyError, TypeError) as exc:
                    raise MalformedJSONError(f"line {lineno}: missing or malformed field {exc}") from None
                except sqlite3.IntegrityError as exc:
                    raise LedgerCorruptError(f"line {lineno}: {exc}") from None
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
