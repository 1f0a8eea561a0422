"""Reading every judgment record of a ledger, or of one file, for ``capseal interpret``.

A ledger (SQLite, opened read-only) gives, in seq order: every judge-family
record and Evidence Result (``judge:*``), every stored jury verdict kept as a
``jury-verdict`` artifact, every referee book row (``referee:book-row``), and
every capsule that records a judgment (``x-judgment-v1``) or is the mesh's
verdict record. A judgment capsule's answer reads when its preimage is kept in
the same ledger as a JSON artifact; a Close's state is checked against the
links other records of the ledger hold into it.

A file holds one record (a JSON object), several (a JSON array), or one per
line (JSON Lines, as a referee book file). An experiment file (an object whose
``items`` carry a ``verdict``) is re-exported: the same document with an
``interpretation`` beside each verdict (:func:`reexport`).
"""

from __future__ import annotations

import dataclasses
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from capseal.errors import InputError, MalformedJSONError
from capseal.ledger import Ledger, StoredEntry
from capseal.record import strict_json

from .capsules import judgment_member, mesh_block
from .dispatch import JURY_VERDICT_ARTIFACT, Reading, read, unreadable

__all__ = ["Source", "SourceRecord", "read_source", "read_ledger", "read_file", "reexport", "is_experiment"]

_SQLITE = b"SQLite format 3\x00"
_ARTIFACT = "judge:artifact/v1"
_BOOK_ROW = "referee:book-row"


@dataclass(frozen=True)
class SourceRecord:
    """One record read from a source: where it sits, the original, and its reading."""

    header: dict[str, Any] | None
    original: Any
    reading: Reading

    @property
    def record_id(self) -> str | None:
        return self.header.get("record_id") if self.header else None


@dataclass(frozen=True)
class Source:
    """What a ledger or file holds: its records, or the re-exported experiment document."""

    records: tuple[SourceRecord, ...]
    document: dict[str, Any] | None = None  # set for an experiment file


def _name(body: Any, fallback: str) -> str:
    rid = body.get("record_id") if isinstance(body, dict) else None
    return rid if isinstance(rid, str) and rid else fallback


class _Unreadable:
    """A stored row whose bytes are not JSON read one way only (a duplicate member, NaN, bad UTF-8)."""

    def __init__(self, why: str) -> None:
        self.why = why


def _stored(entry: StoredEntry) -> Any:
    try:
        return strict_json(entry.body, f"record {entry.seq}")
    except MalformedJSONError as exc:
        return _Unreadable(str(exc))


def _wanted(entry: StoredEntry, stored: Any) -> bool:
    kind = entry.record_type
    if kind == _ARTIFACT:
        return isinstance(stored, dict) and stored.get("artifact_type") == JURY_VERDICT_ARTIFACT
    if kind.startswith("judge:") or kind == _BOOK_ROW:
        return True
    if kind == "capsule" and isinstance(stored, dict):
        capsule = stored.get("capsule")
        return judgment_member(capsule) is not None or mesh_block(capsule) is not None
    return False


def read_ledger(path: str | Path) -> Source:
    """Every judgment record of the ledger at ``path`` (opened read-only).

    Args:
        path: the ledger file.

    Returns:
        The Source: every judgment record with its reading.

    Raises:
        LedgerError: the ledger cannot be opened or read.
    """
    with Ledger(path, readonly=True) as ledger:
        entries = list(ledger.entries())
        inbound: dict[str, list[tuple[str, str]]] = {}
        for e in entries:
            for link in e.links:
                inbound.setdefault(str(link.get("target")), []).append((str(link.get("type")), e.record_id))

        def resolve(digest: str) -> Any:
            entry = ledger.entry(digest) if isinstance(digest, str) else None
            if entry is None or entry.record_type != _ARTIFACT:
                return None
            stored = _stored(entry)
            return stored.get("content") if isinstance(stored, dict) and stored.get("encoding") == "json" else None

        out: list[SourceRecord] = []
        for e in entries:
            stored = _stored(e)
            if isinstance(stored, _Unreadable):
                if e.record_type.startswith("judge:") or e.record_type == _BOOK_ROW:
                    out.append(SourceRecord(e.header(), None, unreadable(stored.why)))
                continue
            if not _wanted(e, stored):
                continue
            body = stored.get("record", stored) if isinstance(stored, dict) and "record" in stored else stored
            reading = read(stored, name=_name(body, f"#{e.seq}"), resolve=resolve, digest=e.record_id,
                           inbound=lambda d: inbound.get(d, ()))
            items = tuple(dataclasses.replace(i, record_id=e.record_id, record_type=e.record_type) for i in reading.items)
            out.append(SourceRecord(e.header(), stored, Reading(reading.interpretation, items)))
    return Source(tuple(out))


def is_experiment(document: Any) -> bool:
    """An experiment file: an object whose ``items`` are objects carrying a ``verdict`` member.

    Args:
        document: a parsed JSON value.

    Returns:
        True for an experiment document.
    """
    items = document.get("items") if isinstance(document, dict) else None
    return isinstance(items, list) and bool(items) and all(isinstance(i, dict) and "verdict" in i for i in items)


def reexport(document: dict[str, Any]) -> dict[str, Any]:
    """An experiment document with an ``interpretation`` beside each item's verdict
    (null for an item with no verdict). The input is not modified; the result
    equals it in every respect except the added keys.

    Args:
        document: an experiment document (see :func:`is_experiment`).

    Returns:
        A new document: the same, with an ``interpretation`` beside each verdict.
    """
    items = []
    for item in document["items"]:
        verdict = item.get("verdict")
        interpretation = None if verdict is None else read(verdict, name=str(item.get("itemSlug"))).interpretation.to_json()
        out: dict[str, Any] = {}
        for key, value in item.items():
            if key == "interpretation":
                continue
            out[key] = value
            if key == "verdict":
                out["interpretation"] = interpretation
        items.append(out)
    return {key: (items if key == "items" else value) for key, value in document.items()}


def _values(path: Path, data: bytes) -> Iterator[Any]:
    try:
        value = strict_json(data, str(path))
    except MalformedJSONError as whole:
        lines = [line for line in data.splitlines() if line.strip()]
        if len(lines) < 2:
            raise whole
        for n, line in enumerate(lines, 1):
            yield strict_json(line, f"{path} line {n}")
        return
    if isinstance(value, list):
        yield from value
    else:
        yield value


def read_file(path: str | Path) -> Source:
    """The records of a JSON, JSON-array or JSON Lines file.

    Args:
        path: a JSON, JSON-array or JSON Lines file.

    Returns:
        The Source (with ``document`` set for an experiment file).

    Raises:
        InputError: the file cannot be read; MalformedJSONError (an InputError): it is not JSON.
    """
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise InputError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    values = list(_values(path, data))
    if len(values) == 1 and is_experiment(values[0]):
        document = reexport(values[0])
        records = [SourceRecord(None, item.get("verdict"), read(item.get("verdict"), name=str(item.get("itemSlug"))))
                   for item in values[0]["items"] if item.get("verdict") is not None]
        return Source(tuple(records), document)
    return Source(tuple(SourceRecord(None, v, read(v, name=_name(v, f"#{n}"))) for n, v in enumerate(values, 1)))


def read_source(path: str | Path) -> Source:
    """A ledger (by its SQLite header) or a file.

    Args:
        path: a ledger or a file.

    Returns:
        The Source.

    Raises:
        InputError: the path cannot be read as either; LedgerError: a ledger that cannot be read.
    """
    path = Path(path)
    try:
        with path.open("rb") as f:
            head = f.read(len(_SQLITE))
    except OSError as exc:
        raise InputError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    if head == _SQLITE:
        try:
            return read_ledger(path)
        except sqlite3.DatabaseError as exc:
            raise InputError(f"{path}: not a readable capseal ledger ({exc})") from None
    return read_file(path)
