"""Hostile values for every door of the referee: a typed error naming what is wrong,
and nothing recorded — the book and its ledger hold what they held."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from capseal.errors import CapsealError, CaseFileError, PairRefusedError, RefereeInputError
from capseal.judge.referee import (
    Candidate,
    HTTPTransport,
    Recorded,
    ScriptedDraw,
    Settings,
    make_pair,
    read_case,
    run_case,
)

from .world import A_TEXT, B_TEXT, REQUEST, World


def deep(n: int) -> Any:
    node: Any = "x"
    for _ in range(n):
        node = [node]
    return node


HOSTILE_IDS = ["", "a\x00b", "a\ud800", "\x1b[31m", 7, None, ["node"], "n" * 1000]


def test_hostile_node_ids_are_refused_by_name(world: World) -> None:
    record = world.half("node-a", A_TEXT)
    for bad in HOSTILE_IDS:
        with pytest.raises(RefereeInputError) as caught:
            world.load(record, bad, A_TEXT, announced=world.signer("node-a").public_key)  # type: ignore[arg-type]
        assert "node_id" in str(caught.value)
        with pytest.raises(RefereeInputError):
            Candidate.from_json({"node_id": bad, "model_hash": None, "weights_digest": None, "announced_key": None})
        with pytest.raises(RefereeInputError):
            Recorded.from_json({"node_id": bad, "model_hash": None, "bucket": "corroborated", "recorded_at": "2026-01-01T00:00:00Z"})


def test_hostile_pairs_are_refused_and_nothing_is_recorded(world: World) -> None:
    book = world.book()
    referee = world.referee(book)
    good = world.pair()
    a, b = good.halves
    count = book.ledger.count()
    for bracket in ("a\ud800", "x\x00", 5, "b" * 1000):
        with pytest.raises(PairRefusedError):
            make_pair(bracket, good.request_digest, [a, b])  # type: ignore[arg-type]
    for digest in ("A" * 64, "a" * 63, None, 1):
        with pytest.raises(PairRefusedError):
            make_pair("bracket-1", digest, [a, b])
    for request in ({"temperature": 0.7}, {"deep": deep(5000)}, {"x": "\ud800"}, {"n": 2**60}):
        with pytest.raises(PairRefusedError):
            make_pair("bracket-1", good.request_digest, [a, b], request=request)
    for halves in ([], [a], [a, b, a], "ab", {"a": a}, [a, "b"]):
        with pytest.raises(PairRefusedError):
            make_pair("bracket-1", good.request_digest, halves)  # type: ignore[arg-type]
    # texts: a lone surrogate, NUL bytes, a huge one — refused unless they are the body signed
    record = world.half("node-a", A_TEXT)
    for text in ("1, 2, 3\ud800", "1\x00", "x" * 1_000_000):
        with pytest.raises(PairRefusedError):
            world.load(record, "node-a", text)
    nul = world.half("node-a", "1\x00 2")
    assert world.load(nul, "node-a", "1\x00 2").text == "1\x00 2"  # NUL in a text that is the signed body is fine
    records: list[Any] = [None, [], "capsule", {"capsule_id": "x"}, {"record_version": "capseal-record/1", "capsule": 5}]
    for record_value in records:
        with pytest.raises(PairRefusedError):
            world.load(record_value, "node-a", A_TEXT)
    with pytest.raises(CapsealError):
        referee.consider("not a pair")  # type: ignore[arg-type]
    assert book.ledger.count() == count


def test_hostile_settings_clocks_and_draws(world: World) -> None:
    for switch, days in (("on", None), (1, None), (None, 0), (None, -5), (None, 1.5), (None, 10**400), (None, "30"), (None, True)):
        with pytest.raises(RefereeInputError):
            Settings(switch, days)  # type: ignore[arg-type]
    values: list[Any] = [[], "x", {"referee_bar_days": 3, "bogus": 1}]
    for value in values:
        with pytest.raises(RefereeInputError):
            Settings.from_json(value)
    book = world.book()
    pair = world.pair()
    count = book.ledger.count()
    for clock in (lambda: 5, lambda: "yesterday", lambda: "2026-10-01T12:00:00+02:00", lambda: "2026-02-30T00:00:00Z"):
        with pytest.raises(RefereeInputError):
            world.referee(book, clock=clock).consider(pair)
    picks: list[list[Any]] = [[-1], [1.0], ["0"], [10**400], [7]]
    for draws in picks:
        with pytest.raises(RefereeInputError):
            world.referee(book, draw=ScriptedDraw(draws)).consider(pair)
    assert book.ledger.count() == count
    with pytest.raises(RefereeInputError):
        world.referee(book, roster=world.roster() + world.roster("node-c"))  # a node twice


def test_a_bar_recorded_at_the_end_of_time_does_not_overflow(world: World) -> None:
    from capseal.judge.referee.bar import parse_time

    history = [Recorded("node-c", "m", "contradicted", parse_time("9999-12-31T23:59:59Z"))]
    from capseal.judge.referee import barred, corroborated

    assert barred("node-c", "m", history, parse_time("9999-12-31T23:59:59Z"), 999_999_999)
    assert not corroborated("node-c", "m", history, 30)


def test_hostile_case_files_are_case_file_errors(world: World) -> None:
    good = world.case()
    read_case(copy.deepcopy(good))
    broken: list[tuple[str, Any]] = []
    for path, value in (("now", 5), ("now", "soon"), ("settings", []), ("pair", None), ("roster", {}), ("history", "x"),
                        ("referee", []), ("draws", "1"), ("draws", [0.5]), ("extra", 1)):
        case = copy.deepcopy(good)
        case[path] = value
        broken.append((path, case))
    h = copy.deepcopy(good)
    h["pair"]["halves"][0]["text"] = None
    broken.append(("text", h))
    h = copy.deepcopy(good)
    h["pair"]["halves"][0]["surprise"] = 1
    broken.append(("surprise", h))
    h = copy.deepcopy(good)
    h["roster"][0]["announced_key"] = "-----BEGIN PUBLIC KEY-----\nnope\n-----END PUBLIC KEY-----\n"
    broken.append(("announced_key", h))
    h = copy.deepcopy(good)
    h["referee"]["node-c"]["signs"] = "yes"
    broken.append(("signs", h))
    h = copy.deepcopy(good)
    h["history"][0]["bucket"] = "score"
    broken.append(("bucket", h))
    for name, case in broken:
        with pytest.raises(CaseFileError) as caught:
            read_case(case)
        assert caught.value.path.startswith("$"), name
    for value in (None, [], "case", 5):
        with pytest.raises(CaseFileError):
            read_case(value)
    # a referee key that cannot be opened: typed, and nothing recorded
    bad_key = copy.deepcopy(good)
    bad_key["referee"]["node-c"]["key"] = f"file:{world.tmp / 'no-such-key.pem'}"
    book = world.book()
    count = book.ledger.count()
    with pytest.raises(CaseFileError):
        run_case(read_case(bad_key, world.tmp), book)
    assert book.ledger.count() == count


def test_http_transport_hostile_arguments() -> None:
    for kw in ({"timeout": 10**400}, {"timeout": float("inf")}, {"headers": {"a": 1}}, {"headers": {"a": "b\r\nX-Evil: 1"}},
               {"target_header": "x mesh"}, {"headers": {"bad name": "v"}}):
        with pytest.raises((RefereeInputError, TypeError)):
            HTTPTransport("http://127.0.0.1:1", **kw)  # type: ignore[arg-type]


_ = (B_TEXT, REQUEST)
