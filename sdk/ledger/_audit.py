"""What ``verify_ledger`` checks of a ledger file itself, beside its records.

* **why it could not be read at all**, as a finding: a file that is empty,
  not SQLite (or has a damaged header), another application's database, or
  damaged past opening is an error of the file (``ledger_empty``,
  ``ledger_not_capseal``, ``ledger_corrupt``); only what says nothing about
  the file (it is missing, unreadable to this user, locked, of a format
  this capseal does not read) is ``ledger_unreadable``;
* **the engine's integrity check** (``ledger_integrity_failed``): for SQLite,
  a damaged page, an index that no longer matches its table (one flipped bit
  in an index makes a lookup miss, and a duplicate then goes in);
* **the chains' heads** (``ledger_tail_missing``, ``ledger_head_mismatch``):
  the head each chain recorded (in ``meta`` and in the side file), against
  the rows that can be read (see :mod:`._head`);
* **the lookup columns** (``ledger_column_mismatch``): a row's
  ``action_id``, ``stream`` and ``tag``, outside its row hash, against what
  its hashed body gives.

Reading goes on past damage: the reader here is read-only and lenient (a
file shorter than its header says is read as far as it goes), and rows
the engine cannot read are skipped and reported, so the rest are still checked.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ..errors import LedgerBusyError, LedgerCorruptError, LedgerFormatError, NotALedgerError
from ..findings import Finding
from . import _head
from ._columns import row_columns
from ._format import StoredEntry
from ._ledger import Ledger
from ._pg_url import is_database_url
from ._sqlite_open import is_busy

__all__ = ["AuditLedger", "ChainTail", "empty_finding", "failure_finding", "file_findings", "column_findings"]


class AuditLedger(Ledger):
    """A ledger opened to be audited: read-only, reading on past damage, and
    reading the heads its side file records as each snapshot begins (so they
    name no commit the snapshot cannot see: writers write that file after
    each commit).

    Args:
        path: the ledger file.

    Raises:
        LedgerError (and its subclasses): as :class:`Ledger` opened read-only.
    """

    _lenient_reads = True

    def __init__(self, path: str | os.PathLike[str], *, lock_timeout: float = 30.0) -> None:
        super().__init__(path, readonly=True, lock_timeout=lock_timeout)


def empty_finding(path: str | Path) -> Finding | None:
    """Whether the file holds nothing to read.

    Args:
        path: the ledger file.

    Returns:
        ``ledger_empty`` for a file of 0 bytes with no ``-wal`` beside it, else None.
    """
    if is_database_url(path):
        return None  # a server ledger: an empty schema is refused on opening
    try:
        if os.path.getsize(path) == 0 and not os.path.exists(f"{path}-wal"):
            return Finding("ledger_empty", f"{path} is 0 bytes: it holds no ledger (truncated to nothing?)")
    except OSError:
        pass
    return None


def failure_finding(exc: BaseException) -> Finding:
    """The finding for a ledger that could not be opened or read through.

    Args:
        exc: what opening or reading it raised.

    Returns:
        ``ledger_not_capseal``, ``ledger_corrupt`` (the file's fault) or
        ``ledger_unreadable`` (nothing said about the file).
    """
    text = f"{type(exc).__name__}: {exc}"
    if isinstance(exc, (LedgerFormatError, LedgerBusyError)):
        return Finding("ledger_unreadable", text)
    if isinstance(exc, NotALedgerError):
        return Finding("ledger_not_capseal", text)
    if isinstance(exc, LedgerCorruptError) or (isinstance(exc, sqlite3.DatabaseError) and not is_busy(exc)):
        return Finding("ledger_corrupt", text)
    return Finding("ledger_unreadable", text)


class ChainTail:
    """What the head check needs of the record rows, kept as they are read
    (in bounded memory): the last seq, and the row hash at each seq a head
    names.

    Args:
        ledger: the ledger, inside its snapshot (its recorded heads are read here).
    """

    def __init__(self, ledger: Ledger) -> None:
        self.last = 0
        self.hashes: dict[int, Any] = {}
        try:
            self._wanted = {h.position for h in ledger._storage.recorded_heads().heads if h.kind == "records"}
        except Exception:  # heads that cannot be read: file_findings says why
            self._wanted = set()

    def add(self, entry: StoredEntry) -> None:
        """Note one record row (in seq order)."""
        self.last = max(self.last, entry.seq)
        if entry.seq in self._wanted:
            self.hashes[entry.seq] = entry.row_hash


def file_findings(ledger: Ledger, entries: Iterable[StoredEntry] | ChainTail) -> list[Finding]:
    """The engine's integrity check, and the heads of both chains. Never
    raises for what the file holds.

    Args:
        ledger: the ledger, inside its snapshot.
        entries: the record rows read (as far as they could be), or a
            :class:`ChainTail` that saw them.

    Returns:
        The findings (empty when the file is sound).

    Raises:
        LedgerBusyError: another connection kept the file locked too long.
    """
    storage = ledger._storage
    findings = [Finding("ledger_integrity_failed", text) for text in storage.integrity_check()]
    if not isinstance(entries, ChainTail):
        rows = {e.seq: e.row_hash for e in entries}
        return findings + _heads(ledger, max(rows, default=0), rows.get)
    return findings + _heads(ledger, entries.last, entries.hashes.get)


def _heads(ledger: Ledger, last_record: int, record_hash: Any) -> list[Finding]:
    storage = ledger._storage
    try:
        recorded = storage.recorded_heads()
        wanted = {h.position for h in recorded.heads if h.kind == "evidence"}
        last_evidence, evidence = 0, {}
        for ev in storage.evidence_rows(batch=500, damaged=[]):
            last_evidence = max(last_evidence, ev.eid)
            if ev.eid in wanted:
                evidence[ev.eid] = ev.row_hash
    except storage.damage_errors as exc:  # the heads cannot be read: the integrity check says why
        if is_busy(exc):
            raise
        return [Finding("ledger_head_unreadable", f"the heads in meta cannot be read ({exc})", severity="warning")]
    findings = [Finding("ledger_head_mismatch", f"{text}: the file was edited") for text in recorded.damaged]
    findings += [Finding("ledger_head_unreadable", text, severity="warning") for text in recorded.unreadable]
    chains = {"records": (last_record, record_hash), "evidence": (last_evidence, evidence.get)}
    for head in recorded.heads:
        last, hash_at = chains[head.kind]
        problem = _head.shortfall(head, last, hash_at)
        if problem is not None:
            how, text = problem
            findings.append(Finding("ledger_tail_missing" if how == "missing" else "ledger_head_mismatch", text))
    return findings


def column_findings(entry: StoredEntry, record: Any) -> list[Finding]:
    """Whether a row's lookup columns (outside its row hash) were edited.

    Args:
        entry: the row.
        record: its parsed body (the columns must be what it gives: :func:`row_columns`).

    Returns:
        ``ledger_column_mismatch`` naming each edited column, or nothing.
    """
    expected = row_columns(entry.record_type, record)
    found = (entry.action_id, entry.stream, entry.tag)
    bad = [f"{name} {got!r} where its body gives {want!r}"
           for name, got, want in zip(("action_id", "stream", "tag"), found, expected) if got != want]
    if not bad:
        return []
    return [Finding("ledger_column_mismatch", f"the row's lookup columns were edited: {'; '.join(bad)}")]
