"""The ledger's record format: what a row holds and how its hash is made.

A record row is its store header (EL -00 §4: seq, record_id, record_type,
epistemic_type, links, nonce), its body (canonical JSON bytes) and its place
in the hash chain (``prev_hash``, ``row_hash``). An evidence row is hashed
the same way over its own header. Every engine stores these bytes and hashes
unchanged, so an export made from one imports into another.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from ..record import storage_json

__all__ = ["LEDGER_FORMAT", "GENESIS", "LedgerEntry", "StoredEntry", "row_hash", "evidence_row_hash",
           "evidence_header", "batch_header", "kind_of"]

LEDGER_FORMAT = "capseal-ledger/2"
#: the ``prev_hash`` of each chain's first row (32 zero bytes, in hex)
GENESIS = bytes(32).hex()
# the row-hash domain: unchanged since capseal-ledger/1, so a /1 export
# (records and slot rows are hashed the same way) imports into a /2 ledger
_DOMAIN = b"capseal-ledger/1\x00"
_DOMAIN_HASH = hashlib.sha256(_DOMAIN)


@dataclass(frozen=True)
class LedgerEntry:
    """What a writer hands the ledger. ``body`` is canonical JSON bytes.

    ``action_id``, ``stream`` and ``tag`` are stored as given, outside the row
    hash; for a capsule (``record_type`` "capsule") they are what its body
    gives (a verifier and an import check that), and the ledger's lookups
    read the body, not them."""

    record_id: str
    record_type: str
    epistemic_type: str
    body: bytes
    links: tuple[dict[str, str], ...] = ()
    action_id: str | None = None
    stream: str | None = None
    tag: str | None = None


@dataclass(frozen=True)
class StoredEntry:
    """A row as stored: the store header, the body and the hash chain.

    ``damage`` (set only by a reading that goes on past damage, see
    :meth:`Ledger.entries`) says why the row is not one capseal writes (a
    column edited at the SQL level to another type); such a row's other
    members are placeholders (text members "", an empty body)."""

    seq: int
    record_id: str
    record_type: str
    epistemic_type: str
    links: tuple[dict[str, str], ...]
    nonce: str
    body: bytes
    prev_hash: str
    row_hash: str
    action_id: str | None = None
    stream: str | None = None
    tag: str | None = None
    damage: str | None = field(default=None, compare=False)

    def header(self) -> dict[str, Any]:
        """The EL -00 §4 store header of this record.

        Returns:
            ``seq``, ``record_id``, ``record_type``, ``epistemic_type``,
            ``links`` and ``nonce``: what its row hash covers beside the body.
        """
        return {
            "seq": self.seq,
            "record_id": self.record_id,
            "record_type": self.record_type,
            "epistemic_type": self.epistemic_type,
            "links": [dict(link) for link in self.links],
            "nonce": self.nonce,
        }

    def record(self) -> dict[str, Any]:
        """The body, parsed.

        Returns:
            The JSON value of the body.

        Raises:
            ValueError: the body is not JSON (the row was edited).
        """
        return json.loads(self.body)  # type: ignore[no-any-return]


def row_hash(prev_hex: str, header: dict[str, Any], body: bytes, extra: bytes = b"") -> str:
    """The hash of a row that follows the row hashed ``prev_hex``.

    Args:
        prev_hex: the previous row's hash (:data:`GENESIS` for a chain's first row).
        header: the row's header (a record's store header, or an evidence header).
        body: the row's body bytes.
        extra: bytes hashed after the body (none for the rows capseal writes).

    Returns:
        64 lowercase hex digits: SHA-256 over the domain, the previous hash,
        and the SHA-256 digests of the header's sorted JSON and of the body.

    Raises:
        ValueError: ``prev_hex`` is not hex.
    """
    h = _DOMAIN_HASH.copy()
    h.update(bytes.fromhex(prev_hex))
    h.update(hashlib.sha256(storage_json(header)).digest())
    h.update(hashlib.sha256(body).digest())
    h.update(extra)
    return h.hexdigest()


def evidence_header(record_seq: int, record_id: str, eid: int) -> dict[str, Any]:
    """The header a slot row (one record's evidence state) is hashed with.

    Args:
        record_seq, record_id: the record's seq and id.
        eid: the row's place in the evidence chain.

    Returns:
        ``{"eid", "record_seq", "record_id"}``.
    """
    return {"eid": eid, "record_seq": record_seq, "record_id": record_id}


def batch_header(eid: int) -> dict[str, Any]:
    """The header a batch row (one quote over many records) is hashed with.

    Args:
        eid: the row's place in the evidence chain.

    Returns:
        ``{"eid", "kind": "batch"}``.
    """
    return {"eid": eid, "kind": "batch"}


def evidence_row_hash(prev_hex: str, record_seq: int, record_id: str, eid: int, body: bytes) -> str:
    """``row_hash(prev, evidence_header(...), body)``, without building and
    serializing the header dict when the id needs no JSON escaping (a capsule
    id is hex): batch evidence writes one row per record."""
    if not (record_id.isascii() and record_id.isalnum()):
        return row_hash(prev_hex, evidence_header(record_seq, record_id, eid), body)
    sha = hashlib.sha256
    body_hash = sha()
    for i in range(0, len(body), 2000):  # pieces under 2048 bytes: hashlib keeps the GIL, so the
        body_hash.update(body[i : i + 2000])  # writer does not queue for it again after every row
    h = _DOMAIN_HASH.copy()
    h.update(bytes.fromhex(prev_hex)
             + sha(f'{{"eid":{int(eid)},"record_id":"{record_id}","record_seq":{int(record_seq)}}}'.encode()).digest()
             + body_hash.digest())
    return h.hexdigest()


def kind_of(value: Any) -> str:
    """The storage class of a value read back (for a message naming a damaged member)."""
    return {int: "an integer", float: "a real", str: "text", bytes: "a blob"}.get(type(value), "NULL")
