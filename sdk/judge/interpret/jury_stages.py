"""Collecting the stages of a stored jury verdict: every attempt a composite jury
entered (``compositeAttempts``) and every 0.13 sub-verdict (``subVerdicts``),
recursively, depth first, the parent before its children.

A stage that entered and produced no verdict keeps a null status and its failure
code: an absent status is never read as a failure, and such a stage gets no
status, reasoning or checks defects.
"""

from __future__ import annotations

from typing import Any

from .defects import Findings
from .jury_nodes import read_node
from .model import Stage
from .values import brief
from .vocab import DISPOSITION_REASONS, DISPOSITIONS, FAILURE_CODES, POLICIES, RELATIONS

__all__ = ["collect_stages", "MAX_NESTING"]

#: how deep composite juries are followed; deeper is reported, not read
MAX_NESTING = 64


def _token(attempt: dict[str, Any], member: str, known: tuple[str, ...], path: str, found: Findings, *, required: bool) -> str | None:
    raw = attempt.get(member)
    if raw is None:
        if required:
            found.absent(path, member, f"the attempt records no {member}")
        return None
    if not isinstance(raw, str):
        found.unparseable(path, member, f"{member} is a token, not {type(raw).__name__}")
        return None
    if raw not in known:
        found.unknown(path, member, f"{member} {brief(raw)} is not a token this reader defines; kept as recorded")
    return raw


def _failure(attempt: dict[str, Any], path: str, found: Findings) -> str | None:
    member = "failure" if attempt.get("failure") is not None else "failureCode"
    raw = attempt.get(member)
    if raw is None:
        return None
    code = raw if isinstance(raw, str) else raw.get("code") if isinstance(raw, dict) else None
    if not isinstance(code, str):
        found.unparseable(path, member, "a failure is a code, or an object with a string code")
        return None
    if code not in FAILURE_CODES:
        found.unknown(path, member, f"failure code {brief(code)} is not a token this reader defines; kept as recorded")
    return code


def _attempt(attempt: dict[str, Any], path: str, parent_path: tuple[str, ...], found: Findings,
             out: list[Stage], depth: int) -> None:
    name_raw = attempt.get("name")
    name = name_raw if isinstance(name_raw, str) else None
    if name is None:
        found.absent(path, "name", "the attempt is not named")
    relation = _token(attempt, "relation", RELATIONS, path, found, required=True)
    policy = _token(attempt, "policy", POLICIES, path, found, required=False)
    if policy is None and relation == "cascade_tier":
        found.absent(path, "policy", "a cascade tier records the policy it ran under")
    disposition = _token(attempt, "disposition", DISPOSITIONS, path, found, required=True)
    used = True if disposition == "used" else False if disposition == "stage_failed" else None
    reason = _token(attempt, "dispositionReason", DISPOSITION_REASONS, path, found, required=False)
    if reason is None and disposition == "stage_failed":
        found.absent(path, "dispositionReason", "a failed stage records why it did not count")
    failure = _failure(attempt, path, found)
    stage_path = (*parent_path, name) if name is not None else parent_path
    facts = {"stage": name, "path": stage_path, "relation": relation, "policy": policy, "disposition": disposition,
             "reason": reason, "failure": failure, "used_by_parent": used}
    verdict = attempt.get("verdict")
    if not isinstance(verdict, dict):
        if failure is None:
            found.absent(path, "verdict", "the attempt records neither a verdict nor a failure")
        out.append(Stage(**facts))  # type: ignore[arg-type]
        return
    at = f"{path}.verdict"
    node = read_node(verdict, at, found, root=False)
    j = node.judgment
    out.append(Stage(**facts, status=j.status, reason_code=j.reason_code, reasoning=j.reasoning,  # type: ignore[arg-type]
                     evidence=node.evidence, judges=node.judges))
    _collect(verdict, at, stage_path, depth + 1, found, out)


def _collect(node: dict[str, Any], path: str, parent_path: tuple[str, ...], depth: int, found: Findings, out: list[Stage]) -> None:
    if depth > MAX_NESTING:
        found.unparseable(path, "compositeAttempts", f"composite juries nest deeper than {MAX_NESTING}; not followed")
        return
    attempts = node.get("compositeAttempts")
    if isinstance(attempts, list):
        for i, attempt in enumerate(attempts):
            if not isinstance(attempt, dict):
                found.unparseable(path, f"compositeAttempts[{i}]", "an attempt is an object")
                continue
            _attempt(attempt, f"{path}.compositeAttempts[{i}]", parent_path, found, out, depth)
    subs = node.get("subVerdicts")
    if isinstance(subs, list):
        for i, sub in enumerate(subs):
            at = f"{path}.subVerdicts[{i}]"
            if not isinstance(sub, dict):
                found.unparseable(path, f"subVerdicts[{i}]", "a sub-verdict is an object")
                continue
            found.absent(at, "name", "a 0.13 sub-verdict has no stage name, relation, policy or disposition")
            read = read_node(sub, at, found, root=False)
            j = read.judgment
            out.append(Stage(path=parent_path, status=j.status, reason_code=j.reason_code, reasoning=j.reasoning,
                             evidence=read.evidence, judges=read.judges))
            _collect(sub, at, parent_path, depth + 1, found, out)


def collect_stages(root: dict[str, Any], found: Findings) -> tuple[Stage, ...]:
    """Every stage of the verdict ``root`` (at path ``verdict``), in depth-first pre-order.

    Args:
        root: the stored verdict object.
        found: where defects go.

    Returns:
        Every stage in depth-first pre-order.
    """
    out: list[Stage] = []
    _collect(root, "verdict", (), 1, found, out)
    return tuple(out)
