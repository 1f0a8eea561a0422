"""Reading judgment capsules: ``x-judgment-v1`` capsules and the mesh's verdict record.

``x-judgment-v1``: the capsule records the digest of the judge's answer
(``agent_output_digest`` over ``{verdict, rationale}``), not the answer. The
verdict reads only when the answer's preimage is published (``resolve``
returns it for the digest, and it digests to it); otherwise no reading, an
ABSENT defect and UNDETERMINED. No ``model_hosting`` on a model judge is read
as hosted and leaves the reading UNDETERMINED: a hosted verdict is attributable
but not re-derivable. The pending citation purposes ``judged_from`` and
``calibrated_against`` are UNKNOWN_VOCABULARY.

The mesh verdict record (``compute_attestation.adjudication`` with schema
``capsule-emit-mesh/adjudication/v1``): ``corroborated`` / ``inconclusive`` /
``contradicted:<node>`` / ``not_comparable``, split like ``adjudication/v1``
into the ruling and the contradicted party; one part per half. Its ``status``
is derived from the verdict (SATISFIED, UNKNOWN, CONTRADICTED): one that is not
is INCONSISTENT, as is a contradicted node that is neither half's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from capseal.canonical import json_digest

from .defects import Findings
from .model import Check, JudgeSeat, Stage
from .parts import ROOT, Part, RecordReading, record_reading, scan_floats, text, token
from .reading import token_reading
from .values import brief

__all__ = ["read_judgment_capsule", "read_mesh_verdict", "mesh_block", "judgment_member", "MESH_SCHEMA", "Resolve"]

#: the published content a digest names, or None
Resolve = Callable[[str], Any]

MESH_SCHEMA = "capsule-emit-mesh/adjudication/v1"
_MEMBER = "x-judgment-v1"
_CASE_VERDICTS = ("met", "not_met", "not_evaluable")
_MESH_VERDICTS = ("corroborated", "inconclusive", "contradicted", "not_comparable")
_MESH_STATUS = {"corroborated": "SATISFIED", "inconclusive": "UNKNOWN", "not_comparable": "UNKNOWN", "contradicted": "CONTRADICTED"}


def _compute(capsule: dict[str, Any]) -> tuple[dict[str, Any] | None, str]:
    attestation = capsule.get("model_attestation")
    compute = attestation.get("compute_attestation") if isinstance(attestation, dict) else None
    if isinstance(compute, dict):
        return compute, f"{ROOT}.model_attestation.compute_attestation"
    compute = capsule.get("compute_attestation")
    return (compute, f"{ROOT}.compute_attestation") if isinstance(compute, dict) else (None, ROOT)


def judgment_member(capsule: Any) -> dict[str, Any] | None:
    """The ``x-judgment-v1`` member of a capsule, or None.

    Args:
        capsule: any value.

    Returns:
        The member object, or None when the value carries none.
    """
    compute, _ = _compute(capsule) if isinstance(capsule, dict) else (None, "")
    member = compute.get(_MEMBER) if compute is not None else None
    return member if isinstance(member, dict) else None


def mesh_block(value: Any) -> tuple[dict[str, Any], str] | None:
    """The mesh adjudication block of a capsule (or the bare block) and its path, or None.

    Args:
        value: a capsule, or the bare adjudication block.

    Returns:
        ``(block, its defect path)``, or None when the value is no mesh verdict record.
    """
    if not isinstance(value, dict):
        return None
    if value.get("schema") == MESH_SCHEMA:
        return value, ROOT
    compute, at = _compute(value)
    block = compute.get("adjudication") if compute is not None else None
    if isinstance(block, dict) and block.get("schema") == MESH_SCHEMA:
        return block, f"{at}.adjudication"
    return None


def _references(capsule: dict[str, Any], found: Findings) -> None:
    refs = capsule.get("references")
    for i, ref in enumerate(refs if isinstance(refs, list) else ()):
        purpose = ref.get("citation_purpose") if isinstance(ref, dict) else None
        if purpose in ("judged_from", "calibrated_against"):
            found.unknown(f"{ROOT}.references[{i}]", "citation_purpose",
                          f"citation purpose {brief(purpose)} is pending registration; kept as recorded")


def _legacy_capsule(capsule: dict[str, Any], found: Findings) -> None:
    chain = capsule.get("chain")
    if isinstance(chain, dict) and chain.get("relation") == "adjudicates":
        found.unknown(f"{ROOT}.chain", "relation", "'adjudicates' is a legacy chain relation spelling, read as confirms; it is not the layer link")
    disposition = capsule.get("disposition")
    if isinstance(disposition, dict) and disposition.get("verdict_class") == "assessed":
        found.unknown(f"{ROOT}.disposition", "verdict_class", "verdict_class 'assessed' is not a registered verdict class")


def _answer(digest: Any, resolve: Resolve | None, at: str, found: Findings) -> dict[str, Any] | None:
    if not isinstance(digest, str):
        found.absent(at, "agent_output_digest", "the capsule records no digest of the judge's answer")
        found.undetermined()
        return None
    answer = None
    if resolve is not None:
        try:
            answer = resolve(digest)
        except Exception:  # a resolver that fails publishes nothing
            answer = None
    if answer is None:
        found.absent(at, "agent_output", "the answer's preimage is not published, so its verdict cannot be read")
        found.undetermined()
        return None
    try:
        same = json_digest(answer) == digest
    except Exception:  # a value with no digest (a float, a non-JSON value) is no published answer
        same = False
    if not same:
        found.inconsistent(at, "agent_output_digest", "the published answer does not digest to agent_output_digest")
        return None
    if not isinstance(answer, dict):
        found.unparseable(at, "agent_output", "the answer is an object {verdict, rationale}")
        found.undetermined()
        return None
    return answer


def read_judgment_capsule(capsule: dict[str, Any], *, resolve: Resolve | None = None) -> RecordReading:
    """One capsule carrying ``x-judgment-v1``.

    Args:
        capsule: a capsule carrying ``x-judgment-v1``.
        resolve: the published content of a digest, or None.

    Returns:
        The capsule's RecordReading (never raises on content).
    """
    found = Findings()
    scan_floats(capsule, found)
    _references(capsule, found)
    _legacy_capsule(capsule, found)
    compute, at = _compute(capsule)
    member = judgment_member(capsule) or {}
    member_at = f"{at}.{_MEMBER}"
    for name in ("rubric_digest", "rubric_version", "judge_parameters_digest"):
        if not isinstance(member.get(name), str):
            found.absent(member_at, name, f"the judgment member records no {name}")
    judge = text(capsule.get("developer"))
    if judge is None:
        found.absent(ROOT, "developer", "the capsule does not name its judge (developer)")
    answer = _answer((compute or {}).get("agent_output_digest"), resolve, at, found)
    verdict = token(answer.get("verdict"), f"{at}.agent_output", "verdict", _CASE_VERDICTS, found) if answer else None
    rationale = text(answer.get("rationale")) if answer else None
    hosting = member.get("model_hosting")
    human = False
    parameters_digest = member.get("judge_parameters_digest")
    if resolve is not None and isinstance(parameters_digest, str):
        try:
            parameters = resolve(parameters_digest)
        except Exception:
            parameters = None
        human = isinstance(parameters, dict) and "protocol" in parameters
    checks: list[Check] = []
    if hosting is None and not human:
        found.absent(member_at, "model_hosting", "no model_hosting: read as hosted, so the verdict is attributable but not re-derivable")
        found.undetermined()
    if not human:
        checks.append(Check("re-derivable", hosting == "self_hosted", f"model_hosting: {hosting or 'absent (read as hosted)'}"))
    seat = JudgeSeat(0, judge or "", status=verdict, reasoning=rationale or "", checks=tuple(checks))
    root = Stage(status=verdict, reasoning=rationale, judges=(seat,))
    reading = token_reading(verdict) if verdict in _CASE_VERDICTS else None
    parts = (Part("judgment", 0, root, reading),) if reading is not None else ()
    return record_reading(form=_MEMBER, source_version=1, root=root, parts=parts, reading=reading, found=found)


def read_mesh_verdict(value: dict[str, Any]) -> RecordReading:
    """The mesh's verdict record (a capsule carrying the block, or the bare block).

    Args:
        value: the mesh verdict capsule, or its bare adjudication block.

    Returns:
        The record's RecordReading, one part per half.
    """
    found = Findings()
    hit = mesh_block(value)
    block, at = hit if hit is not None else ({}, ROOT)
    if at != ROOT:
        scan_floats(value, found)
        _legacy_capsule(value, found)
    raw = block.get("verdict")
    node: str | None = None
    if isinstance(raw, str) and raw.startswith("contradicted:"):
        verdict: str | None = "contradicted"
        node = raw[len("contradicted:"):] or None
        if node is None:
            found.unparseable(at, "verdict", "a contradiction names the node it contradicts")
            found.undetermined()
    else:
        verdict = token(raw, at, "verdict", _MESH_VERDICTS[:2] + _MESH_VERDICTS[3:], found)
    status = block.get("status")
    if verdict in _MESH_STATUS:
        if status is None:
            found.absent(at, "status", "the record states no status")
        elif status != _MESH_STATUS[verdict]:
            found.inconsistent(at, "status", f"status is derived from the verdict: {verdict} is {_MESH_STATUS[verdict]}, not {brief(status)}")
    halves = [text(block.get("half_a_node_id")), text(block.get("half_b_node_id"))]
    for side, half in zip("ab", halves):
        if half is None:
            found.absent(at, f"half_{side}_node_id", "the record does not name this half's node")
            found.undetermined()
    if node is not None and all(halves) and node not in halves:
        found.inconsistent(at, "verdict", f"the contradicted node {brief(node)} is neither half's node")
    referee = text(block.get("referee_node_id")) or text(block.get("referee_id")) or ""
    tier = block.get("selection_tier")
    distinct = block.get("twin_owner_distinct")
    checks = (Check("twin_owner_distinct", distinct is True, f"twin_owner_distinct: {brief(distinct)}"),
              Check("selection_tier", type(tier) is int and tier in (1, 2), f"tier {brief(tier)}"))
    because = text(block.get("not_comparable_because")) if verdict == "not_comparable" else None
    stages: list[Stage] = []
    parts: list[Part] = []
    for j, half in enumerate(halves):
        if verdict == "contradicted":
            party = None if node is None or node not in halves else "contradicted" if half == node else "corroborated"
        else:
            party = verdict if verdict in _MESH_STATUS else None
        stage = Stage(stage=half, path=(half,) if half else (), status=party, reason_code=because,
                      judges=(JudgeSeat(0, referee, status=party, reason_code=because, checks=checks),))
        stages.append(stage)
        parts.append(Part(f"half {half}" if half else f"half {'ab'[j]}", j, stage, token_reading(party)))
    root = Stage(status=verdict, reason_code=because, judges=(JudgeSeat(0, referee, status=verdict, reason_code=because, checks=checks),))
    return record_reading(form=MESH_SCHEMA, source_version=1, root=root, stages=tuple(stages), parts=tuple(parts),
                          reading=token_reading(verdict), found=found)
