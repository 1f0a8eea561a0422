"""The durable, append-only capseal ledger: embedded (SQLite in WAL mode, standard
library only, the default), or on a PostgreSQL server for fleets of producers
(``Ledger("postgresql://…")``, the ``postgres`` extra: psycopg 3).

>>> from capseal.ledger import Ledger
>>> with Ledger("capsules.db") as ledger:  # doctest: +SKIP
...     print(ledger.count(), ledger.check_chain())

Public names: :class:`Ledger`; the rows :class:`LedgerEntry` (what a writer
hands it), :class:`StoredEntry`, :class:`EvidenceEntry`, :class:`PendingAppend`
(a queued append); :data:`LEDGER_FORMAT`; the evidence helpers
:func:`batch_root`, :class:`BatchRoot`, :func:`batch_slot`; the row format
:func:`row_hash`, :data:`GENESIS`, :func:`evidence_header`,
:func:`batch_header` (for tools that check rows themselves); for
:mod:`capseal.audit`, :class:`AuditLedger` and the file findings
:func:`empty_finding`, :func:`failure_finding`, :func:`file_findings` (with :class:`ChainTail`),
:func:`column_findings`; for a ledger on a PostgreSQL server,
:class:`DatabaseURL` (``Ledger.path`` there), :func:`as_url`, :func:`is_database_url` and
:func:`redact_url` (a URL as capseal shows it: no password); :class:`IdIndex`
(record ids in 16 bytes each, in a file past a quarter of a million, for a
walk over a whole ledger). Public modules: :mod:`capseal.ledger.storage` (the
interface an engine implements). Every other module here is private.

What it promises:
  * **append-only**: the engine refuses to change or delete a row (SQLite:
    triggers refuse UPDATE and DELETE); every row is hash-chained to the one
    before it, so an edit of a row's header or body made behind the engine's
    back is detectable;
  * **a head it knows**: each chain's head (last seq or eid, and row hash) is
    kept in ``meta`` by the transaction that appends, and in a side file
    ``<ledger>-head`` after each commit. Rows deleted from the end, a file
    cut short, and a ``-wal`` lost before it was checkpointed are found by
    ``verify_ledger``, and the next append is refused (LedgerCorruptError,
    nothing written) rather than cover the loss up. What no head kept beside
    the file shows: a deletion made together with a rewrite of both heads, a
    chain rebuilt with its heads, or a lost ``-wal`` whose side file went
    with it (the main file copied alone): those need a signed head kept
    elsewhere (e.g. a transparency receipt);
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
    history. A quote over a batch's Merkle root is stored ONCE, with a small
    index row per record; each record's slot, inclusion proof included, is
    rebuilt from it on read (RFC 9162, :mod:`capseal.merkle`).

Export to JSON Lines and import back are byte-identical (``export_jsonl`` of an
imported ledger equals the file it was imported from). The format stays
``capseal-ledger/2``: the body-read indexes are added to an older file on its
first write-open, and a capseal without them reads and appends to it as before.

A Ledger belongs to the process that opened it. In a process forked from that
one without exec, every operation raises LedgerForkedError before it touches
SQLite or the queue, ``close()`` only marks that copy closed, and a new Ledger
opened there works normally, on the same file too.
"""

from __future__ import annotations

from ._audit import AuditLedger, ChainTail, column_findings, empty_finding, failure_finding, file_findings
from ._commit import PendingAppend
from ._evidence import BatchRoot, EvidenceEntry, batch_root, batch_slot
from ._format import GENESIS, LEDGER_FORMAT, LedgerEntry, StoredEntry, batch_header, evidence_header, row_hash
from ._idindex import IdIndex
from ._ledger import Ledger
from ._pg_url import DatabaseURL, as_url, is_database_url, redact_url

__all__ = [
    "Ledger", "LedgerEntry", "StoredEntry", "EvidenceEntry", "PendingAppend", "LEDGER_FORMAT", "batch_root",
    "batch_slot", "BatchRoot", "row_hash", "GENESIS", "evidence_header", "batch_header",
    "AuditLedger", "ChainTail", "empty_finding", "failure_finding", "file_findings", "column_findings",
    "DatabaseURL", "as_url", "is_database_url", "redact_url", "IdIndex",
]
