"""G1–G7: whether a referee is asked at all. Every gate: a not_adjudicated row with
its reason, 0 calls, counted against nobody, and the book says so."""

from __future__ import annotations

import pytest

from capseal.errors import RefereeInputError
from capseal.judge.referee import HostView, Settings, before_asking
from capseal.judge.referee.gates import ENV_BAR_DAYS, ENV_SWITCH

from .world import MODEL, REANSWER, WEIGHTS, World


def _no_call(world: World, pair, row: dict, **kw) -> None:  # type: ignore[no-untyped-def]
    book = world.book()
    referee = world.referee(book, **kw)
    answer = referee.consider(pair)
    assert answer.to_json() == {"counts_against": None, "referee_calls": 0, "row": row}
    assert referee.transport.calls == []  # type: ignore[union-attr]
    stored = book.latest(pair.key)
    assert stored is not None and stored.row == row and stored.called is False


def host(node: str, model: str | None = MODEL, weights: str | None = WEIGHTS, temperature: object = 0) -> HostView:
    return HostView(node, model, weights, temperature)


def test_G1_the_switch_is_off_by_default_and_only_true_turns_it_on(world: World) -> None:
    pair = world.pair()
    _no_call(world, pair, {"state": "not_adjudicated", "reason": "off"}, on=None)  # unset: off
    _no_call(world, pair, {"state": "not_adjudicated", "reason": "off"}, on=False)
    assert not Settings().on and Settings(True).on
    for raw in ("on", " TRUE ", "1", "yes", "Yes"):
        assert Settings.from_env({ENV_SWITCH: raw}).on, raw
    for raw in ("", "0", "off", "no", "enabled", "2", "truthy"):
        assert not Settings.from_env({ENV_SWITCH: raw}).on, raw
    assert not Settings.from_env({}).on
    with pytest.raises(RefereeInputError):
        Settings("on")  # type: ignore[arg-type]  # a string is not the switch
    assert Settings.from_env({ENV_BAR_DAYS: " 10 "}).bar_days == 10
    for raw in ("0", "-3", "ten", "", "+5", "1.5", "٣"):
        with pytest.raises(RefereeInputError):
            Settings.from_env({ENV_BAR_DAYS: raw})


def test_G2_no_bracket_id_is_host_does_not_mark_twins(world: World) -> None:
    for bracket in (None, ""):
        _no_call(world, world.pair(bracket=bracket), {"state": "not_adjudicated", "reason": "host_does_not_mark_twins"})


def test_G3_a_sampled_twin_is_not_comparable_because_sampled(world: World) -> None:
    pair = world.pair(b_kw={"host": host("node-b", temperature=0.7)})
    _no_call(world, pair, {"state": "not_adjudicated", "reason": "not_comparable", "because": "sampled"})
    # the request path counts only a number above 0: a string, a boolean, a negative number say nothing
    for t in ("0.7", True, -1, 0, None):
        assert before_asking(Settings(True), world.pair(a_kw={"host": host("node-a", temperature=t)})) is None, t


def test_G4_a_missing_model_hash_then_differing_hashes(world: World) -> None:
    unknown = world.pair(a_kw={"host": host("node-a", model="")})
    _no_call(world, unknown, {"state": "not_adjudicated", "reason": "not_comparable", "because": "model_hash_unknown"})
    differ = world.pair(b_kw={"host": host("node-b", model="1" * 64)})
    _no_call(world, differ, {"state": "not_adjudicated", "reason": "not_comparable", "because": "model_hash_differs"})
    # model_hash_unknown is checked before the weights
    both = world.pair(a_kw={"host": host("node-a", model=None, weights=None)})
    assert before_asking(Settings(True), both) == {"state": "not_adjudicated", "reason": "not_comparable", "because": "model_hash_unknown"}


def test_G5_weights_unknown_then_weights_differ(world: World) -> None:
    unknown = world.pair(b_kw={"host": host("node-b", weights=None)})
    _no_call(world, unknown, {"state": "not_adjudicated", "reason": "not_comparable", "because": "weights_unknown"})
    differ = world.pair(b_kw={"host": host("node-b", weights="2" * 64)})
    _no_call(world, differ, {"state": "not_adjudicated", "reason": "not_comparable", "because": "weights_differ"})


def test_G6_same_words_is_twins_agree(world: World) -> None:
    _no_call(world, world.pair("1, 2, 3", "1,  2,\t3"), {"state": "not_adjudicated", "reason": "twins_agree"})


def test_G7_otherwise_a_referee_is_selected_and_called_once(world: World) -> None:
    pair = world.pair()
    assert before_asking(Settings(True), pair) is None
    book = world.book()
    referee = world.referee(book)
    answer = referee.consider(pair)
    assert answer.referee_calls == 1 and answer.row["state"] == "adjudicated"
    assert referee.transport.calls == ["node-c"]  # type: ignore[union-attr]
    assert REANSWER  # the replayed re-answer is A's words


def test_gates_run_in_order_off_first(world: World) -> None:
    """Everything wrong at once: the switch answers first, then the bracket."""
    pair = world.pair("a", "a", bracket=None, a_kw={"host": host("node-a", model=None, temperature=1)})
    assert before_asking(Settings(False), pair) == {"state": "not_adjudicated", "reason": "off"}
    assert before_asking(Settings(True), pair) == {"state": "not_adjudicated", "reason": "host_does_not_mark_twins"}
