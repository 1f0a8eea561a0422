"""Bad input to the judge builders: a typed refusal naming the problem, never a
stray IndexError / AttributeError / KeyError / pydantic ValidationError, never
a silently wrong digest, and nothing recorded."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from capseal.canonical import raw_digest
from capseal.errors import CapsealError, JudgmentRefusedError
from capseal.judge import (
    CaseInput,
    Claim,
    Close,
    ContractCompile,
    ExpertProtocolParameters,
    HumanRating,
    JudgeAnswer,
    JudgePin,
    ModelJudge,
    ModelJudgeParameters,
    Requirement,
    RulesJudge,
    Target,
    blind_packet,
    code_identity,
    judgment_capsule_spec,
    judgment_member,
)
from capseal.judge.citation import DigestRef
from capseal.judge.result import ProofRef, ResultBuilder, presentation_for

from .conftest import NOW, World
from .test_refusals import refused as refused_by_rule

ACT = Target.of_json({"act": 1}, type="agent-action-capsule")
HEAD = Target.of_json({"head": 1}, type="store-head")
RUBRIC = {"rubric_id": "r", "criteria": [{"id": "C1"}]}
PROMPT = b"Grade the act.\n"
TEMPLATE = {"template": "t"}


def refused(fn: Callable[[], Any], rule: str, fragment: str) -> JudgmentRefusedError:
    """Refused with ``rule`` (test_refusals.refused), saying ``fragment``."""
    err = refused_by_rule(fn, rule)
    assert isinstance(err, CapsealError)
    assert fragment in str(err), f"{fragment!r} not in {err}"
    return err


def params(**kw: Any) -> ModelJudgeParameters:
    fields: dict[str, Any] = {"instruction_template": TEMPLATE, "prompt": PROMPT, "axes": b"{}", "sampling_params": {"temperature": "0"}}
    fields.update(kw)
    return ModelJudgeParameters.of(**fields)


def member() -> Any:
    return judgment_member(rubric=RUBRIC, rubric_version="1", parameters=params(), model_hosting="hosted")


# --------------------------------------------------------------------------- 1. typed refusals, not stray exceptions


@pytest.mark.parametrize("period", [("a",), ("a", "b", "c"), "ab", None, 5])
def test_close_period_must_be_a_start_end_pair(period: Any) -> None:
    refused(lambda: Close.of(record_id="c", closed_at=NOW, period=period, counts_by_kind={}, head=HEAD), "close_period_malformed", "period")


def test_close_head_must_be_a_computed_target() -> None:
    refused(lambda: Close.of(record_id="c", closed_at=NOW, period=("a", "b"), counts_by_kind={}, head="ab" * 32),  # type: ignore[arg-type]
            "citation_not_computed", "head")


def rules_judge(grade: str = "self-attested") -> RulesJudge:
    return RulesJudge(name="r", contract_ref="ec:c@1", requirements=[Requirement("C1", ("act",), lambda v: "met")], grade=grade)


@pytest.mark.parametrize("body", [
    {"claims": [{"requirement_ref": "C1", "evidence": [{}]}]},
    {"claims": [5]},
    {"claims": 5},
    {"result_version": "evidence-result/v0", "claims": [5]},
])
def test_recompute_refuses_a_body_that_is_not_an_evidence_result(world: World, body: dict[str, Any]) -> None:
    with pytest.raises(JudgmentRefusedError) as caught:
        rules_judge().recompute(body, store=world.store)
    assert "evidence" in str(caught.value).lower() or "result" in str(caught.value).lower()


def test_recompute_refuses_a_non_mapping(world: World) -> None:
    refused(lambda: rules_judge().recompute([1, 2], store=world.store), "record_not_object", "Evidence Result")  # type: ignore[arg-type]


def test_recompute_names_the_wrong_record_version(world: World) -> None:
    refused(lambda: rules_judge().recompute({"claims": [5]}, store=world.store), "record_version_mismatch", "Evidence Result")


def test_model_judge_accepts_the_prompt_bytes_the_pin_accepts(world: World) -> None:
    pin = JudgePin.pin(model_id="judge@1", prompt=PROMPT, sampling={"temperature_micros": 0})
    seen: list[Any] = []

    def call(request: Any) -> str:
        seen.append(request.prompt)
        return "met"

    judge = ModelJudge(pin=pin, prompt=PROMPT, call=call, contract_ref="ec:c@1")
    assert judge.verdict(CaseInput("c1", (world.act_t,), world.rubric_t), store=world.store) == "met"
    assert seen == [PROMPT]
    # the same prompt as text is the same digest
    ModelJudge(pin=pin, prompt=PROMPT.decode(), call=call, contract_ref="ec:c@1")
    refused(lambda: ModelJudge(pin=pin, prompt=b"other", call=call, contract_ref="ec:c@1"), "prompt_digest_mismatch", "not the prompt the pin names")


@pytest.mark.parametrize("prompt", [5, None, ["p"]])
def test_model_judge_refuses_a_prompt_that_is_not_text_or_bytes(prompt: Any) -> None:
    pin = JudgePin.pin(model_id="judge@1", prompt=PROMPT, sampling={})
    refused(lambda: ModelJudge(pin=pin, prompt=prompt, call=lambda r: "met", contract_ref="ec:c@1"), "citation_content_type", "prompt")


def test_model_judge_refuses_an_unpinned_or_uncallable_judge() -> None:
    pin = JudgePin.pin(model_id="judge@1", prompt=PROMPT, sampling={})
    refused(lambda: ModelJudge(pin="judge@1", prompt=PROMPT, call=lambda r: "met", contract_ref="ec:c@1"), "judge_unpinned", "JudgePin")  # type: ignore[arg-type]
    refused(lambda: ModelJudge(pin=pin, prompt=PROMPT, call="model", contract_ref="ec:c@1"), "judge_call_not_callable", "callable")  # type: ignore[arg-type]


@pytest.mark.parametrize("make, rule, fragment", [
    (lambda: params(min_confidence_micros=2_000_000), "schema_above_maximum", "min_confidence_micros"),
    (lambda: params(judge_batch=0), "schema_below_minimum", "judge_batch"),
    (lambda: ExpertProtocolParameters.of(protocol="", packet={"case": 1}), "schema_too_short", "protocol"),
    (lambda: judgment_member(rubric=RUBRIC, rubric_version="", parameters=params(), model_hosting="hosted"), "schema_too_short", "rubric_version"),
    (lambda: judgment_member(rubric=RUBRIC, rubric_version="1", parameters=params(), model_hosting="cloud"), "schema_enum_mismatch", "model_hosting"),
    (lambda: JudgeAnswer(verdict="maybe"), "schema_enum_mismatch", "verdict"),  # type: ignore[arg-type]
    (lambda: JudgeAnswer(verdict="met", score=1), "stored_rate_forbidden", "score"),  # type: ignore[call-arg]
])
def test_extension_blocks_refuse_by_rule(make: Callable[[], Any], rule: str, fragment: str) -> None:
    refused(make, rule, fragment)


def test_claim_refuses_an_unknown_tier_by_rule() -> None:
    err = refused(lambda: Claim(id="c", contract_ref="ec:c@1", requirement_ref="C1", tier="guessed", grade="self-attested",
                                sufficiency="SATISFIED", verdict="met", evidence=[], proofs=[],
                                presentation={"kind": "story", "status": "SATISFIED", "narrative": "n"}),
                  "claim_tier_unknown", "tier")
    assert err.path == "$.tier"
    refused(lambda: Claim.of(id="c", contract_ref="ec:c@1", requirement_ref="C1", tier="guessed", grade="self-attested",
                             sufficiency="SATISFIED", verdict="met", evidence=[ACT]), "claim_tier_unknown", "tier")


def test_judgment_capsule_spec_refuses_a_typed_in_digest() -> None:
    answer = JudgeAnswer(verdict="met")
    refused(lambda: judgment_capsule_spec(action_id="a", judge="m@1", member=member(), answer=answer, judged_from="ab" * 32),  # type: ignore[arg-type]
            "citation_not_computed", "judged_from")
    refused(lambda: judgment_capsule_spec(action_id="a", judge="m@1", member=member(), answer=answer, judged_from=ACT,
                                          calibrated_against="ab" * 32),  # type: ignore[arg-type]
            "citation_not_computed", "calibrated_against")
    refused(lambda: judgment_capsule_spec(action_id="a", judge="m@1", member={"rubric_digest": "x"}, answer=answer, judged_from=ACT),  # type: ignore[arg-type]
            "schema_type_mismatch", "JudgmentMember")
    refused(lambda: judgment_capsule_spec(action_id="a", judge="m@1", member=member(), answer={"verdict": "met"}, judged_from=ACT),  # type: ignore[arg-type]
            "schema_type_mismatch", "JudgeAnswer")


@pytest.mark.parametrize("acts", [["x"], [ACT, "ab" * 32]])
def test_blind_packet_refuses_acts_that_are_not_targets(acts: Any) -> None:
    refused(lambda: blind_packet(case_id="c1", acts=acts, criterion={"id": "C1"}), "citation_not_computed", "acts")


def test_blind_packet_acts_are_a_list() -> None:
    refused(lambda: blind_packet(case_id="c1", acts="ab" * 32, criterion={"id": "C1"}), "argument_not_a_list", "acts is a list")  # type: ignore[arg-type]
    refused(lambda: blind_packet(case_id="", acts=[ACT], criterion={"id": "C1"}), "schema_too_short", "case_id")


@pytest.mark.parametrize("what", ["prompt", "axes"])
@pytest.mark.parametrize("value", [5, 0, None, 1.5, ["a"]])
def test_model_parameters_never_digest_a_number_as_zero_bytes(what: str, value: Any) -> None:
    refused(lambda: params(**{what: value}), "citation_content_type", what)


def test_model_parameters_take_bytes_or_text() -> None:
    assert params(prompt=bytearray(PROMPT)).prompt_digest == raw_digest(PROMPT)
    assert params(prompt=memoryview(PROMPT)).prompt_digest == raw_digest(PROMPT)
    assert params(prompt=PROMPT.decode()).prompt_digest == raw_digest(PROMPT)
    refused(lambda: params(instruction_template=["t"]), "citation_content_type", "instruction_template")
    refused(lambda: ExpertProtocolParameters.of(protocol="p/1", packet="case"), "citation_content_type", "packet")  # type: ignore[arg-type]


@pytest.mark.parametrize("value", [3, 0, None, "abc"])
def test_digest_ref_of_bytes_never_digests_a_number_as_zero_bytes(value: Any) -> None:
    refused(lambda: DigestRef.of_bytes(value), "citation_content_type", "bytes")


# --------------------------------------------------------------------------- 2. a human rating is blind only over a blind packet


def test_rating_over_a_packet_that_showed_the_model_verdict_is_refused(world: World) -> None:
    shown = world.store.put_json({"case_id": "c1", "acts": [world.act_t.digest], "model_verdict_shown": True}, type="rated-case")
    refused(lambda: HumanRating.of(record_id="hr", rated_at=NOW, rater_ref="principal:r1", case=shown, label="met"),
            "rated_case_not_blind", "model_verdict_shown")


@pytest.mark.parametrize("packet, fragment", [
    ({"case_id": "c1", "acts": [], "model_verdict_shown": False, "model_verdict": "met"}, "model_verdict"),
    ({"case_id": "c1", "acts": [], "verdict": "met"}, "verdict"),
    ({"case_id": "c1", "acts": [], "model_verdict_shown": "no"}, "model_verdict_shown"),
    ({"record_version": "evaluation-report/v1", "cases": []}, "judgment record"),
])
def test_rating_over_a_packet_carrying_a_verdict_is_refused(packet: dict[str, Any], fragment: str) -> None:
    refused(lambda: HumanRating.of(record_id="hr", rated_at=NOW, rater_ref="principal:r1", case=Target.of_json(packet, type="rated-case"), label="met"),
            "rated_case_not_blind", fragment)


def test_rating_over_the_evaluation_report_itself_is_refused(world: World) -> None:
    from capseal.judge import Case, EvaluationReport

    pin = JudgePin.pin(model_id="judge@1", prompt=world.prompt_t, sampling={"temperature_micros": 0})
    report = EvaluationReport(record_id="er", generated_at=NOW, contract_ref="ec:c@1", judge_pin=pin,
                              cases=[Case.of("c1", "met", acts=[world.act_t], method=world.rubric_t)])
    sealed = world.store.seal(report)
    refused(lambda: HumanRating.of(record_id="hr", rated_at=NOW, rater_ref="principal:r1", case=report.target(), label="met"),
            "rated_case_not_blind", "judgment record")
    refused(lambda: HumanRating.of(record_id="hr", rated_at=NOW, rater_ref="principal:r1", case=world.store.target(sealed.digest), label="met"),
            "rated_case_not_blind", "judgment record")


@pytest.mark.parametrize("kind", ["text", "bytes", "capsule"])
def test_rating_over_content_that_is_no_packet_is_refused(world: World, kind: str) -> None:
    case = {"text": Target.of_text("the model said met", type="rated-case"), "bytes": Target.of_bytes(b"x", type="rated-case"),
            "capsule": world.act_t}[kind]
    refused(lambda: HumanRating.of(record_id="hr", rated_at=NOW, rater_ref="principal:r1", case=case, label="met"),
            "rated_case_not_blind", "blind packet")


def test_rating_over_a_blind_packet_is_accepted(world: World) -> None:
    packet = world.store.put_json(blind_packet(case_id="c1", acts=[world.act_t], criterion={"id": "C1"}), type="rated-case")
    assert HumanRating.of(record_id="hr", rated_at=NOW, rater_ref="principal:r1", case=packet, label="met").body()["blind"] is True


# --------------------------------------------------------------------------- 3. no grade above self-attested with nothing behind it


@pytest.mark.parametrize("grade", ["witnessed", "countersigned"])
def test_code_identity_is_self_attested(grade: str) -> None:
    refused(lambda: code_identity(RulesJudge, name="r", captured_at=NOW, grade=grade), "code_identity_overgraded", "self-attested")
    assert code_identity(RulesJudge, name="r", captured_at=NOW).grade == "self-attested"  # type: ignore[union-attr]


@pytest.mark.parametrize("grade", ["witnessed", "countersigned"])
def test_rules_judge_cannot_grade_its_claims_above_self_attested(grade: str) -> None:
    refused(lambda: rules_judge(grade), "claim_grade_without_proof", "no proof")


def test_rules_judge_refuses_an_unknown_grade() -> None:
    refused(lambda: rules_judge("gold"), "schema_enum_mismatch", "grade")


def claim(grade: str, proofs: list[ProofRef]) -> Claim:
    return Claim.of(id="c", contract_ref="ec:c@1", requirement_ref="C1", tier="judged", grade=grade,
                    sufficiency="SATISFIED", verdict="met", evidence=[ACT], proofs=proofs)


@pytest.mark.parametrize("grade", ["witnessed", "countersigned"])
def test_claim_graded_above_self_attested_needs_a_proof(grade: str) -> None:
    """The published positive vectors grade claims witnessed or countersigned
    over inclusion proofs; a grade with no proof at all backs nothing."""
    inclusion = ProofRef(kind="inclusion_proof", digest_alg="SHA-256", digest="a" * 64)
    receipt = ProofRef(kind="receipt", digest_alg="SHA-256", digest="b" * 64)
    refused(lambda: claim(grade, []), "claim_grade_without_proof", grade)
    assert claim(grade, [inclusion]).grade == grade
    assert claim(grade, [receipt]).grade == grade
    assert claim("self-attested", []).grade == "self-attested"
    # a Claim built directly is refused when it enters a Result
    direct = Claim(id="c", contract_ref="ec:c@1", requirement_ref="C1", tier="judged", grade=grade, sufficiency="SATISFIED",
                   verdict="met", evidence=[DigestRef.of(ACT)], proofs=[], presentation=presentation_for("SATISFIED", [DigestRef.of(ACT)]))
    refused(lambda: ResultBuilder(generated_at=NOW).add(direct), "claim_grade_without_proof", "no proofs")


# --------------------------------------------------------------------------- 4. a compile never approves itself


def test_human_approval_is_not_the_contract_or_a_compiled_skill() -> None:
    contract = Target.of_json({"contract": 1}, type="evidence-contract")
    skill = Target.of_json({"skill": 1}, type="compiled-skill")
    skill_as_approval = Target.of_json({"skill": 1}, type="human-approval-record")
    for approval, what in ((skill, "compiled_skill"), (contract, "contract"), (skill_as_approval, "compiled_skill")):
        refused(lambda: ContractCompile.of(record_id="cc", compiled_at=NOW, contract_ref="ec:c@1", contract=contract,  # noqa: B023
                                           compiled_skill=[skill], human_approval=approval), "human_approval_self_certifying", what)  # noqa: B023
    ok = ContractCompile.of(record_id="cc", compiled_at=NOW, contract_ref="ec:c@1", contract=contract, compiled_skill=[skill],
                            human_approval=Target.of_json({"approved_by": "principal:p"}, type="human-approval-record"))
    body = ok.body()
    body["human_approval"] = {**body["human_approval"], "digest": skill.digest}
    refused(lambda: ContractCompile.from_body(body), "human_approval_self_certifying", "compiled_skill")


def test_compiled_skill_is_a_list_of_targets() -> None:
    contract = Target.of_json({"contract": 1}, type="evidence-contract")
    approval = Target.of_json({"approved_by": "principal:p"}, type="human-approval-record")
    refused(lambda: ContractCompile.of(record_id="cc", compiled_at=NOW, contract_ref="ec:c@1", contract=contract,
                                       compiled_skill=contract, human_approval=approval),  # type: ignore[arg-type]
            "argument_not_a_list", "compiled_skill")


# --------------------------------------------------------------------------- every public call, each argument wrong


def test_no_wrong_argument_escapes_untyped(world: World) -> None:
    """Each public judge call, from a valid baseline, with one argument at a
    time replaced by a value of the wrong type: every failure is a typed
    CapsealError (a review counted 316 untyped ones, then 73, now none)."""
    import capseal.judge as j
    from capseal.judge import (
        Adjudication,
        AdjudicationResponse,
        CalibrationSummary,
        Case,
        Close,
        ContractCompile,
        EvidenceResult,
        ExpertProtocolParameters,
        HumanRating,
        JudgePin,
        KOfN,
        Link,
        ModelJudge,
        ModelJudgeParameters,
        Requirement,
        ResultBuilder,
        RulesJudge,
        SampleManifest,
        Target,
        agreement,
        blind_packet,
        check_body,
        check_judgment_capsule,
        check_links,
        clause_tally,
        code_identity,
        decimal_string,
        drift,
        epistemic_type_of,
        judgment_capsule_spec,
        judgment_member,
        link,
        micros,
        parse_record,
        refuse,
        refuse_judgment_capsule,
        verify_judgment,
    )
    from capseal.judge.citation import Citation, DigestRef
    from capseal.judge.extension import JudgeAnswer
    from capseal.judge.result import Claim

    store, act, AT = world.store, world.act, NOW
    T = lambda n, ty="x": store.put_json({"n": n}, type=ty)  # noqa: E731
    t1, t2, t3 = T(1), T(2), T(3)
    pin = JudgePin.pin(model_id="m@1", prompt=b"p", sampling={"temperature_micros": 0})
    kn = KOfN.of(1, 2)
    mparams = ModelJudgeParameters.of(instruction_template={"a": "b"}, prompt="p", axes="a", sampling_params={"temperature_micros": 0})
    member = judgment_member(rubric={"r": 1}, rubric_version="1", parameters=mparams, model_hosting="hosted")
    BAD = [None, 5, "", [], {}, b"", 1.5, True, object()]
    C = "ec:x@1"
    base: dict[str, tuple[Any, dict[str, Any]]] = {
     "Target.of_json": (Target.of_json, dict(value={"a": 1}, type="x")),
     "Target.of_bytes": (Target.of_bytes, dict(data=b"x", type="x")),
     "Target.of_text": (Target.of_text, dict(text="x", type="x")),
     "Target.of_capsule": (Target.of_capsule, dict(capsule=act, type="x")),
     "Target.of_record": (Target.of_record, dict(record={"record_version": "x/v1"}, type="x")),
     "Citation.to": (Citation.to, dict(target=t1, purpose="grounds")),
     "DigestRef.of": (DigestRef.of, dict(target=t1)),
     "DigestRef.of_bytes": (DigestRef.of_bytes, dict(data=b"x")),
     "Link.to": (Link.to, dict(type="cites", target=t1)),
     "link": (link, dict(type="cites", target=t1)),
     "JudgePin.pin": (JudgePin.pin, dict(model_id="m@1", prompt=b"p", sampling={"temperature_micros": 0}, axes=b"a", weights=b"w")),
     "decimal_string": (decimal_string, dict(value="0.5")),
     "micros": (micros, dict(value="0.5")),
     "Case.of": (Case.of, dict(case_id="c", verdict="met", acts=[t1], method=t2)),
     "Adjudication.ruling": (Adjudication.ruling, dict(record_id="a", adjudicated_at=AT, verdict="contradicted", basis=pin, parties=[t1, t2], contradicted=t1, referee=t3, margin="0.1", margin_tau="0.1", divergence_index="0.1")),
     "AdjudicationResponse.delivery_receipt": (AdjudicationResponse.delivery_receipt, dict(record_id="r", responded_at=AT, adjudication=t1)),
     "AdjudicationResponse.ack": (AdjudicationResponse.ack, dict(record_id="r", responded_at=AT, adjudication=t1, verdict="corroborated")),
     "AdjudicationResponse.rebuttal": (AdjudicationResponse.rebuttal, dict(record_id="r", responded_at=AT, adjudication=t1, verdict="corroborated", basis="because")),
     "HumanRating.of": (HumanRating.of, dict(record_id="h", rated_at=AT, rater_ref="principal:r", case=Target.of_json(blind_packet(case_id="c", acts=[t1], criterion="x"), type="rc"), label="met")),
     "CalibrationSummary.of": (CalibrationSummary.of, dict(record_id="c", computed_at=AT, judge_pin=pin, clauses=[clause_tally("C1", agreement=kn, drift=kn)])),
     "KOfN.of": (KOfN.of, dict(k=1, n=2)),
     "SampleManifest.of": (SampleManifest.of, dict(record_id="s", generated_at=AT, policy=t1, stratification={"a": 1}, cases=["c1"])),
     "ContractCompile.of": (ContractCompile.of, dict(record_id="cc", compiled_at=AT, contract_ref=C, contract=t1, compiled_skill=[t2], human_approval=t3)),
     "Close.of": (Close.of, dict(record_id="cl", closed_at=AT, period=("2026-09-01T00:00:00Z", AT), counts_by_kind={"x": 1}, head=t1, reconcile=None, peer_close=t2)),
     "Claim.of": (Claim.of, dict(id="c1", contract_ref=C, requirement_ref="r1", tier="judged", grade="self-attested", sufficiency="SUFFICIENT", verdict="met", evidence=[t1], proofs=(), presentation=None, implementation=None)),
     "ResultBuilder": (ResultBuilder, dict(generated_at=AT, view=None)),
     "code_identity": (lambda name, captured_at, grade: code_identity(j, name=name, captured_at=captured_at, grade=grade), dict(name="n", captured_at=AT, grade="self-attested")),
     "ModelJudgeParameters.of": (ModelJudgeParameters.of, dict(instruction_template={"a": "b"}, prompt="p", axes="a", sampling_params={"temperature_micros": 0}, min_confidence_micros=1, judge_batch=1)),
     "ExpertProtocolParameters.of": (ExpertProtocolParameters.of, dict(protocol="p", packet={"a": 1})),
     "judgment_member": (judgment_member, dict(rubric={"r": 1}, rubric_version="1", parameters=mparams, model_hosting="hosted")),
     "judgment_capsule_spec": (judgment_capsule_spec, dict(action_id="a1", judge="m@1", member=member, answer=JudgeAnswer(verdict="met"), judged_from=Target.of_capsule(act), calibrated_against=None)),
     "check_judgment_capsule": (check_judgment_capsule, dict(capsule=dict(act.capsule), preimages={}, raw_files={})),
     "refuse_judgment_capsule": (refuse_judgment_capsule, dict(capsule=dict(act.capsule))),
     "check_body": (check_body, dict(body={"record_version": "human-rating/v1"})),
     "check_links": (check_links, dict(epistemic_type="adjudication", links=[{"type": "cites", "target": t1.digest}], body={"parties": []})),
     "refuse": (refuse, dict(body={"record_version": "human-rating/v1"})),
     "parse_record": (parse_record, dict(body={"record_version": "human-rating/v1"})),
     "epistemic_type_of": (epistemic_type_of, dict(body={"record_version": "human-rating/v1"})),
     "EvidenceResult.from_body": (EvidenceResult.from_body, dict(body={"result_version": "x"})),
     "JudgmentStore.seal": (store.seal, dict(record={"record_version": "human-rating/v1"}, links=(), external=())),
     "JudgmentStore.put": (store.put, dict(target=t1)),
     "JudgmentStore.put_json": (store.put_json, dict(value={"a": 1}, type="x")),
     "JudgmentStore.put_text": (store.put_text, dict(text="x", type="x")),
     "JudgmentStore.put_bytes": (store.put_bytes, dict(data=b"x", type="x")),
     "JudgmentStore.supersede": (store.supersede, dict(old=t1.digest, record={"record_version": "human-rating/v1"}, links=(), external=())),
     "JudgmentStore.target": (store.target, dict(digest=t1.digest, type="x")),
     "verify_judgment": (lambda record: verify_judgment(record, store), dict(record=t1.digest)),
     "RulesJudge": (RulesJudge, dict(name="n", contract_ref=C, requirements=[Requirement("r1", ("a",), lambda i: "met")], grade="self-attested")),
     "ModelJudge": (ModelJudge, dict(pin=pin, prompt=b"p", call=lambda r: "met", contract_ref=C)),
     "blind_packet": (blind_packet, dict(case_id="c", acts=[t1], criterion="x")),
     "agreement": (agreement, dict(judge={"c": "met"}, humans=[("c", "met")])),
     "drift": (drift, dict(first={"c": "met"}, rerun={"c": "met"})),
     "clause_tally": (clause_tally, dict(clause_ref="C1", agreement=kn, drift=kn)),
    }
    untyped: list[str] = []
    for name, (fn, kw) in base.items():
        for p in [None, *kw]:
            for bad in BAD if p is not None else [None]:
                args = dict(kw) if p is None else {**kw, p: bad}
                try:
                    fn(**args)
                except CapsealError:
                    pass
                except Exception as exc:  # noqa: BLE001 - what this test looks for
                    untyped.append(f"{name}({p}={type(bad).__name__}): {type(exc).__name__}: {exc}"[:200])
    assert untyped == []
