"""``interpret`` and ``read``: one entry point for every verdict capseal reads.

The reader is chosen by the value's own shape: a stored judge row
(``capseal-judgment/1``) or capsule row (``capseal-record/1``) is unwrapped; a
body with ``record_version`` is a judge-family record, with ``result_version``
an Evidence Result; a capsule carrying the mesh adjudication block or
``x-judgment-v1`` is read as such; a referee book entry or row by its shape;
anything else as a stored jury verdict map (a map of the wrong shape degrades
into defects). Models and sealed values (``SealedJudgment``, ``EvidenceResult``,
a judge record, ``SealedRecord``) are read through their JSON.

Read-only and never raising: the input is not modified, and whatever it is,
the answer is an Interpretation (a reader failure, which would be a bug here,
becomes an UNPARSEABLE defect rather than an exception).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from capseal.errors import MalformedJSONError
from capseal.record import strict_json

from .capsules import Resolve, judgment_member, mesh_block, read_judgment_capsule, read_mesh_verdict
from .defects import Findings
from .jury import read_jury_verdict
from .model import SCHEMA_VERSION, Interpretation, Stage
from .parts import RecordReading, item_of
from .reading import support
from .records import Inbound, read_judge_record
from .referee_rows import is_book_row, read_book_row
from .results import read_result
from .summary import summarise

__all__ = ["interpret", "read", "unreadable", "Reading", "Item", "READER_FAILURE", "JURY_VERDICT_ARTIFACT"]

#: how a note of a reader failure begins (a bug in this package, never the input's fault)
READER_FAILURE = "reader failure"
#: the artifact type under which a judge pipeline keeps a stored jury verdict in a JudgmentStore
JURY_VERDICT_ARTIFACT = "jury-verdict"

_JUDGMENT_ROW = "capseal-judgment/1"
_CAPSULE_ROW = "capseal-record/1"
_ARTIFACT_ROW = "capseal-artifact/1"


@dataclass(frozen=True)
class Item:
    """One verdict about one subject, named within its record: what a consumer tallies."""

    slug: str
    interpretation: Interpretation
    record_id: str | None = None
    record_type: str | None = None

    def to_json(self) -> dict[str, Any]:
        """This item as JSON.

        Returns:
            ``{"itemSlug", "recordId", "recordType", "interpretation"}``.
        """
        return {"itemSlug": self.slug, "recordId": self.record_id, "recordType": self.record_type,
                "interpretation": self.interpretation.to_json()}


@dataclass(frozen=True)
class Reading:
    """A value read: its interpretation as a whole, and its items (one per
    verdict about a subject; none for a record that holds no such verdict)."""

    interpretation: Interpretation
    items: tuple[Item, ...]


def _finished(i: Interpretation) -> Interpretation:
    return dataclasses.replace(i, summary=summarise(i))


def unreadable(note: str) -> Reading:
    """The reading of a stored value that is not JSON: no reading, one UNPARSEABLE defect, no item.

    Args:
        note: why the stored bytes are not read (names the row).

    Returns:
        A Reading with no reading, one UNPARSEABLE defect and no item.
    """
    found = Findings()
    found.unparseable("record", "value", note)
    i = _finished(Interpretation(SCHEMA_VERSION, 0, None, support(found, None), None, Stage(stage="unreadable"), (),
                                 tuple(found.defects), ""))
    return Reading(i, ())


def _failed(exc: BaseException) -> Interpretation:
    found = Findings()
    found.unparseable("verdict", "value", f"{READER_FAILURE}: {type(exc).__name__}; the value was not read")
    i = Interpretation(SCHEMA_VERSION, 0, None, support(found, None), None, Stage(), (), tuple(found.defects), "")
    try:
        return _finished(i)
    except Exception:  # pragma: no cover - the summary of this fixed value does not fail
        return i


def _unwrapped(value: Any) -> Any:
    """The JSON a value stands for: a model's body, a sealed value's record, a stored row's content."""
    if isinstance(value, (str, bytes, bytearray)):
        value = strict_json(bytes(value) if isinstance(value, bytearray) else value, "the JSON text")
    if isinstance(value, dict):
        version = value.get("record_version")
        if version == _JUDGMENT_ROW and isinstance(value.get("record"), dict):
            return value["record"]
        if version == _CAPSULE_ROW and isinstance(value.get("capsule"), dict):
            return value["capsule"]
        if version == _ARTIFACT_ROW and value.get("encoding") == "json":
            return value.get("content")
        if version == _ARTIFACT_ROW and value.get("encoding") == "utf-8" and isinstance(value.get("content"), str):
            return _unwrapped(value["content"])  # a stored jury verdict kept as its JSON text (it holds floats)
        if set(value) >= {"header", "record"} and isinstance(value.get("record"), dict):
            return value["record"]  # SealedJudgment.to_json()
        return value
    body = getattr(value, "body", None)
    if callable(body):  # a builder model (EvaluationReport, EvidenceResult …)
        return body()
    if isinstance(body, dict):  # a SealedJudgment
        return body
    if isinstance(body, bytes):  # a stored ledger row
        return _unwrapped(body)
    capsule = getattr(value, "capsule", None)
    return capsule if isinstance(capsule, dict) else value  # a SealedRecord


def _record(value: Any, resolve: Resolve | None, digest: str | None, inbound: Inbound | None) -> RecordReading | None:
    if not isinstance(value, dict):
        return None
    if "record_version" in value:
        return read_judge_record(value, digest=digest, inbound=inbound)
    if "result_version" in value:
        return read_result(value)
    if mesh_block(value) is not None:
        return read_mesh_verdict(value)
    if judgment_member(value) is not None:
        return read_judgment_capsule(value, resolve=resolve)
    if is_book_row(value):
        return read_book_row(value)
    return None


def _read(value: Any, name: str, resolve: Resolve | None, digest: str | None, inbound: Inbound | None) -> Reading:
    try:
        body = _unwrapped(value)
    except MalformedJSONError as exc:  # JSON text read one way only: a duplicate member, NaN, bad UTF-8
        return unreadable(str(exc))
    record = _record(body, resolve, digest, inbound)
    if record is None:
        whole = _finished(read_jury_verdict(body))
        return Reading(whole, (Item(name, whole),))
    whole = _finished(record.interpretation)
    items = tuple(Item(f"{name}/{part.slug}", _finished(item_of(record, part))) for part in record.parts)
    return Reading(whole, items)


def read(value: Any, *, name: str = "verdict", resolve: Resolve | None = None, digest: str | None = None,
         inbound: Inbound | None = None) -> Reading:
    """Read any verdict capseal reads, and the items it holds.

    Args:
        value: a stored jury verdict map (any age), a judge-family record body,
            an Evidence Result, an ``x-judgment-v1`` capsule, the mesh verdict
            record, a referee book entry or row; or a stored ledger row, a
            ``SealedJudgment``, a builder model or a ``SealedRecord`` holding one;
            or JSON text of one.
        name: how the items are named (``<name>/case c1`` …); a jury verdict's one item is ``name``.
        resolve: the published content of a digest (a judgment capsule's answer
            preimage), or None when unpublished.
        digest: the record's digest, to find the links into it (a Close's counterparty links).
        inbound: ``(link type, source digest)`` of the links into a digest.

    Returns:
        The Reading: the value's interpretation and its items (one per verdict
        about a subject). Never raises; the value is not modified.
    """
    try:
        return _read(value, name, resolve, digest, inbound)
    except Exception as exc:  # never raise: a reader failure is reported, not thrown
        failed = _failed(exc)
        return Reading(failed, (Item(name, failed),))


def interpret(value: Any, *, resolve: Resolve | None = None) -> Interpretation:
    """What a verdict says, whether its recorded facts back it, and what the record lacks.

    Args:
        value: any value :func:`read` takes.
        resolve: the published content of a digest, or None when unpublished.

    Returns:
        The Interpretation of the value as a whole. Never raises; the value is
        not modified.
    """
    return read(value, resolve=resolve).interpretation
