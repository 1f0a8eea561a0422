"""Reading one node of a stored jury verdict: its aggregate, its evidence block and its seated judges.

A node is the root verdict, an attempt's verdict or a 0.13 sub-verdict; ``N`` is
its path (``verdict``, ``verdict.compositeAttempts[0].verdict`` …). Absent and
JSON null are the same everywhere; a member of the wrong type reads as absent
unless the rules call it UNPARSEABLE; members this reader does not know are
ignored. Defects are appended in the order the members are read.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .defects import Findings
from .model import Check, Evidence, JudgeSeat, ScoreScale
from .values import brief, finite, is_number, truncated_int, whole_count
from .vocab import ERROR_POLICIES, KEY_SOURCES, NOT_APPLICABLE_POLICIES, REASON_FAMILY, STATUS_BY_ENUM, STATUSES

__all__ = ["Judgment", "read_judgment", "read_evidence", "read_node", "Node", "normalise_status", "block_present"]


def normalise_status(value: Any) -> str | None:
    """A status string as its wire token (the 0.13 enum names read as lower case);
    an unknown string is kept raw; anything else is None.

    Args:
        value: a recorded status.

    Returns:
        The wire token, the raw unknown string, or None for a non-string.
    """
    if not isinstance(value, str):
        return None
    if value in STATUSES:
        return value
    return STATUS_BY_ENUM.get(value, value)


@dataclass(frozen=True)
class Judgment:
    """The readable facts of one judgment."""

    status: str | None = None
    reason_code: str | None = None
    reasoning: str | None = None
    score: float | None = None
    scale: ScoreScale | None = None
    checks: tuple[Check, ...] = ()


def _score(raw: Any, path: str, found: Findings) -> tuple[float | None, ScoreScale | None]:
    """A score: a bare number in [0, 1], or ``{value, min, max}`` normalised on its own recorded scale."""
    if raw is None:
        return None, None
    if is_number(raw):
        number = finite(raw)
        if number is not None and 0.0 <= number <= 1.0:
            return number, None
        found.unparseable(path, "score", "a bare score is a finite number in [0, 1]")
        return None, None
    if not isinstance(raw, dict):
        found.unparseable(path, "score", f"a score is a number or {{value, min, max}}, not {type(raw).__name__}")
        return None, None
    value, low, high = raw.get("value"), raw.get("min"), raw.get("max")
    if type(value) is bool:
        found.unparseable(path, "score", "a {value: boolean} score says no number; it is ignored")
        return None, None
    if not (is_number(value) and is_number(low) and is_number(high)):
        found.unparseable(path, "score", "a score object needs a numeric value, min and max")
        return None, None
    lo, hi = finite(low), finite(high)
    if lo is None or hi is None or hi <= lo:
        found.unparseable(path, "score", "the recorded scale is unusable (bounds not finite, or max not above min)")
        return None, None
    scale = ScoreScale(lo, hi)
    number = finite(value)  # an infinite (or float-overflowing) value normalises to nothing
    normalised = (number - lo) / (hi - lo) if number is not None else float("nan")
    if normalised == normalised and 0.0 <= normalised <= 1.0:
        return normalised, scale
    found.unparseable(path, "score", "the score falls outside its own recorded scale")
    return None, scale


def _checks(raw: Any, path: str, found: Findings) -> tuple[Check, ...]:
    if raw is None:
        found.absent(path, "checks", "the judgment records no checks list")
        return ()
    if not isinstance(raw, list):
        found.unparseable(path, "checks", f"checks is a list, not {type(raw).__name__}")
        return ()
    out: list[Check] = []
    for k, entry in enumerate(raw):
        name = entry.get("name") if isinstance(entry, dict) else None
        passed = entry.get("passed") if isinstance(entry, dict) else None
        if not isinstance(name, str) or not name.strip() or type(passed) is not bool:
            found.unparseable(path, f"checks[{k}]", "a check is an object with a non-blank name and a boolean passed; dropped")
            continue
        message = entry.get("message")
        if message is None:
            found.absent(f"{path}.checks[{k}]", "message", "the check records no message")
            message = ""
        elif not isinstance(message, str):
            found.unparseable(f"{path}.checks[{k}]", "message", f"a check message is text, not {type(message).__name__}")
            message = ""
        out.append(Check(name, passed, message))
    return tuple(out)


def read_judgment(raw: dict[str, Any], path: str, found: Findings) -> Judgment:
    """One judgment at ``path``: status, reasonCode, reasoning, score, checks (defects in that order).

    Args:
        raw: the judgment object.
        path: its defect path.
        found: where defects go.

    Returns:
        The Judgment's readable facts.
    """
    status_raw = raw.get("status")
    status: str | None
    if status_raw is None:
        found.absent(path, "status", "the judgment records no status")
        status = None
    elif not isinstance(status_raw, str):
        found.unparseable(path, "status", f"a status is a token, not {type(status_raw).__name__}")
        status = None
    else:
        status = normalise_status(status_raw)
        if status not in STATUSES:
            found.unknown(path, "status", f"status {brief(status_raw)} is not a token this reader defines; kept as recorded")
    code_raw = raw.get("reasonCode")
    code: str | None = None
    if code_raw is None:
        if status == "error":
            found.absent(path, "reasonCode", "an error without a reason code: a failure nobody can count is a failure nobody fixes")
    elif not isinstance(code_raw, str):
        found.unparseable(path, "reasonCode", f"a reason code is a token, not {type(code_raw).__name__}")
    else:
        code = code_raw
        if code not in REASON_FAMILY:
            found.unknown(path, "reasonCode", f"reason code {brief(code_raw)} is not a token this reader defines; kept as recorded")
    reasoning_raw = raw.get("reasoning")
    reasoning: str | None = None
    if reasoning_raw is None:
        found.absent(path, "reasoning", "the judgment records no reasoning")
    elif not isinstance(reasoning_raw, str):
        found.unparseable(path, "reasoning", f"reasoning is text, not {type(reasoning_raw).__name__}")
    else:
        reasoning = reasoning_raw
    score, scale = _score(raw.get("score"), path, found)
    checks = _checks(raw.get("checks"), path, found)
    return Judgment(status, code, reasoning, score, scale, checks)


def block_present(aggregated: Any) -> bool:
    """Does the aggregate hold an evidence block (``metadata.aggregation`` non-null, of any type)?

    Args:
        aggregated: an aggregate (any value).

    Returns:
        True when ``metadata.aggregation`` is present and non-null.
    """
    metadata = aggregated.get("metadata") if isinstance(aggregated, dict) else None
    return isinstance(metadata, dict) and metadata.get("aggregation") is not None


_TEXT = ("strategy", "errorPolicy", "notApplicablePolicy")
_REAL = ("threshold", "inputWeight", "eligibleWeight")
_VOCAB = {"errorPolicy": ERROR_POLICIES, "notApplicablePolicy": NOT_APPLICABLE_POLICIES}
_ORDER = (
    "strategy", "errorPolicy", "notApplicablePolicy", "inputCount", "eligibleCount", "explicitAbstainCount",
    "notApplicableCount", "errorCount", "ignoredErrorCount", "errorsTreatedAsAbstainCount",
    "errorsTreatedAsFailCount", "notApplicableTreatedAsFailCount", "errorCodeCounts", "passCount",
    "failCount", "threshold", "bindingIndex", "inputWeight", "eligibleWeight",
)


def read_evidence(aggregated: dict[str, Any], path: str, found: Findings) -> Evidence | None:
    """The evidence block of an aggregate at ``path`` (``N.aggregated``), key by key;
    a missing key is None with no defect, a key of the wrong type None with a defect.

    Args:
        aggregated: the aggregate object.
        path: its defect path (``N.aggregated``).
        found: where defects go.

    Returns:
        The Evidence, or None when there is no readable block.
    """
    if not block_present(aggregated):
        return None
    block = aggregated["metadata"]["aggregation"]
    if not isinstance(block, dict):
        found.unparseable(path, "metadata.aggregation", f"the evidence block is an object, not {type(block).__name__}")
        return None
    values: list[tuple[str, Any]] = []
    for key in _ORDER:
        raw = block.get(key)
        field = f"metadata.aggregation.{key}"
        if raw is None:
            continue
        if key in _TEXT:
            if not isinstance(raw, str):
                found.unparseable(path, field, f"{key} is text, not {type(raw).__name__}")
                continue
            if key in _VOCAB and raw not in _VOCAB[key]:
                found.unknown(path, field, f"{key} {brief(raw)} is not a token this reader defines; kept as recorded")
            values.append((key, raw))
        elif key in _REAL:
            number = finite(raw)
            if number is None:
                found.unparseable(path, field, f"{key} is a finite number")
                continue
            values.append((key, number))
        elif key == "errorCodeCounts":
            if not isinstance(raw, dict):
                found.unparseable(path, field, f"errorCodeCounts is an object of counts, not {type(raw).__name__}")
                continue
            counts: list[tuple[str, int]] = []
            for code, n in raw.items():
                kept = truncated_int(n)
                if kept is None:
                    found.unparseable(path, f"{field}.{code}", "a cause count is a number (kept as an integer); dropped")
                    continue
                counts.append((code, kept))
            values.append((key, tuple(counts)))
        else:
            count = whole_count(raw)
            if count is None:
                found.unparseable(path, field, f"{key} is a whole number no larger than 2^31-1")
                continue
            values.append((key, count))
    return Evidence(tuple(values))


@dataclass(frozen=True)
class Node:
    """What one verdict node reads as."""

    aggregated: bool  # the aggregate is an object
    judgment: Judgment
    evidence: Evidence | None
    judges: tuple[JudgeSeat, ...]


def _seat_from(position: int, name: str, key_source: str | None, raw: Any, path: str, found: Findings) -> JudgeSeat:
    if not isinstance(raw, dict):
        found.absent(path, "judgment", "the seat holds no judgment")
        return JudgeSeat(position, name, key_source)
    j = read_judgment(raw, path, found)
    return JudgeSeat(position, name, key_source, j.status, j.reason_code, j.score, j.scale, j.reasoning or "", j.checks)


def _seated(node: dict[str, Any], path: str, seats: list[Any], found: Findings) -> list[JudgeSeat]:
    individual = node.get("individual")
    by_name = node.get("individualByName")
    out: list[JudgeSeat] = []
    for i, seat in enumerate(seats):
        at = f"{path}.seats[{i}]"
        if not isinstance(seat, dict):
            found.unparseable(path, f"seats[{i}]", "a seat is an object {position, verdictKey, keySource}")
            continue
        position = truncated_int(seat.get("position"))
        if position is None:
            found.unparseable(at, "position", "a seat position is a number; its index is used")
            position = i
        key = seat.get("verdictKey")
        name = key if isinstance(key, str) else ""
        if not isinstance(key, str):
            found.absent(at, "verdictKey", "the seat names no verdict key")
        source_raw = seat.get("keySource")
        source: str | None = None
        if source_raw is None:
            found.absent(at, "keySource", "the seat says not how its key was chosen")
        elif isinstance(source_raw, str):
            source = source_raw
            if source not in KEY_SOURCES:
                found.unknown(at, "keySource", f"key source {brief(source_raw)} is not a token this reader defines; kept as recorded")
        else:
            found.unparseable(at, "keySource", f"a key source is a token, not {type(source_raw).__name__}")
        judgment_path = f"{path}.individual[{i}]"
        raw: Any = None
        if isinstance(individual, list) and i < len(individual) and isinstance(individual[i], dict):
            raw = individual[i]
        elif isinstance(by_name, dict) and name:
            judgment_path = f"{path}.individualByName[{name}]"
            raw = by_name.get(name)
        out.append(_seat_from(position, name, source, raw, judgment_path, found))
    return out


def _unseated(node: dict[str, Any], path: str, root: bool, found: Findings) -> list[JudgeSeat]:
    if root:
        found.absent(path, "seats", "the record seats no judges (written before 0.17)")
    by_name = node.get("individualByName")
    individual = node.get("individual")
    if isinstance(by_name, dict):
        return [_seat_from(i, key if isinstance(key, str) else repr(key), None, raw, f"{path}.individualByName[{key}]", found)
                for i, (key, raw) in enumerate(by_name.items())]
    found.absent(path, "individualByName", "the record keys no judgments by name")
    if isinstance(individual, list):
        return [_seat_from(i, "", None, raw, f"{path}.individual[{i}]", found) for i, raw in enumerate(individual)]
    return []


def read_node(node: dict[str, Any], path: str, found: Findings, *, root: bool) -> Node:
    """One verdict node at ``path``: its aggregate, evidence block and judges.

    Args:
        node: the verdict node object.
        path: its defect path.
        found: where defects go.
        root: whether it is the root (only the root's missing seats are a defect).

    Returns:
        The Node: aggregate, evidence and judges.
    """
    aggregated = node.get("aggregated")
    if not isinstance(aggregated, dict):
        found.absent(path, "aggregated", "the verdict has no aggregate")
        judgment, evidence = Judgment(), None
    else:
        judgment = read_judgment(aggregated, f"{path}.aggregated", found)
        evidence = read_evidence(aggregated, f"{path}.aggregated", found)
    seats = node.get("seats")
    if seats is not None:
        if not isinstance(seats, list):
            found.unparseable(path, "seats", f"seats is a list, not {type(seats).__name__}")
            judges: list[JudgeSeat] = []
        else:
            judges = _seated(node, path, seats, found)
    else:
        judges = _unseated(node, path, root, found)
    return Node(isinstance(aggregated, dict), judgment, evidence, tuple(judges))
