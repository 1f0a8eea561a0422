"""The Interpretation: one shape for what any verdict capseal reads says.

Whatever the input (a stored jury verdict of any age, a judge-family record,
an Evidence Result, a judgment capsule, a referee row), the reading comes back
as the same frozen value. What differs between a complete record and an
incomplete one is only its ``defects``.

:meth:`Interpretation.to_json` gives the serialised form: camelCase keys in a
fixed order, every null written explicitly except a ``scoreScale`` that is
null (omitted), scores, thresholds, weights and scale bounds as floats, counts
and positions as integers.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

__all__ = [
    "SCHEMA_VERSION",
    "READINGS",
    "SUPPORTS",
    "DEFECT_KINDS",
    "Check",
    "ScoreScale",
    "JudgeSeat",
    "Evidence",
    "EVIDENCE_KEYS",
    "Stage",
    "DecidedBy",
    "Defect",
    "Interpretation",
]

SCHEMA_VERSION = 1

#: what a verdict says about its subject
READINGS = ("ACCEPTED", "REJECTED", "UNDECIDED", "NOT_APPLICABLE", "NOT_ASSESSED")
#: whether the recorded facts back the reading
SUPPORTS = ("SUPPORTED", "CONTRADICTED", "UNDETERMINED")
#: what is wrong with a record: missing, unreadable, an unknown token, or a self-contradiction
DEFECT_KINDS = ("ABSENT", "UNPARSEABLE", "UNKNOWN_VOCABULARY", "INCONSISTENT")


@dataclass(frozen=True)
class Check:
    """One recorded check of a judge: its name, whether it held, and what it said."""

    name: str
    passed: bool
    detail: str

    def to_json(self) -> dict[str, Any]:
        """This check as JSON.

        Returns:
            ``{"name", "passed", "detail"}``.
        """
        return {"name": self.name, "passed": self.passed, "detail": self.detail}


@dataclass(frozen=True)
class ScoreScale:
    """The scale a normalised score was recorded on."""

    min: float
    max: float

    def to_json(self) -> dict[str, Any]:
        """This scale as JSON.

        Returns:
            ``{"min", "max"}``, as floats.
        """
        return {"min": float(self.min), "max": float(self.max)}


@dataclass(frozen=True)
class JudgeSeat:
    """One judge as seated: position, name, how its key was chosen, and its judgment."""

    position: int
    name: str
    key_source: str | None = None
    status: str | None = None
    reason_code: str | None = None
    score: float | None = None
    score_scale: ScoreScale | None = None
    reasoning: str = ""
    checks: tuple[Check, ...] = ()

    def to_json(self) -> dict[str, Any]:
        """This seat as JSON (camelCase keys, nulls explicit).

        Returns:
            The seat's JSON object.
        """
        out: dict[str, Any] = {
            "position": self.position, "name": self.name, "keySource": self.key_source, "status": self.status,
            "reasonCode": self.reason_code, "score": None if self.score is None else float(self.score),
        }
        if self.score_scale is not None:
            out["scoreScale"] = self.score_scale.to_json()
        out["reasoning"] = self.reasoning
        out["checks"] = [c.to_json() for c in self.checks]
        return out


#: the evidence block's members, in the order they are read and written
EVIDENCE_KEYS = (
    "strategy", "errorPolicy", "notApplicablePolicy", "inputCount", "eligibleCount", "explicitAbstainCount",
    "notApplicableCount", "errorCount", "ignoredErrorCount", "errorsTreatedAsAbstainCount",
    "errorsTreatedAsFailCount", "notApplicableTreatedAsFailCount", "errorCodeCounts", "passCount",
    "failCount", "threshold", "bindingIndex", "inputWeight", "eligibleWeight",
)
_FLOAT_KEYS = ("threshold", "inputWeight", "eligibleWeight")


@dataclass(frozen=True)
class Evidence:
    """The nullable view of an aggregate's evidence block: a member the block
    lacks is None (so an older block binds leniently)."""

    values: tuple[tuple[str, Any], ...] = ()

    def get(self, key: str) -> Any:
        """One member's value.

        Args:
            key: the member's name.

        Returns:
            Its value, or None when the block lacks it.
        """
        for k, v in self.values:
            if k == key:
                return v
        return None

    def to_json(self) -> dict[str, Any]:
        """The evidence block as JSON: every known member, None where the block lacks it.

        Returns:
            The block's JSON object.
        """
        known = dict(self.values)
        out: dict[str, Any] = {}
        for key in EVIDENCE_KEYS:
            value = known.get(key)
            if key == "errorCodeCounts" and value is not None:
                value = dict(value)
            elif key in _FLOAT_KEYS and value is not None:
                value = float(value)
            out[key] = value
        return out


@dataclass(frozen=True)
class Stage:
    """The root, or one attempt (part) the record holds: where it sits
    (``path``), how it was entered, and the verdict it produced."""

    stage: str | None = None
    path: tuple[str, ...] = ()
    relation: str | None = None
    policy: str | None = None
    disposition: str | None = None
    reason: str | None = None
    failure: str | None = None
    used_by_parent: bool | None = None
    status: str | None = None
    reason_code: str | None = None
    reasoning: str | None = None
    evidence: Evidence | None = None
    judges: tuple[JudgeSeat, ...] = ()

    def to_json(self) -> dict[str, Any]:
        """This stage as JSON (nulls explicit).

        Returns:
            The stage's JSON object.
        """
        return {
            "stage": self.stage, "path": list(self.path), "relation": self.relation, "policy": self.policy,
            "disposition": self.disposition, "reason": self.reason, "failure": self.failure,
            "usedByParent": self.used_by_parent, "status": self.status, "reasonCode": self.reason_code,
            "reasoning": self.reasoning, "evidence": None if self.evidence is None else self.evidence.to_json(),
            "judges": [j.to_json() for j in self.judges],
        }


@dataclass(frozen=True)
class DecidedBy:
    """Which stage decided, as the recorded decision chain names it."""

    stage: str
    path: tuple[str, ...]
    basis: str

    def to_json(self) -> dict[str, Any]:
        """As JSON.

        Returns:
            ``{"stage", "path", "basis"}``.
        """
        return {"stage": self.stage, "path": list(self.path), "basis": self.basis}


@dataclass(frozen=True)
class Defect:
    """One thing the record is missing, cannot say, says in an unknown token, or
    contradicts itself on. ``path`` names the structure, ``field`` the member."""

    path: str
    field: str
    kind: str
    note: str
    #: the index of the part (case, claim, party) it concerns, when it concerns one; not serialised
    part: int | None = dataclasses.field(default=None, compare=False, repr=False)

    def to_json(self) -> dict[str, Any]:
        """This defect as JSON.

        Returns:
            ``{"path", "field", "kind", "note"}``.
        """
        return {"path": self.path, "field": self.field, "kind": self.kind, "note": self.note}


@dataclass(frozen=True)
class Interpretation:
    """What a verdict says, whether its recorded facts back it, and what the record lacks."""

    schema_version: int
    source_version: int
    reading: str | None
    reading_support: str
    decided_by: DecidedBy | None
    root: Stage
    stages: tuple[Stage, ...]
    defects: tuple[Defect, ...]
    summary: str

    def to_json(self) -> dict[str, Any]:
        """The serialised form (the keys a consumer reads, nulls explicit).

        Returns:
            The interpretation's JSON object.
        """
        return {
            "schemaVersion": self.schema_version, "sourceVersion": self.source_version, "reading": self.reading,
            "readingSupport": self.reading_support,
            "decidedBy": None if self.decided_by is None else self.decided_by.to_json(),
            "root": self.root.to_json(), "stages": [s.to_json() for s in self.stages],
            "defects": [d.to_json() for d in self.defects], "summary": self.summary,
        }
