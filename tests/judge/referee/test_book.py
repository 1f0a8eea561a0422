"""P1–P6: one call per pair, in a book that survives restarts and crashes."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from capseal.audit import verify_ledger
from capseal.canonical import json_digest
from capseal.errors import PairRefusedError
from capseal.judge.referee import Book, Referee, ReplayTransport, load_case, make_pair, run_case
from capseal.keys import FileSigner, generate_private_key, write_pkcs8
from capseal.ledger import Ledger

from .world import A_TEXT, B_TEXT, CORROBORATED_C, REANSWER, REQUEST, World

CHILD = Path(__file__).with_name("child.py")


def test_P1_a_pair_is_bracket_request_and_sorted_nodes_resealed_halves_are_the_same_pair(world: World) -> None:
    book = world.book()
    referee = world.referee(book)
    first = referee.consider(world.pair())
    assert first.referee_calls == 1
    resealed = world.pair()  # new records, new capsule ids: the same exchange
    assert resealed.capsule_ids != first.pair.capsule_ids and resealed.key == first.pair.key
    assert referee.consider(resealed).referee_calls == 0
    swapped = world.pair(B_TEXT, A_TEXT, nodes=("node-b", "node-a"))
    assert swapped.key == first.pair.key  # node ids sorted
    assert referee.consider(world.pair(bracket="bracket-2")).referee_calls == 1  # a new bracket: a new pair
    other = {**REQUEST, "messages": [{"role": "user", "content": "Count from 1 to 6."}]}
    assert referee.consider(world.pair(request=other)).referee_calls == 1  # a new request: a new pair


def test_P1_one_half_or_halves_of_different_requests_are_no_pair(world: World) -> None:
    a, b = world.pair().halves
    with pytest.raises(PairRefusedError) as caught:
        make_pair("bracket-1", a.request_digest, [a])
    assert (caught.value.rule, caught.value.reason) == ("P1", "not_a_pair") and "orphan" in str(caught.value)
    other = {**REQUEST, "seed": 8}
    c = world.load(world.half("node-b", B_TEXT, request=other), "node-b", B_TEXT, request=other)
    with pytest.raises(PairRefusedError) as caught:
        make_pair("bracket-1", a.request_digest, [a, c])
    assert caught.value.reason == "twins_differ_in_request"
    with pytest.raises(PairRefusedError):
        make_pair("bracket-1", a.request_digest, [a, a])
    with pytest.raises(PairRefusedError):
        make_pair("bracket-1", a.request_digest, [a, b], request=other)  # the request given is not the one answered


def test_P2_after_the_call_the_stored_row_with_0_calls_an_unanswered_call_is_never_retried(world: World) -> None:
    book = world.book()
    roster = world.roster("node-a", "node-b", "node-c", "node-d")
    transport = ReplayTransport({"node-c": None, "node-d": None})
    referee = world.referee(book, roster=roster, transport=transport, seats=("node-c", "node-d"))
    pair = world.pair()
    first = referee.consider(pair)
    assert first.to_json()["row"] == {"state": "not_adjudicated", "reason": "referee_unreachable"}
    assert first.referee_calls == 1
    for _ in range(3):
        again = referee.consider(pair)
        assert again.referee_calls == 0 and again.row == first.row
        assert referee.consider(pair, reask=True).referee_calls == 0  # not even on a re-ask
    assert len(transport.calls) == 1  # no other referee was tried


def test_P3_no_eligible_referee_does_not_spend_the_call_only_a_reask_selects_again(world: World) -> None:
    book = world.book()
    pair = world.pair()
    nobody = world.referee(book, roster=world.roster("node-a", "node-b"), seats=())
    assert nobody.consider(pair).to_json()["row"] == {"state": "not_adjudicated", "reason": "no_eligible_referee"}
    assert book.spent(pair.key) is None
    later = world.referee(book)  # node-c is now known and eligible
    again = later.consider(pair)
    assert again.referee_calls == 0 and again.row["reason"] == "no_eligible_referee"  # not retried on its own
    asked = later.consider(pair, reask=True)
    assert asked.referee_calls == 1 and asked.row["state"] == "adjudicated"
    assert later.consider(pair, reask=True).referee_calls == 0  # the one call is used


def test_P4_each_outcome_of_the_call_spends_it(world: World) -> None:
    outcomes = {
        "adjudicated": world.referee(world.book("adj")),
        "referee_unreachable": world.referee(world.book("unr"), answers={"node-c": None}),
        "referee_cannot_sign": world.referee(world.book("cs"), seats=()),  # it answers, but has no seat that signs
    }
    for expected, referee in outcomes.items():
        pair = world.pair()
        answer = referee.consider(pair)
        assert answer.referee_calls == 1
        assert expected in (answer.row["state"], answer.row.get("reason")), answer.row
        assert referee.book.spent(pair.key) is not None
        assert referee.consider(pair).referee_calls == 0


def test_P5_counts_against_is_the_contradicted_node_and_nothing_else(world: World) -> None:
    book = world.book()
    assert world.referee(book).consider(world.pair()).counts_against == "node-b"
    assert world.referee(world.book("x"), answers={"node-c": "1, 2, 3, 999 5"}).consider(world.pair()).counts_against == "node-a"
    for answers in ({"node-c": "1, 2, 3, 7, 5"}, {"node-c": None}):
        assert world.referee(world.book(f"n{len(str(answers))}"), answers=answers).consider(world.pair()).counts_against is None


def test_P6_the_book_survives_a_restart(world: World) -> None:
    pair = world.pair()
    book = world.book("kept")
    first = world.referee(book).consider(pair)
    book.close()
    reopened = Book(world.tmp / "kept.db", FileSigner(write_pkcs8(generate_private_key("ed25519"), world.tmp / "k2.pem")))
    try:
        again = world.referee(reopened).consider(pair)
        assert (again.referee_calls, again.row) == (0, first.row)
    finally:
        reopened.close()


def test_P6_the_row_for_a_call_is_written_before_the_call(world: World) -> None:
    book = world.book()
    seen: list[object] = []

    def looking(referee: str, request: dict) -> object:  # type: ignore[type-arg]
        rows = book.history(pair.key)
        seen.append([(r.called, r.row, r.in_flight) for r in rows])
        return ReplayTransport({"node-c": REANSWER})(referee, request)

    pair = world.pair()
    answer = world.referee(book, transport=looking).consider(pair)
    assert seen == [[(True, {"state": "not_adjudicated", "reason": "referee_unreachable"}, {"referee": "node-c", "tier": 2})]]
    rows = book.history(pair.key)
    assert [r.in_flight for r in rows] == [{"referee": "node-c", "tier": 2}, None]
    assert rows[1].row == answer.row and rows[1].prior == rows[0].record_id and rows[1].ruling_id is not None


def _case_files(world: World) -> tuple[Path, Path]:
    case = world.write_case("case", world.case(history=(CORROBORATED_C,)))
    key = write_pkcs8(generate_private_key("ed25519"), world.tmp / "book-key.pem")
    return case, key


def test_P6_a_restart_between_the_call_and_the_answer_is_spent_not_retried(world: World) -> None:
    case, key = _case_files(world)
    book_path, marker = world.tmp / "book.db", world.tmp / "in-call"
    child = subprocess.Popen([sys.executable, str(CHILD), "hang", str(case), str(book_path), str(key), str(marker)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while not marker.exists():
            assert child.poll() is None, child.communicate()[1].decode()
            assert time.monotonic() < deadline, "the child never reached the call"
            time.sleep(0.02)
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
    with Book(book_path, FileSigner(key)) as book:
        answer = run_case(load_case(case), book)
        assert answer.to_json() == {"counts_against": None, "referee_calls": 0,
                                    "row": {"state": "not_adjudicated", "reason": "referee_unreachable"}}
        rows = book.history(answer.pair.key)
        assert len(rows) == 1 and rows[0].called and rows[0].in_flight == {"referee": "node-c", "tier": 1}
    assert verify_ledger(book_path).ok


def test_P6_a_sigkill_while_the_book_is_written_leaves_no_half_row(world: World) -> None:
    """A comparing node rules pair after pair and is killed at a random moment
    shortly after one of its calls starts (inside the referee's sealing, the
    final row, or the next pair's call row), four times over the same book:
    every row is whole, the ledger verifies, each pair is spent (its call row
    is in) or untouched (no row), and after the restart a spent pair makes no
    call and an untouched one makes one."""
    case, key = _case_files(world)
    book_path, marker = world.tmp / "book.db", world.tmp / "call"
    rng = random.Random(19)
    for _ in range(4):
        for old in world.tmp.glob("call.*"):
            old.unlink()
        target = Path(f"{marker}.{rng.randint(2, 4)}")
        child = subprocess.Popen([sys.executable, str(CHILD), "churn", str(case), str(book_path), str(key), str(marker)],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            deadline = time.monotonic() + 60
            while not target.exists():
                assert child.poll() is None, child.communicate()[1].decode()
                assert time.monotonic() < deadline
                time.sleep(0.001)
            time.sleep(rng.uniform(0, 0.03))
        finally:
            os.kill(child.pid, signal.SIGKILL)
            child.wait()
        report = verify_ledger(book_path)
        assert report.ok, [(r.record_type, r.findings) for r in report.records if not r.ok]
    loaded = load_case(case)
    with Book(book_path, FileSigner(key)) as book:
        rows = book.rows()  # every row parses: none half-written
        brackets = sorted({str(r.key[0]) for r in rows}, key=lambda b: int(b.split("-")[1]))
        assert len(brackets) >= 4
        pair = loaded.halves()
        referee = Referee(book, roster=loaded.roster, settings=loaded.settings, history=loaded.history,
                          transport=ReplayTransport({"node-c": REANSWER}), seats={}, clock=lambda: loaded.now)
        for bracket in brackets + [f"bracket-{int(brackets[-1].split('-')[1]) + 1}"]:
            p = make_pair(bracket, pair.request_digest, pair.halves, request=pair.request)
            history = book.history(p.key)
            assert all(r.called for r in history)  # every row of a pair asked is a call row: spent, or no row at all
            answer = referee.consider(p)
            assert answer.referee_calls == (1 if not history else 0), (bracket, [r.row for r in history])


def test_the_book_row_shape_is_the_one_interpret_reads(world: World) -> None:
    """The ledger body of a referee:book-row: the members named in the book module, the row as the rules write it."""
    book = world.book()
    answer = world.referee(book).consider(world.pair())
    entries = [e for e in book.ledger.entries() if e.record_type == "referee:book-row"]
    assert [e.epistemic_type for e in entries] == ["producer_claim", "producer_claim"] and all(not e.links for e in entries)
    flight, final = (json.loads(e.body) for e in entries)
    assert set(flight) == {"book_version", "pair", "capsule_ids", "row", "called", "at", "pair_state", "prior",
                           "in_flight", "action_id", "envelopes"}
    # the ledger's unique action_id column that claims the call is the hashed body's own
    assert flight["action_id"] == entries[0].action_id == f"referee-call:{world.pair().pair_id}"
    assert set(final) == {"book_version", "pair", "capsule_ids", "row", "called", "at", "pair_state", "prior",
                          "ruling_id", "statement_id", "envelopes"}
    assert final["book_version"] == "capseal-referee-book/1"
    assert final["pair"] == {"twin_bracket_id": "bracket-1", "request_digest": json_digest(REQUEST), "node_ids": ["node-a", "node-b"]}
    assert final["row"] == answer.row == {"state": "adjudicated", "referee": "node-c", "tier": 2, "verdict": "contradicted:node-b"}
    assert final["called"] is True and final["pair_state"] == "halves_disagree" and final["prior"] == entries[0].record_id
    assert flight["row"] == {"state": "not_adjudicated", "reason": "referee_unreachable"} and flight["called"] is True
    assert entries[1].record_id == json_digest({k: v for k, v in final.items() if k != "envelopes"})


def test_an_orphan_is_held_as_one_half_unavailable_never_as_tampering(world: World) -> None:
    book = world.book()
    referee = world.referee(book)
    a, _ = world.pair().halves
    held = referee.hold(a, twin_bracket_id="bracket-9")
    assert held.to_json()["pair_state"] == "one_half_unavailable"
    assert [h.capsule_id for h in book.orphans()] == [a.capsule_id]
    assert referee.hold(a, twin_bracket_id="bracket-9") == held  # held once
    report = verify_ledger(book.ledger.path)
    assert report.ok and all(not any(f.severity == "error" for f in r.findings) for r in report.records)
    # its twin comes: the pair is complete, the half is no orphan any more
    b = world.load(world.half("node-b", B_TEXT), "node-b", B_TEXT)
    referee.consider(make_pair("bracket-9", a.request_digest, [a, b], request=REQUEST))
    assert book.orphans() == []


def test_a_book_record_changed_in_the_ledger_fails_verification(world: World) -> None:
    book = world.book()
    world.referee(book).consider(world.pair())
    path = book.ledger.path
    book.close()
    with Ledger(path) as ledger:
        seq = [e.seq for e in ledger.entries() if e.record_type == "referee:book-row"][-1]  # the final row
    import sqlite3

    db = sqlite3.connect(path)
    db.execute("DROP TRIGGER records_no_update")
    body = json.loads(db.execute("SELECT body FROM records WHERE seq=?", (seq,)).fetchone()[0])
    body["row"]["verdict"] = "contradicted:node-a"  # still a row the rules write: only its digest tells
    db.execute("UPDATE records SET body=? WHERE seq=?", (json.dumps(body, sort_keys=True, separators=(",", ":")).encode(), seq))
    db.commit()
    db.close()
    report = verify_ledger(path)
    bad = next(r for r in report.records if r.seq == seq)
    codes = [f.code for f in bad.findings]
    assert not report.ok and not bad.ok and "record_digest_mismatch" in codes and "envelope_payload_mismatch" in codes
