"""Rows of a ledger file as entries, and entries as rows.

SQLite stores any value in any column, so a row edited at the SQL level can
hold an integer where capseal wrote text, or text where it wrote a blob. A
row read back is checked member by member: one of other types is
LedgerCorruptError naming it, or, for a reader that goes on past damage, an
entry with ``damage`` set, so that one edited row fails on its own instead
of stopping every reader of the file. Nothing read is converted: an integer
N taken for a body would become N zero bytes.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from ..errors import LedgerCorruptError
from ..record import storage_json
from ._evidence import EvidenceEntry
from ._format import StoredEntry, kind_of

__all__ = ["RECORD_COLUMNS", "EVIDENCE_COLUMNS", "stored", "evidence_entry", "record_values", "evidence_values"]

RECORD_COLUMNS = ("seq, record_id, record_type, epistemic_type, links, nonce, action_id, stream, tag, body, "
                  "prev_hash, row_hash")
EVIDENCE_COLUMNS = "eid, record_seq, record_id, body, prev_hash, row_hash"


def record_values(e: StoredEntry) -> tuple[Any, ...]:
    """The values of a record row, in :data:`RECORD_COLUMNS` order."""
    links = b"[]" if not e.links else storage_json([dict(x) for x in e.links])
    return (e.seq, e.record_id, e.record_type, e.epistemic_type, links.decode(), e.nonce, e.action_id, e.stream,
            e.tag, e.body, e.prev_hash, e.row_hash)


def evidence_values(e: EvidenceEntry) -> tuple[Any, ...]:
    """The values of an evidence row, in :data:`EVIDENCE_COLUMNS` order."""
    return (e.eid, e.record_seq, e.record_id, e.body, e.prev_hash, e.row_hash)


def _links(raw: Any) -> tuple[dict[str, str], ...]:
    """A row's links column. One that is not a JSON array of objects (edited
    behind SQLite's back) is kept as an unreadable marker, so that row's hash
    fails in check_chain, instead of making every other row unreadable too."""
    if raw == "[]":  # most rows: no links
        return ()
    try:
        links = json.loads(raw)
        if isinstance(links, list) and all(isinstance(x, dict) for x in links):
            return tuple(links)
    except (ValueError, TypeError, RecursionError):
        pass
    return ({"unreadable": str(raw)[:64]},)


def _record_damage(row: Sequence[Any]) -> str | None:
    """Why a record row read from the file is not one capseal writes (a
    member edited at the SQL level to another type), or None."""
    if (type(row[9]) is bytes and type(row[1]) is str and type(row[2]) is str and type(row[3]) is str
            and type(row[5]) is str and type(row[10]) is str and type(row[11]) is str
            and (row[6] is None or type(row[6]) is str) and (row[7] is None or type(row[7]) is str)
            and (row[8] is None or type(row[8]) is str)):
        return None  # every member of the type capseal writes (the common case, checked at once)
    body = row[9]
    if type(body) is not bytes:
        return f"its body is stored as {kind_of(body)}, not a blob"
    text = ("record_id", 1), ("record_type", 2), ("epistemic_type", 3), ("nonce", 5), ("prev_hash", 10), ("row_hash", 11)
    bad = [f"{name} ({kind_of(row[i])})" for name, i in text if type(row[i]) is not str]
    bad += [f"{name} ({kind_of(row[i])})" for name, i in (("action_id", 6), ("stream", 7), ("tag", 8))
            if row[i] is not None and type(row[i]) is not str]
    return f"not stored as text: {', '.join(bad)}" if bad else None


def stored(row: Sequence[Any], *, tolerant: bool = False) -> StoredEntry:
    """A record row as read. One whose columns are not of the types capseal
    writes is LedgerCorruptError naming it, or with ``tolerant`` an entry
    with ``damage`` set (placeholders for the rest)."""
    damage = _record_damage(row)
    if damage is not None:
        if not tolerant:
            raise LedgerCorruptError(f"record {row[0]} is damaged ({damage})")

        def text(value: Any) -> str:
            return value if type(value) is str else ""

        return StoredEntry(seq=row[0], record_id=text(row[1]), record_type=text(row[2]),
                           epistemic_type=text(row[3]), links=(), nonce=text(row[5]), body=b"",
                           prev_hash=text(row[10]), row_hash=text(row[11]), damage=damage)
    return StoredEntry(
        seq=row[0], record_id=row[1], record_type=row[2], epistemic_type=row[3],
        links=_links(row[4]), nonce=row[5], action_id=row[6], stream=row[7], tag=row[8],
        body=row[9], prev_hash=row[10], row_hash=row[11],
    )


def evidence_entry(row: Sequence[Any]) -> EvidenceEntry:
    """An evidence row as read; a row whose members are not of the types
    capseal writes comes back with ``damage`` set, so one edited row fails
    on its own instead of stopping every reader of the file."""
    eid, seq, rid, body, prev, row_hash = row
    damage = None
    if type(body) is not bytes:
        damage = f"its body is stored as {kind_of(body)}, not a blob"
    elif not (seq is None and rid is None or type(seq) is int and type(rid) is str):
        damage = f"its record_seq and record_id are {kind_of(seq)} and {kind_of(rid)}, not an integer and text"
    elif type(prev) is not str or type(row_hash) is not str:
        damage = f"its prev_hash and row_hash are {kind_of(prev)} and {kind_of(row_hash)}, not text"
    if damage is None:
        return EvidenceEntry(eid, seq, rid, body, prev, row_hash)
    slot = type(seq) is int and type(rid) is str  # else neither is kept (placeholders: both None)
    return EvidenceEntry(eid, seq if slot else None, rid if slot else None, b"",
                         prev if type(prev) is str else "", row_hash if type(row_hash) is str else "", damage)
