"""What ``verify_ledger`` checks of a ledger file itself, beside its records.

* **why it could not be read at all**, as a finding: a file that is empty,
  not SQLite (or has a damaged header), another application's database, or
  damaged past opening is an error of the file (``ledger_empty``,
  ``ledger_not_capseal``, ``ledger_corrupt``); only what says nothing about
  the file (it is missing, unreadable to this user, locked, of a format
  this capseal does not read) is ``ledger_unreadable``;
* **SQLite's integrity check** (``ledger_integrity_failed``): a damaged page,
  an index that no longer matches its table (one flipped bit in an index
  makes a lookup miss, and a duplicate then goes in);
* **the chains' heads** (``ledger_tail_missing``, ``ledger_head_mismatch``):
  the head each chain recorded in ``meta`` and in its side file, against
  the rows that can be read (see :mod:`._ledger_head`);
* **the lookup columns** (``ledger_column_mismatch``): a row's
  ``action_id``, ``stream`` and ``tag``, outside its row hash, against what
  its hashed body gives.

Reading goes on past damage: the reader here is read-only and lenient (a
file shorter than its header says is read as far as it goes), and rows
SQLite cannot read are skipped and reported, so the rest are still checked.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from . import _ledger_head
from ._ledger_columns import row_columns
from .errors import LedgerBusyError, LedgerCorruptError, LedgerFormatError, NotALedgerError
from .findings import Finding
from .ledger import Ledger, StoredEntry, _is_busy

__all__ = ["AuditLedger", "empty_finding", "failure_finding", "file_findings", "column_findings"]

_MAX_INTEGRITY = 10  # messages from SQLite's integrity check reported one by one; the rest are counted


class AuditLedger(Ledger):
    """A ledger opened read-only to be audited: it reads on past damage, and
    reads its side file as each snapshot begins (see :attr:`side`)."""

    _lenient_reads = True
    #: the side file's heads and problems, read as the latest snapshot began:
    #: before its first query, so they name no commit the snapshot cannot see
    #: (writers write the file after each commit)
    side: tuple[list[tuple[str, _ledger_head.Head]], list[str]] = ([], [])

    @contextmanager
    def snapshot(self) -> Iterator[None]:
        if getattr(self._snap, "db", None) is None:  # a new snapshot, not a nested one
            self.side = _ledger_head.side_heads(self._real_path)
        with super().snapshot():
            yield


def empty_finding(path: str | Path) -> Finding | None:
    """Whether the file holds nothing to read.

    Args:
        path: the ledger file.

    Returns:
        ``ledger_empty`` for a file of 0 bytes with no ``-wal`` beside it, else None.
    """
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
    if isinstance(exc, LedgerCorruptError) or (isinstance(exc, sqlite3.DatabaseError) and not _is_busy(exc)):
        return Finding("ledger_corrupt", text)
    return Finding("ledger_unreadable", text)


def file_findings(ledger: Ledger, entries: Iterable[StoredEntry]) -> list[Finding]:
    """SQLite's integrity check, and the heads of both chains. Never raises
    for what the file holds.

    Args:
        ledger: the ledger, inside its snapshot.
        entries: the record rows read (as far as they could be).

    Returns:
        The findings (empty when the file is sound).
    """
    return _integrity(ledger) + _heads(ledger, {e.seq: e.row_hash for e in entries})


def _integrity(ledger: Ledger) -> list[Finding]:
    rows: list[Any] | None = None
    for limit in (100, 10, 1):  # a check that goes on far enough into the damage can stop on it: fewer, then
        try:
            rows = ledger._query(f"PRAGMA integrity_check({limit})")
            break
        except sqlite3.DatabaseError as exc:
            if _is_busy(exc):
                raise
            error = exc
    if rows is None:
        return [Finding("ledger_integrity_failed", f"SQLite's integrity check stopped on the damage: {error}")]
    messages = [line for row in rows for line in str(row[0]).splitlines()
                if line != "ok" and not line.startswith("*** in database")]
    findings = [Finding("ledger_integrity_failed", f"SQLite's integrity check: {m}") for m in messages[:_MAX_INTEGRITY]]
    if len(messages) > _MAX_INTEGRITY:
        findings.append(Finding("ledger_integrity_failed",
                                f"SQLite's integrity check: {len(messages) - _MAX_INTEGRITY} more problem(s)"))
    return findings


def _heads(ledger: Ledger, records: dict[int, Any]) -> list[Finding]:
    try:
        ident = _ledger_head.ledger_id(ledger._query)
        heads, damaged = _ledger_head.meta_heads(ledger._query)
        evidence = {ev.eid: ev.row_hash for ev in ledger.evidence_entries(damaged=[])}
    except sqlite3.DatabaseError as exc:  # meta cannot be read: the integrity check says why
        if _is_busy(exc):
            raise
        return [Finding("ledger_head_unreadable", f"the heads in meta cannot be read ({exc})", severity="warning")]
    heads_in_file, unreadable = ledger.side if isinstance(ledger, AuditLedger) else _ledger_head.side_heads(ledger._real_path)
    side = [head for owner, head in heads_in_file if owner == ident]
    findings = [Finding("ledger_head_mismatch", f"{text}: the file was edited") for text in damaged]
    findings += [Finding("ledger_head_unreadable", text, severity="warning") for text in unreadable]
    rows = {"records": records, "evidence": evidence}
    for head in heads + side:
        chain = rows[head.kind]
        problem = _ledger_head.shortfall(head, max(chain, default=0), chain.get)
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
