"""Issue 5 item 4: each refusal the engine makes before sealing, named by rule."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest

from capseal.errors import JudgmentRefusedError
from capseal.judge import (
    Adjudication,
    AdjudicationResponse,
    CalibrationSummary,
    Case,
    Claim,
    ClauseTally,
    EvaluationReport,
    EvidenceResult,
    HumanRating,
    JudgePin,
    KOfN,
    ResultBuilder,
    Target,
    check_body,
    decimal_string,
    micros,
    refuse,
)
from capseal.judge.citation import Citation, DigestRef

from .conftest import JUDGE, NOW, RESULT, load

ACT = Target.of_json({"act": 1}, type="agent-action-capsule")
ACT2 = Target.of_json({"act": 2}, type="agent-action-capsule")
RUBRIC = Target.of_json({"rubric": "C1"}, type="rubric")
PROMPT = b"Grade the act.\n"


def refused(fn: Callable[[], Any], rule: str) -> JudgmentRefusedError:
    with pytest.raises(JudgmentRefusedError) as caught:
        fn()
    assert caught.value.rule == rule, f"{caught.value.rule} != {rule}: {caught.value}"
    assert rule in str(caught.value)
    return caught.value


def pin(**sampling: Any) -> JudgePin:
    return JudgePin.pin(model_id="judge@1", prompt=PROMPT, sampling=sampling or {"temperature_micros": 0})


def body_of(name: str) -> dict[str, Any]:
    return copy.deepcopy(load(JUDGE / f"{name}.json"))


# --------------------------------------------------------------------------- the judge pin


def test_judge_must_be_pinned_by_model_id() -> None:
    refused(lambda: JudgePin.pin(model_id="", prompt=PROMPT, sampling={}), "judge_unpinned")
    body = body_of("evaluation-report/pos-example-org-evaluation-report")
    del body["judge_pin"]["model_id"]
    refused(lambda: refuse(body), "judge_unpinned")
    body = body_of("evaluation-report/pos-example-org-evaluation-report")
    del body["judge_pin"]["prompt_digest"]
    refused(lambda: refuse(body), "judge_unpinned")


def test_prompt_digest_is_computed_from_the_prompt_bytes() -> None:
    p = pin()
    assert p.prompt_digest.digest == Target.of_bytes(PROMPT, type="p").digest
    assert JudgePin.pin(model_id="m", prompt=PROMPT.decode(), sampling={}).prompt_digest == p.prompt_digest
    # a digest cannot be typed in: a DigestRef or a bare hex is not the prompt's bytes
    refused(lambda: JudgePin.pin(model_id="m", prompt=DigestRef.of_bytes(PROMPT), sampling={}), "judge_unpinned")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="computed from the cited content"):
        Target(type="rubric", digest="a" * 64, kind="json")


@pytest.mark.parametrize("value", [0.7, 0.0, 1e-9, float("nan")])
def test_float_sampling_is_refused(value: float) -> None:
    refused(lambda: pin(temperature=value), "sampling_float")


def test_float_sampling_refused_when_a_pin_is_built_directly() -> None:
    digest = DigestRef.of_bytes(PROMPT)
    refused(lambda: JudgePin(model_id="m", prompt_digest=digest, sampling={"temperature": 0.7}), "sampling_float")  # type: ignore[dict-item]
    refused(lambda: JudgePin(model_id="m", prompt_digest=digest, sampling={"temperature": [1]}), "schema_type_mismatch")  # type: ignore[dict-item]
    refused(lambda: Claim.of(id="c", contract_ref="ec:c@1", requirement_ref="r", tier="guessed", grade="self-attested",
                             sufficiency="SATISFIED", verdict="met", evidence=[ACT]), "claim_tier_unknown")


def test_float_sampling_in_a_body_is_refused_by_name() -> None:
    body = body_of("evaluation-report/pos-example-org-evaluation-report")
    body["judge_pin"]["sampling"]["temperature"] = 0.7
    refused(lambda: refuse(body), "sampling_float")
    body = body_of("adjudication/pos-example-org-twin-adjudication")
    body["basis"]["sampling"]["top_p"] = 0.9
    refused(lambda: refuse(body), "sampling_float")


def test_sampling_as_decimal_string_or_micros_is_accepted() -> None:
    assert decimal_string(0.7) == "0.7" and decimal_string(1e-7) == "0.0000001" and decimal_string(2.50) == "2.5"
    assert micros(0.7) == 700000 and micros("0.000001") == 1
    refused(lambda: micros(1e-7), "sampling_float")  # never rounded
    p = pin(temperature=decimal_string(0.7), top_p_micros=micros(0.9), seed=7, stream=False)
    assert p.sampling == {"temperature": "0.7", "top_p_micros": 900000, "seed": 7, "stream": False}
    refused(lambda: pin(temperature=[0]), "sampling_value_type")


# --------------------------------------------------------------------------- cases cite rubric and acts


def test_every_case_cites_its_rubric() -> None:
    refused(lambda: Case.of("c1", "met", acts=[ACT], method=None), "case_method_required")
    refused(lambda: refuse(body_of("evaluation-report/neg-case-without-method")), "case_method_required")


def test_every_case_cites_the_acts_it_rests_on() -> None:
    refused(lambda: Case.of("c1", "met", acts=[], method=RUBRIC), "case_acts_required")
    body = body_of("evaluation-report/pos-example-org-evaluation-report")
    body["cases"][0]["acts"] = []
    refused(lambda: refuse(body), "case_acts_required")


def test_citation_purpose_comes_from_the_field() -> None:
    case = Case.of("c1", "met", acts=[ACT], method=RUBRIC)
    assert [a.judge_purpose for a in case.acts] == ["grounds"] and case.method.judge_purpose == "method"
    body = body_of("evaluation-report/pos-example-org-evaluation-report")
    body["cases"][0]["method"]["judge_purpose"] = "grounds"
    refused(lambda: refuse(body), "judge_purpose_mismatch")


def test_legacy_citation_purpose_is_refused() -> None:
    body = body_of("human-rating/pos-example-org-human-rating")
    body["case"]["citation_purpose"] = body["case"].pop("judge_purpose")
    refused(lambda: refuse(body), "legacy_citation_purpose")


def test_unversioned_contract_ref_and_bad_timestamps() -> None:
    refused(lambda: EvaluationReport(record_id="er", generated_at=NOW, contract_ref="ec:claims", judge_pin=pin(), cases=[Case.of("c", "met", acts=[ACT], method=RUBRIC)]), "contract_ref_unversioned")
    refused(lambda: EvaluationReport(record_id="er", generated_at="today", contract_ref="ec:c@1", judge_pin=pin(), cases=[Case.of("c", "met", acts=[ACT], method=RUBRIC)]), "timestamp_not_rfc3339")


def test_duplicate_cases_are_refused() -> None:
    case = Case.of("c1", "met", acts=[ACT], method=RUBRIC)
    refused(lambda: EvaluationReport(record_id="er", generated_at=NOW, contract_ref="ec:c@1", judge_pin=pin(), cases=[case, case]), "case_id_duplicate")


# --------------------------------------------------------------------------- no score, rate or confidence


@pytest.mark.parametrize("member", ["confidence_micros", "confidence", "score", "rate", "agreement_rate"])
def test_confidence_score_or_rate_fields_are_refused(member: str) -> None:
    body = body_of("evaluation-report/pos-example-org-evaluation-report")
    body["cases"][0][member] = 1
    refused(lambda: refuse(body), "stored_rate_forbidden")
    body = body_of("calibration-summary/pos-example-org-calibration-summary")
    body["clauses"][0]["agreement"][member] = "0.85"
    refused(lambda: refuse(body), "stored_rate_forbidden")


def test_epistemic_type_and_version_are_not_caller_settable() -> None:
    refused(lambda: HumanRating(record_id="hr", epistemic_type="observed_event", rated_at=NOW, rater_ref="principal:r1", case=Citation.to(ACT, "rated_case"), label="met"), "epistemic_type_fixed_by_shape")  # type: ignore[call-arg]
    refused(lambda: HumanRating(record_id="hr", record_version="human-rating/v2", rated_at=NOW, rater_ref="principal:r1", case=Citation.to(ACT, "rated_case"), label="met"), "record_version_fixed_by_shape")  # type: ignore[call-arg]
    body = body_of("human-rating/pos-example-org-human-rating")
    body["epistemic_type"] = "observed_event"
    refused(lambda: refuse(body), "epistemic_type_fixed_by_shape")


# --------------------------------------------------------------------------- human ratings are blind


def test_human_ratings_are_blind() -> None:
    rating = HumanRating.of(record_id="hr", rated_at=NOW, rater_ref="principal:r1", case=ACT, label="met")
    assert rating.body()["blind"] is True
    refused(lambda: HumanRating(record_id="hr", blind=False, rated_at=NOW, rater_ref="principal:r1", case=Citation.to(ACT, "rated_case"), label="met"), "rating_not_blind")  # type: ignore[call-arg]
    refused(lambda: refuse(body_of("human-rating/neg-blind-false")), "rating_not_blind")
    body = body_of("human-rating/pos-example-org-human-rating")
    del body["blind"]
    refused(lambda: refuse(body), "rating_not_blind")


@pytest.mark.parametrize("ref", ["alice@example.org", "Alice Smith"])
def test_rater_ref_is_opaque(ref: str) -> None:
    refused(lambda: HumanRating.of(record_id="hr", rated_at=NOW, rater_ref=ref, case=ACT, label="met"), "rater_ref_identifying")


# --------------------------------------------------------------------------- calibration k of n


def test_calibration_is_k_of_n_with_k_at_most_n() -> None:
    refused(lambda: KOfN.of(21, 20), "k_exceeds_n")
    body = body_of("calibration-summary/pos-example-org-calibration-summary")
    body["clauses"][0]["agreement"] = {"k": 21, "n": 20}
    refused(lambda: refuse(body), "k_exceeds_n")
    body["clauses"][0]["agreement"] = {"k": 17, "n": 20}
    body["clauses"][0]["drift"] = {"k": 3, "n": 2}
    refused(lambda: refuse(body), "k_exceeds_n")
    refused(lambda: refuse(body_of("calibration-summary/neg-clause-with-rate-field")), "stored_rate_forbidden")
    refused(lambda: KOfN.of(-1, 3), "schema_below_minimum")


def test_rate_is_computed_at_read_time_and_absent_when_n_is_zero() -> None:
    from fractions import Fraction

    assert KOfN.of(17, 20).rate() == Fraction(17, 20)
    assert KOfN.of(0, 0).rate() is None


def test_one_tally_per_clause() -> None:
    tally = ClauseTally(clause_ref="C1", agreement=KOfN.of(1, 2), drift=KOfN.of(0, 2))
    refused(lambda: CalibrationSummary.of(record_id="cal", computed_at=NOW, judge_pin=pin(), clauses=[tally, tally]), "clause_ref_duplicate")


# --------------------------------------------------------------------------- sufficiency apart from verdict


def claim(**kw: Any) -> Claim:
    fields: dict[str, Any] = dict(id="c1", contract_ref="ec:c@1", requirement_ref="r1", tier="judged", grade="self-attested",
                                  sufficiency="SATISFIED", verdict="met", evidence=[ACT])
    fields.update(kw)
    return Claim.of(**fields)


@pytest.mark.parametrize("sufficiency", ["GAP", "INSUFFICIENT", "UNKNOWN"])
@pytest.mark.parametrize("verdict", ["met", "not_met"])
def test_met_or_not_met_refused_without_sufficiency(sufficiency: str, verdict: str) -> None:
    refused(lambda: claim(sufficiency=sufficiency, verdict=verdict), "verdict_requires_sufficiency")
    assert claim(sufficiency=sufficiency, verdict="not_evaluable").verdict == "not_evaluable"


def test_not_evaluable_under_satisfied_follows_the_shipped_schema() -> None:
    refused(lambda: claim(verdict="not_evaluable"), "satisfied_verdict_not_evaluable")


@pytest.mark.parametrize("sufficiency", ["SATISFIED", "GAP", "INSUFFICIENT", "UNKNOWN"])
def test_an_unknown_verdict_token_names_the_vocabulary_rule(sufficiency: str) -> None:
    """As ``case_verdict_unknown`` for a Case: a token outside met / not_met /
    not_evaluable breaks the vocabulary rule, not the sufficiency pairing."""
    refused(lambda: claim(sufficiency=sufficiency, verdict="maybe"), "claim_verdict_unknown")
    body = load(RESULT / "pos-example-org-claims-result.json")
    body["claims"][0]["verdict"], body["claims"][0]["sufficiency"] = "MET", sufficiency
    refused(lambda: refuse(body), "claim_verdict_unknown")
    rules = {v.rule for v in check_body(body) if v.path == "$.claims[0].verdict"}
    assert rules == {"claim_verdict_unknown"}
    report = body_of("evaluation-report/pos-example-org-evaluation-report")  # the counterpart this rule mirrors
    report["cases"][0]["verdict"] = "maybe"
    refused(lambda: refuse(report), "case_verdict_unknown")


def test_an_unknown_verdict_token_is_refused_at_seal_by_that_rule(world: Any) -> None:
    body = load(RESULT / "pos-example-org-claims-result.json")
    body["claims"][0]["verdict"] = "probably"
    world.assert_seal_refused(body, "claim_verdict_unknown")


def test_claims_are_tiered_and_recomputed_claims_name_their_code() -> None:
    body = load(RESULT / "pos-example-org-claims-result.json")
    del body["claims"][1]["tier"]
    refused(lambda: refuse(body), "claim_tier_required")
    refused(lambda: claim(tier="recomputed"), "recomputed_code_identity_required")


def test_unnameable_recomputed_row_is_withheld_and_counted_never_relabelled() -> None:
    builder = ResultBuilder(generated_at=NOW)
    builder.add(claim())
    builder.withhold_recomputed()
    result = builder.build()
    assert [c.tier for c in result.claims] == ["judged"]
    defects = result.aggregate.coverage.producer_defects
    assert (defects.count, defects.denominator) == (1, 1)
    assert result.aggregate.coverage.evaluated_population == 1


def test_result_cross_element_rules() -> None:
    body = load(RESULT / "pos-example-org-claims-result.json")
    dup = copy.deepcopy(body)
    dup["claims"][1]["id"] = "claim-1"
    assert "claim_id_duplicate" in {v.rule for v in check_body(dup)}
    moved = copy.deepcopy(body)
    moved["aggregate"]["buckets"]["met"], moved["aggregate"]["buckets"]["not_met"] = ["claim-2"], ["claim-1"]
    refused(lambda: refuse(moved), "bucket_mismatch")
    pop = copy.deepcopy(body)
    pop["aggregate"]["coverage"]["evaluated_population"] = 4
    refused(lambda: refuse(pop), "coverage_population_mismatch")
    unk = copy.deepcopy(body)
    unk["aggregate"]["coverage"]["unknown_count"] = 1
    refused(lambda: refuse(unk), "coverage_unknown_mismatch")
    refused(lambda: EvidenceResult.from_body(load(RESULT / "neg-producer-defects-count-over-denominator.json")), "producer_defects_over_denominator")


def test_builder_derives_coverage_and_buckets() -> None:
    builder = ResultBuilder(generated_at=NOW)
    builder.add(claim(id="a"))
    builder.add(claim(id="b", verdict="not_met"))
    builder.add(claim(id="c", sufficiency="UNKNOWN", verdict="not_evaluable"))
    builder.exclude_not_applicable(2)
    agg = builder.build().aggregate
    assert (agg.buckets.met, agg.buckets.not_met, agg.buckets.not_evaluable) == (["a"], ["b"], ["c"])
    assert (agg.coverage.evaluated_population, agg.coverage.excluded_not_applicable, agg.coverage.unknown_count) == (3, 2, 1)
    refused(lambda: builder.add(claim(id="a")), "claim_id_duplicate")


def test_disclosure_is_illegal_under_withheld() -> None:
    refused(lambda: refuse(load(RESULT / "neg-disclosure-carrier-under-withheld.json")), "disclosure_under_withheld")


# --------------------------------------------------------------------------- adjudication and responses


def ruling(**kw: Any) -> Adjudication:
    fields: dict[str, Any] = dict(record_id="adj", adjudicated_at=NOW, verdict="contradicted", basis=pin(), parties=[ACT, ACT2], contradicted=ACT2)
    fields.update(kw)
    return Adjudication.ruling(**fields)


def test_adjudication_rules() -> None:
    assert ruling().contradicted_party == ACT2.digest
    refused(lambda: ruling(contradicted=None), "contradicted_party_required")
    refused(lambda: ruling(verdict="corroborated"), "contradicted_party_forbidden")
    refused(lambda: ruling(contradicted=RUBRIC), "contradicted_party_not_a_party")
    refused(lambda: ruling(parties=[ACT, ACT2, RUBRIC]), "parties_count")
    refused(lambda: ruling(parties=[ACT, ACT], contradicted=ACT), "parties_duplicate")
    refused(lambda: ruling(margin=0.42), "float_in_record")
    assert ruling(verdict="inconclusive", contradicted=None, margin="0.42").margin == "0.42"


def test_adjudication_response_rules() -> None:
    adj = ruling().target()
    receipt = AdjudicationResponse.delivery_receipt(record_id="r", responded_at=NOW, adjudication=adj)
    assert receipt.adjudication.judge_purpose == "responds_to"
    refused(lambda: AdjudicationResponse(record_id="r", responded_at=NOW, kind="delivery_receipt", adjudication=receipt.adjudication, verdict="contradicted"), "delivery_receipt_forbids_verdict")
    refused(lambda: AdjudicationResponse(record_id="r", responded_at=NOW, kind="ack", adjudication=receipt.adjudication), "ack_requires_verdict")
    refused(lambda: AdjudicationResponse(record_id="r", responded_at=NOW, kind="ack", adjudication=receipt.adjudication, verdict="contradicted", basis="because"), "ack_forbids_basis")
    refused(lambda: AdjudicationResponse.rebuttal(record_id="r", responded_at=NOW, adjudication=adj, verdict="contradicted", basis=""), "rebuttal_basis_empty")
    refused(lambda: AdjudicationResponse(record_id="r", responded_at=NOW, kind="rebuttal", adjudication=receipt.adjudication, verdict="contradicted"), "rebuttal_requires_basis")
    assert AdjudicationResponse.rebuttal(record_id="r", responded_at=NOW, adjudication=adj, verdict="corroborated", basis="the referee misread token 3").kind == "rebuttal"


def test_the_store_writes_nothing_nested_deeper_than_any_verifier_reads(world: Any) -> None:
    """The judge store writes into the same ledger as the producer and keeps
    the same bound: content nested past MAX_DEPTH is refused with a typed
    error before anything is signed or written."""
    from capseal.canonical import MAX_DEPTH
    from capseal.errors import NonJSONValueError

    value: Any = {}
    for _ in range(MAX_DEPTH + 5):
        value = {"a": value}
    count = world.store.ledger.count()
    with pytest.raises(NonJSONValueError, match=f"deeper than {MAX_DEPTH}"):
        world.store.put_json(value, type="deep")
    assert world.store.ledger.count() == count
