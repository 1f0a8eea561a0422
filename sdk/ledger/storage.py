"""The storage seam: what a :class:`~capseal.ledger.Ledger` needs from the
engine that keeps its rows.

The Ledger does the ledger's own work, the same over every engine: the
record format and row hashes, group commit (one transaction for many
appends), pairs that are written together or not at all, evidence batches,
chain checks, export and import. An engine only stores and reads rows; it
never hashes, and never decides what a row holds. The embedded engine is
SQLite (one file in WAL mode). Another engine (a database server many hosts
append to) implements :class:`Storage` and :class:`Transaction`, keeping
these promises:

* **durable on commit**: when a :meth:`Storage.write` block ends without an
  error, its rows survive a crash of the process and of the machine (the
  commit is on disk before the block returns); when it ends with an error,
  none of its rows is stored.
* **append-only**: the engine refuses to change or delete a stored row; rows
  are appended in key order (``seq`` for records, ``eid`` for evidence).
* **the heads it keeps**: each chain's last row (position and row hash) is
  recorded by the transaction that appends it, where a loss of rows from the
  end shows (:meth:`Storage.recorded_heads`); a write refuses a chain that
  falls short of a recorded head (:meth:`Transaction.records_head`).
* **one writer per chain at a time**: the head :meth:`Transaction.records_head`
  gives stays the head until the transaction ends (SQLite: its write lock,
  taken by ``BEGIN IMMEDIATE``), or an add on a head another writer moved
  raises ``DuplicateRow("seq")``, and the Ledger reads the head again and
  writes the group anew.
* **one record per id**: ``record_id`` is unique, and so is a capsule's
  action id as its *body* gives it (``$.capsule.action_id``), not the
  ``action_id`` column (outside the row hash); another record's
  ``action_id`` column is unique too, in the same key space (one id is
  taken once, whichever record took it). Ids are compared whole: two that
  differ only after a U+0000 are two ids. A unit of rows holding a key the
  store has is refused whole (:class:`DuplicateRow`), the rest of its
  transaction unharmed.
* **lookups read the hashed body**: for a capsule, the action id and the
  epoch boundaries of a stream are found from the body; the ``action_id``,
  ``stream`` and ``tag`` columns are stored as given, and only read back.
* **snapshots**: inside :meth:`Storage.snapshot` every read of the thread
  sees the store as of the snapshot's first read.
* **damage is read past when asked**: given a ``damaged`` list, a reading of
  rows skips what it cannot read, describing each stretch in the list, and
  hands back a row whose members are of the wrong types with ``damage`` set
  (placeholders for the rest); without one it raises (:attr:`Storage.damage_errors`).
* **a forked copy touches nothing**: in a process forked from the one that
  opened it, every call raises LedgerForkedError before it reaches the
  engine's connections (which belong to the parent).

What the engine keeps beside the rows (indexes, the recorded heads) is its
own; what a verifier needs of it comes through :meth:`Storage.integrity_check`
and :meth:`Storage.recorded_heads`. A Ledger makes its engine in one place
(``open_storage`` beside the Ledger class), where another engine is chosen
from what the Ledger is given (a file path today).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from ._evidence import EvidenceEntry
from ._format import StoredEntry

__all__ = ["Storage", "Transaction", "DuplicateRow", "Head", "RecordedHeads"]


class DuplicateRow(Exception):
    """A unit of rows was not added: one of them holds a key the store has.

    Attributes:
        column: the key: ``"seq"`` or ``"eid"`` (a row is at that position
            already: another writer appended since the head was read),
            ``"record_id"``, ``"action_id"`` (the column, or a capsule's body).
        index: which row of the unit.
        detail: the engine's own words (for a message).
    """

    def __init__(self, column: str, index: int, detail: str) -> None:
        super().__init__(detail)
        self.column, self.index, self.detail = column, index, detail


@dataclass(frozen=True)
class Head:
    """One chain's head as the store recorded it.

    Attributes:
        kind: ``"records"`` or ``"evidence"``.
        position: the last row's seq or eid.
        row_hash: its row hash.
        source: where it was read, for messages (e.g. "its meta head").
    """

    kind: str
    position: int
    row_hash: str
    source: str


@dataclass(frozen=True)
class RecordedHeads:
    """The heads a store recorded, for a verifier to hold the chains to.

    Attributes:
        heads: every head recorded (a chain may have several).
        damaged: one sentence per head that was edited (not a head any more).
        unreadable: one sentence per head that cannot be read (a torn
            write, say): a warning, not proof of an edit.
    """

    heads: list[Head] = field(default_factory=list)
    damaged: list[str] = field(default_factory=list)
    unreadable: list[str] = field(default_factory=list)


class Transaction(Protocol):
    """One write transaction (see :meth:`Storage.write`)."""

    def records_head(self) -> tuple[int, str]:
        """The records chain's last row, read in this transaction.

        Returns:
            ``(seq, row_hash)``; ``(0, GENESIS)`` for an empty chain.

        Raises:
            LedgerCorruptError: the chain falls short of a head the store
                recorded, or its last row hash is damaged: appending would
                hide a loss (nothing is written).
        """
        ...

    def add_records(self, rows: Sequence[StoredEntry]) -> None:
        """Add a unit of record rows (one record, or a pair written together).

        Args:
            rows: the rows, hashed and numbered by the caller, in seq order.

        Raises:
            DuplicateRow: a row's key is in the store already; none of
                ``rows`` is added, what the transaction added before stays.
        """
        ...

    def record_seqs(self, record_ids: Sequence[str]) -> dict[str, int]:
        """The seq of each of ``record_ids`` the store holds.

        Args:
            record_ids: record ids (any number).

        Returns:
            ``record_id -> seq``, for those found.
        """
        ...

    def evidence_head(self) -> tuple[int, str]:
        """The evidence chain's last row: ``(eid, row_hash)``, ``(0, GENESIS)``
        for none; checked as :meth:`records_head` is.

        Returns:
            ``(eid, row_hash)`` of the last evidence row.

        Raises:
            LedgerCorruptError: as :meth:`records_head`.
        """
        ...

    def add_evidence(self, rows: Sequence[EvidenceEntry], members: Sequence[tuple[int, int, int]]) -> None:
        """Add evidence rows and their index rows.

        Args:
            rows: evidence rows in eid order (slot rows, or one batch row).
            members: ``(record_seq, eid, leaf_index)`` per record each row
                gives a state (leaf index -1 for a slot row).

        Raises:
            DuplicateRow: a row's key is in the store already (an import of
                a damaged export); the transaction should be abandoned.
        """
        ...


@runtime_checkable
class Storage(Protocol):
    """An engine a Ledger keeps its rows in.

    Attributes:
        name: a short name for messages (a file's name).
        location: where the store is, as the engine resolved it (a file's
            real path): the same store opened twice has one location.
        readonly: opened for reading only.
        write_lock: held by the caller around every :meth:`write` (and while
            the ledger commits and runs its commit callbacks); one write
            transaction at a time per Storage object.
        read_lock: held by the engine around each read; with ``write_lock``,
            what a fork takes so that no call is under way in the copy.
        damage_errors: what a read raises for a part of the store it cannot
            read (damage, not a lock: a lock held too long is LedgerBusyError).
    """

    name: str
    location: str
    readonly: bool
    write_lock: threading.Lock
    read_lock: threading.Lock
    damage_errors: tuple[type[BaseException], ...]

    def open(self) -> None:
        """Connect, checking that the store is a ledger of this format (a new
        or empty one is made a ledger, unless read-only); the caller holds
        :attr:`write_lock`.

        Raises:
            NotALedgerError: the store holds something else (nothing written).
            LedgerFormatError: a ledger of another format.
            LedgerCorruptError, LedgerBusyError, LedgerError: damaged, locked
                too long, or not there.
        """
        ...

    def write(self, what: str) -> AbstractContextManager[Transaction]:
        """``with storage.write("append to") as tx:`` one write transaction,
        committed durably when the block ends, rolled back if it raises.

        Args:
            what: what the write does, for messages ("append to").

        Returns:
            A context manager yielding the transaction.

        Raises:
            LedgerBusyError: another writer kept the store locked too long
                (nothing begun; raised as the block is entered).
            LedgerError: the store is read-only (LedgerClosedError: closed;
                LedgerForkedError: in a forked copy).
        """
        ...

    def snapshot(self) -> AbstractContextManager[None]:
        """This thread's reads inside the block see one state of the store
        (nesting reuses the outer snapshot).

        Returns:
            A context manager; its block reads one state of the store.

        Raises:
            LedgerClosedError: the store is closed.
        """
        ...

    def count(self) -> int:
        """How many record rows the store holds.

        Returns:
            The number of record rows.
        """
        ...

    def record_rows(self, *, batch: int, damaged: list[str] | None) -> Iterator[StoredEntry]:
        """Every record row in seq order.

        Args:
            batch: rows read at a time.
            damaged: None to raise on damage; or a list to read on past it
                (see the module's promises).

        Returns:
            An iterator of rows.
        """
        ...

    def record_row(self, record_id: str) -> StoredEntry | None:
        """The record row with this id, or None.

        Args:
            record_id: the record's id (a capsule's capsule id).

        Returns:
            The row, or None when no record has this id.

        Raises:
            LedgerCorruptError: the row is not one capseal writes.
        """
        ...

    def has_record(self, record_id: str) -> bool:
        """Whether a record with this id is stored.

        Args:
            record_id: the record's id.

        Returns:
            True when it is stored.
        """
        ...

    def has_action_id(self, action_id: str) -> bool:
        """Whether a capsule whose body carries this action id, or another
        record given it as its ``action_id``, is stored.

        Args:
            action_id: the action id looked for.

        Returns:
            True when such a record is stored.
        """
        ...

    def last_tagged(self, tag: str, stream: str) -> StoredEntry | None:
        """The last record given ``tag`` in ``stream`` (for ``"epoch_boundary"``:
        the last epoch-boundary capsule whose body names the stream's
        operator and developer), or None.

        Args:
            tag: the tag given at append (``"epoch_boundary"``).
            stream: the stream (a producer's operator and developer).

        Returns:
            The last such row, or None.

        Raises:
            LedgerCorruptError: the row found is not one capseal writes.
        """
        ...

    def evidence_rows(self, *, batch: int, damaged: list[str] | None) -> Iterator[EvidenceEntry]:
        """Every evidence row in eid order.

        Args:
            batch: rows read at a time.
            damaged: as for :meth:`record_rows`.

        Returns:
            An iterator of evidence rows.
        """
        ...

    def evidence_states(self, record_id: str, *, latest: bool) -> list[tuple[int, Any, Any]]:
        """The index rows that give the record a state, in eid order.

        Args:
            record_id: the record.
            latest: only the last one.

        Returns:
            ``(eid, leaf_index, body)`` each: a slot row's body, or None and
            the leaf of batch row ``eid`` (:meth:`evidence_body`). Values are
            as stored (a damaged row's may be of other types).
        """
        ...

    def evidence_body(self, eid: int) -> Any:
        """The body of evidence row ``eid``, as stored.

        Args:
            eid: the position of a stored evidence row.

        Returns:
            Its body, as stored.
        """
        ...

    def evidence_index(self) -> set[tuple[int, int, int]]:
        """Every index row.

        Returns:
            ``(record_seq, eid, leaf_index)`` for each.

        Raises:
            LedgerCorruptError: the index cannot be read.
        """
        ...

    def evidence_index_rows(self, *, batch: int) -> Iterator[tuple[int, int, int]]:
        """Every index row, ``(record_seq, eid, leaf_index)``, in key order,
        read ``batch`` at a time (memory bounded, unlike :meth:`evidence_index`).

        Raises:
            LedgerCorruptError: the index cannot be read.
        """
        ...

    def epoch_boundaries(self, *, batch: int) -> Iterator[StoredEntry]:
        """Every epoch-boundary capsule row (any stream), in seq order, found
        from the bodies as :meth:`last_tagged` finds them: a verifier learns
        the keys their custody statements name before it reads the records.

        Raises:
            LedgerCorruptError: a row found is not one capseal writes.
        """
        ...

    def integrity_check(self) -> list[str]:
        """The engine's own check of its storage (pages, indexes).

        Returns:
            One sentence per problem (empty when sound; a long list may end
            with a count of the rest).
        """
        ...

    def recorded_heads(self) -> RecordedHeads:
        """The heads of both chains the store recorded (for a verifier).

        Returns:
            Every head recorded, and those edited or unreadable.
        """
        ...

    def connections(self) -> list[Any]:
        """The engine's open connections (the fork machinery keeps a forked
        copy's from being used or closed the ordinary way).

        Returns:
            The connection objects, engine-specific.
        """
        ...

    def close(self) -> bool:
        """Close the store; the caller holds :attr:`write_lock`.

        Returns:
            True when nothing of it is left open; False while a snapshot
            on another thread still is (its next read is refused).
        """
        ...
