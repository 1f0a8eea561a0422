"""Every stored jury verdict shape reads (0.13 subVerdicts, 0.14-0.16 compositeAttempts,
the 0.17 seven-component form), with the facts upstream's tests pin for the same files."""

from __future__ import annotations

from typing import Any

import pytest

from capseal.judge import interpret
from capseal.judge.interpret import DecidedBy, ScoreScale

from .conftest import A068E50A, A36A7598C, ACP_13, BOUNDARY, BUD_EVAL, COMPOSITE, EXAMPLE_ONE, EXAMPLE_TWO, stored


def defects(i: object) -> list[tuple[str, str, str]]:
    return [(d.path, d.field, d.kind) for d in i.defects]  # type: ignore[attr-defined]


def test_0_17_seven_component_cascade_reads_undecided_supported_decided_by_its_tier() -> None:
    i = interpret(stored(EXAMPLE_ONE))
    assert (i.schema_version, i.source_version, i.reading, i.reading_support) == (1, 1, "UNDECIDED", "SUPPORTED")
    assert i.decided_by == DecidedBy("structure", ("structure",), "tier_outcome")
    assert [s.stage for s in i.stages] == ["structure"] and i.stages[0].used_by_parent is True
    assert [(j.position, j.name, j.key_source, j.status) for j in i.root.judges] == [
        (0, "structure:ddd-review.md", "DECLARED", "pass"), (1, "reportStructure", "DECLARED", "fail")]
    assert i.defects == ()


def test_0_13_sub_verdicts_read_with_upper_case_statuses_and_only_the_legacy_defects() -> None:
    i = interpret(stored(EXAMPLE_TWO))
    assert (i.source_version, i.reading, i.reading_support, i.decided_by) == (0, "REJECTED", "UNDETERMINED", None)
    assert [(s.stage, s.path, s.status) for s in i.stages] == [(None, (), "fail")]
    assert [(j.name, j.status, j.key_source) for j in i.root.judges] == [
        ("structure:ddd-action-brief.md", "pass", None), ("structure:ddd-review.md", "fail", None)]
    assert defects(i) == [
        ("verdict.aggregated", "score", "UNPARSEABLE"), ("verdict", "seats", "ABSENT"),
        ("verdict.individualByName[structure:ddd-action-brief.md]", "score", "UNPARSEABLE"),
        ("verdict.individualByName[structure:ddd-review.md]", "score", "UNPARSEABLE"),
        ("verdict.subVerdicts[0]", "name", "ABSENT"), ("verdict.subVerdicts[0].aggregated", "score", "UNPARSEABLE"),
        ("verdict.subVerdicts[0].individualByName[structure:ddd-action-brief.md]", "score", "UNPARSEABLE"),
        ("verdict.subVerdicts[0].individualByName[structure:ddd-review.md]", "score", "UNPARSEABLE"),
        ("verdict", "decision", "ABSENT"), ("verdict.aggregated", "metadata.aggregation", "ABSENT")]


def test_0_13_value_min_max_score_is_normalised_on_its_own_scale_with_score_scale_beside_it() -> None:
    i = interpret(stored(BUD_EVAL))
    assert (i.reading, i.source_version, i.decided_by) == ("ACCEPTED", 0, None)
    assert len(i.stages) == 3 and all(s.stage is None and s.path == () for s in i.stages)
    seat = i.root.judges[0]
    assert (seat.name, seat.status, seat.score, seat.score_scale) == ("codeQuality", "pass", 0.7777777777777778, ScoreScale(0.0, 1.0))
    assert len(seat.checks) == 6
    assert seat.to_json()["scoreScale"] == {"min": 0.0, "max": 1.0}


def test_0_13_value_boolean_score_is_unparseable_and_ignored() -> None:
    i = interpret(stored(EXAMPLE_TWO))
    assert all(j.score is None and j.score_scale is None for j in i.root.judges)
    assert ("verdict.individualByName[structure:ddd-review.md]", "score", "UNPARSEABLE") in defects(i)


def test_0_14_to_0_16_composite_attempts_block_that_agrees_is_supported_though_decided_by_is_null() -> None:
    i = interpret(stored(A068E50A))
    assert (i.source_version, i.reading, i.reading_support, i.decided_by) == (0, "REJECTED", "SUPPORTED", None)
    assert [(s.stage, s.path, s.policy, s.status, s.used_by_parent, s.disposition) for s in i.stages] == [
        ("artifacts", ("artifacts",), "REJECT_ON_ANY_FAIL", "pass", None, None),
        ("structure", ("structure",), "REJECT_ON_ANY_FAIL", "fail", None, None)]
    assert [j.name for j in i.root.judges] == ["reportStructure"] and len(i.root.judges[0].checks) == 5
    evidence = i.root.evidence.to_json()  # type: ignore[union-attr]
    assert (evidence["strategy"], evidence["notApplicablePolicy"], evidence["passCount"], evidence["failCount"]) == ("consensus", None, 0, 1)
    assert defects(i) == [("verdict", "seats", "ABSENT"), ("verdict.compositeAttempts[0]", "disposition", "ABSENT"),
                          ("verdict.compositeAttempts[1]", "disposition", "ABSENT"), ("verdict", "decision", "ABSENT")]


def test_0_16_propagated_judge_error_is_not_assessed_never_a_rejection() -> None:
    i = interpret(stored(A36A7598C))
    assert (i.reading, i.reading_support, i.decided_by) == ("NOT_ASSESSED", "SUPPORTED", None)
    assert [s.stage for s in i.stages] == ["artifacts", "structure", "quality"]
    assert [(j.name, j.status) for j in i.stages[2].judges] == [("dddQuality", "error"), ("goldRecall", "pass")]
    assert ("verdict.aggregated", "reasonCode", "ABSENT") in defects(i)
    assert {d.kind for d in i.defects} == {"ABSENT"}


def test_a_stage_that_entered_and_produced_no_verdict_keeps_a_null_status_and_its_failure_code() -> None:
    i = interpret(stored(ACP_13))
    failed = i.stages[1]
    assert (failed.stage, failed.failure, failed.status, failed.reasoning, failed.evidence, failed.judges) == (
        "review-quality", "jury_execution_failed", None, None, None, ())
    assert failed.policy == "FINAL_TIER" and failed.used_by_parent is None
    assert not [d for d in i.defects if d.path.startswith("verdict.compositeAttempts[1]") and d.field != "disposition"]
    assert i.reading == "NOT_ASSESSED" and i.root.judges == ()


@pytest.mark.parametrize("form", ["failure", "failureCode", "object"])
def test_a_failed_attempt_code_reads_in_each_stored_spelling(form: str) -> None:
    verdict = stored(ACP_13)
    attempt = verdict["compositeAttempts"][1]
    del attempt["failureCode"]
    attempt["failure" if form != "failureCode" else "failureCode"] = {"code": "jury_execution_failed"} if form == "object" else "jury_execution_failed"
    assert interpret(verdict).stages[1].failure == "jury_execution_failed"


def test_built_in_0_17_juries_read_without_defects() -> None:
    boundary = interpret(stored(BOUNDARY))
    assert (boundary.reading, boundary.reading_support, boundary.defects) == ("REJECTED", "SUPPORTED", ())
    assert boundary.decided_by == DecidedBy("rubric", ("rubric",), "individual_rejection")
    composite = interpret(stored(COMPOSITE))
    assert (composite.reading, composite.reading_support, composite.defects, composite.decided_by) == ("NOT_ASSESSED", "SUPPORTED", (), None)
    assert [s.path for s in composite.stages] == [("pipeline",), ("pipeline", "broken-check"), ("pipeline", "semantic-check"), ("audit",)]


def test_a_flat_0_13_record_reads_its_root() -> None:
    verdict = stored(EXAMPLE_TWO)
    del verdict["subVerdicts"]
    i = interpret(verdict)
    assert i.stages == () and i.root.status == "fail" and i.reading == "REJECTED"
    assert [j.status for j in i.root.judges] == ["pass", "fail"]
    assert not [d for d in i.defects if d.kind == "UNKNOWN_VOCABULARY"]


def test_a_map_of_the_wrong_shape_degrades_into_missing_facts() -> None:
    i = interpret({"something": "else"})
    assert (i.reading, i.reading_support, i.stages, i.root.judges) == (None, "UNDETERMINED", (), ())
    assert ("verdict", "aggregated", "ABSENT") in defects(i) and i.summary


def test_a_cascade_nested_deeper_than_64_is_reported_not_followed() -> None:
    node: dict[str, Any] = {"aggregated": {"status": "pass", "reasoning": "r", "checks": []}}
    for n in range(70):
        node = {"aggregated": {"status": "pass", "reasoning": "r", "checks": []},
                "compositeAttempts": [{"name": f"t{n}", "relation": "meta_member", "disposition": "used", "verdict": node}]}
    i = interpret(node)
    assert len(i.stages) == 64
    assert [d for d in i.defects if d.field == "compositeAttempts" and d.kind == "UNPARSEABLE"]
