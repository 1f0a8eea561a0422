"""Every vector in the judge family, Evidence Result and x-judgment-v1 sets:
positives accepted and reproducing their digests, negatives refused with the
rule they break named in the error (issue 5, "done when")."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from capseal.canonical import canonical_bytes, capsule_id, json_digest, raw_digest
from capseal.errors import JudgmentRefusedError
from capseal.judge import (
    Adjudication,
    AdjudicationResponse,
    CalibrationSummary,
    Case,
    Citation,
    ClauseTally,
    Close,
    ContractCompile,
    EvaluationReport,
    EvidenceResult,
    HumanRating,
    JudgePin,
    KOfN,
    Reconcile,
    ReconcileTallies,
    SampleManifest,
    Target,
    check_body,
    check_judgment_capsule,
    parse_record,
    refuse,
    refuse_judgment_capsule,
)

from .conftest import DATA, JUDGE, RESULT, judgment_vectors, load

P = load(DATA / "preimages.json")["values"]
AT = "2026-09-25T00:00:00Z"
CONTRACT = "ec:example-org-claims-eval:2026-09-22@1"

JUDGE_POSITIVES = sorted(p for p in JUDGE.glob("*/pos-*.json") if p.name != "pos-example-org-close.json")

JUDGE_NEGATIVES = {
    "adjudication-response/neg-delivery-receipt-with-verdict": "delivery_receipt_forbids_verdict",
    "adjudication/neg-contradicted-missing-party": "contradicted_party_required",
    "calibration-summary/neg-clause-with-rate-field": "stored_rate_forbidden",
    "close/neg-reconcile-without-peer-close": "reconcile_peer_close_link_required",
    "close/pos-example-org-close": "peer_close_retired",  # frozen legacy shape: MUST fail
    "contract-compile/neg-missing-human-approval": "human_approval_required",
    "evaluation-report/neg-case-without-method": "case_method_required",
    "human-rating/neg-blind-false": "rating_not_blind",
    "sample-manifest/neg-cases-empty": "sample_cases_empty",
}

RESULT_NEGATIVES = {
    "neg-untiered-claim": "claim_tier_required",
    "neg-met-with-sufficiency-gap": "verdict_requires_sufficiency",
    "neg-aggregate-without-coverage": "coverage_required",
    "neg-contract-ref-missing": "contract_ref_required",
    "neg-disclosure-carrier-under-withheld": "disclosure_under_withheld",
    "neg-unrecognized-claim-type": "claim_type_unrecognized",
    "neg-recomputed-code-identity-missing": "recomputed_code_identity_required",
    "neg-recomputed-code-identity-unknown": "recomputed_code_identity_unknown",
    "neg-recomputed-code-identity-version-string": "code_digest_not_git_object",
    "neg-recomputed-code-identity-grade-missing": "implementation_grade_required",
    "neg-code-identity-unknown-countersigned": "unknown_code_identity_overgraded",
    "neg-producer-defects-count-over-denominator": "producer_defects_over_denominator",  # checker-only rule
}


def test_every_vector_file_is_covered() -> None:
    judge = {f"{p.parent.name}/{p.stem}" for p in JUDGE.glob("*/*.json")}
    assert judge == {f"{p.parent.name}/{p.stem}" for p in JUDGE_POSITIVES} | set(JUDGE_NEGATIVES)
    results = {p.stem for p in RESULT.glob("*.json")}
    assert results == set(RESULT_NEGATIVES) | {"pos-example-org-claims-result", "pos-example-org-recomputed-code-identity-result"}


# --------------------------------------------------------------------------- judge family


@pytest.mark.parametrize("path", JUDGE_POSITIVES, ids=lambda p: p.parent.name)
def test_judge_positive_is_accepted_and_round_trips(path: Path) -> None:
    body = load(path)
    assert check_body(body) == []
    record = parse_record(body)
    assert record.body() == body
    assert json_digest(record.body()) == json_digest(body)
    assert record.epistemic_type == body["epistemic_type"]


@pytest.mark.parametrize("name, rule", sorted(JUDGE_NEGATIVES.items()))
def test_judge_negative_is_refused_naming_its_rule(name: str, rule: str) -> None:
    body = load(JUDGE / f"{name}.json")
    with pytest.raises(JudgmentRefusedError) as caught:
        refuse(body)
    assert caught.value.rule == rule
    assert rule in str(caught.value)
    with pytest.raises(JudgmentRefusedError) as again:
        parse_record(body)
    assert again.value.rule == rule


def test_frozen_close_reports_the_legacy_citation_purpose_too() -> None:
    rules = {v.rule for v in check_body(load(JUDGE / "close" / "pos-example-org-close.json"))}
    assert {"peer_close_retired", "legacy_citation_purpose", "reconcile_peer_close_link_required"} <= rules


def _t(name: str, type: str) -> Target:
    return Target.of_json(P[name], type=type)


def _rebuilt() -> dict[str, Any]:
    """Every positive fixture rebuilt through the typed builders from the
    placeholder contents its digests were computed over."""
    return {
        "contract-compile": ContractCompile.of(
            record_id="cc-example-org-1", compiled_at=AT, contract_ref=CONTRACT,
            contract=_t("contract", "evidence-contract"), compiled_skill=[_t("compiled_skill", "compiled-skill")],
            human_approval=_t("human_approval", "human-approval-record"),
        ),
        "adjudication": Adjudication(
            record_id="adj-example-org-1", adjudicated_at=AT, verdict="contradicted", contradicted_party="half-b",
            margin="0.42", margin_tau="0.05", divergence_index="0.37",
            basis=JudgePin.pin(
                model_id="example-org-referee-v1", prompt=canonical_bytes(P["referee_prompt"]),
                weights=canonical_bytes(P["referee_weights"]), sampling={"temperature_micros": 0, "seed": 7},
            ),
            parties=[Citation.to(_t("half_a", "twin-half"), "adjudicated_party"), Citation.to(_t("half_b", "twin-half"), "adjudicated_party")],
        ),
        "adjudication-response": AdjudicationResponse.delivery_receipt(
            record_id="adjr-example-org-1", responded_at=AT, adjudication=_t("adjudication_ref", "adjudication"),
        ),
        "evaluation-report": EvaluationReport(
            record_id="er-example-org-1", generated_at=AT, contract_ref=CONTRACT,
            judge_pin=JudgePin.pin(
                model_id="example-org-judge-v1", prompt=canonical_bytes(P["judge_prompt"]),
                axes=canonical_bytes(P["judge_axes"]), sampling={"temperature_micros": 0, "seed": 1},
            ),
            cases=[Case.of("example-org-sim-001", "met", acts=[_t("tau2_case1_conversation", "tau2-conversation")], method=_t("method", "rubric"))],
        ),
        "close": Close.of(
            record_id="close-example-org-1", closed_at=AT, period=("2026-09-01T00:00:00Z", AT),
            counts_by_kind={"observation": 12, "evaluation-report": 1}, head=_t("store_head", "store-head"),
            reconcile=Reconcile(tallies=ReconcileTallies(matched=10, a_only=1, b_only=0, conflicting=0, insufficient=1, unresolved=0), status="AGREED"),
            peer_close=_t("peer_close", "close"),
        ),
        "sample-manifest": SampleManifest.of(
            record_id="sm-example-org-1", generated_at=AT, policy=_t("policy", "sampling-policy"),
            stratification={"held_out": 40, "regression": 10}, cases=["example-org-sim-001", "example-org-sim-002"],
        ),
        "human-rating": HumanRating.of(
            record_id="hr-example-org-1", rated_at=AT, rater_ref="principal:example-org-rater-7f3c",
            case=_t("rated_case", "rated-case"), label="met",
        ),
        "calibration-summary": CalibrationSummary.of(
            record_id="cal-example-org-1", computed_at=AT, judge_pin=_t("judge_pin", "judge-pin"),
            clauses=[ClauseTally(clause_ref="req-claim-1", agreement=KOfN.of(17, 20), drift=KOfN.of(1, 20))],
        ),
    }


@pytest.mark.parametrize("path", JUDGE_POSITIVES, ids=lambda p: p.parent.name)
def test_builders_reproduce_each_positive_byte_for_byte(path: Path) -> None:
    record = _rebuilt()[path.parent.name]
    assert canonical_bytes(record.body()) == canonical_bytes(load(path))


# --------------------------------------------------------------------------- Evidence Result v0


@pytest.mark.parametrize("name", ["pos-example-org-claims-result", "pos-example-org-recomputed-code-identity-result"])
def test_result_positive_is_accepted_and_round_trips(name: str) -> None:
    body = load(RESULT / f"{name}.json")
    assert check_body(body) == []
    result = EvidenceResult.from_body(body)
    assert json_digest(result.body()) == json_digest(body)
    assert result.epistemic_type == "semantic_judgment"  # one claim is judged: never upgraded to derived_metric


@pytest.mark.parametrize("name, rule", sorted(RESULT_NEGATIVES.items()))
def test_result_negative_is_refused_naming_its_rule(name: str, rule: str) -> None:
    body = load(RESULT / f"{name}.json")
    with pytest.raises(JudgmentRefusedError) as caught:
        EvidenceResult.from_body(body)
    assert caught.value.rule == rule


# --------------------------------------------------------------------------- x-judgment-v1

V, _, RAW = judgment_vectors()


def test_evidence_capsule_id_recomputes() -> None:
    assert capsule_id(V["evidence"]) == V["evidence"]["capsule_id"]


@pytest.mark.parametrize("case", V["cases"], ids=lambda c: c["id"])
def test_judgment_vector(case: dict[str, Any]) -> None:
    capsule, values, expect = case["capsule"], case["preimages"]["values"], case["expect"]
    assert capsule_id(capsule) == expect["capsule_id"]
    for name, text in case["preimages"]["canonical"].items():  # our JCS equals the published JCS
        assert canonical_bytes(values[name]).decode() == text
    digests = expect["digests"]
    assert json_digest(values["rubric"]) == digests["rubric_digest"]
    assert json_digest(values["agent_output"]) == digests["agent_output_digest"]
    assert [r["digest"] for r in capsule["references"] if r.get("citation_purpose") == "judged_from"] == digests["judged_from"]
    assert values["rubric"]["policy_digest"] == raw_digest(RAW["policy"].encode())
    params = values["judge_parameters"]
    if "prompt_digest" in params:
        assert params["prompt_digest"] == raw_digest(RAW["prompt"].encode())
        assert params["axes_digest"] == raw_digest(RAW["axes"].encode())
        assert params["instruction_template_digest"] == json_digest(values["instruction_template"])
    else:
        assert params["packet_digest"] == json_digest(values["packet"])
    recomputed = expect.get("recomputed_judge_parameters_digest", digests["judge_parameters_digest"])
    assert json_digest(params) == recomputed

    found = check_judgment_capsule(capsule, preimages=values, raw_files=RAW)
    errors = [{"code": v.rule, "pointer": v.pointer} for v in found if v.severity == "error"]
    assert errors == expect["findings"]
    assert (expect["result"] == "pass") == (not errors)
    assert (expect["schema_valid"]) == (not any(v.rule.startswith("schema_") for v in found))
    if errors:
        with pytest.raises(JudgmentRefusedError) as caught:
            refuse_judgment_capsule(capsule, preimages=values, raw_files=RAW)
        assert caught.value.rule == expect["findings"][0]["code"]
    else:
        refuse_judgment_capsule(capsule, preimages=values, raw_files=RAW)


def test_same_rubric_and_evidence_across_the_two_judges() -> None:
    ai, human = (c for c in V["cases"] if c["id"] in ("pos-ai-judge", "pos-human-expert"))
    for key in human["expect"]["same_as_pos_ai_judge"]:
        assert ai["expect"]["digests"][key] == human["expect"]["digests"][key]
    calibrated = [r["digest"] for r in ai["capsule"]["references"] if r.get("citation_purpose") == "calibrated_against"]
    assert calibrated == [human["capsule"]["capsule_id"]]


def test_model_judge_vectors_without_model_hosting_read_as_hosted() -> None:
    ai = next(c for c in V["cases"] if c["id"] == "pos-ai-judge")
    found = check_judgment_capsule(ai["capsule"], preimages=ai["preimages"]["values"], raw_files=RAW)
    assert [(v.rule, v.severity) for v in found] == [("model_hosting_absent", "info")]
