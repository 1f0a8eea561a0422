"""The reading precedence and the support rules, each named: an individual rejection
outranks the aggregate; error outranks abstain; a null status is not a failure; an
unknown token is kept with a defect; each recorded inconsistency reads CONTRADICTED;
absent facts read UNDETERMINED."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from capseal.canonical import json_digest
from capseal.judge import interpret
from capseal.judge.interpret import read

from .conftest import A068E50A, ACP_13, BOUNDARY, EXAMPLE_ONE, stored

VECTORS = Path(__file__).resolve().parents[2] / "vectors" / "judge-data" / "vectors"


def vector(relative: str) -> Any:
    return json.loads((VECTORS / relative).read_text(encoding="utf-8"))


def kinds(i: Any, kind: str) -> list[tuple[str, str]]:
    return [(d.path, d.field) for d in i.defects if d.kind == kind]


def jury(status: str, *, judges: tuple[str, ...] = (), evidence: dict[str, Any] | None = None, code: str | None = None) -> dict[str, Any]:
    aggregated: dict[str, Any] = {"status": status, "reasoning": "r", "checks": []}
    if code is not None:
        aggregated["reasonCode"] = code
    if evidence is not None:
        aggregated["metadata"] = {"aggregation": evidence}
    individual = {f"j{n}": {"status": s, "reasoning": "r", "checks": [], **({"reasonCode": "judge_failed"} if s == "error" else {})}
                  for n, s in enumerate(judges)}
    return {"aggregated": aggregated, "individual": list(individual.values()), "individualByName": individual,
            "seats": [{"position": n, "verdictKey": k, "keySource": "DECLARED"} for n, k in enumerate(individual)],
            "decision": {"kind": "own"}, "compositeAttempts": []}


# ----------------------------------------------------------------- an individual rejection outranks the aggregate


@pytest.mark.parametrize("aggregate", ["error", "pass", "abstain", "not_applicable", None])
def test_individual_rejection_outranks_the_aggregate(aggregate: str | None) -> None:
    verdict = stored(BOUNDARY)
    if aggregate is None:
        del verdict["aggregated"]["status"]
    else:
        verdict["aggregated"]["status"] = aggregate
    i = interpret(verdict)
    assert i.reading == "REJECTED" and i.decided_by is not None and i.decided_by.basis == "individual_rejection"
    assert i.root.status == aggregate  # the aggregate is kept as recorded: no FAIL is manufactured


def test_individual_rejection_outranks_the_aggregate_across_a_records_parts() -> None:
    report = vector("judge/evaluation-report/pos-example-org-evaluation-report.json")
    case = report["cases"][0]
    report["cases"] = [dict(case, case_id="c1", verdict="met"), dict(case, case_id="c2", verdict="not_met"),
                       dict(case, case_id="c3", verdict="not_evaluable")]
    i = interpret(report)
    assert i.reading == "REJECTED" and i.reading_support == "SUPPORTED" and i.root.status is None
    assert [s.status for s in i.stages] == ["met", "not_met", "not_evaluable"]
    assert [it.interpretation.reading for it in read(report).items] == ["ACCEPTED", "REJECTED", "UNDECIDED"]


# ----------------------------------------------------------------- error outranks abstain


def test_error_outranks_abstain() -> None:
    evidence = {"strategy": "consensus", "errorPolicy": "propagate", "inputCount": 2, "eligibleCount": 1, "errorCount": 1,
                "passCount": 0, "failCount": 0}
    i = interpret(jury("error", judges=("error", "abstain"), evidence=evidence, code="errors_propagated"))
    assert (i.reading, i.reading_support) == ("NOT_ASSESSED", "SUPPORTED")
    assert interpret(jury("abstain", judges=("abstain",))).reading == "UNDECIDED"


def test_error_outranks_abstain_across_a_records_parts() -> None:
    result = vector("evidence-result/pos-example-org-claims-result.json")
    result["claims"] = [result["claims"][2], dict(result["claims"][0], id="claim-4", verdict="not_evaluable")]
    result["aggregate"]["buckets"] = {"met": [], "not_met": [], "not_evaluable": ["claim-3", "claim-4"]}
    result["aggregate"]["coverage"]["excluded_not_applicable"] = 0
    i = interpret(result)
    assert [it.interpretation.reading for it in read(result).items] == ["NOT_ASSESSED", "UNDECIDED"]
    assert i.reading == "NOT_ASSESSED"


def test_error_outranks_abstain_for_a_spent_referee_call() -> None:
    row = {"state": "not_adjudicated", "reason": "referee_unreachable"}
    assert interpret(row).reading == "NOT_ASSESSED"


# ----------------------------------------------------------------- a null status is not a failure


def test_null_status_is_not_a_failure() -> None:
    i = interpret(stored(ACP_13))
    assert i.stages[1].status is None and i.stages[1].failure == "jury_execution_failed"
    verdict = stored(A068E50A)
    del verdict["aggregated"]["status"]
    i = interpret(verdict)
    assert i.reading is None and i.reading_support == "UNDETERMINED"
    assert kinds(i, "ABSENT")[:1] == [("verdict.aggregated", "status")]


def test_null_status_is_not_a_failure_in_capseal_records() -> None:
    result = vector("evidence-result/pos-example-org-claims-result.json")
    del result["claims"][1]["sufficiency"]  # the not_met claim: without its sufficiency it reads nothing
    items = read(result).items
    assert items[1].interpretation.reading is None and items[1].interpretation.reading_support == "UNDETERMINED"
    rating = vector("judge/human-rating/pos-example-org-human-rating.json")
    del rating["label"]
    assert interpret(rating).reading is None and read(rating).items == ()


# ----------------------------------------------------------------- an unknown token is kept with a defect


def test_unknown_token_kept_with_a_defect() -> None:
    verdict = stored(A068E50A)
    verdict["aggregated"].update(status="maybe", reasonCode="gremlins")
    verdict["compositeAttempts"][0].update(disposition="sideways", policy="REJECT_ON_TUESDAYS")
    i = interpret(verdict)
    assert (i.root.status, i.root.reason_code, i.reading, i.reading_support) == ("maybe", "gremlins", None, "UNDETERMINED")
    assert (i.stages[0].disposition, i.stages[0].used_by_parent, i.stages[0].policy) == ("sideways", None, "REJECT_ON_TUESDAYS")
    unknown = kinds(i, "UNKNOWN_VOCABULARY")
    for where in (("verdict.aggregated", "status"), ("verdict.aggregated", "reasonCode"),
                  ("verdict.compositeAttempts[0]", "disposition"), ("verdict.compositeAttempts[0]", "policy")):
        assert where in unknown


@pytest.mark.parametrize("record, mutate, where", [
    ("judge/evaluation-report/pos-example-org-evaluation-report.json", lambda b: b["cases"][0].update(verdict="maybe"),
     ("record.cases[0]", "verdict")),
    ("evidence-result/neg-unrecognized-claim-type.json", lambda b: None, ("record.claims[0]", "type")),
    ("judge/adjudication/pos-example-org-twin-adjudication.json", lambda b: b.update(verdict="contradicted-ish"),
     ("record", "verdict")),
])
def test_unknown_token_kept_with_a_defect_in_capseal_records(record: str, mutate: Any, where: tuple[str, str]) -> None:
    body = vector(record)
    mutate(body)
    i = interpret(body)
    assert where in kinds(i, "UNKNOWN_VOCABULARY")
    assert i.reading is None or record.endswith("neg-unrecognized-claim-type.json")
    row = interpret({"state": "not_adjudicated", "reason": "gremlins"})
    assert row.root.reason_code == "gremlins" and ("record", "reason") in kinds(row, "UNKNOWN_VOCABULARY")


# ----------------------------------------------------------------- each listed inconsistency reads CONTRADICTED


def contradicted(i: Any, *where: tuple[str, str]) -> None:
    assert i.reading_support == "CONTRADICTED", i.summary
    found = kinds(i, "INCONSISTENT")
    for w in where:
        assert w in found, found


def test_inconsistent_met_under_a_sufficiency_gap_reads_contradicted() -> None:
    i = interpret(vector("evidence-result/neg-met-with-sufficiency-gap.json"))
    contradicted(i, ("record.claims[0]", "verdict"))
    item = read(vector("evidence-result/neg-met-with-sufficiency-gap.json")).items[0].interpretation
    assert item.reading == "NOT_ASSESSED" and item.reading_support == "CONTRADICTED"  # sufficiency first


def test_inconsistent_bucket_that_is_not_the_verdict_reads_contradicted() -> None:
    result = vector("evidence-result/pos-example-org-claims-result.json")
    result["aggregate"]["buckets"]["met"], result["aggregate"]["buckets"]["not_met"] = ["claim-2"], ["claim-1"]
    contradicted(interpret(result), ("record.aggregate.buckets", "met"), ("record.aggregate.buckets", "not_met"))
    items = read(result).items
    assert items[0].interpretation.reading_support == "CONTRADICTED" and items[2].interpretation.reading_support != "CONTRADICTED"


def test_inconsistent_k_greater_than_n_reads_contradicted() -> None:
    summary = vector("judge/calibration-summary/pos-example-org-calibration-summary.json")
    summary["clauses"][0]["agreement"] = {"k": 21, "n": 20}
    i = interpret(summary)
    contradicted(i, ("record.clauses[0].agreement", "k"))
    assert i.reading is None and read(summary).items == ()


def test_inconsistent_count_over_denominator_reads_contradicted() -> None:
    contradicted(interpret(vector("evidence-result/neg-producer-defects-count-over-denominator.json")),
                 ("record.aggregate.coverage.producer_defects", "count"))


def test_inconsistent_contested_close_claim_that_is_met_reads_contradicted() -> None:
    result = vector("evidence-result/pos-example-org-claims-result.json")
    claim = result["claims"][0]
    claim.update(type="close", close={"period": {"start": "2026-09-01T00:00:00Z", "end": "2026-09-25T00:00:00Z"},
                                      "close_state": "CONTESTED", "close_ref": claim["evidence"][0]})
    contradicted(interpret(result), ("record.claims[0]", "verdict"))


def test_inconsistent_duplicate_claim_ids_read_contradicted() -> None:
    result = vector("evidence-result/pos-example-org-claims-result.json")
    result["claims"][1]["id"] = "claim-1"
    contradicted(interpret(result), ("record.claims[1]", "id"))


def mesh(verdict: str, status: str) -> dict[str, Any]:
    return {"effect": {"mode": "not_applicable"}, "model_attestation": {"compute_attestation": {
        "epistemic_type": "adjudication",
        "adjudication": {"schema": "capsule-emit-mesh/adjudication/v1", "source": "twin_comparison",
                         "capture_method": "deterministic_replay", "verdict": verdict, "status": status,
                         "divergence_index": 3, "twin_owner_distinct": True, "selection_tier": 1,
                         "half_a_node_id": "node-a", "half_b_node_id": "node-b", "referee_node_id": "node-c",
                         "half_a_capsule_id": "a" * 64, "half_b_capsule_id": "b" * 64}}}}


def test_inconsistent_mesh_status_that_is_not_its_verdict_reads_contradicted() -> None:
    ok = read(mesh("contradicted:node-b", "CONTRADICTED"))
    assert (ok.interpretation.reading, ok.interpretation.reading_support) == ("REJECTED", "SUPPORTED")
    assert [(it.slug, it.interpretation.reading) for it in ok.items] == [("verdict/half node-a", "ACCEPTED"), ("verdict/half node-b", "REJECTED")]
    contradicted(interpret(mesh("corroborated", "CONTRADICTED")), ("record.model_attestation.compute_attestation.adjudication", "status"))
    assert interpret(mesh("not_comparable", "UNKNOWN")).reading == "NOT_APPLICABLE"


def test_inconsistent_contradicted_party_that_is_no_party_reads_contradicted() -> None:
    adjudication = vector("judge/adjudication/pos-example-org-twin-adjudication.json")
    adjudication["contradicted_party"] = "f" * 64
    contradicted(interpret(adjudication), ("record", "contradicted_party"))
    contradicted(interpret(mesh("contradicted:node-z", "CONTRADICTED")),
                 ("record.model_attestation.compute_attestation.adjudication", "verdict"))
    row = {"book_version": "capseal-referee-book/1", "pair": {"node_ids": ["node-a", "node-b"]}, "called": True,
           "row": {"state": "adjudicated", "referee": "node-c", "tier": 1, "verdict": "contradicted:node-z"}}
    contradicted(interpret(row), ("record.row", "verdict"))


def test_inconsistent_contradicted_party_resolved_rejects_it_and_accepts_the_other() -> None:
    adjudication = vector("judge/adjudication/pos-example-org-twin-adjudication.json")
    b = adjudication["parties"][1]["digest"]
    adjudication["contradicted_party"] = b
    reading = read(adjudication)
    assert (reading.interpretation.reading, reading.interpretation.reading_support) == ("REJECTED", "SUPPORTED")
    assert [it.interpretation.reading for it in reading.items] == ["ACCEPTED", "REJECTED"]
    corroborated = dict(adjudication, verdict="corroborated")
    contradicted(interpret(corroborated), ("record", "contradicted_party"))


def test_inconsistent_jury_evidence_that_contradicts_its_status_reads_contradicted() -> None:
    verdict = stored(A068E50A)
    verdict["aggregated"]["status"] = "pass"
    i = interpret(verdict)
    assert i.reading == "ACCEPTED"  # still what the record says
    contradicted(i, ("verdict.aggregated", "status"))
    assert len(kinds(i, "INCONSISTENT")) == 1


# ----------------------------------------------------------------- absent facts read UNDETERMINED


def test_absent_facts_read_undetermined_no_evidence_block() -> None:
    verdict = stored(A068E50A)
    verdict["aggregated"]["metadata"] = {}
    i = interpret(verdict)
    assert i.reading == "REJECTED" and i.reading_support == "UNDETERMINED"
    assert ("verdict.aggregated", "metadata.aggregation") in kinds(i, "ABSENT") and not kinds(i, "INCONSISTENT")
    assert all(s.evidence is not None for s in i.stages)  # only the root's own block counts


def test_absent_facts_read_undetermined_unnamed_contradicted_party() -> None:
    adjudication = vector("judge/adjudication/pos-example-org-twin-adjudication.json")  # names "half-b", no digest
    i = interpret(adjudication)
    assert i.reading == "REJECTED" and i.reading_support == "UNDETERMINED"
    assert ("record", "contradicted_party") in kinds(i, "UNPARSEABLE")
    assert [it.interpretation.reading for it in read(adjudication).items] == [None, None]
    del adjudication["contradicted_party"]
    assert ("record", "contradicted_party") in kinds(interpret(adjudication), "ABSENT")


def test_absent_facts_read_undetermined_unpublished_answer_and_no_model_hosting() -> None:
    answer = {"verdict": "not_met", "rationale": "the amount came after the tool call"}
    capsule: dict[str, Any] = {"developer": "judge@1", "references": [], "model_attestation": {"compute_attestation": {
        "agent_output_digest": json_digest(answer),
        "x-judgment-v1": {"rubric_digest": "1" * 64, "rubric_version": "1", "judge_parameters_digest": "2" * 64,
                          "model_hosting": "self_hosted"}}}}
    unpublished = interpret(capsule)
    assert (unpublished.reading, unpublished.reading_support) == (None, "UNDETERMINED")
    assert ("record.model_attestation.compute_attestation", "agent_output") in kinds(unpublished, "ABSENT")
    published = interpret(capsule, resolve={json_digest(answer): answer}.get)
    assert (published.reading, published.reading_support, published.root.reasoning) == ("REJECTED", "SUPPORTED", answer["rationale"])
    hosted = copy.deepcopy(capsule)
    del hosted["model_attestation"]["compute_attestation"]["x-judgment-v1"]["model_hosting"]
    i = interpret(hosted, resolve={json_digest(answer): answer}.get)
    assert (i.reading, i.reading_support) == ("REJECTED", "UNDETERMINED")
    lying = interpret(capsule, resolve=lambda d: {"verdict": "met"})
    contradicted(lying, ("record.model_attestation.compute_attestation", "agent_output_digest"))


def test_absent_facts_read_undetermined_producer_asserted_close_state() -> None:
    close = vector("judge/close/pos-example-org-close-linked.json")
    i = interpret(close)
    assert i.reading is None and i.reading_support == "UNDETERMINED"
    assert ("record.reconcile", "counterparty_links") in kinds(i, "ABSENT")


def test_inconsistent_recomputed_close_state_reads_contradicted() -> None:
    close = vector("judge/close/pos-example-org-close-linked.json")  # records AGREED
    digest = json_digest(close)
    contested = read(close, digest=digest, inbound=lambda d: [("rebuts", "9" * 64)] if d == digest else [])
    contradicted(contested.interpretation, ("record.reconcile", "status"))
    agreed = read(close, digest=digest, inbound=lambda d: [("acknowledges", "9" * 64)] if d == digest else [])
    assert not kinds(agreed.interpretation, "INCONSISTENT") and not kinds(agreed.interpretation, "ABSENT")


def test_absent_facts_read_undetermined_unknown_strategy_is_not_closed_form() -> None:
    verdict = stored(A068E50A)
    verdict["aggregated"]["metadata"]["aggregation"]["strategy"] = "oracle"
    i = interpret(verdict)
    assert i.reading_support == "UNDETERMINED" and not kinds(i, "INCONSISTENT")


def test_absent_facts_do_not_mark_a_record_whose_reading_needs_none_of_them() -> None:
    verdict = stored(EXAMPLE_ONE)
    assert interpret(verdict).reading_support == "SUPPORTED"


# ----------------------------------------------------------------- the defect catalogue of capseal's records


def with_legacy_citation(body: dict[str, Any]) -> dict[str, Any]:
    body["cases"][0]["method"]["citation_purpose"] = body["cases"][0]["method"].pop("judge_purpose")
    return body


@pytest.mark.parametrize("body, where, kind", [
    (vector("evidence-result/neg-recomputed-code-identity-version-string.json"),
     ("record.claims[0].implementation.code_digest", "value"), "UNPARSEABLE"),                     # a version string as digest
    ({**vector("judge/adjudication/pos-example-org-twin-adjudication.json"), "margin_float": 0.42},
     ("record", "margin_float"), "UNPARSEABLE"),                                                    # a float
    (with_legacy_citation(vector("judge/evaluation-report/pos-example-org-evaluation-report.json")),
     ("record.cases[0].method", "citation_purpose"), "UNKNOWN_VOCABULARY"),                         # the legacy member name
    ({**mesh("corroborated", "SATISFIED"), "disposition": {"verdict_class": "assessed"}},
     ("record.disposition", "verdict_class"), "UNKNOWN_VOCABULARY"),                                # an unregistered verdict class
    ({**mesh("corroborated", "SATISFIED"), "chain": {"relation": "adjudicates", "parent_capsule_id": "a" * 64}},
     ("record.chain", "relation"), "UNKNOWN_VOCABULARY"),                                           # the legacy chain relation
    ({**vector("judge/close/pos-example-org-close.json")}, ("record.reconcile", "peer_close"), "UNKNOWN_VOCABULARY"),
    (vector("evidence-result/neg-untiered-claim.json"), ("record.claims[0]", "tier"), "ABSENT"),
])
def test_capseal_records_defect_catalogue(body: dict[str, Any], where: tuple[str, str], kind: str) -> None:
    assert where in kinds(interpret(body), kind)
