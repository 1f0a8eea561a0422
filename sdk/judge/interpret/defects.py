"""Collecting defects while a record is read, in the order they are found.

The order matters: the defect list and the summary both expose it. Besides the
defects, a reader marks whether the facts a support check needed were absent
(``undeterminable``): that, not every ABSENT defect, is what makes a reading
UNDETERMINED (a record can lack members the reading does not rest on).
"""

from __future__ import annotations

from .model import Defect

__all__ = ["Findings", "ABSENT", "UNPARSEABLE", "UNKNOWN_VOCABULARY", "INCONSISTENT"]

ABSENT = "ABSENT"
UNPARSEABLE = "UNPARSEABLE"
UNKNOWN_VOCABULARY = "UNKNOWN_VOCABULARY"
INCONSISTENT = "INCONSISTENT"


class Findings:
    """The defects found so far, and whether a needed fact was missing."""

    __slots__ = ("defects", "undetermined_in", "part")

    def __init__(self) -> None:
        self.defects: list[Defect] = []
        #: the parts (None: the record as a whole) a needed fact was missing for
        self.undetermined_in: set[int | None] = set()
        #: the part (case, claim, party index) being read; defects added now concern it
        self.part: int | None = None

    @property
    def undeterminable(self) -> bool:
        """Was a fact some support check needed absent, anywhere in the record?"""
        return bool(self.undetermined_in)

    def add(self, kind: str, path: str, field: str, note: str, *, part: int | None = None) -> None:
        """Record one defect.

        Args:
            kind: ABSENT, UNPARSEABLE, UNKNOWN_VOCABULARY or INCONSISTENT.
            path: the structure it is found in.
            field: the member it concerns.
            note: what is wrong, in words.
            part: the part it concerns (default: the part being read).

        Returns:
            None.
        """
        self.defects.append(Defect(path, field, kind, note, part if part is not None else self.part))

    def absent(self, path: str, field: str, note: str) -> None:
        """Record an ABSENT defect: a member the record lacks.

        Args:
            path: the structure it is found in.
            field: the member it concerns.
            note: what is wrong, in words.
        """
        self.add(ABSENT, path, field, note)

    def unparseable(self, path: str, field: str, note: str) -> None:
        """Record an UNPARSEABLE defect: a member whose value cannot be read.

        Args:
            path: the structure it is found in.
            field: the member it concerns.
            note: what is wrong, in words.
        """
        self.add(UNPARSEABLE, path, field, note)

    def unknown(self, path: str, field: str, note: str) -> None:
        """Record an UNKNOWN_VOCABULARY defect: a token outside the known vocabulary.

        Args:
            path: the structure it is found in.
            field: the member it concerns.
            note: what is wrong, in words.
        """
        self.add(UNKNOWN_VOCABULARY, path, field, note)

    def inconsistent(self, path: str, field: str, note: str, *, part: int | None = None) -> None:
        """Record an INCONSISTENT defect: the record contradicts itself.

        Args:
            path: the structure it is found in.
            field: the member it concerns.
            note: what is wrong, in words.
            part: the part it concerns (default: the part being read).
        """
        self.add(INCONSISTENT, path, field, note, part=part)

    def undetermined(self) -> None:
        """A fact a support check needs is absent (or its rule is not closed-form)."""
        self.undetermined_in.add(self.part)

    def contradicted(self) -> bool:
        """Does the record contradict itself anywhere?

        Returns:
            True when an INCONSISTENT defect was recorded.
        """
        return any(d.kind == INCONSISTENT for d in self.defects)

    def for_part(self, part: int) -> Findings:
        """What concerns one part: the record's own defects and marks, and the part's.

        Args:
            part: the part's index.

        Returns:
            A new Findings holding only those.
        """
        out = Findings()
        out.defects = [d for d in self.defects if d.part is None or d.part == part]
        out.undetermined_in = {p for p in self.undetermined_in if p is None or p == part}
        return out
