"""Recomputing a ledger's two hash chains (records, evidence) and its evidence index.

What the store holds never raises here: a row the engine cannot read, a
column of another type, a hash that is not hex or a record stored twice is a
problem of its own, and the rows around it are still checked. The caller
runs it inside one snapshot.

Memory stays bounded whatever the ledger's size: rows are read in batches,
the ids seen are kept in an :class:`~._idindex.IdIndex`, and the evidence
index is compared with what the evidence chain backs by a keyed sum over
both (the rows that differ are looked for only when the sums differ).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Iterable

from ..canonical import is_hex64
from ..errors import LedgerCorruptError
from ._evidence import Batch
from ._format import GENESIS, StoredEntry, row_hash
from ._idindex import IdIndex
from .storage import Storage

__all__ = ["check"]


OnRecord = Callable[[StoredEntry], object]
#: record rows with whether each one's row hash matches its header and body (None: not known yet)
CheckedRows = Iterable[tuple[StoredEntry, "bool | None"]]


class _Tally:
    """A keyed sum of index rows: equal for equal sets (of distinct rows), whatever their order."""

    __slots__ = ("_key", "count", "total")

    def __init__(self, key: bytes) -> None:
        self._key, self.count, self.total = key, 0, 0

    def add(self, row: tuple[int, int, int]) -> None:
        digest = hashlib.blake2b(repr(row).encode(), digest_size=8, key=self._key).digest()  # an edited row may hold text
        self.count += 1
        self.total = (self.total + int.from_bytes(digest, "little")) & 0xFFFFFFFFFFFFFFFF


def check(storage: Storage, *, on_record: OnRecord | None = None, index: IdIndex | None = None,
          rows: CheckedRows | None = None, damaged: list[str] | None = None) -> list[str]:
    """Every problem of both chains and of the evidence index.

    Args:
        storage: the engine, inside a snapshot.
        on_record: called with each record row as it is checked, in seq order
            (damaged rows too), for a caller that reads every row anyway.
        index: the index to fill with each record id's first seq (a new one by default).
        rows: the record rows, read by the caller from ``storage`` (in seq
            order, with ``damaged`` given to the read), each with whether its
            row hash matches (computed elsewhere, e.g. in other processes;
            None: computed here). Default: read here.
        damaged: with ``rows``: the list their read describes unreadable stretches in.

    Returns:
        The problems found, one sentence each (empty when intact).

    Raises:
        LedgerBusyError, LedgerClosedError, LedgerForkedError: as every read.
    """
    problems: list[str] = []
    index = IdIndex() if index is None else index
    if rows is None:
        damaged = []
        rows = ((stored, None) for stored in storage.record_rows(batch=2000, damaged=damaged))
    _check_records(rows, damaged if damaged is not None else [], problems, index, on_record)
    key = os.urandom(16)
    backed = _Tally(key)
    _check_evidence(storage, index, problems, backed.add)
    indexed = _Tally(key)
    try:
        for row in storage.evidence_index_rows(batch=5000):
            indexed.add(row)
    except LedgerCorruptError as exc:
        problems.append(f"evidence index: cannot be read ({str(exc)[:200]})")
        return problems
    if (indexed.count, indexed.total) != (backed.count, backed.total):
        members: set[tuple[int, int, int]] = set()  # only now: the rows that differ, exactly
        _check_evidence(storage, index, [], members.add)
        stored = set(storage.evidence_index_rows(batch=5000))
        problems.append(f"evidence index: {len(stored - members)} row(s) not backed by the evidence chain, "
                        f"{len(members - stored)} missing")
    return problems


def _check_records(rows: CheckedRows, damaged: list[str], problems: list[str], index: IdIndex,
                   on_record: OnRecord | None) -> None:
    """The records chain's problems (into ``problems``); each record's first seq into ``index``."""
    prev, expected_seq = GENESIS, 1
    for stored, hash_ok in rows:
        if on_record is not None:
            on_record(stored)
        if stored.seq != expected_seq:
            problems.append(f"seq {stored.seq}: expected {expected_seq} (gap or reorder)")
        prev, expected_seq, prev_hash = stored.row_hash, stored.seq + 1, prev
        if stored.damage is not None:  # this row only: the rest of the chain is still checked
            problems.append(f"seq {stored.seq}: damaged row ({stored.damage})")
            continue
        first = index.add(stored.record_id, stored.seq)
        if first is not None:  # the unique index let it in: it is damaged
            problems.append(f"seq {stored.seq}: record {stored.record_id[:16]}… is stored twice "
                            f"(first at seq {first})")
        if stored.prev_hash != prev_hash:
            problems.append(f"seq {stored.seq}: prev_hash does not match the previous row")
        if not (is_hex64(stored.prev_hash) and is_hex64(stored.row_hash)):
            problems.append(f"seq {stored.seq}: damaged row (its prev_hash or row_hash is not 64 hex digits)")
        elif not (row_hash_matches(stored) if hash_ok is None else hash_ok):
            problems.append(f"seq {stored.seq}: row_hash does not match its header and body")
    problems += damaged


def row_hash_matches(stored: StoredEntry) -> bool:
    """Whether a record row's row hash is the one its prev_hash, header and body give.

    Args:
        stored: the row (not damaged; both hashes 64 hex digits).

    Returns:
        True when it matches.
    """
    return row_hash(stored.prev_hash, stored.header(), stored.body) == stored.row_hash


def _check_evidence(storage: Storage, index: IdIndex, problems: list[str],
                    backs: Callable[[tuple[int, int, int]], object]) -> None:
    """The evidence chain's problems (into ``problems``); each index row it backs to ``backs``."""
    damaged: list[str] = []
    prev = GENESIS
    for ev in storage.evidence_rows(batch=500, damaged=damaged):
        prev_hash, prev = prev, ev.row_hash
        if ev.damage is not None:  # this row only: the rest of the chain is still checked
            problems.append(f"evidence {ev.eid}: damaged row ({ev.damage})")
            if ev.record_seq is not None and ev.record_id is not None:
                backs((ev.record_seq, ev.eid, -1))
            continue
        if not (is_hex64(ev.prev_hash) and is_hex64(ev.row_hash)):
            problems.append(f"evidence {ev.eid}: damaged row (its prev_hash or row_hash is not 64 hex digits)")
        elif ev.prev_hash != prev_hash or row_hash(ev.prev_hash, ev.header(), ev.body) != ev.row_hash:
            problems.append(f"evidence {ev.eid}: hash chain broken")
        if ev.record_id is not None:
            if index.seq(ev.record_id) != ev.record_seq:
                problems.append(f"evidence {ev.eid}: record {ev.record_id} is not at seq {ev.record_seq}")
            backs((ev.record_seq or 0, ev.eid, -1))
            continue
        try:
            batch = Batch.parse(ev.body)
            Batch.check(batch.leaves, batch.root, batch.shared)
        except (LedgerCorruptError, ValueError, KeyError, TypeError) as exc:
            problems.append(f"evidence {ev.eid}: not a valid batch ({exc})")
            continue
        seqs = [index.seq(rid) for rid in batch.leaves]
        unknown = sum(seq is None for seq in seqs)
        if unknown:
            problems.append(f"evidence {ev.eid}: names {unknown} record(s) the ledger lacks")
        for i, seq in enumerate(seqs):
            if seq is not None:
                backs((seq, ev.eid, i))
    problems += damaged

