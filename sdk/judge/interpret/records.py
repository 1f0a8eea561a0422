"""Reading the judge-family records capseal seals.

* ``evaluation-report/v1``: one part per case, its verdict ``met`` /
  ``not_met`` / ``not_evaluable`` read as ACCEPTED / REJECTED / UNDECIDED, the
  report across its cases; the judge is the pinned model.
* ``adjudication/v1``: the ruling (``corroborated`` ACCEPTED, ``contradicted``
  REJECTED, ``inconclusive`` UNDECIDED) and one part per party: a
  contradiction rejects ``contradicted_party`` and corroborates the other.
* ``human-rating/v1``: the label, read only when it is a verdict token.
* ``calibration-summary/v1``: no reading; each clause exposes agreement and
  drift as k of n, with the rate k/n computed now (absent when n = 0).
* ``close/v1``: no reading; its reconcile state is producer-asserted unless the
  counterparty links that make it are at hand.
* ``adjudication-response/v1``, ``sample-manifest/v1``, ``contract-compile/v1``:
  no reading (a response, a sampling policy, a compile are no verdict).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from fractions import Fraction
from typing import Any

from capseal.canonical import is_hex64
from capseal.judge.vocab import ADJUDICATION_VERDICTS, CASE_VERDICTS, SHAPES

from .defects import Findings
from .model import Check, JudgeSeat, Stage
from .parts import ROOT, Part, RecordReading, record_reading, scan_floats, text, token
from .reading import across_parts, token_reading
from .values import brief, members

__all__ = ["read_judge_record", "Inbound"]

#: inbound links to a record: ``[(link type, source digest)]`` for a record digest
Inbound = Callable[[str], Iterable[tuple[str, str]]]

CLOSE_STATES = ("AGREED", "UNILATERAL", "CONTESTED")


def _legacy_citations(body: Any, found: Findings) -> None:
    for path, field, _ in members(body, ROOT):
        if field == "citation_purpose":
            found.unknown(path, field, "a judge citation states judge_purpose; citation_purpose is the retired name")


def _digest_of(citation: Any) -> str | None:
    return citation.get("digest") if isinstance(citation, dict) and isinstance(citation.get("digest"), str) else None


def _evaluation(body: dict[str, Any], found: Findings) -> RecordReading:
    pin = body.get("judge_pin")
    model = pin.get("model_id") if isinstance(pin, dict) else None
    if not isinstance(model, str):
        found.absent(f"{ROOT}.judge_pin", "model_id", "the report does not name its judge model")
    judge = model if isinstance(model, str) else ""
    cases = body.get("cases")
    stages: list[Stage] = []
    parts: list[Part] = []
    readings: list[str | None] = []
    if not isinstance(cases, list) or not cases:
        found.absent(ROOT, "cases", "the report judges no case")
        found.undetermined()
        cases = []
    for i, case in enumerate(cases):
        found.part = i
        at = f"{ROOT}.cases[{i}]"
        if not isinstance(case, dict):
            found.unparseable(ROOT, f"cases[{i}]", "a case is an object")
            found.undetermined()
            readings.append(None)
            continue
        name = text(case.get("case_id"))
        if name is None:
            found.absent(at, "case_id", "the case is not named")
        verdict = token(case.get("verdict"), at, "verdict", CASE_VERDICTS, found)
        acts = case.get("acts")
        n_acts = len(acts) if isinstance(acts, list) else 0
        if n_acts == 0:
            found.absent(at, "acts", "the case cites no act it rests on")
        method = _digest_of(case.get("method"))
        if method is None:
            found.absent(at, "method", "the case cites no rubric it was judged against")
        checks = (Check("acts", n_acts > 0, f"{n_acts} act(s) cited as grounds"),
                  Check("method", method is not None, f"rubric {method}" if method else "no rubric cited"))
        stage = Stage(stage=name, path=(name,) if name is not None else (), status=verdict,
                      judges=(JudgeSeat(0, judge, status=verdict, checks=checks),))
        stages.append(stage)
        reading = token_reading(verdict)
        readings.append(reading)
        parts.append(Part(f"case {name}" if name is not None else f"cases[{i}]", i, stage, reading))
    found.part = None
    return record_reading(form="evaluation-report/v1", source_version=1, root=Stage(), stages=tuple(stages),
                          parts=tuple(parts), reading=across_parts(readings), found=found)


def _adjudication(body: dict[str, Any], found: Findings) -> RecordReading:
    verdict = token(body.get("verdict"), ROOT, "verdict", ADJUDICATION_VERDICTS, found)
    basis = body.get("basis")
    model = basis.get("model_id") if isinstance(basis, dict) else None
    if not isinstance(model, str):
        found.absent(f"{ROOT}.basis", "model_id", "the ruling does not name the referee's model")
    referee = model if isinstance(model, str) else ""
    parties = body.get("parties")
    digests: list[str | None] = []
    if not isinstance(parties, list) or not parties:
        found.absent(ROOT, "parties", "the ruling cites no party")
        found.undetermined()
        parties = []
    for j, party in enumerate(parties):
        digest = _digest_of(party)
        if digest is None:
            found.part = j
            found.unparseable(ROOT, f"parties[{j}]", "a party is a citation with a digest")
            found.undetermined()
            found.part = None
        digests.append(digest)
    named = body.get("contradicted_party")
    against: str | None = None
    if verdict == "contradicted":
        if named is None:
            found.absent(ROOT, "contradicted_party", "a contradiction names the party it contradicts")
            found.undetermined()
        elif not isinstance(named, str):
            found.unparseable(ROOT, "contradicted_party", "contradicted_party is a party's digest")
            found.undetermined()
        elif named in digests:
            against = named
        elif is_hex64(named):
            found.inconsistent(ROOT, "contradicted_party", "contradicted_party names a digest that is none of the parties")
        else:
            found.unparseable(ROOT, "contradicted_party", f"contradicted_party {brief(named)} names no party by its digest, "
                              "so which party is contradicted cannot be read")
            found.undetermined()
    elif named is not None and verdict in ADJUDICATION_VERDICTS:
        found.inconsistent(ROOT, "contradicted_party", f"a {verdict} ruling contradicts no party, yet one is named")
    count = len(parties)
    seat_checks = (Check("parties", 1 <= count <= 2, f"{count} party(ies) cited"),)
    stages: list[Stage] = []
    parts: list[Part] = []
    for j, digest in enumerate(digests):
        if verdict == "contradicted":
            status = None if against is None else "contradicted" if digest == against else "corroborated"
        else:
            status = verdict if verdict in ADJUDICATION_VERDICTS else None
        stage = Stage(stage=digest, path=(digest,) if digest else (), status=status,
                      judges=(JudgeSeat(0, referee, status=status, checks=seat_checks),))
        stages.append(stage)
        parts.append(Part(f"party {digest}" if digest else f"parties[{j}]", j, stage, token_reading(status)))
    root = Stage(status=verdict, judges=(JudgeSeat(0, referee, status=verdict, checks=seat_checks),))
    return record_reading(form="adjudication/v1", source_version=1, root=root, stages=tuple(stages), parts=tuple(parts),
                          reading=token_reading(verdict) if verdict in ADJUDICATION_VERDICTS else None, found=found)


def _human_rating(body: dict[str, Any], found: Findings) -> RecordReading:
    label_raw = body.get("label")
    label = text(label_raw)
    if label_raw is None:
        found.absent(ROOT, "label", "the rating records no label")
        found.undetermined()
    elif label is None:
        found.unparseable(ROOT, "label", f"a label is text, not {type(label_raw).__name__}")
        found.undetermined()
    blind = body.get("blind")
    if blind is None:
        found.absent(ROOT, "blind", "a human-rating/v1 states that it was blind")
    elif blind is not True:
        found.inconsistent(ROOT, "blind", f"a human-rating/v1 is blind by its shape, and this one says blind: {brief(blind)}")
    rater = text(body.get("rater_ref"))
    if rater is None:
        found.absent(ROOT, "rater_ref", "the rating names no rater reference")
    seat = JudgeSeat(0, rater or "", status=label, checks=(Check("blind", blind is True, f"blind: {brief(blind)}"),))
    root = Stage(status=label, judges=(seat,))
    reading = token_reading(label) if label in CASE_VERDICTS else None
    parts = (Part("rating", 0, root, reading),) if reading is not None else ()
    return record_reading(form="human-rating/v1", source_version=1, root=root, parts=parts, reading=reading, found=found)


def _kofn(raw: Any, at: str, name: str, position: int, found: Findings) -> JudgeSeat:
    k = raw.get("k") if isinstance(raw, dict) else None
    n = raw.get("n") if isinstance(raw, dict) else None
    if type(k) is not int or type(n) is not int or k < 0 or n < 0:
        found.unparseable(at, name, f"{name} is k of n: two whole numbers, never a ratio")
        return JudgeSeat(position, name)
    if k > n:
        found.inconsistent(f"{at}.{name}", "k", f"k={k} exceeds n={n}: a count of n cannot hold more than n")
    rate = float(Fraction(k, n)) if n and k <= n else None
    return JudgeSeat(position, name, score=rate, checks=(Check("k of n", k <= n, f"{k} of {n}"),))


def _calibration(body: dict[str, Any], found: Findings) -> RecordReading:
    clauses = body.get("clauses")
    stages: list[Stage] = []
    if not isinstance(clauses, list) or not clauses:
        found.absent(ROOT, "clauses", "the summary tallies no clause")
        clauses = []
    for i, clause in enumerate(clauses):
        at = f"{ROOT}.clauses[{i}]"
        if not isinstance(clause, dict):
            found.unparseable(ROOT, f"clauses[{i}]", "a clause is an object")
            continue
        ref = text(clause.get("clause_ref"))
        if ref is None:
            found.absent(at, "clause_ref", "the clause is not named")
        seats = (_kofn(clause.get("agreement"), at, "agreement", 0, found), _kofn(clause.get("drift"), at, "drift", 1, found))
        stages.append(Stage(stage=ref, path=(ref,) if ref is not None else (), judges=seats))
    return record_reading(form="calibration-summary/v1", source_version=1, root=Stage(), stages=tuple(stages),
                          reading=None, found=found)


def _close(body: dict[str, Any], found: Findings, digest: str | None, inbound: Inbound | None) -> RecordReading:
    reconcile = body.get("reconcile")
    status = None
    if isinstance(reconcile, dict):
        at = f"{ROOT}.reconcile"
        status = token(reconcile.get("status"), at, "status", CLOSE_STATES, found, required=False)
        if "peer_close" in reconcile:
            found.unknown(at, "peer_close", "the peer link of a Close is an x-evidence-links cites link; reconcile.peer_close is the retired place")
        links = list(inbound(digest)) if inbound is not None and digest is not None else None
        if links is None:
            found.absent(at, "counterparty_links", "the state is producer-asserted: the counterparty links that make it are not at hand")
            found.undetermined()
        else:
            types = {t for t, _ in links}
            made = "CONTESTED" if "rebuts" in types else "AGREED" if "acknowledges" in types else "UNILATERAL"
            if status in CLOSE_STATES and status != made:
                found.inconsistent(at, "status", f"the counterparty links make this Close {made}; it records {status}")
    return record_reading(form="close/v1", source_version=1, root=Stage(status=status), reading=None, found=found)


def _no_verdict(form: str, body: dict[str, Any], found: Findings) -> RecordReading:
    reasoning = text(body.get("basis")) if form == "adjudication-response/v1" else None
    return record_reading(form=form, source_version=1, root=Stage(reasoning=reasoning), reading=None, found=found)


def read_judge_record(body: dict[str, Any], *, digest: str | None = None, inbound: Inbound | None = None) -> RecordReading:
    """One judge-family record body (``digest``: its record digest, for the links into it).

    Args:
        body: a judge-family record body.
        digest: its record digest (to look up the links into it).
        inbound: the links into a digest, or None when not at hand.

    Returns:
        The record's RecordReading.
    """
    found = Findings()
    version = body.get("record_version")
    scan_floats(body, found)
    _legacy_citations(body, found)
    if version == "evaluation-report/v1":
        return _evaluation(body, found)
    if version == "adjudication/v1":
        return _adjudication(body, found)
    if version == "human-rating/v1":
        return _human_rating(body, found)
    if version == "calibration-summary/v1":
        return _calibration(body, found)
    if version == "close/v1":
        return _close(body, found, digest, inbound)
    if isinstance(version, str) and version in SHAPES:
        return _no_verdict(str(version), body, found)
    found.unknown(ROOT, "record_version", f"record_version {brief(version)} is not a judge-family shape this reader defines")
    return record_reading(form=str(version) if isinstance(version, str) else "judge-record", source_version=0, root=Stage(),
                          reading=None, found=found)
