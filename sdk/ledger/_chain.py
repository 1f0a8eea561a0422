"""Recomputing a ledger's two hash chains (records, evidence) and its evidence index.

What the store holds never raises here: a row the engine cannot read, a
column of another type, a hash that is not hex or a record stored twice is a
problem of its own, and the rows around it are still checked. The caller
runs it inside one snapshot.
"""

from __future__ import annotations

from ..canonical import is_hex64
from ..errors import LedgerCorruptError
from ._evidence import Batch
from ._format import GENESIS, row_hash
from .storage import Storage

__all__ = ["check"]


def check(storage: Storage) -> list[str]:
    """Every problem of both chains and of the evidence index.

    Args:
        storage: the engine, inside a snapshot.

    Returns:
        The problems found, one sentence each (empty when intact).

    Raises:
        LedgerBusyError, LedgerClosedError, LedgerForkedError: as every read.
    """
    problems: list[str] = []
    seq_of = _check_records(storage, problems)
    members = _check_evidence(storage, seq_of, problems)
    try:
        indexed = storage.evidence_index()
    except LedgerCorruptError as exc:
        problems.append(f"evidence index: cannot be read ({str(exc)[:200]})")
        return problems
    if indexed != members:
        problems.append(f"evidence index: {len(indexed - members)} row(s) not backed by the evidence chain, "
                        f"{len(members - indexed)} missing")
    return problems


def _check_records(storage: Storage, problems: list[str]) -> dict[str, int]:
    """The records chain's problems (into ``problems``); returns each record's seq."""
    damaged: list[str] = []
    prev, expected_seq = GENESIS, 1
    seq_of: dict[str, int] = {}
    for stored in storage.record_rows(batch=2000, damaged=damaged):
        if stored.seq != expected_seq:
            problems.append(f"seq {stored.seq}: expected {expected_seq} (gap or reorder)")
        prev, expected_seq, prev_hash = stored.row_hash, stored.seq + 1, prev
        if stored.damage is not None:  # this row only: the rest of the chain is still checked
            problems.append(f"seq {stored.seq}: damaged row ({stored.damage})")
            continue
        if stored.record_id in seq_of:  # the unique index let it in: it is damaged
            problems.append(f"seq {stored.seq}: record {stored.record_id[:16]}… is stored twice "
                            f"(first at seq {seq_of[stored.record_id]})")
        seq_of.setdefault(stored.record_id, stored.seq)
        if stored.prev_hash != prev_hash:
            problems.append(f"seq {stored.seq}: prev_hash does not match the previous row")
        if not (is_hex64(stored.prev_hash) and is_hex64(stored.row_hash)):
            problems.append(f"seq {stored.seq}: damaged row (its prev_hash or row_hash is not 64 hex digits)")
        elif row_hash(stored.prev_hash, stored.header(), stored.body) != stored.row_hash:
            problems.append(f"seq {stored.seq}: row_hash does not match its header and body")
    problems += damaged
    return seq_of


def _check_evidence(storage: Storage, seq_of: dict[str, int], problems: list[str]) -> set[tuple[int, int, int]]:
    """The evidence chain's problems (into ``problems``); returns the index rows it backs."""
    damaged: list[str] = []
    prev = GENESIS
    members: set[tuple[int, int, int]] = set()
    for ev in storage.evidence_rows(batch=500, damaged=damaged):
        prev_hash, prev = prev, ev.row_hash
        if ev.damage is not None:  # this row only: the rest of the chain is still checked
            problems.append(f"evidence {ev.eid}: damaged row ({ev.damage})")
            if ev.record_seq is not None and ev.record_id is not None:
                members.add((ev.record_seq, ev.eid, -1))
            continue
        if not (is_hex64(ev.prev_hash) and is_hex64(ev.row_hash)):
            problems.append(f"evidence {ev.eid}: damaged row (its prev_hash or row_hash is not 64 hex digits)")
        elif ev.prev_hash != prev_hash or row_hash(ev.prev_hash, ev.header(), ev.body) != ev.row_hash:
            problems.append(f"evidence {ev.eid}: hash chain broken")
        if ev.record_id is not None:
            if seq_of.get(ev.record_id) != ev.record_seq:
                problems.append(f"evidence {ev.eid}: record {ev.record_id} is not at seq {ev.record_seq}")
            members.add((ev.record_seq or 0, ev.eid, -1))
            continue
        try:
            batch = Batch.parse(ev.body)
            Batch.check(batch.leaves, batch.root, batch.shared)
        except (LedgerCorruptError, ValueError, KeyError, TypeError) as exc:
            problems.append(f"evidence {ev.eid}: not a valid batch ({exc})")
            continue
        unknown = [rid for rid in batch.leaves if rid not in seq_of]
        if unknown:
            problems.append(f"evidence {ev.eid}: names {len(unknown)} record(s) the ledger lacks")
        members.update((seq_of[rid], ev.eid, i) for i, rid in enumerate(batch.leaves) if rid in seq_of)
    problems += damaged
    return members
