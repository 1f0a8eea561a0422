"""Evidence rows: one record's slot state, or one quote over a batch.

Hardware evidence is appended to its own hash-chained table, so a slot's
earlier ``null`` state stays visible in history. A quote over a batch's
Merkle root is stored ONCE (the shared quote members, the root and the
batch's record ids in leaf order), with a small index row per record; each
record's slot, inclusion proof included, is rebuilt from it on read
(RFC 9162, :mod:`capseal.merkle`). Why: almost all of a slot is the same
for every record of a batch, and writing it once per record would slow the
sealing path that shares the write lock.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .. import merkle
from ..canonical import hex_bytes
from ..errors import LedgerCorruptError
from ._format import batch_header, evidence_header, kind_of

__all__ = ["EvidenceEntry", "BatchRoot", "Batch", "batch_root", "batch_slot", "slot_state", "stored_blob",
           "SlotReader", "CurrentSlots"]


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
        """True for a batch row (one quote over many records)."""
        return self.record_id is None

    def header(self) -> dict[str, Any]:
        """The header this row's hash covers beside its body.

        Returns:
            ``eid``, ``record_seq`` and ``record_id`` for a slot row;
            ``eid`` and ``kind`` "batch" for a batch row.
        """
        if self.record_id is None:
            return batch_header(self.eid)
        assert self.record_seq is not None
        return evidence_header(self.record_seq, self.record_id, self.eid)

    def evidence(self) -> dict[str, Any] | None:
        """A slot row's state.

        Returns:
            The filled slot, or None (the slot was emptied again).

        Raises:
            ValueError: this is a batch row (its slots are in :meth:`slots`).
            LedgerCorruptError: the row is damaged.
        """
        self.refuse_damaged()
        if self.record_id is None:
            raise ValueError(f"evidence {self.eid} is a batch; its slots are in slots()")
        return slot_state(self.body)

    def slots(self) -> list[tuple[str, dict[str, Any] | None]]:
        """Every record this row gives a state.

        Returns:
            ``(record_id, slot)`` pairs, in leaf order for a batch.

        Raises:
            LedgerCorruptError: the row is damaged.
        """
        self.refuse_damaged()
        if self.record_id is not None:
            return [(self.record_id, self.evidence())]
        batch = Batch.parse(self.body)
        return [(rid, batch.slot(i)) for i, rid in enumerate(batch.leaves)]

    def refuse_damaged(self) -> None:
        """Raise LedgerCorruptError naming the damage, if the row is damaged."""
        if self.damage is not None:
            raise LedgerCorruptError(f"evidence {self.eid} is damaged ({self.damage})")


class BatchRoot(bytes):
    """A batch's RFC 9162 root, as bytes, that remembers the record ids it
    was computed from: :meth:`Ledger.add_evidence_batch` given it with those
    same ids checks them without hashing them again."""

    record_ids: tuple[str, ...]


def stored_blob(value: Any, what: str) -> bytes:
    """A body as stored (a record's or an evidence row's): a blob, as capseal writes it. Anything else
    is an edit at the SQL level (LedgerCorruptError), never converted: an
    integer N would become N zero bytes (gigabytes for a large N), text its
    encoding, and neither is what was written."""
    if type(value) is not bytes:
        raise LedgerCorruptError(f"{what} is damaged (its body is stored as {kind_of(value)}, not a blob)")
    return value


def slot_state(body: bytes) -> dict[str, Any] | None:
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
    """The slot of one record of a quoted batch.

    Args:
        shared: the quote members every slot of the batch carries.
        merkle_root: the batch's RFC 9162 root (the quote's qualifyingData).
        leaf_index: the record's place in the batch.
        tree_size: how many records the batch holds.
        proof: the record's inclusion proof (audit path).

    Returns:
        ``shared`` plus this record's ``binding`` (root, leaf index, tree
        size and inclusion proof, in hex).
    """
    out = dict(shared)
    out["binding"] = {
        "merkle_root": merkle_root.hex(),
        "leaf_index": leaf_index,
        "tree_size": tree_size,
        "inclusion_proof": [p.hex() for p in proof],
    }
    return out


class Batch:
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
        members that leave ``binding`` to each record. A :class:`BatchRoot`
        of these very ids was checked and hashed by :func:`batch_root`."""
        if not isinstance(shared, Mapping) or not shared or "binding" in shared:
            raise ValueError("a batch's shared quote members are a filled object without 'binding'")
        if isinstance(merkle_root, BatchRoot) and merkle_root.record_ids == tuple(record_ids):
            return
        if merkle.root_and_path(Batch.raw_leaves(record_ids))[0] != merkle_root:
            raise ValueError("the batch's records do not hash to its merkle_root (RFC 9162)")

    @classmethod
    def parse(cls, body: bytes) -> Batch:
        """A stored batch body; LedgerCorruptError if it is not one (the file
        was edited: the writer checks every batch it stores)."""
        try:
            data = json.loads(body)
            leaves, shared = data["leaves"], data["shared"]
            if not isinstance(leaves, list) or not isinstance(shared, dict):
                raise ValueError("leaves must be an array and shared an object")
            Batch.raw_leaves(leaves)
            root = hex_bytes(data["merkle_root"])  # digits only, as every hex capseal reads
            if root is None or len(root) != 32:
                raise ValueError("merkle_root is not 32 bytes in hex")
            return cls(leaves, root, shared)
        except (ValueError, KeyError, TypeError, RecursionError) as exc:
            raise LedgerCorruptError(f"an evidence batch row is damaged ({type(exc).__name__}: {exc})") from None

    def slot(self, leaf_index: int) -> dict[str, Any]:
        """The slot of the record at ``leaf_index`` (LedgerCorruptError for an index the batch lacks)."""
        if type(leaf_index) is not int:  # an index row edited to text or a real: read from the file, never converted
            raise LedgerCorruptError(f"an evidence index row names leaf {str(leaf_index)[:40]!r} "
                                     f"({kind_of(leaf_index)}, not an integer)")
        if not 0 <= leaf_index < len(self.leaves):
            raise LedgerCorruptError(f"an evidence index row names leaf {leaf_index} of a batch of {len(self.leaves)}")
        if self._proofs is None:  # every proof at once: O(n log n), once per batch
            self._proofs = merkle.build([bytes.fromhex(rid) for rid in self.leaves]).proofs
        return batch_slot(self.shared, self.root, leaf_index, len(self.leaves), self._proofs[leaf_index])

    def drop_proofs(self) -> None:
        """Forget the built proofs (memory); slot() builds them again if asked."""
        self._proofs = None


def batch_root(record_ids: Sequence[str]) -> tuple[BatchRoot, tuple[bytes, ...]]:
    """The RFC 9162 root of a batch of capsule ids and the first id's audit
    path: what a batch writer quotes and checks the quote with.

    Args:
        record_ids: the batch's capsule ids, in leaf order.

    Returns:
        ``(root, path)``: the root (a :class:`BatchRoot`, which
        :meth:`Ledger.add_evidence_batch` of the same ids does not hash
        again) and the audit path of the first id.

    Raises:
        ValueError: the ids are not distinct lowercase capsule ids, or none is given.
    """
    ids = tuple(record_ids)
    raw, path = merkle.root_and_path(Batch.raw_leaves(ids), 0)
    root = BatchRoot(raw)
    root.record_ids = ids
    return root, path


class SlotReader:
    """Rebuilds records' slots from the states an engine reads, keeping the
    last few batch rows parsed (readers walk records in order)."""

    def __init__(self, batch_body: Callable[[int], Any]) -> None:
        self._batch_body = batch_body
        self._batches: dict[int, Batch] = {}
        self._lock = threading.Lock()

    def state(self, eid: int, leaf_index: Any, body: Any) -> dict[str, Any] | None:
        """The slot an index row names: a slot row's ``body`` (not None), or
        leaf ``leaf_index`` of the batch row ``eid``."""
        if body is not None:  # a slot row
            return slot_state(stored_blob(body, f"evidence {eid}"))
        batch = self._batches.get(eid)
        if batch is None:
            batch = Batch.parse(stored_blob(self._batch_body(eid), f"evidence batch {eid}"))
            with self._lock:
                if len(self._batches) >= 8:
                    self._batches.pop(next(iter(self._batches)))
                self._batches[eid] = batch
        return batch.slot(leaf_index)


class CurrentSlots:
    """Each record's latest slot, from every evidence row in eid order; a
    batch's slots are built when asked for, keeping the proofs of only a few
    batches at a time (memory stays bounded while records are read in order)."""

    def __init__(self, evidence: Iterable[EvidenceEntry]) -> None:
        self._latest: dict[str, dict[str, Any] | None | tuple[Batch, int]] = {}
        for ev in evidence:
            ev.refuse_damaged()
            if ev.record_id is not None:
                self._latest[ev.record_id] = ev.evidence()
            else:
                batch = Batch.parse(ev.body)
                for i, rid in enumerate(batch.leaves):
                    self._latest[rid] = (batch, i)
        self._warm: list[Batch] = []  # batches with built proofs

    def slot(self, record_id: str) -> dict[str, Any] | None:
        """The record's latest slot (None: empty)."""
        state = self._latest.get(record_id)
        if not isinstance(state, tuple):
            return state
        batch, index = state
        if batch not in self._warm:
            self._warm.append(batch)
            if len(self._warm) > 4:
                self._warm.pop(0).drop_proofs()
        return batch.slot(index)
