"""Counting readings: a consumer's helper, never capseal's own figure.

Whether a reading counts against a subject, enters a denominator or moves a
rate is the policy of whoever owns the denominator. This helper is one such
policy, the one ``examples/interpret_consumer.py`` states, offered so a consumer need
not rewrite it:

* ACCEPTED counts as a pass; REJECTED and UNDECIDED as non-passes;
* NOT_ASSESSED is an instrument failure (a jury ran and could not assess), never a non-pass;
* NOT_APPLICABLE is excluded and counted apart;
* CONTRADICTED is reported (``unattestable``) and never counted;
* UNDETERMINED is reported (``unverified``) and, by default, counted by its reading;
* an item with no verdict (no interpretation) never enters the tally: it is
  counted apart as ``not_judged``; one whose reading cannot be read, as ``unread``.

The pass rate is passes over passes and non-passes; with an empty denominator
it is absent (None), never 0 — which says no item was eligible for the
denominator, not that no item was judged.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from .model import Interpretation

__all__ = ["Tally", "tally", "pass_rate"]

_BUCKET = {"ACCEPTED": "passes", "REJECTED": "non_passes", "UNDECIDED": "non_passes", "NOT_APPLICABLE": "excluded",
           "NOT_ASSESSED": "instrument_failures"}


@dataclass(frozen=True)
class Tally:
    """Counts of items by how a consumer's policy buckets their readings."""

    passes: int = 0
    non_passes: int = 0
    excluded: int = 0
    instrument_failures: int = 0
    unattestable: int = 0
    unverified: int = 0
    unread: int = 0
    not_judged: int = 0

    @property
    def pass_rate(self) -> Fraction | None:
        """passes / (passes + non-passes); None (absent, never 0) when that is empty."""
        judged = self.passes + self.non_passes
        return Fraction(self.passes, judged) if judged else None

    def to_json(self) -> dict[str, int]:
        """The counts as JSON (camelCase keys).

        Returns:
            One count per kind, ``passes`` … ``notJudged``.
        """
        return {"passes": self.passes, "nonPasses": self.non_passes, "excluded": self.excluded,
                "instrumentFailures": self.instrument_failures, "unattestable": self.unattestable,
                "unverified": self.unverified, "unread": self.unread, "notJudged": self.not_judged}


def _fields(item: Any) -> tuple[str | None, str | None] | None:
    """(reading, support) of an item, or None when it carries no interpretation."""
    if isinstance(item, Mapping):
        interpretation = item["interpretation"] if "interpretation" in item else item
    else:
        interpretation = getattr(item, "interpretation", item)
    if interpretation is None:
        return None
    if isinstance(interpretation, Interpretation):
        return interpretation.reading, interpretation.reading_support
    if isinstance(interpretation, Mapping):
        reading, support = interpretation.get("reading"), interpretation.get("readingSupport")
        return (reading if isinstance(reading, str) else None), (support if isinstance(support, str) else None)
    return None


def tally(items: Iterable[Any], *, count_unverified: bool = True) -> Tally:
    """Tally items by their readings.

    Args:
        items: Interpretations, ``Item``s, or serialised items (mappings with an
            ``interpretation`` member, which may be null) or interpretations.
        count_unverified: count an UNDETERMINED reading by its reading (it is
            reported as unverified either way).

    Returns:
        The Tally. Never raises for an item it cannot read: that is ``not_judged``.
    """
    counts = dict.fromkeys(("passes", "non_passes", "excluded", "instrument_failures", "unattestable", "unverified",
                            "unread", "not_judged"), 0)
    for item in items:
        fields = _fields(item)
        if fields is None:
            counts["not_judged"] += 1
            continue
        reading, support = fields
        if support == "CONTRADICTED":
            counts["unattestable"] += 1
            continue
        if support == "UNDETERMINED":
            counts["unverified"] += 1
            if not count_unverified:
                continue
        bucket = _BUCKET.get(reading) if reading is not None else None
        counts[bucket or "unread"] += 1
    return Tally(**counts)


def pass_rate(t: Tally) -> Fraction | None:
    """The pass rate of a tally: absent (None), never 0, when no item is eligible for the denominator.

    Args:
        t: a Tally.

    Returns:
        Passes over passes and non-passes, or None when that denominator is empty.
    """
    return t.pass_rate
