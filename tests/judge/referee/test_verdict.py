"""V1–V8: the ruling two halves and a re-answer give, in order."""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import pytest

from capseal.canonical import capsule_id
from capseal.errors import PairRefusedError
from capseal.judge.referee import adjudicate, compare, referee_verdict

from .world import A_TEXT, B_TEXT, REANSWER, REQUEST, World


def called(text: str | None) -> Any:
    calls: list[int] = []

    def referee() -> str | None:
        calls.append(1)
        return text

    referee.calls = calls  # type: ignore[attr-defined]
    return referee


def test_V1_a_forged_half_is_refused(world: World) -> None:
    record = world.half("node-a", A_TEXT).to_json()
    forged = copy.deepcopy(record)
    forged["capsule"]["effect"]["response_digest"] = "f" * 64  # changed after sealing: the id no longer recomputes
    with pytest.raises(PairRefusedError) as caught:
        world.load(forged, "node-a", A_TEXT)
    assert (caught.value.rule, caught.value.reason) == ("V1", "half_forged")
    # re-identified after the change: the id recomputes, the signature does not verify
    forged["capsule"]["capsule_id"] = capsule_id(forged["capsule"])
    with pytest.raises(PairRefusedError) as caught:
        world.load(forged, "node-a", A_TEXT)
    assert caught.value.reason == "half_forged"
    # signed, but by a key node-a did not announce
    other = world.half("node-a", A_TEXT, signer=world.signer("node-x"))
    with pytest.raises(PairRefusedError) as caught:
        world.load(other, "node-a", A_TEXT)
    assert caught.value.reason == "half_unverified"
    with pytest.raises(PairRefusedError) as caught:  # nobody announced a key for it
        world.load(record, "node-a", A_TEXT, announced=None)
    assert caught.value.reason == "half_unverified"
    # the pure ruling refuses a half whose record changed after it was checked
    a, b = world.pair().halves
    bad = dataclasses.replace(a, capsule={**a.capsule, "action_id": "changed"})
    with pytest.raises(PairRefusedError) as caught:
        adjudicate(bad, b)
    assert caught.value.reason == "half_forged"


def test_V1_a_text_that_does_not_match_its_digest_is_refused(world: World) -> None:
    record = world.half("node-a", A_TEXT)
    with pytest.raises(PairRefusedError) as caught:
        world.load(record, "node-a", "1, 2, 3, 4, 6")
    assert (caught.value.rule, caught.value.reason) == ("V1", "answer_not_the_signed_body")
    # a chat-completion body whose text is not the one given
    body = {"choices": [{"message": {"role": "assistant", "content": A_TEXT}}]}
    served = world.half("node-a", body=body)
    assert world.load(served, "node-a", A_TEXT, body=body).text == A_TEXT
    with pytest.raises(PairRefusedError):
        world.load(served, "node-a", B_TEXT, body=body)
    a, b = world.pair().halves
    with pytest.raises(PairRefusedError) as caught:
        adjudicate(dataclasses.replace(a, text="something else", body="something else"), b)
    assert caught.value.reason == "answer_not_the_signed_body"


def test_V2_a_providers_half_without_its_body_holds_no_answer(world: World) -> None:
    a, b = world.pair().halves
    bodies: list[Any] = [None, {}]
    for body in bodies:
        assert adjudicate(dataclasses.replace(a, body=body), b).no_verdict_reason == "no_requester_transcript"
    # any other half without its body is checked as {} and refused (V1)
    record = world.half("node-r", A_TEXT, role="referee")
    half = world.load(record, "node-r", A_TEXT)
    with pytest.raises(PairRefusedError) as caught:
        adjudicate(dataclasses.replace(half, body=None), b)
    assert caught.value.reason == "answer_not_the_signed_body"


def test_V3_sampled_or_unknown_weights_is_not_comparable_differing_weights_is_weights_mismatch(world: World) -> None:
    # the ruling path reads the record's temperature as a number or a numeric string
    sampled = world.pair(b_kw={"temperature": "0.7"}).halves
    assert adjudicate(*sampled, called(REANSWER)).no_verdict_reason == "not_comparable"
    request = {**REQUEST, "temperature": "0.5"}
    assert adjudicate(*world.pair(request=request).halves).no_verdict_reason == "not_comparable"
    for t in (-1, "-0.5", "0", 0):  # negative or zero: not sampled
        assert adjudicate(*world.pair(b_kw={"temperature": t}).halves).verdict == "inconclusive", t
    unknown = world.pair(b_kw={"weights": None}).halves
    assert adjudicate(*unknown).no_verdict_reason == "not_comparable"
    assert adjudicate(*unknown, unknown_weights="compare").verdict == "inconclusive"
    differ = world.pair(b_kw={"weights": "9" * 64}).halves
    assert adjudicate(*differ).no_verdict_reason == "weights_mismatch"


def test_V3_a_boolean_temperature_says_nothing(world: World) -> None:
    a, b = world.pair().halves
    b2 = dataclasses.replace(b, facts={**b.facts, "temperature": True})
    assert adjudicate(a, b2).verdict == "inconclusive"


def test_V4_no_serving_node_is_owner_absent_one_node_twice_is_same_owner(world: World) -> None:
    a, b = world.pair().halves
    nameless = dataclasses.replace(b, facts={k: v for k, v in b.facts.items() if k != "node_id"})
    assert adjudicate(a, nameless).no_verdict_reason == "owner_absent"
    same = world.pair(nodes=("node-a", "node-a")).halves
    outcome = adjudicate(*same, called(REANSWER))
    assert (outcome.no_verdict_reason, outcome.twin_owner_distinct) == ("same_owner_twin", False)


def test_V5_the_same_words_are_corroborated_without_a_referee(world: World) -> None:
    referee = called(REANSWER)
    outcome = adjudicate(*world.pair("1, 2, 3", " 1,\n2,  3").halves, referee)
    assert outcome.verdict == "corroborated" and not outcome.referee_called and referee.calls == []


def test_V6_words_differ_and_no_referee_is_inconclusive_never_a_contradiction(world: World) -> None:
    outcome = adjudicate(*world.pair().halves)
    assert (outcome.verdict, outcome.divergence_index) == ("inconclusive", 3)


def test_V7_a_referee_that_is_a_twin_or_does_not_answer(world: World) -> None:
    halves = world.pair().halves
    referee = called(REANSWER)
    assert adjudicate(*halves, referee, "node-b").no_verdict_reason == "referee_not_independent"
    assert referee.calls == []  # never asked
    assert adjudicate(*halves, called(None), "node-c").no_verdict_reason == "referee_unreachable"
    # through the facade: a referee that does not answer is referee_unreachable, spent
    book = world.book()
    answer = world.referee(book, answers={"node-c": None}).consider(world.pair())
    assert answer.to_json() == {"counts_against": None, "referee_calls": 1,
                                "row": {"state": "not_adjudicated", "reason": "referee_unreachable"}}
    assert book.spent(answer.pair.key) is not None


def test_V8_the_word_at_the_split_names_the_other_twin(world: World) -> None:
    a, b = world.pair().halves
    comparison = compare(a.text, b.text)
    assert referee_verdict(a, b, comparison, REANSWER) == "contradicted:node-b"
    assert referee_verdict(a, b, comparison, "1, 2, 3, 999 5") == "contradicted:node-a"
    assert referee_verdict(a, b, comparison, "1, 2, 3, 7, 5") == "inconclusive"  # agrees with neither
    # the request has messages: the agreed words must be repeated first
    assert referee_verdict(a, b, comparison, "one, 2, 3, 4, 5") == "inconclusive"
    assert adjudicate(a, b, called(REANSWER), "node-c").verdict == "contradicted:node-b"


def test_V8_with_no_disclosed_request_the_referees_first_word_decides(world: World) -> None:
    a, b = (dataclasses.replace(h, request=None) for h in world.pair().halves)
    comparison = compare(a.text, b.text)
    assert referee_verdict(a, b, comparison, "4, 5") == "contradicted:node-b"
    assert referee_verdict(a, b, comparison, REANSWER) == "inconclusive"  # its first word is "1,"
    # half A's request decides, not half B's
    b_only = dataclasses.replace(b, request=REQUEST)
    assert referee_verdict(a, b_only, comparison, "4, 5") == "contradicted:node-b"


def test_V8_an_empty_answer_can_be_contradicted_an_empty_reanswer_is_inconclusive(world: World) -> None:
    a, b = world.pair("", "x y").halves
    comparison = compare(a.text, b.text)
    assert comparison.divergence_index == 0
    assert referee_verdict(a, b, comparison, "x y") == "contradicted:node-a"
    assert referee_verdict(a, b, comparison, "") == "inconclusive"
    assert adjudicate(a, b, called(""), "node-c").verdict == "inconclusive"
