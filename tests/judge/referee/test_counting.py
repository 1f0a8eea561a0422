"""Counting, locally: verified rulings only, once per referee per pair, a
contradiction of one twin is a corroboration of the other, opt-in stop routing,
never a score."""

from __future__ import annotations

import dataclasses

import pytest

from capseal.errors import RefereeInputError
from capseal.judge.referee import Counted, Recorded, StopRouting, Tally, counted_rulings, tally
from capseal.judge.referee.bar import parse_time

from .world import MODEL, World


def test_a_contradiction_of_one_twin_is_a_corroboration_of_the_other(world: World) -> None:
    book = world.book()
    referee = world.referee(book)
    referee.consider(world.pair())
    counted = counted_rulings(book, referee.roster)
    assert sorted((c.recorded.node_id, c.recorded.bucket, c.referee) for c in counted) == [
        ("node-a", "corroborated", "node-c"), ("node-b", "contradicted", "node-c")]
    assert {c.recorded.model_hash for c in counted} == {MODEL}
    assert tally(c.recorded for c in counted) == [Tally("node-a", MODEL, 1, 0), Tally("node-b", MODEL, 0, 1)]
    assert not any(hasattr(t, name) for t in tally(c.recorded for c in counted) for name in ("rate", "score"))


def test_a_ruling_counts_only_under_the_referees_announced_key_and_once_per_referee_per_pair(world: World) -> None:
    book = world.book()
    referee = world.referee(book)
    answer = referee.consider(world.pair())
    row = answer.book_row
    assert row is not None
    # the same ruling named again by a second row of the pair: counted once
    book.write(answer.pair, row.row, called=True, at="2026-10-02T00:00:00Z", ruling_id=row.ruling_id, statement_id=row.statement_id)
    assert len(counted_rulings(book, referee.roster)) == 2
    # a roster in which node-c announced another key: its ruling does not verify, nothing counts
    moved = [c if c.node_id != "node-c" else dataclasses.replace(c, announced_key=world.signer("node-x").public_key)
             for c in referee.roster]
    assert counted_rulings(book, moved) == []
    assert counted_rulings(book, [c for c in referee.roster if c.node_id != "node-c"]) == []  # no key at all
    # rows without a ruling never count
    other = world.referee(world.book("u"), answers={"node-c": None})
    other.consider(world.pair())
    assert counted_rulings(other.book, other.roster) == []


def _contradicted(node: str, referee: str | None, when: str) -> Counted:
    return Counted(Recorded(node, MODEL, "contradicted", parse_time(when)), referee)


def test_stop_routing_is_opt_in_n_in_d_days_at_most_n_minus_1_per_referee(world: World) -> None:
    rule = StopRouting(3, 30)
    now = parse_time("2026-10-01T00:00:00Z")
    one_referee = [_contradicted("node-c", "r1", "2026-09-20T00:00:00Z") for _ in range(5)]
    assert not rule.applies("node-c", one_referee, now)  # one referee alone never stops routing
    two = one_referee[:2] + [_contradicted("node-c", "r2", "2026-09-25T00:00:00Z")]
    assert rule.applies("node-c", two, now)
    old = [_contradicted("node-c", r, "2026-08-01T00:00:00Z") for r in ("r1", "r2", "r3")]
    assert not rule.applies("node-c", old, now)  # outside the D days
    assert not rule.applies("node-c", two, now, model_hash="9" * 64)
    for n, days in ((1, 30), (0, 30), (3, 0), (3, 1.5), ("3", 30)):
        with pytest.raises(RefereeInputError):
            StopRouting(n, days)  # type: ignore[arg-type]
    # through the facade: node-c is contradicted as a twin by two referees (node-d, node-e); with
    # stop routing on, it is not asked (blocked), where without it it is only barred
    book = world.book()
    roster = world.roster("node-a", "node-b", "node-c", "node-d", "node-e")
    answers = {n: "1, 2, 3, 4, 5" for n in ("node-c", "node-d", "node-e")}
    from capseal.judge.referee import ScriptedDraw

    # pools are sorted: node-d from [node-b, node-d, node-e], then node-e from [node-d, node-e] (node-a, now
    # corroborated and tier 1 alone, is left out of the second roster)
    for twins, pick, nodes in ((("node-a", "node-c"), 1, roster), (("node-b", "node-c"), 1, roster[1:])):
        first = world.referee(book, roster=nodes, answers=answers, seats=("node-d", "node-e"), draw=ScriptedDraw([pick]))
        ruled = first.consider(world.pair(nodes=twins))
        assert ruled.counts_against == "node-c", ruled.row
    # node-d and node-e stay known (their rulings verify under their keys) but are blocked as referees
    only_c = [c if c.node_id in ("node-a", "node-b", "node-c") else dataclasses.replace(c, blocked=True) for c in roster]
    stopped = world.referee(book, roster=only_c, answers=answers, stop_routing=StopRouting(2, 30)).consider(world.pair())
    assert stopped.row == {"state": "not_adjudicated", "reason": "no_eligible_referee"} and stopped.ineligible["node-c"] == "blocked"
    barred = world.referee(book, roster=only_c, answers=answers).consider(world.pair(bracket="bracket-2"))
    assert barred.ineligible["node-c"].startswith("barred until") and barred.referee_calls == 0
