"""The consumer-side tally: the consumer example's policy, and never a figure capseal reports itself."""

from __future__ import annotations

from fractions import Fraction
from typing import Any

from capseal.judge import pass_rate, tally
from capseal.judge.interpret import Tally, read, read_source


def item(reading: str | None, support: str = "SUPPORTED") -> dict[str, Any]:
    return {"itemSlug": "x", "interpretation": {"reading": reading, "readingSupport": support}}


def test_an_empty_denominator_gives_an_absent_rate_never_zero() -> None:
    t = tally([item("NOT_APPLICABLE"), item("NOT_ASSESSED")])
    assert (t.excluded, t.instrument_failures, t.passes, t.non_passes) == (1, 1, 0, 0)
    assert pass_rate(t) is None and t.pass_rate is None and pass_rate(tally([])) is None
    assert pass_rate(tally([item("REJECTED")])) == 0  # a real zero: one item judged and not passed


def test_an_item_with_no_verdict_never_enters_the_tally() -> None:
    t = tally([{"itemSlug": "never-judged", "interpretation": None}, item("ACCEPTED"), None])
    assert (t.not_judged, t.passes, t.non_passes) == (2, 1, 0) and t.pass_rate == 1


def test_not_assessed_is_an_instrument_failure_not_a_non_pass() -> None:
    t = tally([item("NOT_ASSESSED"), item("ACCEPTED"), item("UNDECIDED")])
    assert (t.instrument_failures, t.non_passes, t.pass_rate) == (1, 1, Fraction(1, 2))


def test_not_applicable_is_excluded_and_counted_apart() -> None:
    t = tally([item("NOT_APPLICABLE"), item("ACCEPTED")])
    assert (t.excluded, t.pass_rate) == (1, 1)


def test_contradicted_is_reported_never_counted() -> None:
    t = tally([item("ACCEPTED", "CONTRADICTED"), item("REJECTED")])
    assert (t.unattestable, t.passes, t.non_passes, t.pass_rate) == (1, 0, 1, 0)


def test_undetermined_is_reported_and_counted_by_its_reading_unless_asked_not_to() -> None:
    items = [item("ACCEPTED", "UNDETERMINED"), item("REJECTED")]
    assert tally(items).to_json() == {**Tally().to_json(), "passes": 1, "nonPasses": 1, "unverified": 1}
    assert tally(items, count_unverified=False).to_json() == {**Tally().to_json(), "nonPasses": 1, "unverified": 1}


def test_a_reading_that_cannot_be_read_is_counted_apart() -> None:
    t = tally([item(None, "UNDETERMINED"), item("SOMETHING"), 42])
    assert (t.unread, t.unverified, t.not_judged) == (2, 1, 1)


def test_tally_takes_interpretations_items_and_serialised_items(sealed: Any) -> None:
    records = read_source(sealed.path).records
    items = [i for r in records for i in r.reading.items]
    by_object = tally(items)
    assert by_object == tally([i.interpretation for i in items]) == tally([i.to_json() for i in items])
    assert (by_object.passes, by_object.non_passes, by_object.instrument_failures, by_object.excluded) == (5, 4, 2, 1)
    assert by_object.pass_rate == Fraction(5, 9)
    assert tally(read({"state": "not_adjudicated", "reason": "off"}).items) == Tally()  # a row with no ruling adds nothing
