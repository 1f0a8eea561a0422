"""Issue 5 item 5: three ways of judging, each ending in a judgment record."""

from __future__ import annotations

from collections.abc import Mapping
from decimal import Decimal
from typing import Any

import pytest

from capseal.canonical import json_digest
from capseal.errors import JudgmentRefusedError
from capseal.judge import (
    CalibrationSummary,
    CaseInput,
    HumanRating,
    JudgePin,
    JudgeRequest,
    ModelJudge,
    Requirement,
    RulesJudge,
    Target,
    agreement,
    blind_packet,
    clause_tally,
    code_identity,
    drift,
    link,
    verify_judgment,
)
from capseal.judge.result import git_blob_id, git_tree_id

from .conftest import NOW, World


def approval(values: Mapping[str, Any]) -> str:
    act, request = values["act"], values["request"]
    if act["effect"].get("request_digest") != json_digest(request):
        return "insufficient"
    return "met" if Decimal(request["refund"]) <= Decimal("500.00") or request.get("approval_ref") else "not_met"


def stricter(values: Mapping[str, Any]) -> str:
    return "not_met"


def rules(rule: Any = approval) -> RulesJudge:
    return RulesJudge(name="refund-rules", contract_ref="ec:refunds@1", requirements=[Requirement("C1", ("act", "request"), rule)])


# --------------------------------------------------------------------------- 1. rules


def test_rules_judge_is_recomputed_and_re_runnable(world: World) -> None:
    judge = rules()
    result = judge.judge({"act": world.act_t, "request": world.request_t}, store=world.store, as_of=NOW)
    claim = result.claims[0]
    assert (claim.tier, claim.sufficiency, claim.verdict) == ("recomputed", "SATISFIED", "met")
    assert claim.implementation.code_digest.alg == "git-tree" and len(claim.implementation.code_digest.value) == 40
    assert [e.digest for e in claim.evidence] == [world.act.capsule_id, world.request_t.digest]
    assert result.epistemic_type == "derived_metric"
    sealed = world.store.seal(result, links=[link("cites", world.act_t)])
    assert sealed.epistemic_type == "derived_metric" and verify_judgment(sealed, world.store).ok
    # anyone with the inputs re-runs it and gets the same record digest
    assert judge.recompute(sealed, store=world.store).target().digest == sealed.digest
    assert rules().recompute(sealed.body, store=world.store).target().digest == sealed.digest


def test_recompute_notices_other_code(world: World) -> None:
    sealed = world.store.seal(rules().judge({"act": world.act_t, "request": world.request_t}, store=world.store, as_of=NOW))
    other = rules(stricter).recompute(sealed, store=world.store)
    assert other.target().digest != sealed.digest
    assert other.claims[0].verdict == "not_met"


def test_missing_input_is_a_gap_never_a_guess(world: World) -> None:
    absent = Target.of_json({"refund": "1.00"}, type="refund-request")
    result = rules().judge({"act": world.act_t, "request": absent}, store=world.store, as_of=NOW)
    assert (result.claims[0].sufficiency, result.claims[0].verdict) == ("GAP", "not_evaluable")
    assert result.claims[0].presentation.status == "NOT_FOUND"
    wrong = world.store.put_json({"refund": "9.00"}, type="refund-request")  # not the act's request
    result = rules().judge({"act": world.act_t, "request": wrong}, store=world.store, as_of=NOW)
    assert (result.claims[0].sufficiency, result.claims[0].verdict) == ("INSUFFICIENT", "not_evaluable")


def test_rule_cannot_change_what_it_reads(world: World) -> None:
    def vandal(values: Mapping[str, Any]) -> str:
        values["request"]["refund"] = "0.00"  # type: ignore[index]
        return "met"

    rules(vandal).judge({"act": world.act_t, "request": world.request_t}, store=world.store, as_of=NOW)
    assert world.store.value(world.request_t.digest)["refund"] == "612.00"


def test_rule_outcome_outside_the_vocabulary_is_refused(world: World) -> None:
    with pytest.raises(JudgmentRefusedError) as caught:
        rules(lambda v: "probably").judge({"act": world.act_t, "request": world.request_t}, store=world.store, as_of=NOW)
    assert caught.value.rule == "rule_outcome_unknown"


def test_unnameable_rule_code_is_withheld_and_counted(world: World) -> None:
    namespace: dict[str, Any] = {"__name__": "generated_rules"}
    exec("def rule(values):\n    return 'met'\n", namespace)  # made at run time: no source file to name
    judge = RulesJudge(name="mixed", contract_ref="ec:refunds@1", requirements=[
        Requirement("C1", ("act", "request"), approval), Requirement("C9", ("act",), namespace["rule"]),
    ])
    result = judge.judge({"act": world.act_t, "request": world.request_t}, store=world.store, as_of=NOW)
    assert [(c.requirement_ref, c.tier) for c in result.claims] == [("C1", "recomputed")]  # never relabelled judged
    defects = result.aggregate.coverage.producer_defects
    assert (defects.count, defects.denominator, defects.as_of) == (1, 2, NOW)
    assert result.aggregate.coverage.evaluated_population == 1


def test_code_identity_is_a_git_tree_of_the_rule_sources() -> None:
    assert git_blob_id(b"") == "e69de29bb2d1d6434b8b29ae775ad8c2e48c5391"  # git's own empty blob
    assert git_tree_id({}) == "4b825dc642cb6eb9a060e54bf8d69288fbee4904"  # git's own empty tree
    impl = code_identity(approval, name="r", captured_at=NOW)
    assert impl is not None and impl.grade == "self-attested"
    assert code_identity(approval, name="r", captured_at=NOW) == impl
    assert code_identity(len, name="builtin", captured_at=NOW) is None  # no source: cannot be named
    import functools

    assert code_identity(functools.partial(approval), name="r", captured_at=NOW) == impl  # the wrapped rule, not functools


# --------------------------------------------------------------------------- 2. judge model


def model_judge(world: World, call: Any) -> ModelJudge:
    pin = JudgePin.pin(model_id="judge@2026-09", prompt=world.prompt_t, sampling={"temperature_micros": 0, "seed": 7})
    return ModelJudge(pin=pin, prompt=world.prompt, call=call, contract_ref="ec:refunds@1")


def test_model_judge_is_pinned_and_injected(world: World) -> None:
    seen: list[JudgeRequest] = []

    def call(request: JudgeRequest) -> dict[str, Any]:
        seen.append(request)
        return {"verdict": "met", "rationale": "stated first", "confidence": 0.93, "score": 9}

    judge = model_judge(world, call)
    report = judge.judge([CaseInput("c1", (world.act_t,), world.rubric_t)], record_id="er-1", generated_at=NOW, store=world.store)
    assert seen[0].model_id == "judge@2026-09" and seen[0].prompt == world.prompt and seen[0].acts[0]["capsule_id"] == world.act.capsule_id
    body = report.body()
    assert body["judge_pin"]["prompt_digest"]["digest"] == world.prompt_t.digest
    assert "confidence" not in str(body) and "score" not in str(body) and "rationale" not in str(body)
    assert report.cases[0].acts[0].judge_purpose == "grounds" and report.cases[0].method.judge_purpose == "method"
    sealed = world.store.seal(report, links=[link("cites", world.act_t)])
    assert sealed.epistemic_type == "semantic_judgment" and verify_judgment(sealed, world.store).ok


@pytest.mark.parametrize("answer", ["yes", {"verdict": "pass"}, {"label": "met"}, None, {"verdict": 1}])
def test_model_answer_outside_the_verdicts_is_refused(world: World, answer: Any) -> None:
    judge = model_judge(world, lambda request: answer)
    with pytest.raises(JudgmentRefusedError) as caught:
        judge.judge([CaseInput("c1", (world.act_t,), world.rubric_t)], record_id="er", generated_at=NOW, store=world.store)
    assert caught.value.rule == "judge_answer_not_a_verdict"


def test_model_judge_refuses_a_prompt_other_than_the_pinned_one(world: World) -> None:
    pin = JudgePin.pin(model_id="judge@1", prompt=world.prompt_t, sampling={})
    with pytest.raises(JudgmentRefusedError) as caught:
        ModelJudge(pin=pin, prompt="a different prompt", call=lambda r: "met", contract_ref="ec:c@1")
    assert caught.value.rule == "prompt_digest_mismatch"


# --------------------------------------------------------------------------- 3. blind humans, calibration


def test_blind_ratings_and_calibration_k_of_n(world: World) -> None:
    judge = model_judge(world, lambda request: "met")
    case = CaseInput("c1", (world.act_t,), world.rubric_t)
    report = judge.judge([case], record_id="er-1", generated_at=NOW, store=world.store)
    sealed_report = world.store.seal(report)
    packet = blind_packet(case_id="c1", acts=case.acts, criterion={"id": "C1"})
    assert packet["model_verdict_shown"] is False and "met" not in str(packet)
    packet_t = world.store.put_json(packet, type="rated-case")
    ratings = [
        world.store.seal(HumanRating.of(record_id=f"hr-{i}", rated_at=NOW, rater_ref=f"principal:r{i}", case=packet_t, label=label))
        for i, label in enumerate(["met", "not_met", "met", "unsure"])
    ]
    assert {r.epistemic_type for r in ratings} == {"human_report"} and all(r.body["blind"] is True for r in ratings)
    judged = {"c1": report.cases[0].verdict}
    agree = agreement(judged, [("c1", r.body["label"]) for r in ratings])
    assert (agree.k, agree.n) == (2, 3)  # "unsure" is not a verdict: not comparable, not counted
    again = drift(judged, {"c1": judge.verdict(case, store=world.store)})
    assert (again.k, again.n) == (0, 1)
    world.store.put(judge.pin.target())
    summary = CalibrationSummary.of(record_id="cal-1", computed_at=NOW, judge_pin=judge.pin,
                                    clauses=[clause_tally("C1", agreement=agree, drift=again)])
    sealed = world.store.seal(summary, links=[link("cites", sealed_report), *(link("cites", r) for r in ratings)])
    assert sealed.epistemic_type == "derived_metric"
    assert sealed.body["clauses"][0]["agreement"] == {"k": 2, "n": 3}
    assert verify_judgment(sealed, world.store).ok
    assert summary.clauses[0].agreement.rate() is not None and agreement({}, []).rate() is None
