"""The referee's ruling as sealed: verify_judgment and capseal verify accept it, the
reference verifier accepts the halves and the answer capsule unchanged, a tampered
tier, verdict, half id or answer digest fails with a named finding, and the
referee's own refusals."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import agent_action_capsule as ref
from agent_action_capsule.producer_envelope import verify_record_signature

from capseal.audit import verify_ledger
from capseal.judge import verify_judgment
from capseal.judge.referee import Book, Pair, ReplayTransport, verify_ruling
from capseal.judge.referee.transports import reanswer_request

from .world import REANSWER, World

CLI = str(Path(sys.executable).parent / "capseal")


def ruled(world: World, **kw: Any) -> tuple[Book, Any]:
    book = world.book()
    answer = world.referee(book, **kw).consider(world.pair())
    assert answer.row["state"] == "adjudicated", (answer.row, answer.refusal)
    return book, answer


def test_the_ruling_passes_verify_judgment_and_capseal_verify(world: World) -> None:
    book, answer = ruled(world)
    row = answer.book_row
    assert row is not None and row.ruling_id and row.statement_id
    report = verify_judgment(row.ruling_id, book.ledger, trusted_keys=[world.signer("node-c").public_key])
    assert report.ok and report.epistemic_type == "adjudication" and report.signer_kid == world.signer("node-c").kid
    sealed = next(j for j in __import__("capseal.judge", fromlist=["JudgmentStore"]).JudgmentStore(book.ledger).judgments()
                  if j.digest == row.ruling_id)
    body = sealed.body
    a, b = answer.pair.halves
    assert body["record_version"] == "adjudication/v1" and body["verdict"] == "contradicted"
    assert body["contradicted_party"] == b.capsule_id and body["divergence_index"] == "3"
    assert sorted(p["digest"] for p in body["parties"]) == sorted([a.capsule_id, b.capsule_id])
    assert body["referee"]["digest"] == row.statement_id and body["referee"]["judge_purpose"] == "referee"
    assert {("adjudicates", a.capsule_id), ("adjudicates", b.capsule_id)} <= {(x["type"], x["target"]) for x in sealed.links}
    path = book.ledger.path
    book.close()
    assert verify_ledger(path).ok
    proc = subprocess.run([CLI, "verify", str(path)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_reference_verifier_accepts_both_halves_and_the_answer_capsule_with_their_ids(world: World) -> None:
    book, answer = ruled(world)
    a, b = answer.pair.halves
    before = {h.capsule_id: json.dumps(h.capsule, sort_keys=True) for h in (a, b)}
    statement = book.ledger.entry(answer.book_row.statement_id)  # type: ignore[union-attr]
    assert statement is not None
    answer_id = json.loads(statement.body)["content"]["answer_capsule_id"]
    for cid in (a.capsule_id, b.capsule_id, answer_id):
        row = book.ledger.entry(cid)  # the halves are kept as received (capsule:received), the answer as sealed
        assert row is not None and row.record_type == ("capsule" if cid == answer_id else "capsule:received")
        capsule = row.record()["capsule"]
        result = ref.verify(capsule)
        assert result.ok and not [f for f in result.findings if f.severity == "error"], result.findings
        assert ref.compute_capsule_id(dict(capsule)) == cid == capsule["capsule_id"]
        assert verify_record_signature(capsule) == ("authored", [])
        if cid in before:  # the halves are never edited
            assert json.dumps(capsule, sort_keys=True) == before[cid]
    referee_capsule = book.ledger.get(answer_id).capsule  # type: ignore[union-attr]
    assert referee_capsule["key_id"] == world.signer("node-c").kid
    ca = referee_capsule["model_attestation"]["compute_attestation"]
    assert ca["x-twin-serving-v1"]["role"] == "referee" and ca["x-twin-serving-v1"]["capture_method"] == "deterministic_replay"
    assert ca["decoding"] == {"temperature": 0, "seed": 7}


def _tamper(path: Path, record_id: str, change: Any) -> None:
    db = sqlite3.connect(path)
    db.execute("DROP TRIGGER IF EXISTS records_no_update")
    body = json.loads(db.execute("SELECT body FROM records WHERE record_id=?", (record_id,)).fetchone()[0])
    change(body)
    db.execute("UPDATE records SET body=? WHERE record_id=?",
               (json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode(), record_id))
    db.commit()
    db.close()


def _check(book_path: Path, world: World, row: Any) -> list[str]:
    with Book(book_path) as book:
        report = verify_ruling(book.ledger, statement_id=row.statement_id, ruling_id=row.ruling_id,
                               referee_key=world.signer("node-c").public_key,
                               expect={"referee": "node-c", "tier": row.row["tier"], "capsule_ids": list(row.capsule_ids)})
    assert not report.ok
    return report.codes()


def test_a_tampered_tier_verdict_half_id_or_answer_digest_fails_with_a_named_finding(world: World) -> None:
    cases = {
        "tier": (lambda row: row.statement_id, lambda b: b["content"].__setitem__("selection_tier", 1),
                 ["record_digest_mismatch", "ruling_statement_tampered"]),
        "verdict": (lambda row: row.ruling_id, lambda b: b["record"].__setitem__("verdict", "inconclusive"),
                    ["record_digest_mismatch", "ruling_unverified"]),
        "half id": (lambda row: row.ruling_id, lambda b: b["record"]["parties"][0].__setitem__("digest", "e" * 64),
                    ["record_digest_mismatch", "ruling_unverified"]),
        "answer digest": (lambda row: row.statement_id, lambda b: b["content"].__setitem__("answer_digest", "d" * 64),
                          ["record_digest_mismatch", "ruling_statement_tampered"]),
    }
    for name, (which, change, expected) in cases.items():
        sub = world.tmp / name.replace(" ", "-")
        sub.mkdir()
        w = World(sub)
        try:
            book, answer = ruled(w)
            row = answer.book_row
            path = book.ledger.path
            assert _verifies(path, w, row)  # before the change it verifies: the findings after come from it
            book.close()
            _tamper(path, which(row), change)
            codes = _check(path, w, row)
            for code in expected:
                assert code in codes, (name, codes)
            assert not verify_ledger(path).ok, name
        finally:
            w.close()


def _verifies(path: Path, world: World, row: Any) -> bool:
    book = Book(path)
    try:
        report = verify_ruling(book.ledger, statement_id=row.statement_id, ruling_id=row.ruling_id,
                               referee_key=world.signer("node-c").public_key, expect={"referee": "node-c", "tier": row.row["tier"]})
        return report.ok
    finally:
        book.close()


def test_an_answer_capsule_changed_after_sealing_is_named(world: World) -> None:
    book, answer = ruled(world)
    row = answer.book_row
    statement = json.loads(book.ledger.entry(row.statement_id).body)["content"]  # type: ignore[union-attr]
    path = book.ledger.path
    book.close()
    _tamper(path, statement["answer_capsule_id"],
            lambda b: b["capsule"]["effect"].__setitem__("response_digest", "c" * 64))
    codes = _check(path, world, row)
    assert "ruling_answer_tampered" in codes


def test_a_ruling_signed_by_a_key_the_referee_did_not_announce_does_not_count(world: World) -> None:
    book = world.book()
    roster = world.roster()
    impostor = world.signer("someone-else")
    seat_roster = [c if c.node_id != "node-c" else world.candidate("node-c", key=impostor.public_key) for c in roster]
    referee = world.referee(book, roster=roster, seats=())
    referee._seats = {"node-c": world.seat(book, "node-c", seat_roster, signer=impostor)}
    answer = referee.consider(world.pair())
    assert answer.to_json() == {"counts_against": None, "referee_calls": 1,
                                "row": {"state": "not_adjudicated", "reason": "referee_cannot_sign"}}
    assert answer.ruling is not None and "ruling_statement_tampered" in answer.ruling.codes()
    assert referee.counted() == []


def _seat_rule(world: World, pair: Pair, roster: Any = None, node: str = "node-c") -> Any:
    book = world.book(f"seat-{len(list(world.tmp.glob('seat-*')))}")
    seat = world.seat(book, node, roster)
    reanswer = ReplayTransport({node: REANSWER})(node, reanswer_request(pair.halves[0], 3, pair.request))
    return seat.rule(pair, tier=1, reanswer=reanswer)


def test_the_referee_refuses_when_it_cannot_name_itself_is_a_twin_or_a_half_is_unverified(world: World) -> None:
    pair = world.pair()
    twice = world.roster() + [world.candidate("node-c2", key=world.signer("node-c").public_key)]
    assert _seat_rule(world, pair, twice).reason == "referee_unnamed"
    assert _seat_rule(world, pair, world.roster("node-a", "node-b")).reason == "referee_unnamed"
    assert _seat_rule(world, pair, node="node-b").reason == "referee_not_independent"
    wrong_key = [c if c.node_id != "node-a" else world.candidate("node-a", key=world.signer("node-x").public_key)
                 for c in world.roster()]
    refusal = _seat_rule(world, pair, wrong_key)
    assert (refusal.reason, refusal.detail) == ("half_unverified", "half_unverified")
    assert _seat_rule(world, pair, [c for c in world.roster() if c.node_id != "node-b"]).reason == "half_unverified"
    assert _seat_rule(world, pair).verdict == "contradicted:node-b"


def test_twins_whose_records_name_different_weights_get_a_signed_not_comparable(world: World) -> None:
    """The host says the same weights (the gates pass); the records say otherwise: the
    referee signs not_comparable because weights_differ, and no adjudication/v1 (no token)."""
    from capseal.judge.referee import HostView

    from .world import MODEL, WEIGHTS

    pair = world.pair(b_kw={"weights": "7" * 64, "host": HostView("node-b", MODEL, WEIGHTS, 0)})
    book = world.book()
    answer = world.referee(book).consider(pair)
    assert answer.to_json() == {"counts_against": None, "referee_calls": 1,
                                "row": {"state": "not_adjudicated", "reason": "not_comparable", "because": "weights_differ"}}
    row = answer.book_row
    assert row is not None and row.called and row.statement_id and row.ruling_id is None
    assert answer.ruling is not None and answer.ruling.ok and answer.ruling.because == "weights_differ"
    sampled = world.pair(b_kw={"temperature": "0.7"})  # a string: the request path says nothing, the ruling path says sampled
    other = world.referee(world.book("s")).consider(sampled)
    assert other.row == {"state": "not_adjudicated", "reason": "not_comparable", "because": "sampled"}
    assert other.referee_calls == 1


def test_a_referee_with_a_p256_key_seals_a_ruling_that_verifies(world: World) -> None:
    """Not only Ed25519: a referee whose key makes plain COSE_Sign1 envelopes (ES256,
    as a TPM or most HSM keys do) seals an answer capsule and a ruling that verify,
    and the book's ledger verifies (the referee's epoch boundary carries its key)."""
    from capseal.keys import FileSigner, generate_private_key, write_pkcs8

    p256 = FileSigner(write_pkcs8(generate_private_key("p256"), world.tmp / "keys" / "node-c-p256.pem"))
    world.signers["node-c"] = p256
    book, answer = ruled(world)
    assert p256.alg == "ES256" and answer.ruling is not None and answer.ruling.ok
    report = verify_judgment(answer.book_row.ruling_id, book.ledger, trusted_keys=[p256.public_key])  # type: ignore[union-attr]
    assert report.ok and report.signer_kid == p256.kid
    path = book.ledger.path
    book.close()
    ledger_report = verify_ledger(path)
    assert ledger_report.ok, [(r.record_type, r.findings) for r in ledger_report.records if not r.ok]
