"""A real ledger holding every kind of judgment capseal writes, for the interpret tests.

Sealed through the public API (Producer, JudgmentStore) with a software key:
an act and two twin halves (capsules); an evaluation report of two cases (met,
not_met); a twin adjudication (contradicted); three blind human ratings (met,
not_met, and a label that is no verdict token); a calibration summary; an
Evidence Result (met, GAP, one requirement excluded as not applicable); an
``x-judgment-v1`` capsule whose answer is kept as an artifact; a stored jury
verdict kept as a ``jury-verdict`` artifact; and referee book rows appended
as ``referee:book-row`` records (contradicted, naming the adjudication as its
sealed ruling; referee_unreachable; off).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from capseal import Producer
from capseal.canonical import json_digest
from capseal.judge import (
    Adjudication,
    CalibrationSummary,
    Case,
    Claim,
    EvaluationReport,
    HumanRating,
    JudgePin,
    JudgmentStore,
    ResultBuilder,
    Target,
    blind_packet,
    clause_tally,
    code_identity,
    link,
)
from capseal.judge.extension import JudgeAnswer, ModelJudgeParameters, judgment_capsule_spec, judgment_member
from capseal.judge.interpret import JURY_VERDICT_ARTIFACT
from capseal.judge.shapes import KOfN
from capseal.ledger import LedgerEntry
from capseal.record import storage_json

NOW = "2026-10-01T12:00:00Z"
CONTRACT = "ec:example-org-refunds:2026-10-01@1"
VECTORS = Path(__file__).resolve().parent / "vectors"
BOOK_VERSION = "capseal-referee-book/1"


def stored_verdict(name: str) -> Any:
    """A stored jury verdict from the vectors, freshly parsed."""
    return json.loads((VECTORS / name).read_text(encoding="utf-8"))


def book_entry(row: dict[str, Any], *, called: bool, nodes: tuple[str, str] = ("node-a", "node-b"), at: str = NOW,
               **extra: Any) -> dict[str, Any]:
    """A referee book entry in the book's JSON shape (``extra``: ``ruling_id`` …)."""
    return {"book_version": BOOK_VERSION, "pair": {"twin_bracket_id": "bracket-1", "request_digest": "e" * 64,
                                                   "node_ids": list(nodes)},
            "capsule_ids": ["a" * 64, "b" * 64], "row": row, "called": called, "at": at, **extra}


def append_book_row(ledger: Any, entry: dict[str, Any]) -> str:
    """Append one book entry as a ``referee:book-row`` record; returns its record id."""
    digest = json_digest(entry)
    ledger.append(LedgerEntry(record_id=digest, record_type="referee:book-row", epistemic_type="producer_claim",
                              body=storage_json(entry)))
    return digest


def rule(values: Any) -> str:
    return "met"


@dataclass
class Sealed:
    """What the world sealed, by role."""

    path: Path
    report: Any
    adjudication: Any
    ratings: list[Any]
    calibration: Any
    result: Any
    judgment_capsule: Any
    jury_artifact: Target
    book_rows: list[str]


def build(path: Path, signer: Any) -> Sealed:
    with Producer("example-org", "refund-agent@1.0", signer, path) as producer:
        act = producer.confirmed(producer.planned("refund-A-1009", effect_type="send_payment", request={"order": "A-1009"}),
                                 response={"status": "issued"}, effect_attestation="gate_executed")
        half_a = producer.seal({"action_id": "twin-a", "action_type": "fyi"})
        half_b = producer.seal({"action_id": "twin-b", "action_type": "fyi"})
        store = JudgmentStore(producer.ledger, signer)
        act_t = Target.of_capsule(act)
        rubric_t = store.put_json({"rubric_id": "r", "criteria": [{"id": "C1"}, {"id": "C2"}]}, type="rubric")
        prompt_t = store.put_text("Grade the act.\n", type="judge-prompt")
        pin = JudgePin.pin(model_id="example-judge-model@2026-09-15", prompt=prompt_t, sampling={"temperature_micros": 0})
        store.put(pin.target())
        report = store.seal(EvaluationReport(
            record_id="er-A-1009", generated_at=NOW, contract_ref=CONTRACT, judge_pin=pin,
            cases=[Case.of("A-1009/C1", "met", acts=[act_t], method=rubric_t),
                   Case.of("A-1009/C2", "not_met", acts=[act_t], method=rubric_t)]), links=[link("cites", act_t)])
        a_t, b_t = Target.of_capsule(half_a), Target.of_capsule(half_b)
        referee_pin = JudgePin.pin(model_id="example-referee@1", prompt=prompt_t, sampling={"temperature_micros": 0})
        adjudication = store.seal(Adjudication.ruling(
            record_id="adj-1", adjudicated_at=NOW, verdict="contradicted", basis=referee_pin, parties=[a_t, b_t],
            contradicted=b_t), links=[link("adjudicates", b_t)])
        packet = store.put_json(blind_packet(case_id="A-1009/C2", acts=[act_t], criterion={"id": "C2"}), type="rated-case")
        ratings = [store.seal(HumanRating.of(record_id=f"hr-{i}", rated_at=NOW, rater_ref=f"principal:rater-{i}", case=packet,
                                             label=label))
                   for i, label in enumerate(("not_met", "met", "partly"), 1)]
        calibration = store.seal(CalibrationSummary.of(
            record_id="cal-1", computed_at=NOW, judge_pin=pin,
            clauses=[clause_tally("C2", agreement=KOfN.of(1, 2), drift=KOfN.of(0, 0))]))
        builder = ResultBuilder(generated_at=NOW)
        impl = code_identity(rule, name="example-rules", captured_at=NOW)
        builder.add(Claim.of(id="claim-1", contract_ref=CONTRACT, requirement_ref="C1", tier="recomputed", grade="self-attested",
                             sufficiency="SATISFIED", verdict="met", evidence=[act_t], implementation=impl))
        builder.add(Claim.of(id="claim-2", contract_ref=CONTRACT, requirement_ref="C3", tier="judged", grade="self-attested",
                             sufficiency="GAP", verdict="not_evaluable", evidence=[act_t]))
        builder.exclude_not_applicable(1)
        result = store.seal(builder.build(), links=[link("cites", act_t)])
        params = ModelJudgeParameters.of(instruction_template={"t": 1}, prompt="p", axes="a", sampling_params={"temperature_micros": 0})
        member = judgment_member(rubric={"rubric_id": "r"}, rubric_version="1", parameters=params, model_hosting="self_hosted")
        answer = JudgeAnswer(verdict="met", rationale="the amount was stated before the refund")
        store.put_json(answer.to_json(), type="judge-answer")
        developer, spec = judgment_capsule_spec(action_id="judge-A-1009", judge="example-judge-model@2026-09-15", member=member,
                                                answer=answer, judged_from=act_t)
        jury_text = (VECTORS / "example-0-17-cascade.verdict.json").read_text(encoding="utf-8")
        jury_artifact = store.put_text(jury_text, type=JURY_VERDICT_ARTIFACT)
        rows = [append_book_row(producer.ledger, book_entry({"state": "adjudicated", "referee": "node-c", "tier": 1,
                                                             "verdict": "contradicted:node-b"}, called=True,
                                                            ruling_id=adjudication.digest)),
                append_book_row(producer.ledger, book_entry({"state": "not_adjudicated", "reason": "referee_unreachable"},
                                                            called=True, at="2026-10-01T12:00:01Z")),
                append_book_row(producer.ledger, book_entry({"state": "not_adjudicated", "reason": "off"}, called=False,
                                                            at="2026-10-01T12:00:02Z"))]
    with Producer("example-org", developer, signer, path) as judge:
        judgment_capsule = judge.seal(spec)
    return Sealed(path, report, adjudication, ratings, calibration, result, judgment_capsule, jury_artifact, rows)
