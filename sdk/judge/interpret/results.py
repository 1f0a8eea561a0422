"""Reading an Evidence Result: two answers per claim, sufficiency first.

A claim whose sufficiency is not SATISFIED reads NOT_ASSESSED whatever its
verdict (there was not enough evidence to judge: an instrument outcome, never
a rejection), its reason code naming the sufficiency (``sufficiency_gap`` …).
Under SATISFIED, ``met`` / ``not_met`` / ``not_evaluable`` read ACCEPTED /
REJECTED / UNDECIDED. Requirements the Result excludes as not applicable have
no claim; they read as one NOT_APPLICABLE part. The Result reads across its
parts.

Contradictions (INCONSISTENT): ``met``/``not_met`` under a sufficiency other
than SATISFIED, a claim in a bucket other than its verdict's (or in none), a
claim id held twice, a CONTESTED Close claim that is ``met``, producer
defects counting more than their denominator.
"""

from __future__ import annotations

import re
from typing import Any

from capseal.judge.vocab import CASE_VERDICTS, GRADES, RESULT_VERSION, SUFFICIENCY, TIERS

from .defects import Findings
from .model import Check, JudgeSeat, Stage
from .parts import ROOT, Part, RecordReading, record_reading, scan_floats, text, token
from .reading import across_parts, token_reading
from .values import brief

__all__ = ["read_result"]

CLAIM_TYPES = ("requirement", "reconcile", "close")
_GIT_ID = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")


def _implementation(claim: dict[str, Any], at: str, found: Findings) -> Check | None:
    impl = claim.get("implementation")
    if impl is None:
        return None
    code = impl.get("code_digest") if isinstance(impl, dict) else None
    alg = code.get("alg") if isinstance(code, dict) else None
    value = code.get("value") if isinstance(code, dict) else None
    named = alg in ("git-commit", "git-tree") and isinstance(value, str) and _GIT_ID.fullmatch(value) is not None
    if alg in ("git-commit", "git-tree") and isinstance(value, str) and not named:
        found.unparseable(f"{at}.implementation.code_digest", "value", f"{brief(value)} is no git object id (a version string is not a digest)")
    grade = impl.get("grade") if isinstance(impl, dict) else None
    detail = f"{alg} {value}" if isinstance(alg, str) and isinstance(value, str) else "no code identity recorded"
    if isinstance(grade, str):
        detail += f" ({grade})"
    return Check("implementation", named, detail)


def _presentation(claim: dict[str, Any]) -> tuple[Check | None, str | None]:
    carrier = claim.get("presentation")
    if not isinstance(carrier, dict):
        return None, None
    kind, status = carrier.get("kind"), carrier.get("status")
    prose = carrier.get("summary") if kind == "analysis" else carrier.get("narrative") if kind == "story" else None
    check = Check("presentation", status == "SATISFIED", f"{kind} {status}") if isinstance(kind, str) and isinstance(status, str) else None
    return check, prose if isinstance(prose, str) else None


def _claim(claim: dict[str, Any], i: int, found: Findings) -> tuple[Stage, str | None]:
    at = f"{ROOT}.claims[{i}]"
    name = text(claim.get("id"))
    if name is None:
        found.absent(at, "id", "the claim has no id")
    kind = claim.get("type")
    unrecognised = False
    if kind is not None and kind not in CLAIM_TYPES:
        found.unknown(at, "type", f"claim type {brief(kind)} is not one this reader defines: an unrecognised row")
        unrecognised = True
    tier = token(claim.get("tier"), at, "tier", TIERS, found, required=False)
    if claim.get("tier") is None:
        found.absent(at, "tier", "the claim does not say how it was reached (recomputed or judged)")
    sufficiency = token(claim.get("sufficiency"), at, "sufficiency", SUFFICIENCY, found)
    verdict = token(claim.get("verdict"), at, "verdict", CASE_VERDICTS, found)
    if sufficiency in SUFFICIENCY and sufficiency != "SATISFIED" and verdict in ("met", "not_met"):
        found.inconsistent(at, "verdict", f"{verdict} under sufficiency {sufficiency}: only SATISFIED admits met or not_met")
    close = claim.get("close")
    if kind == "close" and isinstance(close, dict):
        if close.get("close_state") == "CONTESTED" and verdict == "met":
            found.inconsistent(at, "verdict", "a CONTESTED Close is never met")
        found.absent(f"{at}.close", "counterparty_links", "the Close state is producer-asserted: the records whose links make it are not at hand")
        found.undetermined()
    grade = claim.get("grade")
    checks = [Check("sufficiency", sufficiency == "SATISFIED", str(sufficiency) if sufficiency is not None else "not recorded"),
              Check("tier", tier in TIERS, str(tier) if tier is not None else "not recorded")]
    if isinstance(grade, str) and grade not in GRADES:
        found.unknown(at, "grade", f"grade {brief(grade)} is not one this reader defines; kept as recorded")
    implementation = _implementation(claim, at, found)
    if implementation is not None:
        checks.append(implementation)
    elif tier == "recomputed":
        found.absent(at, "implementation", "a recomputed claim names the code that computed it")
    presentation, prose = _presentation(claim)
    if presentation is not None:
        checks.append(presentation)
    code = f"sufficiency_{sufficiency.lower()}" if sufficiency in SUFFICIENCY and sufficiency != "SATISFIED" else None
    if unrecognised or sufficiency is None or sufficiency not in SUFFICIENCY:
        reading = None
    elif sufficiency != "SATISFIED":
        reading = "NOT_ASSESSED"
    else:
        reading = token_reading(verdict)
    seat = JudgeSeat(0, text((claim.get("implementation") or {}).get("name") if isinstance(claim.get("implementation"), dict) else None) or "",
                     status=verdict, reason_code=code, reasoning=prose or "", checks=tuple(checks))
    stage = Stage(stage=name, path=(name,) if name is not None else (), status=verdict, reason_code=code, reasoning=prose,
                  judges=(seat,))
    return stage, reading


def _aggregate(body: dict[str, Any], claims: list[Any], found: Findings) -> int:
    """Check the aggregate against the claims; returns the count excluded as not applicable."""
    aggregate = body.get("aggregate")
    at = f"{ROOT}.aggregate"
    if not isinstance(aggregate, dict):
        found.absent(ROOT, "aggregate", "the Result has no aggregate")
        return 0
    index: dict[str, int] = {c["id"]: i for i, c in enumerate(claims) if isinstance(c, dict) and isinstance(c.get("id"), str)}
    verdict_of = {cid: claims[i].get("verdict") for cid, i in index.items()}
    buckets = aggregate.get("buckets")
    if not isinstance(buckets, dict):
        found.absent(at, "buckets", "the aggregate lists no buckets")
    else:
        placed: dict[str, int] = {}
        for bucket in CASE_VERDICTS:
            listed = buckets.get(bucket)
            for cid in listed if isinstance(listed, list) else ():
                if not isinstance(cid, str):
                    continue
                placed[cid] = placed.get(cid, 0) + 1
                if cid not in verdict_of:
                    found.inconsistent(f"{at}.buckets", bucket, f"the bucket names {brief(cid)}, which is no claim of this Result")
                elif verdict_of[cid] != bucket:
                    found.inconsistent(f"{at}.buckets", bucket, f"claim {brief(cid)} is {brief(verdict_of[cid])}, not {bucket}", part=index[cid])
        for cid, i in index.items():
            if placed.get(cid, 0) != 1:
                found.inconsistent(at, "buckets", f"claim {brief(cid)} is in {placed.get(cid, 0)} buckets, not exactly one", part=i)
    coverage = aggregate.get("coverage")
    if not isinstance(coverage, dict):
        found.absent(at, "coverage", "the aggregate states no coverage")
        return 0
    defects = coverage.get("producer_defects")
    if isinstance(defects, dict) and type(defects.get("count")) is int and type(defects.get("denominator")) is int \
            and defects["count"] > defects["denominator"]:
        found.inconsistent(f"{at}.coverage.producer_defects", "count",
                           f"count {defects['count']} exceeds its denominator {defects['denominator']}")
    excluded = coverage.get("excluded_not_applicable")
    return excluded if type(excluded) is int and excluded > 0 else 0


def read_result(body: dict[str, Any]) -> RecordReading:
    """One Evidence Result v0 body.

    Args:
        body: an Evidence Result body.

    Returns:
        The Result's RecordReading, one part per claim (and one for the requirements excluded).
    """
    found = Findings()
    scan_floats(body, found)
    version = body.get("result_version")
    if version != RESULT_VERSION:
        found.unknown(ROOT, "result_version", f"result_version {brief(version)} is not {RESULT_VERSION}")
    claims = body.get("claims")
    if not isinstance(claims, list) or not claims:
        found.absent(ROOT, "claims", "the Result holds no claim")
        found.undetermined()
        claims = []
    stages: list[Stage] = []
    parts: list[Part] = []
    readings: list[str | None] = []
    seen: set[str] = set()
    for i, claim in enumerate(claims):
        found.part = i
        if not isinstance(claim, dict):
            found.unparseable(ROOT, f"claims[{i}]", "a claim is an object")
            found.undetermined()
            readings.append(None)
            continue
        cid = claim.get("id")
        if isinstance(cid, str):
            if cid in seen:
                found.inconsistent(f"{ROOT}.claims[{i}]", "id", f"claim id {brief(cid)} is held twice; a claim is judged once")
            seen.add(cid)
        stage, reading = _claim(claim, i, found)
        stages.append(stage)
        readings.append(reading)
        parts.append(Part(f"claim {stage.stage}" if stage.stage is not None else f"claims[{i}]", i, stage, reading))
    found.part = None
    excluded = _aggregate(body, claims, found)
    if excluded:
        index = len(claims)
        stage = Stage(stage="excluded_not_applicable", path=("excluded_not_applicable",), status="not_applicable",
                      reasoning=f"{excluded} requirement(s) excluded as not applicable, with no claim")
        stages.append(stage)
        readings.append("NOT_APPLICABLE")
        parts.append(Part("excluded_not_applicable", index, stage, "NOT_APPLICABLE"))
    source = 1 if version == RESULT_VERSION else 0
    return record_reading(form=RESULT_VERSION, source_version=source, root=Stage(), stages=tuple(stages), parts=tuple(parts),
                          reading=across_parts(readings), found=found)
