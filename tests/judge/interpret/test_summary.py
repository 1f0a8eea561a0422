"""The summary: deterministic, from the fields alone, and in agreement with them both
ways — every name, status, reason code, reading and support value it mentions is in
the fields, and every one in the fields is mentioned."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

from capseal.judge import interpret, summarise
from capseal.judge.interpret import read
from capseal.judge.interpret.summary import RESERVED_WORDS, shown, shown_reasoning

from .conftest import ALL_STORED, EXAMPLE_ONE, EXAMPLE_TWO, stored
from .oracle import disagreements

# The pinned 0.17 wording of agent-judge's SummaryGoldens (fixed output phrases, quoted for byte compatibility).
EXAMPLE_ONE_SUMMARY = (
    "1 stage(s) ran: 'structure' (cascade_tier, REJECT_ON_ANY_FAIL, used). 'structure' abstained (No consensus: 1 passed, "
    "1 failed among 2 applicable judge(s)); its judges: 'structure:ddd-review.md' passed (report present); 'reportStructure' "
    "failed (report has no bounded contexts). Evidence: consensus, errors propagate, exclusions refuse, 2 in, 2 eligible, "
    "1 pass, 1 fail, 0 error(s), 0 not applicable, 0 explicit abstention(s). The root abstained (No consensus: 1 passed, "
    "1 failed among 2 applicable judge(s)); its judges: 'structure:ddd-review.md' passed (report present); 'reportStructure' "
    "failed (report has no bounded contexts). Evidence: consensus, errors propagate, exclusions refuse, 2 in, 2 eligible, "
    "1 pass, 1 fail, 0 error(s), 0 not applicable, 0 explicit abstention(s). The root adopted the outcome of 'structure' "
    "(tier_outcome). Reading: UNDECIDED \u2014 the subject was judged and the jury could not decide; not an instrument failure. "
    "Support: SUPPORTED \u2014 the recorded facts agree with the reading. Source: the seven-component form 0.17 writes "
    "(sourceVersion 1). Defects: none.")
EXAMPLE_TWO_SUMMARY = (
    "1 stage(s) ran: an unnamed stage. An unnamed stage failed (No consensus: 1 passed, 1 failed (consensus required)); its "
    "judges: 'structure:ddd-action-brief.md' passed (File exists at ddd-action-brief.md); 'structure:ddd-review.md' failed "
    "(File not found at ddd-review.md). The root failed (No consensus: 1 passed, 1 failed (consensus required)); its judges: "
    "'structure:ddd-action-brief.md' passed (File exists at ddd-action-brief.md); 'structure:ddd-review.md' failed (File not "
    "found at ddd-review.md). Which stage decided is not recorded and has not been inferred. Reading: REJECTED \u2014 the "
    "subject was judged and rejected. Support: UNDETERMINED \u2014 the facts needed to check the reading are absent or their "
    "rule is not closed-form. Source: an unstamped record written before 0.17 (sourceVersion 0). 10 defect(s): "
    "verdict.aggregated.score UNPARSEABLE; verdict.seats ABSENT; verdict.individualByName[structure:ddd-action-brief.md].score "
    "UNPARSEABLE; verdict.individualByName[structure:ddd-review.md].score UNPARSEABLE; verdict.subVerdicts[0].name ABSENT; "
    "verdict.subVerdicts[0].aggregated.score UNPARSEABLE; "
    "verdict.subVerdicts[0].individualByName[structure:ddd-action-brief.md].score UNPARSEABLE; "
    "verdict.subVerdicts[0].individualByName[structure:ddd-review.md].score UNPARSEABLE; verdict.decision ABSENT; "
    "verdict.aggregated.metadata.aggregation ABSENT.")


def test_example_one_summary_is_the_pinned_text() -> None:
    assert interpret(stored(EXAMPLE_ONE)).summary == EXAMPLE_ONE_SUMMARY


def test_example_two_summary_is_the_pinned_text() -> None:
    assert interpret(stored(EXAMPLE_TWO)).summary == EXAMPLE_TWO_SUMMARY


def every_interpretation(sealed: Any) -> list[Any]:
    from capseal.judge.interpret import read_source

    out = [interpret(stored(name)) for name in ALL_STORED] + [interpret({"x": 1}), interpret(None)]
    for record in read_source(sealed.path).records:
        out.append(record.reading.interpretation)
        out.extend(item.interpretation for item in record.reading.items)
    return out


def test_summary_mentions_only_what_the_fields_hold_and_all_of_it(sealed: Any) -> None:
    """Both directions at once: the oracle compares the two sets for each kind of token."""
    checked = every_interpretation(sealed)
    assert len(checked) > 30
    for i in checked:
        assert disagreements(i) == [], i.summary


def test_summary_is_deterministic_and_from_the_fields_alone(sealed: Any) -> None:
    for i in every_interpretation(sealed):
        assert summarise(i) == i.summary
        assert summarise(dataclasses.replace(i, summary="anything")) == i.summary


def test_the_oracle_catches_a_summary_that_mentions_too_much_or_too_little() -> None:
    i = interpret(stored(EXAMPLE_ONE))
    assert disagreements(dataclasses.replace(i, summary=i.summary + " 'ghost' errored [judge_failed]. ACCEPTED"))
    assert disagreements(dataclasses.replace(i, summary=i.summary.replace("'reportStructure'", "the other")))
    assert disagreements(dataclasses.replace(i, summary=i.summary.replace("abstained", "stopped")))
    assert disagreements(dataclasses.replace(i, summary=i.summary.replace("UNDECIDED", "?")))


@pytest.mark.parametrize("name", ["it's", "passed", "a [judge_failed] b", "x (y)", "ACCEPTED", "\ud800", "tab\tname", "was met", "\x00"])
def test_a_name_that_could_pass_for_a_mark_is_escaped_and_still_agrees(name: str) -> None:
    verdict = stored(EXAMPLE_ONE)
    seat = verdict["seats"][1]
    verdict["individualByName"][name] = verdict["individualByName"].pop(seat["verdictKey"])
    seat["verdictKey"] = name
    verdict["compositeAttempts"][0]["name"] = name
    verdict["decision"]["tier"] = name
    i = interpret(verdict)
    assert disagreements(i) == [], i.summary
    assert json.loads(shown(name)) == name and shown(name).isascii()
    i.summary.encode("utf-8")  # printable: no unpaired surrogate reaches the text


@pytest.mark.parametrize("reasoning", ["it's (x", "a) b (c", "\ud800", "line\nbreak", "plain (balanced) text"])
def test_reasoning_is_quoted_verbatim_unless_it_could_break_the_quoting(reasoning: str) -> None:
    verdict = stored(EXAMPLE_ONE)
    verdict["individualByName"]["reportStructure"]["reasoning"] = reasoning
    verdict["individual"][1]["reasoning"] = reasoning
    i = interpret(verdict)
    assert disagreements(i) == [], i.summary
    assert f" ({shown_reasoning(reasoning)})" in i.summary
    assert (shown_reasoning(reasoning) == reasoning) == (reasoning == "plain (balanced) text")


def test_shown_leaves_plain_values_and_escapes_reserved_ones() -> None:
    for plain in ("structure:ddd-review.md", "REJECT_ON_ANY_FAIL", "consensus", "", "two words"):
        assert shown(plain) == plain
    for word in RESERVED_WORDS:
        escaped = shown(f"x {word}")
        assert json.loads(escaped) == f"x {word}" and word not in escaped


def test_capseal_record_summaries_name_their_form_and_parts(sealed: Any) -> None:
    from capseal.judge.interpret import read_source

    text = {(r.header or {})["record_type"]: r.reading.interpretation.summary for r in read_source(sealed.path).records}
    report = text["judge:evaluation-report/v1"]
    assert "'A-1009/C1' was met" in report and "'A-1009/C2' was not met" in report and "'evaluation-report/v1'" in report
    assert "a rejected part outranks the rest" in report
    result = read(sealed.result).items[1].interpretation.summary
    assert "was not evaluable [sufficiency_gap]" in result and "NOT_ASSESSED" in result


def test_a_status_less_node_still_names_its_reason_code() -> None:
    """The agreement contract needs every recorded code mentioned, so "records no
    readable status" is followed by the code when one is recorded (no reasoning is quoted)."""
    i = interpret({"aggregated": {"reasonCode": "stage_failed", "reasoning": "r", "checks": []}, "individualByName": {}})
    assert "The root records no readable status [stage_failed] with no seated judge." in i.summary
    assert disagreements(i) == []
