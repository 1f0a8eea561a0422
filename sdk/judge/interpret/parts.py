"""What capseal's own records read as: the record, and the parts it judges.

A capseal record (a judge-family record, an Evidence Result, a judgment
capsule, a referee row, the mesh verdict record) reads as one Interpretation
whose root is the record as a whole (its ``stage`` names the record's form)
and whose stages are its parts: the cases of a report, the claims of a Result,
the parties of a ruling, the clauses of a calibration. Each part that carries
a verdict about a subject is also an *item*: an Interpretation of its own,
rooted at that part, with the record's own defects and the part's. A record
with no verdict about a subject (a calibration, a manifest, a referee row that
reached no ruling) has no items: it never enters a tally.

Paths in defects start at ``record``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from .defects import Findings
from .model import SCHEMA_VERSION, DecidedBy, Interpretation, Stage
from .reading import support
from .values import floats_in

__all__ = ["Part", "RecordReading", "record_reading", "item_of", "token", "text", "scan_floats", "ROOT"]

ROOT = "record"


@dataclass(frozen=True)
class Part:
    """One part of a record that carries a verdict about a subject."""

    slug: str  # how the item is named within its record
    index: int  # the part index its defects carry
    stage: Stage
    reading: str | None


@dataclass(frozen=True)
class RecordReading:
    """A record read: its own interpretation (summary still empty), its items' parts, and what was found."""

    interpretation: Interpretation
    parts: tuple[Part, ...]
    found: Findings


def record_reading(*, form: str, source_version: int, root: Stage, stages: tuple[Stage, ...] = (),
                   parts: tuple[Part, ...] = (), reading: str | None, found: Findings,
                   decided_by: DecidedBy | None = None) -> RecordReading:
    """Assemble a record's interpretation: the root names the form; support follows the defects.

    Args:
        form: the record's form (the root's stage name).
        source_version: 1 when the record carries its version stamp, else 0.
        root: the record as a whole.
        stages: its parts as stages.
        parts: the parts that are items.
        reading: the record's reading.
        found: what was found.
        decided_by: the recorded deciding stage, if any.

    Returns:
        The RecordReading (summary still empty).
    """
    root = dataclasses.replace(root, stage=form)
    interpretation = Interpretation(SCHEMA_VERSION, source_version, reading, support(found, reading), decided_by, root,
                                    stages, tuple(found.defects), "")
    return RecordReading(interpretation, parts, found)


def item_of(read: RecordReading, part: Part) -> Interpretation:
    """The interpretation of one part, rooted at it (summary still empty).

    Args:
        read: the record read.
        part: one of its parts.

    Returns:
        The part's own Interpretation (summary still empty).
    """
    found = read.found.for_part(part.index)
    root = dataclasses.replace(part.stage, stage=read.interpretation.root.stage, relation=None, policy=None,
                               disposition=None, reason=None, failure=None, used_by_parent=None)
    return Interpretation(SCHEMA_VERSION, read.interpretation.source_version, part.reading, support(found, part.reading),
                          None, root, (), tuple(found.defects), "")


def token(raw: Any, path: str, field: str, known: tuple[str, ...], found: Findings, *, required: bool = True) -> str | None:
    """A verdict-like token: absent (ABSENT, and undeterminable when required),
    not a string (UNPARSEABLE), or kept as recorded (UNKNOWN_VOCABULARY if unknown).

    Args:
        raw: the recorded value.
        path: the defect path.
        field: the member name.
        known: the tokens this reader defines.
        found: where defects go.
        required: whether its absence leaves the reading undetermined.

    Returns:
        The token as recorded, or None.
    """
    if raw is None:
        if required:
            found.absent(path, field, f"the record states no {field}")
            found.undetermined()
        return None
    if not isinstance(raw, str):
        found.unparseable(path, field, f"{field} is a token, not {type(raw).__name__}")
        if required:
            found.undetermined()
        return None
    if raw not in known:
        found.unknown(path, field, f"{field} {raw!r} is not a token this reader defines; kept as recorded")
    return raw


def text(raw: Any) -> str | None:
    """A recorded string member, or None.

    Args:
        raw: any value.

    Returns:
        The value when it is a string, else None.
    """
    return raw if isinstance(raw, str) else None


def scan_floats(body: Any, found: Findings) -> None:
    """UNPARSEABLE for every float in a digest-bearing body (such a record holds
    integers, decimal strings or micros, never floats).

    Args:
        body: the record body.
        found: where defects go.

    Returns:
        None; one UNPARSEABLE defect per float.
    """
    for path, field in floats_in(body, ROOT):
        found.unparseable(path, field, "a float has no place in a digest-bearing record (integers, decimal strings or micros)")
