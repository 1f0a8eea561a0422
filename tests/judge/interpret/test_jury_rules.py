"""The stored-verdict reader rule by rule: the decision walk, the support checks, scores,
the evidence block and seats; where a rule is the reader's own choice (inferred), the
test names the choice."""

from __future__ import annotations

import math
from typing import Any

import pytest

from capseal.judge import interpret
from capseal.judge.interpret import DecidedBy, ScoreScale

from .conftest import A068E50A, BOUNDARY, COMPOSITE, EXAMPLE_ONE, stored


def found(i: Any, kind: str) -> list[tuple[str, str]]:
    return [(d.path, d.field) for d in i.defects if d.kind == kind]


# ----------------------------------------------------------------- support checks


def test_legacy_consensus_semantics_on_an_evidence_block_contradict() -> None:
    verdict = stored(EXAMPLE_ONE)
    verdict["aggregated"]["status"] = "fail"
    verdict["compositeAttempts"][0]["verdict"]["aggregated"]["status"] = "fail"
    i = interpret(verdict)
    assert i.reading == "REJECTED" and i.reading_support == "CONTRADICTED"
    assert ("verdict.aggregated", "status") in found(i, "INCONSISTENT")


def test_a_rejection_claimed_through_a_tier_whose_policy_cannot_reject_is_inconsistent() -> None:
    verdict = stored(BOUNDARY)
    verdict["compositeAttempts"][0]["policy"] = "FINAL_TIER"
    i = interpret(verdict)
    assert i.reading == "REJECTED" and i.decided_by == DecidedBy("rubric", ("rubric",), "individual_rejection")
    inconsistent = [d for d in i.defects if d.kind == "INCONSISTENT"]
    assert len(inconsistent) == 1 and inconsistent[0].path == "verdict.decision"
    assert "REJECT_ON_ANY_FAIL" in inconsistent[0].note and "FINAL_TIER" in inconsistent[0].note


def test_a_decision_naming_a_tier_the_record_does_not_hold_is_inconsistent() -> None:
    verdict = stored(BOUNDARY)
    verdict["decision"]["tier"] = "ghost"
    i = interpret(verdict)
    assert i.decided_by == DecidedBy("ghost", ("ghost",), "individual_rejection")  # what the record says
    assert i.reading_support == "CONTRADICTED" and ("verdict.decision", "tier") in found(i, "INCONSISTENT")


def test_a_tier_outcome_root_whose_aggregate_differs_from_its_tier_is_inconsistent() -> None:
    verdict = stored(EXAMPLE_ONE)
    verdict["aggregated"]["reasoning"] = "something the tier never said"
    i = interpret(verdict)
    assert i.reading_support == "CONTRADICTED" and ("verdict.decision", "basis") in found(i, "INCONSISTENT")


def test_deep_equality_is_type_strict_inferred_an_integer_is_not_a_float() -> None:
    verdict = stored(EXAMPLE_ONE)
    verdict["aggregated"]["metadata"]["aggregation"]["passCount"] = 1.0  # 1 in the tier, 1.0 at the root
    i = interpret(verdict)
    assert ("verdict.decision", "basis") in found(i, "INCONSISTENT")
    same_order = stored(EXAMPLE_ONE)
    agg = same_order["aggregated"]
    same_order["aggregated"] = dict(reversed(list(agg.items())))  # key order never matters
    assert not found(interpret(same_order), "INCONSISTENT")


def test_an_undecided_root_without_a_machinery_error_is_inconsistent() -> None:
    verdict = stored(COMPOSITE)
    verdict["aggregated"]["status"] = "pass"
    del verdict["aggregated"]["reasonCode"]
    i = interpret(verdict)
    assert i.reading == "ACCEPTED" and i.reading_support == "CONTRADICTED"
    assert ("verdict.decision", "kind") in found(i, "INCONSISTENT")
    wrapper = stored(COMPOSITE)
    wrapper["aggregated"]["reasonCode"] = "errors_propagated"
    assert ("verdict.decision", "kind") in found(interpret(wrapper), "INCONSISTENT")


def test_an_adopted_outcome_is_decided_by_the_last_edge() -> None:
    leaf = stored(EXAMPLE_ONE)["compositeAttempts"][0]["verdict"]
    middle = {**leaf, "decision": {"kind": "tier", "tier": "leaf", "basis": "tier_outcome"},
              "compositeAttempts": [{"name": "leaf", "relation": "cascade_tier", "policy": "REJECT_ON_ANY_FAIL",
                                     "disposition": "used", "verdict": leaf}]}
    root = {**leaf, "decision": {"kind": "tier", "tier": "outer-tier", "basis": "tier_outcome"},
            "compositeAttempts": [{"name": "outer-tier", "relation": "cascade_tier", "policy": "REJECT_ON_ANY_FAIL",
                                   "disposition": "used", "verdict": middle}]}
    i = interpret(root)
    assert i.decided_by == DecidedBy("leaf", ("outer-tier", "leaf"), "tier_outcome")
    assert i.reading_support == "SUPPORTED" and [s.path for s in i.stages] == [("outer-tier",), ("outer-tier", "leaf")]


def test_decided_by_is_never_inferred_from_a_root_equal_to_its_last_stage() -> None:
    verdict = stored(A068E50A)  # the root equals the failed last tier, and no decision is recorded
    assert interpret(verdict).decided_by is None


def test_a_decision_chain_that_does_not_end_is_unparseable() -> None:
    node: dict[str, Any] = {"aggregated": {"status": "pass", "reasoning": "r", "checks": []}, "decision": {"kind": "own"}}
    for n in range(70):
        node = {"aggregated": node["aggregated"], "decision": {"kind": "tier", "tier": f"t{n}", "basis": "tier_outcome"},
                "compositeAttempts": [{"name": f"t{n}", "relation": "cascade_tier", "policy": "FINAL_TIER", "disposition": "used",
                                       "verdict": node}]}
    i = interpret(node)
    assert i.decided_by is None and i.reading_support == "UNDETERMINED"
    assert [d for d in i.defects if d.field == "decision" and d.kind == "UNPARSEABLE"]


@pytest.mark.parametrize("strategy, counts, status, ok", [
    ("majority", {"passCount": 1, "failCount": 1}, "abstain", True),       # a tie takes pass, fail or abstain
    ("majority", {"passCount": 1, "failCount": 1}, "error", False),
    ("majority", {"passCount": 2, "failCount": 1}, "pass", True),
    ("allMustPass", {"failCount": 0}, "pass", True),
    ("allMustPass", {"failCount": 1}, "pass", False),
    ("average", {"threshold": 0.5}, "pass", True),                         # the root score 0.75 >= 0.5
    ("average", {"threshold": 0.9}, "pass", False),
])
def test_closed_form_rules_by_strategy(strategy: str, counts: dict[str, Any], status: str, ok: bool) -> None:
    block = {"strategy": strategy, "errorPolicy": "ignore", "inputCount": 3, "eligibleCount": 3, **counts}
    verdict = {"aggregated": {"status": status, "reasoning": "r", "checks": [], "score": 0.75, "metadata": {"aggregation": block}},
               "individualByName": {}, "seats": [], "decision": {"kind": "own"}}
    i = interpret(verdict)
    assert (i.reading_support != "CONTRADICTED") == ok, i.defects


def test_closed_form_missing_member_is_absent_and_undetermined() -> None:
    block = {"strategy": "consensus", "errorPolicy": "ignore", "inputCount": 2, "eligibleCount": 2, "failCount": 1}
    verdict = {"aggregated": {"status": "fail", "reasoning": "r", "checks": [], "metadata": {"aggregation": block}},
               "individualByName": {}, "seats": [], "decision": {"kind": "own"}}
    i = interpret(verdict)
    assert i.reading_support == "UNDETERMINED" and ("verdict.aggregated", "metadata.aggregation.passCount") in found(i, "ABSENT")


def test_an_error_without_a_recorded_code_is_not_a_contradiction() -> None:
    block: dict[str, Any] = {"strategy": "consensus", "errorPolicy": "propagate", "inputCount": 2, "eligibleCount": 0, "errorCount": 1}
    verdict: dict[str, Any] = {"aggregated": {"status": "error", "reasoning": "r", "checks": [], "metadata": {"aggregation": block}},
                               "individualByName": {}, "seats": [], "decision": {"kind": "own"}}
    i = interpret(verdict)
    assert i.reading_support == "SUPPORTED"
    verdict["aggregated"]["reasonCode"] = "aggregation_failed"
    assert ("verdict.aggregated", "reasonCode") in found(interpret(verdict), "INCONSISTENT")


# ----------------------------------------------------------------- scores


def score_of(raw: Any) -> tuple[Any, Any, bool]:
    verdict = {"aggregated": {"status": "pass", "reasoning": "r", "checks": []},
               "individualByName": {"j": {"status": "pass", "reasoning": "r", "checks": [], "score": raw}}}
    i = interpret(verdict)
    seat = i.root.judges[0]
    return seat.score, seat.score_scale, ("verdict.individualByName[j]", "score") in found(i, "UNPARSEABLE")


@pytest.mark.parametrize("raw, score, scale, unparseable", [
    (None, None, None, False),                                   # inferred: null is absent
    (0.75, 0.75, None, False),
    (1, 1.0, None, False),
    (1.5, None, None, True),
    (float("nan"), None, None, True),
    (True, None, None, True),
    ("0.5", None, None, True),
    ({"value": True}, None, None, True),
    ({"value": 7.5, "min": 0, "max": 10}, 0.75, ScoreScale(0.0, 10.0), False),
    ({"value": 0.75, "min": 0.0, "max": 1.0}, 0.75, ScoreScale(0.0, 1.0), False),
    ({"value": 0.7777777777777778, "min": 0.0, "max": 1.0}, 0.7777777777777778, ScoreScale(0.0, 1.0), False),
    ({"value": 3.0, "min": 5, "max": 5}, None, None, True),
    ({"value": "good", "allowedValues": ["good"]}, None, None, True),
    ({"value": 12, "min": 0, "max": 10}, None, ScoreScale(0.0, 10.0), True),        # read: the scale stays
    ({"value": 1e308, "min": -1e308, "max": 1e308}, None, ScoreScale(-1e308, 1e308), True),  # inferred: plain formula
    ({"value": 10**400, "min": 0, "max": 1}, None, ScoreScale(0.0, 1.0), True),
])
def test_score_rule(raw: Any, score: Any, scale: Any, unparseable: bool) -> None:
    got = score_of(raw)
    assert got[1] == scale and got[2] == unparseable
    assert got[0] == score or (score is None and got[0] is None) or (isinstance(score, float) and math.isclose(got[0], score))


# ----------------------------------------------------------------- evidence block and seats


def test_evidence_block_binds_leniently_and_writes_every_member() -> None:
    i = interpret(stored(A068E50A))
    evidence = i.root.evidence.to_json()  # type: ignore[union-attr]
    assert len(evidence) == 19 and evidence["notApplicableCount"] is None and evidence["errorCodeCounts"] is None


@pytest.mark.parametrize("member, value, kind", [
    ("inputCount", 2.0, None), ("inputCount", 2.5, "UNPARSEABLE"), ("inputCount", True, "UNPARSEABLE"),
    ("inputCount", 2**31, "UNPARSEABLE"), ("errorPolicy", "treat_as_fail", "UNKNOWN_VOCABULARY"),
    ("strategy", "oracle", None), ("threshold", float("inf"), "UNPARSEABLE"), ("errorCodeCounts", [], "UNPARSEABLE"),
])
def test_evidence_members_of_the_wrong_type(member: str, value: Any, kind: str | None) -> None:
    verdict = stored(A068E50A)
    verdict["aggregated"]["metadata"]["aggregation"][member] = value
    i = interpret(verdict)
    hit = [d.kind for d in i.defects if d.field == f"metadata.aggregation.{member}"]
    assert hit == ([kind] if kind else [])


@pytest.mark.parametrize("value, kept", [(2, 2), (2.9, 2), ("x", None), (2**31, None), (float("inf"), None)])
def test_error_code_counts_are_truncated_and_bounded_inferred(value: Any, kept: int | None) -> None:
    verdict = stored(A068E50A)
    verdict["aggregated"]["metadata"]["aggregation"]["errorCodeCounts"] = {"judge_failed": value}
    counts = interpret(verdict).root.evidence.get("errorCodeCounts")  # type: ignore[union-attr]
    assert counts == ((("judge_failed", kept),) if kept is not None else ())


@pytest.mark.parametrize("position, kept", [(1, 1), (1.9, 1), (True, 0), ("1", 0), (2**40, 0)])
def test_seat_position_is_truncated_else_its_index_inferred_for_huge_and_boolean(position: Any, kept: int) -> None:
    verdict = stored(EXAMPLE_ONE)
    verdict["seats"][0]["position"] = position
    i = interpret(verdict)
    assert i.root.judges[0].position == kept
    assert (("verdict.seats[0]", "position") in found(i, "UNPARSEABLE")) == (kept == 0)


def test_a_seat_without_its_judgment_is_absent() -> None:
    verdict = stored(EXAMPLE_ONE)
    del verdict["individual"]
    del verdict["individualByName"]["reportStructure"]
    i = interpret(verdict)
    assert ("verdict.individualByName[reportStructure]", "judgment") in found(i, "ABSENT")
    assert i.root.judges[1].status is None and i.root.judges[1].reasoning == ""


def test_check_entries_are_read_or_dropped() -> None:
    verdict = {"aggregated": {"status": "pass", "reasoning": "r", "checks": []}, "individualByName": {"j": {
        "status": "pass", "reasoning": "r",
        "checks": [{"name": "ok", "passed": True, "message": "fine"}, {"name": " ", "passed": True}, {"name": "no-msg", "passed": False},
                   "junk", {"name": "bad-msg", "passed": True, "message": 5}]}}}
    i = interpret(verdict)
    assert [(c.name, c.passed, c.detail) for c in i.root.judges[0].checks] == [("ok", True, "fine"), ("no-msg", False, ""), ("bad-msg", True, "")]
    p = "verdict.individualByName[j]"
    assert [(p, "checks[1]"), (p, "checks[3]")] == [x for x in found(i, "UNPARSEABLE") if x[1].startswith("checks[")]
    assert (f"{p}.checks[2]", "message") in found(i, "ABSENT") and (f"{p}.checks[4]", "message") in found(i, "UNPARSEABLE")


def test_threshold_is_printed_with_the_host_float_format_inferred() -> None:
    block = {"strategy": "average", "errorPolicy": "ignore", "threshold": 1e-05, "inputCount": 1, "eligibleCount": 1}
    verdict = {"aggregated": {"status": "pass", "reasoning": "r", "checks": [], "score": 0.5, "metadata": {"aggregation": block}},
               "individualByName": {}, "seats": [], "decision": {"kind": "own"}}
    assert "Evidence: average, errors ignore, threshold 1e-05, 1 in, 1 eligible." in interpret(verdict).summary


@pytest.mark.parametrize("decision, block_absent", [
    ({}, True),                                   # no kind read: the root reduced itself as far as is known
    ({"kind": 5}, True),
    ({"kind": "tier", "tier": 5}, False),         # inferred: a tier decision, however broken, is no own reduction
    ({"kind": "sideways"}, False),
])
def test_stopping_kind_of_a_broken_decision_inferred(decision: dict[str, Any], block_absent: bool) -> None:
    verdict = {"aggregated": {"status": "pass", "reasoning": "r", "checks": []}, "individualByName": {}, "seats": [],
               "decision": decision}
    i = interpret(verdict)
    assert i.reading_support == "UNDETERMINED"
    assert (("verdict.aggregated", "metadata.aggregation") in found(i, "ABSENT")) == block_absent
