"""Findings: what every capseal verifier returns instead of raising.

Codes, check numbers (1–9, or None for non-gating defensive checks) and severities
follow the reference verifier (``agent-action-capsule`` 0.12.0), so a finding from
capseal and one from the reference can be compared by ``(check, code, severity)``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = ["Finding", "HasFindings", "VerificationResult", "Severity"]

Severity = Literal["error", "warning", "info"]


@dataclass(frozen=True)
class Finding:
    """One verification finding. ``severity == "error"`` gates ``ok``."""

    code: str
    detail: str
    severity: Severity = "error"
    check: int | None = None

    def to_dict(self) -> dict[str, Any]:
        """This finding as JSON.

        Returns:
            ``{"check", "code", "detail", "severity"}`` (check None when no numbered check made it).
        """
        return {"check": self.check, "code": self.code, "detail": self.detail, "severity": self.severity}

    def __str__(self) -> str:
        where = f"check {self.check} " if self.check is not None else ""
        return f"[{self.severity}] {where}{self.code}: {self.detail}"


class HasFindings:
    """``errors`` and ``codes()`` for every verifier's result (capsule,
    judgment, evidence): one reading of a ``findings`` list, written once."""

    findings: list[Finding]

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "error"]

    def codes(self) -> list[str]:
        """The findings' codes, in order.

        Returns:
            One code per finding, repeats kept.
        """
        return [f.code for f in self.findings]


@dataclass
class VerificationResult(HasFindings):
    """Result of verifying one capsule. One ``ok`` flag gates every other field."""

    ok: bool
    findings: list[Finding] = field(default_factory=list)
    derived: dict[str, str] = field(default_factory=dict)
    capsule_id: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """This result as JSON.

        Returns:
            ``{"ok", "capsule_id_recomputed", "derived", "findings"}``.
        """
        return {
            "ok": self.ok,
            "capsule_id_recomputed": self.capsule_id,
            "derived": dict(self.derived),
            "findings": [f.to_dict() for f in self.findings],
        }
