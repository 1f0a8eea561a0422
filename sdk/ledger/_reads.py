"""The ledger's reads: records, evidence slots and their history, by id or in
order, each in one consistent state of the store. :class:`capseal.ledger.Ledger`
inherits them; every read goes through its storage engine (``_storage``)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from ..record import SealedRecord
from ._evidence import CurrentSlots, EvidenceEntry, SlotReader
from ._format import StoredEntry
from .storage import Storage

__all__ = ["LedgerReads"]


class LedgerReads:
    """What a ledger answers about what it holds (see :class:`capseal.ledger.Ledger`)."""

    _storage: Storage
    _slots: SlotReader

    @contextmanager
    def snapshot(self) -> Iterator[None]:
        """``with ledger.snapshot():`` this thread's reads see the file as of
        the first one (one read transaction of a private connection), so a
        walk over records and evidence is consistent while others append.
        Nesting reuses it.

        Returns:
            A context manager (the block reads one state of the file).

        Raises:
            LedgerClosedError, LedgerForkedError.
        """
        with self._storage.snapshot():
            yield

    def count(self) -> int:
        """How many records the ledger holds.

        Returns:
            The number of records, of every type.

        Raises:
            LedgerClosedError: the ledger is closed.
            LedgerForkedError: in a process forked from the ledger's.
            LedgerBusyError: another connection kept the file locked too long.
        """
        return self._storage.count()

    def has_action_id(self, action_id: str) -> bool:
        """Whether a record with this action_id is already in the file: a
        capsule whose body carries it (the ``action_id`` column, outside the
        row hash, is not read for capsules), or another record given it.

        Args:
            action_id: the action id looked for.

        Returns:
            True when such a record is stored.

        Raises:
            LedgerClosedError: the ledger is closed.
            LedgerForkedError: in a process forked from the ledger's.
            LedgerBusyError: another connection kept the file locked too long.
        """
        return self._storage.has_action_id(action_id)

    def has_record(self, record_id: str) -> bool:
        """Whether a record with this id is already in the file (reads no body).

        Args:
            record_id: the record's id (a capsule's capsule id).

        Returns:
            True when it is stored.

        Raises:
            LedgerClosedError: the ledger is closed.
            LedgerForkedError: in a process forked from the ledger's.
            LedgerBusyError: another connection kept the file locked too long.
        """
        return self._storage.has_record(record_id)

    def entries(self, *, batch: int = 2000, damaged: list[str] | None = None) -> Iterator[StoredEntry]:
        """Every record row in seq order.

        Args:
            batch: rows read per query.
            damaged: None to stop at damage; or a list, to read on past it (a
                verifier): a row of other types then comes back with ``damage``
                set, and each stretch SQLite cannot read is skipped and described here.

        Returns:
            An iterator of StoredEntry.

        Raises:
            LedgerCorruptError: without ``damaged``, a row of other types.
            sqlite3.DatabaseError: without ``damaged``, a page SQLite cannot read.
        """
        return self._storage.record_rows(batch=batch, damaged=damaged)

    def evidence_entries(self, *, batch: int = 500, damaged: list[str] | None = None) -> Iterator[EvidenceEntry]:
        """Every evidence row (slot rows and batch rows) in eid order.

        Args:
            batch, damaged: as for :meth:`entries` (a row of other types has ``damage`` set either way).

        Returns:
            An iterator of EvidenceEntry.

        Raises:
            sqlite3.DatabaseError: without ``damaged``, a page SQLite cannot read.
        """
        return self._storage.evidence_rows(batch=batch, damaged=damaged)

    def entry(self, record_id: str) -> StoredEntry | None:
        """The row of a record, or None.

        Args:
            record_id: the record's id.

        Returns:
            Its StoredEntry, or None when no record has this id.

        Raises:
            LedgerCorruptError: the row is not one capseal writes.
        """
        return self._storage.record_row(record_id)

    def evidence_history(self, record_id: str) -> list[dict[str, Any] | None]:
        """Every evidence state of a record, oldest first, from the ``None`` it was sealed with.

        Args:
            record_id: the record's id.

        Returns:
            The slot values, ``[None]`` for a record never given evidence.

        Raises:
            LedgerCorruptError: an evidence row it reads is damaged.
        """
        history: list[dict[str, Any] | None] = [None]
        history += [self._slots.state(*row) for row in self._storage.evidence_states(record_id, latest=False)]
        return history

    def current_evidence(self, record_id: str) -> dict[str, Any] | None:
        """A record's current evidence slot.

        Args:
            record_id: the record's id.

        Returns:
            The evidence object, or None when the slot is empty.

        Raises:
            LedgerCorruptError: the evidence row it reads is damaged.
        """
        rows = self._storage.evidence_states(record_id, latest=True)
        return self._slots.state(*rows[0]) if rows else None

    def get(self, record_id: str) -> SealedRecord | None:
        """The sealed record with its current evidence slot.

        Args:
            record_id: the capsule id.

        Returns:
            The record, or None when no capsule record has this id.

        Raises:
            LedgerCorruptError, ValueError: the row or its evidence is damaged
                (MalformedJSONError: a body that is not a capsule record).
        """
        stored = self.entry(record_id)
        if stored is None or stored.record_type != "capsule":
            return None
        record = SealedRecord.from_json(stored.record(), seq=stored.seq)
        return record.with_evidence(self.current_evidence(record_id))

    def records(self) -> Iterator[SealedRecord]:
        """Every sealed capsule record in order, with its current evidence.

        Returns:
            An iterator of SealedRecord, in seq order (other record types left out).

        Raises:
            LedgerCorruptError, ValueError: a row or its evidence is damaged.
        """
        slots = CurrentSlots(self.evidence_entries())
        for stored in self.entries():
            if stored.record_type == "capsule":
                rec = SealedRecord.from_json(stored.record(), seq=stored.seq)
                yield rec.with_evidence(slots.slot(stored.record_id))

    def last_tagged(self, tag: str, stream: str) -> StoredEntry | None:
        """The last record given ``tag`` in ``stream``.

        Args:
            tag: the tag; for ``"epoch_boundary"``, the last boundary capsule whose
                body names the stream's operator and developer (never the columns).
            stream: ``operator`` U+001F ``developer``, as a Producer names its stream.

        Returns:
            The StoredEntry, or None.

        Raises:
            LedgerCorruptError: the row found is not one capseal writes.
        """
        return self._storage.last_tagged(tag, stream)
