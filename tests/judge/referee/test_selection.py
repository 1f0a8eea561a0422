"""S1–S4 and B1–B5: who may referee, in which tier, a uniform pick, the bar."""

from __future__ import annotations

from collections import Counter
from datetime import timedelta

import pytest

from capseal.errors import RefereeInputError
from capseal.judge.referee import Recorded, ScriptedDraw, UniformDraw, barred, corroborated, select
from capseal.judge.referee.bar import parse_time

from .world import MODEL, NOW, OTHER, WEIGHTS, World

T = parse_time("2026-08-30T00:00:00Z")


def rec(node: str, bucket: str, when: str, model: str | None = MODEL) -> Recorded:
    return Recorded(node, model, bucket, parse_time(when))


def pool(world: World, roster: list, history: list | None = None, now: str = NOW, days: int = 30) -> tuple:  # type: ignore[type-arg]
    a, b = world.signer("node-a"), world.signer("node-b")
    s = select(now=parse_time(now), days=days, model_hash=MODEL, weights_digest=WEIGHTS, twin_ids=("node-a", "node-b"),
               twin_kids=(a.kid, b.kid), candidates=roster, history=history or [])
    return s.tier, s.pool


def test_S1_eligibility_each_condition_is_yes_or_no(world: World) -> None:
    ok = world.candidate("node-c")
    assert pool(world, [ok]) == (2, ("node-c",))
    assert pool(world, [world.candidate("node-c", model=OTHER)]) == (None, ())
    assert pool(world, [world.candidate("node-c", weights=OTHER)]) == (None, ())
    assert pool(world, [world.candidate("node-c", key=None)]) == (None, ())  # announced no key: cannot sign
    assert pool(world, [world.candidate("node-c", blocked=True)]) == (None, ())
    assert pool(world, [ok], [rec("node-c", "contradicted", "2026-09-20T00:00:00Z")]) == (None, ())  # barred
    assert pool(world, [world.candidate("node-a")]) == (None, ())  # a twin by node id


def test_S1_a_node_sharing_a_twins_key_under_another_id_is_that_twin(world: World) -> None:
    twin_key = world.signer("node-b").public_key
    assert pool(world, [world.candidate("node-z", key=twin_key)]) == (None, ())
    # through the facade: the only candidate is node-b under another name; nobody is asked
    book = world.book()
    roster = world.roster("node-a", "node-b") + [world.candidate("node-b-alias", key=twin_key)]
    referee = world.referee(book, roster=roster, seats=())
    answer = referee.consider(world.pair())
    assert answer.to_json()["row"] == {"state": "not_adjudicated", "reason": "no_eligible_referee"}
    assert answer.ineligible["node-b-alias"] == "shares_a_twins_key" and answer.ineligible["node-a"] == "is_a_twin"


def test_S2_tier_1_is_eligible_nodes_with_a_corroboration_tier_2_the_rest(world: World) -> None:
    roster = [world.candidate(n) for n in ("node-c", "node-d", "node-e")]
    history = [rec("node-d", "corroborated", "2026-09-01T00:00:00Z"), rec("node-e", "corroborated", "2026-09-01T00:00:00Z", OTHER)]
    assert pool(world, roster, history) == (1, ("node-d",))  # node-e's corroboration is for another model
    assert pool(world, roster) == (2, ("node-c", "node-d", "node-e"))  # none yet: tier 2, sorted


def test_S3_the_pick_is_uniform_within_the_best_tier_from_a_csprng() -> None:
    draw = UniformDraw()
    seen = Counter(draw(3) for _ in range(3000))
    assert set(seen) == {0, 1, 2} and min(seen.values()) > 800  # every index, none starved
    assert draw(1) == 0
    # rejection sampling: a value at or above the largest multiple of n is drawn again
    n = 3
    zone = 2**64 - (2**64 % n)
    values = iter([zone.to_bytes(8, "big"), (2**64 - 1).to_bytes(8, "big"), (7).to_bytes(8, "big")])
    assert UniformDraw(lambda k: next(values))(n) == 7 % n
    with pytest.raises(RefereeInputError):
        draw(0)


def test_S3_an_injected_draw_picks_within_the_pool(world: World) -> None:
    roster = world.roster("node-a", "node-b", "node-c", "node-d")
    for pick, who in ((0, "node-c"), (1, "node-d")):
        book = world.book(f"b{pick}")
        referee = world.referee(book, roster=roster, seats=("node-c", "node-d"),
                                answers={"node-c": "1, 2, 3, 4, 5", "node-d": "1, 2, 3, 4, 5"}, draw=ScriptedDraw([pick]))
        assert referee.consider(world.pair()).row["referee"] == who
    book = world.book("b5")
    referee = world.referee(book, roster=roster, draw=ScriptedDraw([5]))
    with pytest.raises(RefereeInputError):
        referee.consider(world.pair())
    assert book.rows() == []  # a bad draw records nothing


def test_S4_the_tier_is_sealed_and_a_verdict_at_another_tier_is_refused(world: World) -> None:
    from capseal.judge.referee import RefereeSeat

    class Misstated(RefereeSeat):  # a real seat, real key: it seals the tier it was not asked from
        def rule(self, pair, *, tier, reanswer):  # type: ignore[no-untyped-def]
            return super().rule(pair, tier=2 if tier == 1 else 1, reanswer=reanswer)

    book = world.book()
    roster = world.roster()
    seat = Misstated("node-c", world.signer("node-c"), book.ledger, roster=roster, clock=lambda: NOW)
    referee = world.referee(book, seats=(), history=[rec("node-c", "corroborated", "2026-09-01T00:00:00Z")])
    referee._seats = {"node-c": seat}
    answer = referee.consider(world.pair())
    seat.close()
    assert answer.to_json() == {"counts_against": None, "referee_calls": 1,
                                "row": {"state": "not_adjudicated", "reason": "referee_cannot_sign"}}
    assert answer.ruling is not None and "ruling_tier_not_asked" in answer.ruling.codes()
    # the honest seat seals the tier it was asked from
    honest = world.book("honest")
    good = world.referee(honest, history=[rec("node-c", "corroborated", "2026-09-01T00:00:00Z")]).consider(world.pair())
    assert good.row["tier"] == 1 and good.ruling is not None and good.ruling.tier == 1


def test_B1_barred_over_t_to_t_plus_d_half_open_exact_to_the_second() -> None:
    v = [rec("node-c", "contradicted", "2026-08-30T00:00:00Z")]
    assert barred("node-c", MODEL, v, T, 30)  # from t
    assert barred("node-c", MODEL, v, T + timedelta(days=30) - timedelta(seconds=1), 30)  # t+D-1 s
    assert not barred("node-c", MODEL, v, T + timedelta(days=30), 30)  # eligible at t+D
    assert not barred("node-c", MODEL, v, T - timedelta(seconds=1), 30)  # a verdict recorded later bars nothing now
    assert not barred("node-c", OTHER, v, T, 30)  # per model
    assert not barred("node-c", MODEL, [rec("node-c", "contradicted", "2026-08-30T00:00:00Z", None)], T, 30)  # no model: nothing


def test_B1_the_bar_at_t_plus_d_minus_1s_and_at_t_plus_d_through_selection(world: World) -> None:
    history = [rec("node-c", "contradicted", "2026-08-30T00:00:00Z")]
    assert pool(world, [world.candidate("node-c")], history, now="2026-09-28T23:59:59Z") == (None, ())
    assert pool(world, [world.candidate("node-c")], history, now="2026-09-29T00:00:00Z") == (2, ("node-c",))


def test_B2_t_is_this_nodes_recording_time_not_the_referees(world: World) -> None:
    """The bar runs from the book row's ``at`` (this node's clock), not the ruling's own time."""
    book = world.book()
    clock = {"now": "2026-10-01T12:00:00Z"}
    seat_clock = "2020-01-01T00:00:00Z"  # the referee writes an old time
    roster = world.roster()
    referee = world.referee(book, roster=roster, seats=(), clock=lambda: clock["now"])
    referee._seats = {"node-c": world.seat(book, "node-c", roster, clock=lambda: seat_clock)}
    assert referee.consider(world.pair()).row["verdict"] == "contradicted:node-b"
    counted = [c.recorded for c in referee.counted() if c.recorded.bucket == "contradicted"]
    assert [(r.node_id, r.recorded_at) for r in counted] == [("node-b", parse_time("2026-10-01T12:00:00Z"))]
    # node-b is now barred as a referee for MODEL for 30 days from this node's time
    assert barred("node-b", MODEL, counted, parse_time("2026-10-31T11:59:59Z"), 30)
    assert not barred("node-b", MODEL, counted, parse_time("2026-10-31T12:00:00Z"), 30)


def test_B3_D_is_a_positive_integer_defaulting_to_30(world: World) -> None:
    from capseal.judge.referee import Settings

    assert Settings().bar_days == 30 and Settings(True, 7).bar_days == 7
    for bad in (0, -1, 1.5, "10", True):
        with pytest.raises(RefereeInputError):
            Settings(True, bad)  # type: ignore[arg-type]
    history = [rec("node-c", "contradicted", "2026-09-25T00:00:00Z")]
    assert pool(world, [world.candidate("node-c")], history, now="2026-10-01T12:00:00Z", days=7) == (None, ())
    assert pool(world, [world.candidate("node-c")], history, now="2026-10-02T00:00:00Z", days=7) == (2, ("node-c",))


def test_B4_a_corroboration_during_a_bar_does_not_end_it(world: World) -> None:
    history = [rec("node-c", "contradicted", "2026-09-20T00:00:00Z"), rec("node-c", "corroborated", "2026-09-25T00:00:00Z")]
    assert barred("node-c", MODEL, history, parse_time(NOW), 30)
    assert pool(world, [world.candidate("node-c")], history) == (None, ())


def test_B5_after_a_lapse_tier_2_until_a_corroboration_strictly_after_the_latest_lapse(world: World) -> None:
    contradiction = rec("node-c", "contradicted", "2026-07-01T00:00:00Z")  # lapses 2026-07-31T00:00:00Z
    before = rec("node-c", "corroborated", "2026-06-01T00:00:00Z")
    inside = rec("node-c", "corroborated", "2026-07-15T00:00:00Z")
    at_lapse = rec("node-c", "corroborated", "2026-07-31T00:00:00Z")
    after = rec("node-c", "corroborated", "2026-07-31T00:00:01Z")
    assert not corroborated("node-c", MODEL, [contradiction, before, inside, at_lapse], 30)  # strictly after
    assert corroborated("node-c", MODEL, [contradiction, after], 30)
    # the lapse is the LATEST contradiction's t+D
    later = rec("node-c", "contradicted", "2026-08-10T00:00:00Z")
    assert not corroborated("node-c", MODEL, [contradiction, later, after], 30)
    assert corroborated("node-c", MODEL, [before], 30)  # never barred
    assert pool(world, [world.candidate("node-c")], [contradiction, inside]) == (2, ("node-c",))
    assert pool(world, [world.candidate("node-c")], [contradiction, after]) == (1, ("node-c",))


def test_B1_verdict_times_are_recorded_to_the_second(world: World) -> None:
    book = world.book()
    answer = world.referee(book, clock=lambda: "2026-10-01T12:00:00.987654Z").consider(world.pair())
    assert answer.book_row is not None and answer.book_row.at == "2026-10-01T12:00:00Z"
