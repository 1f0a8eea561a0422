"""interpret reads every record capseal writes, as sealed in a real ledger: the mapping
of each family to readings, items (one per verdict about a subject) and checks."""

from __future__ import annotations

from typing import Any

from capseal.judge import interpret
from capseal.judge.interpret import read, read_source

from .conftest import EXAMPLE_ONE, stored


def by_type(sealed: Any) -> dict[str, list[Any]]:
    out: dict[str, list[Any]] = {}
    for record in read_source(sealed.path).records:
        out.setdefault((record.header or {})["record_type"], []).append(record)
    return out


def items_of(reading: Any) -> list[tuple[str, str | None, str]]:
    return [(i.slug, i.interpretation.reading, i.interpretation.reading_support) for i in reading.items]


def items(record: Any) -> list[tuple[str, str | None, str]]:
    return items_of(record.reading)


def test_the_ledger_reader_reads_every_judgment_record_and_only_those(sealed: Any) -> None:
    kinds = by_type(sealed)
    assert sorted((k, len(v)) for k, v in kinds.items()) == [
        ("capsule", 1), ("judge:adjudication/v1", 1), ("judge:artifact/v1", 1), ("judge:calibration-summary/v1", 1),
        ("judge:evaluation-report/v1", 1), ("judge:evidence-result/v0", 1), ("judge:human-rating/v1", 3),
        ("referee:book-row", 3)]
    assert kinds["judge:artifact/v1"][0].original["artifact_type"] == "jury-verdict"


def test_evaluation_report_reads_per_case_and_across_its_cases(sealed: Any) -> None:
    record = by_type(sealed)["judge:evaluation-report/v1"][0]
    assert items(record) == [("er-A-1009/case A-1009/C1", "ACCEPTED", "SUPPORTED"), ("er-A-1009/case A-1009/C2", "REJECTED", "SUPPORTED")]
    whole = record.reading.interpretation
    assert (whole.reading, whole.reading_support, whole.root.stage, whole.decided_by) == ("REJECTED", "SUPPORTED", "evaluation-report/v1", None)
    seat = whole.stages[0].judges[0]
    assert seat.name == "example-judge-model@2026-09-15" and [c.name for c in seat.checks] == ["acts", "method"]
    assert all(c.passed for c in seat.checks)


def test_adjudication_reads_per_party(sealed: Any) -> None:
    record = by_type(sealed)["judge:adjudication/v1"][0]
    a, b = (p["digest"] for p in sealed.adjudication.body["parties"])
    assert items(record) == [(f"adj-1/party {a}", "ACCEPTED", "SUPPORTED"), (f"adj-1/party {b}", "REJECTED", "SUPPORTED")]
    assert record.reading.interpretation.root.judges[0].name == "example-referee@1"


def test_human_rating_label_maps_only_when_it_is_a_verdict_token(sealed: Any) -> None:
    ratings = by_type(sealed)["judge:human-rating/v1"]
    assert [items(r) for r in ratings] == [[("hr-1/rating", "REJECTED", "SUPPORTED")], [("hr-2/rating", "ACCEPTED", "SUPPORTED")], []]
    free = ratings[2].reading.interpretation
    assert (free.reading, free.root.status, free.defects) == (None, "partly", ())
    assert [(c.name, c.passed) for c in free.root.judges[0].checks] == [("blind", True)]


def test_calibration_gives_no_reading_and_exposes_k_n_and_a_read_time_rate(sealed: Any) -> None:
    record = by_type(sealed)["judge:calibration-summary/v1"][0]
    whole = record.reading.interpretation
    assert whole.reading is None and record.reading.items == ()
    agreement, drift = whole.stages[0].judges
    assert (agreement.name, agreement.score, agreement.checks[0].detail) == ("agreement", 0.5, "1 of 2")
    assert (drift.name, drift.score, drift.checks[0].detail) == ("drift", None, "0 of 0")  # n = 0: absent, never 0


def test_evidence_result_reads_sufficiency_first_then_verdict(sealed: Any) -> None:
    record = by_type(sealed)["judge:evidence-result/v0"][0]
    seq = record.header["seq"]
    assert items(record) == [(f"#{seq}/claim claim-1", "ACCEPTED", "SUPPORTED"), (f"#{seq}/claim claim-2", "NOT_ASSESSED", "SUPPORTED"),
                             (f"#{seq}/excluded_not_applicable", "NOT_APPLICABLE", "SUPPORTED")]
    gap = record.reading.items[1].interpretation.root
    assert (gap.status, gap.reason_code) == ("not_evaluable", "sufficiency_gap")
    assert [(c.name, c.passed, c.detail) for c in gap.judges[0].checks][:2] == [("sufficiency", False, "GAP"), ("tier", True, "judged")]
    met = record.reading.items[0].interpretation.root.judges[0]
    assert met.name == "example-rules" and ("implementation", True) in [(c.name, c.passed) for c in met.checks]


def test_judgment_capsule_reads_its_published_answer(sealed: Any) -> None:
    record = by_type(sealed)["capsule"][0]
    whole = record.reading.interpretation
    assert (whole.reading, whole.reading_support, whole.root.stage) == ("ACCEPTED", "SUPPORTED", "x-judgment-v1")
    assert whole.root.reasoning == "the amount was stated before the refund"
    assert [d.field for d in whole.defects] == ["citation_purpose"]  # judged_from: a pending purpose
    alone = interpret(sealed.judgment_capsule)  # without the ledger, the answer is unpublished
    assert alone.reading is None and alone.reading_support == "UNDETERMINED"


def test_referee_rows_read_by_their_shape(sealed: Any) -> None:
    ruled, spent, off = by_type(sealed)["referee:book-row"]
    assert ruled.reading.interpretation.reading == "REJECTED"
    assert [(s.path, s.status) for s in ruled.reading.interpretation.stages] == [(("node-a",), "corroborated"), (("node-b",), "contradicted")]
    assert items(ruled) == []  # it names its sealed ruling (the adjudication/v1): that is the item, counted once
    unsealed = {k: v for k, v in ruled.original.items() if k != "ruling_id"}
    assert [r for _, r, _ in items_of(read(unsealed))] == ["ACCEPTED", "REJECTED"]
    assert [r for _, r, _ in items(spent)] == ["NOT_ASSESSED"] and spent.reading.interpretation.root.reason_code == "referee_unreachable"
    assert off.reading.items == () and off.reading.interpretation.reading is None  # never tallied


def test_a_bare_row_and_every_not_adjudicated_reason(sealed: Any) -> None:
    for reason in ("off", "host_does_not_mark_twins", "twins_agree", "no_eligible_referee"):
        assert read({"state": "not_adjudicated", "reason": reason}).items == ()
    for reason in ("referee_unreachable", "referee_cannot_sign"):
        assert interpret({"state": "not_adjudicated", "reason": reason}).reading == "NOT_ASSESSED"
    row = interpret({"state": "not_adjudicated", "reason": "not_comparable", "because": "sampled"})
    assert (row.reading, row.root.reasoning, row.source_version) == (None, "because sampled", 0)
    assert interpret({"state": "adjudicated", "referee": "node-c", "tier": 2, "verdict": "not_comparable"}).reading == "NOT_APPLICABLE"


def test_a_book_entry_whose_called_flag_contradicts_its_row_is_contradicted() -> None:
    entry = {"book_version": "capseal-referee-book/1", "pair": {"node_ids": ["a", "b"]}, "called": False,
             "row": {"state": "not_adjudicated", "reason": "referee_unreachable"}}
    assert interpret(entry).reading_support == "CONTRADICTED"


def test_a_stored_jury_verdict_kept_in_the_ledger_reads_back_the_same_way(sealed: Any) -> None:
    record = by_type(sealed)["judge:artifact/v1"][0]
    direct = interpret(stored(EXAMPLE_ONE))
    assert record.reading.interpretation.to_json() == direct.to_json()


def test_sealed_values_and_models_read_through_their_json(sealed: Any) -> None:
    assert interpret(sealed.report).to_json() == interpret(sealed.report.body).to_json()
    assert interpret(sealed.report.to_json()).reading == "REJECTED"
    from capseal.ledger import Ledger

    with Ledger(sealed.path, readonly=True) as ledger:
        entry = ledger.entry(sealed.report.digest)
        assert interpret(entry).to_json() == interpret(sealed.report.body).to_json()


def test_json_text_is_read_one_way_only() -> None:
    """A duplicate member would read as one record to one parser and another to the
    next: such text, NaN and bytes that are not UTF-8 read as UNPARSEABLE, no item."""
    for text in ('{"state": "not_adjudicated", "reason": "off", "reason": "referee_unreachable"}', "NaN", b"\xff", "not json"):
        reading = read(text)
        assert reading.items == () and reading.interpretation.reading is None
        assert [(d.path, d.field, d.kind) for d in reading.interpretation.defects] == [("record", "value", "UNPARSEABLE")]
    assert interpret('{"state": "not_adjudicated", "reason": "referee_unreachable"}').reading == "NOT_ASSESSED"
