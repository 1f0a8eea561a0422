"""Writing evidence: slot rows and batch rows, in one transaction beside the record stream.

A slot row holds one record's new state; a batch row holds one quote for
many records (its index rows name each record's leaf). Either way the rows
are hash-chained after the evidence chain's head, read and checked in the
same transaction, and the write is refused whole when a record it names is
not in the ledger.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any

from ..errors import LedgerError
from ..record import storage_json
from ._evidence import Batch, EvidenceEntry
from ._format import batch_header, evidence_row_hash, row_hash
from .storage import Storage

__all__ = ["add_slot", "add_batch"]

SideWrite = Callable[[], AbstractContextManager[None]]


def _slot_rows(bodies: Sequence[tuple[str, bytes]], seqs: Mapping[str, int], eid: int, prev: str) -> list[EvidenceEntry]:
    """The slot rows that append ``(record_id, body)`` states to the evidence
    chain after the row hashed ``prev``, the first at ``eid``."""
    rows: list[EvidenceEntry] = []
    for record_id, body in bodies:
        seq = seqs[record_id]
        hashed = evidence_row_hash(prev, seq, record_id, eid, body)
        rows.append(EvidenceEntry(eid, seq, record_id, body, prev, hashed))
        eid, prev = eid + 1, hashed
    return rows


def _batch_body(record_ids: Sequence[str], merkle_root: bytes, shared: Mapping[str, Any]) -> bytes:
    """The body of the batch row for a checked batch."""
    return storage_json({"leaves": list(record_ids), "merkle_root": merkle_root.hex(), "shared": dict(shared)})


def _batch_row(body: bytes, eid: int, prev: str) -> EvidenceEntry:
    """The batch row of ``body`` at ``eid``, after the row hashed ``prev``."""
    return EvidenceEntry(eid, None, None, body, prev, row_hash(prev, batch_header(eid), body))


def _append(side_write: SideWrite, storage: Storage, name: str, record_ids: Sequence[str],
            rows: Callable[[dict[str, int], int, str], list[EvidenceEntry]],
            members: Callable[[dict[str, int], int], list[tuple[int, int, int]]] | None = None) -> list[EvidenceEntry]:
    """One transaction: ``rows(record_id -> seq, first eid, chain head)``
    makes the rows, ``members(record_id -> seq, first eid)`` their index
    rows (by default one per slot row, leaf index -1); refused whole when a
    record of ``record_ids`` is unknown."""
    with side_write(), storage.write("evidence write to") as tx:
        wanted = list(dict.fromkeys(record_ids))
        seqs = tx.record_seqs(wanted)
        missing = [rid for rid in wanted if rid not in seqs]
        if missing:
            more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
            raise LedgerError(f"no record {missing[0]}{more} in {name}; no evidence written")
        last, prev = tx.evidence_head()
        made = rows(seqs, last + 1, prev)
        index = members(seqs, last + 1) if members is not None else [
            (row.record_seq, row.eid, -1) for row in made if row.record_seq is not None]
        tx.add_evidence(made, index)
    return made


def add_slot(side_write: SideWrite, storage: Storage, name: str, record_id: str,
             evidence: dict[str, Any] | None) -> EvidenceEntry:
    """Append a slot row: ``record_id``'s new state (``evidence``, or None: empty again).

    Args:
        side_write: holds the engine's write lock without being starved by the committer.
        storage: the engine.
        name: the ledger's name, for messages.
        record_id: the record.
        evidence: a filled slot, or None.

    Returns:
        The row, once durable.

    Raises:
        ValueError: ``evidence`` is an empty object.
        LedgerError: no such record (nothing written), or the ledger is read-only or closed.
    """
    if evidence is not None and not evidence:
        raise ValueError("evidence is a filled object, never {}")
    body = storage_json(evidence)
    return _append(side_write, storage, name, [record_id],
                   lambda seqs, eid, prev: _slot_rows([(record_id, body)], seqs, eid, prev))[0]


def add_batch(side_write: SideWrite, storage: Storage, name: str, record_ids: Sequence[str], merkle_root: bytes,
              shared: Mapping[str, Any]) -> EvidenceEntry:
    """Append a batch row (one quote over ``record_ids``) and an index row per record.

    Args:
        side_write, storage, name: as for :func:`add_slot`.
        record_ids: the records, in leaf order.
        merkle_root: their RFC 9162 root.
        shared: the quote members every slot carries.

    Returns:
        The batch row, once durable.

    Raises:
        ValueError: not a batch of distinct capsule ids hashing to ``merkle_root``
            with filled ``shared`` members (nothing written).
        LedgerError: a record is unknown (nothing written), or the ledger is read-only or closed.
    """
    ids = list(record_ids)
    Batch.check(ids, merkle_root, shared)
    body = _batch_body(ids, merkle_root, shared)
    return _append(side_write, storage, name, ids, lambda seqs, eid, prev: [_batch_row(body, eid, prev)],
                   members=lambda seqs, eid: sorted((seqs[rid], eid, i) for i, rid in enumerate(ids)))[0]
