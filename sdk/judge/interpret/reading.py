"""The reading rules and the support rule, in one place.

A stored jury verdict reads, first match wins: a decision that stopped on an
individual rejection is REJECTED whatever the aggregate says; no status is no
reading; ``error`` is NOT_ASSESSED (so an error outranks an abstention);
``not_applicable`` NOT_APPLICABLE; ``fail`` REJECTED; ``pass`` ACCEPTED;
``abstain`` UNDECIDED; an unknown token no reading (its defect was recorded).

Capseal's verdict tokens read through :data:`~.vocab.CAPSEAL_READING`. A record
holding several parts (the cases of a report, the claims of a Result) reads
across them with the same precedence: a rejected part outranks the rest, then
a part that cannot be read, then an instrument failure, then an undecided
part; NOT_APPLICABLE parts stand aside unless every part is one.

Support: any INCONSISTENT defect is CONTRADICTED; otherwise a needed fact that
is absent, or no reading, is UNDETERMINED; otherwise SUPPORTED.
"""

from __future__ import annotations

from collections.abc import Iterable

from .defects import Findings
from .vocab import CAPSEAL_READING, JURY_READING

__all__ = ["jury_reading", "token_reading", "across_parts", "support"]


def jury_reading(rejection: bool, status: str | None) -> str | None:
    """The reading of a stored jury verdict from its root status (normalised).

    Args:
        rejection: whether the decision stopped on an individual rejection.
        status: the root status, normalised.

    Returns:
        The reading, or None.
    """
    if rejection:
        return "REJECTED"
    if status is None:
        return None
    return JURY_READING.get(status)


def token_reading(status: str | None) -> str | None:
    """The reading of a capseal verdict token (None for a token that is no verdict).

    Args:
        status: a capseal verdict token, or None.

    Returns:
        The reading, or None.
    """
    return CAPSEAL_READING.get(status) if status is not None else None


def across_parts(readings: Iterable[str | None]) -> str | None:
    """The reading of a record from the readings of its parts (None when it has none).

    Args:
        readings: the readings of the record's parts.

    Returns:
        The record's reading, or None.
    """
    seen = list(readings)
    if not seen:
        return None
    if "REJECTED" in seen:
        return "REJECTED"
    if None in seen:
        return None
    for reading in ("NOT_ASSESSED", "UNDECIDED", "ACCEPTED"):
        if reading in seen:
            return reading
    return "NOT_APPLICABLE"


def support(found: Findings, reading: str | None) -> str:
    """``readingSupport`` from the defects found and the reading taken.

    Args:
        found: what was found while reading.
        reading: the reading taken.

    Returns:
        SUPPORTED, CONTRADICTED or UNDETERMINED.
    """
    if found.contradicted():
        return "CONTRADICTED"
    if found.undeterminable or reading is None:
        return "UNDETERMINED"
    return "SUPPORTED"
