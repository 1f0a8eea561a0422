"""One group of queued appends into one transaction.

Each append gets the next seq and the row hash chained to the one before; a
pair (an epoch's boundary and its first record) goes in as one unit, whole
or not at all. An append refused (a duplicate, or something it needs was
refused) is skipped without disturbing the rest of its group. When another
process appended since the head was read, the group is written again on the
new head.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING

from ..errors import DuplicateRecordError, LedgerError
from ._format import LedgerEntry, StoredEntry, row_hash
from .storage import DuplicateRow, Storage, Transaction

if TYPE_CHECKING:
    from ._commit import PendingAppend

__all__ = ["write_group"]


def write_group(storage: Storage, batch: Sequence[PendingAppend], name: str) -> int:
    """Write ``batch`` in one durable transaction, setting each append's
    ``stored`` (written) or ``error`` (refused).

    Args:
        storage: the engine; the caller holds its write lock.
        batch: the appends, in queue order (a pair's two side by side).
        name: the ledger's name, for messages.

    Returns:
        How many records were written.

    Raises:
        LedgerError: the transaction failed as a whole (nothing written).
    """
    while True:
        try:
            return _write_once(storage, batch, name)
        except DuplicateRow as stale:  # a taken seq: another process appended; re-read the head, go again
            if stale.column != "seq":
                raise
            for p in batch:
                p.error = None


def _write_once(storage: Storage, batch: Sequence[PendingAppend], name: str) -> int:
    staged: list[tuple[PendingAppend, StoredEntry]] = []
    with storage.write("append to") as tx:
        seq, prev = tx.records_head()
        i, n = 0, len(batch)
        while i < n:
            p = batch[i]
            unit = (p, batch[i + 1]) if i + 1 < n and batch[i + 1].lead is p else (p,)
            i += len(unit)
            rows = _add(tx, unit, seq, prev, name)
            if rows:
                staged.extend(zip(unit, rows))
                seq, prev = rows[-1].seq, rows[-1].row_hash
    for p, stored in staged:
        p.stored = stored
    return len(staged)


def _add(tx: Transaction, unit: Sequence[PendingAppend], seq: int, prev: str, name: str) -> list[StoredEntry]:
    """Add one append, or a pair, after the row ``seq``; the rows written, or
    none (each refused append's ``error`` set)."""
    first = unit[0]
    refusal = _refused_with(first) if first.after or first.lead is not None else None  # before any INSERT
    if refusal is not None:
        first.error = refusal
        if len(unit) > 1:  # a pair's lead refused: its follower goes in with it
            unit[1].error = _refused_with(unit[1])
        return []
    if len(unit) > 1:
        refusal = _refused_with(unit[1])  # what the follower needs was refused: neither is written
        if refusal is not None:
            first.error = unit[1].error = refusal
            return []
    rows: list[StoredEntry] = []
    for p in unit:
        row = _row(p.entry, seq + 1, prev)
        rows.append(row)
        seq, prev = row.seq, row.row_hash
    try:
        tx.add_records(rows)
    except DuplicateRow as dup:
        if dup.column == "seq":
            raise
        refused = unit[dup.index]
        refused.error = _duplicate(refused.entry, dup.column, name)
        if len(unit) > 1:  # the pair: neither is written
            lead, follower = unit
            if refused is lead:
                follower.error = _refused_with(follower)
            else:
                lead.error = follower.error
        return []
    return rows


def _row(e: LedgerEntry, seq: int, prev: str) -> StoredEntry:
    """The row of ``e`` at ``seq``, after the row hashed ``prev``, with fresh randomness."""
    nonce = os.urandom(16).hex()
    header = {"seq": seq, "record_id": e.record_id, "record_type": e.record_type,
              "epistemic_type": e.epistemic_type, "links": [dict(x) for x in e.links], "nonce": nonce}
    return StoredEntry(seq=seq, record_id=e.record_id, record_type=e.record_type, epistemic_type=e.epistemic_type,
                       links=e.links, nonce=nonce, body=e.body, prev_hash=prev, row_hash=row_hash(prev, header, e.body),
                       action_id=e.action_id, stream=e.stream, tag=e.tag)


def _refused_with(p: PendingAppend) -> LedgerError | None:
    """Why ``p`` cannot be written, decided before its INSERT: the lead of its
    pair, or an append it needs (queued earlier, so decided already), was
    refused. None when nothing stands in its way. A record refused with the
    lead of its pair (its epoch's boundary) for a duplicate is itself refused
    as a duplicate: its epoch id is taken."""
    for other, how in ((p.lead, "goes in with"), *((a, "needs") for a in p.after)):
        if other is not None and other.error is not None:
            kind = DuplicateRecordError if other is p.lead and isinstance(other.error, DuplicateRecordError) \
                else LedgerError
            return kind(f"record {p.entry.record_id[:16]}… not written: it {how} "
                        f"{other.entry.record_id[:16]}…, which was refused ({other.error})")
    return None


def _duplicate(e: LedgerEntry, column: str, name: str) -> DuplicateRecordError:
    """The refusal of ``e``, whose ``column`` is in the ledger already."""
    value = e.action_id if column == "action_id" else e.record_id
    if value is None:  # the body's index: the action id its capsule carries
        return DuplicateRecordError(f"its capsule's action_id is already in {name} (record {e.record_id[:16]}…)")
    return DuplicateRecordError(f"{column} {value!r} is already in {name}")
