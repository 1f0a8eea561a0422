# ruff: noqa: F811  (pytest fixtures imported from test_attest_support are redefined as parameters)
"""The ledger side of batch evidence: ``Ledger.add_evidence_batch`` stores a
quote once per batch and rebuilds every record's slot (inclusion proof
included) on read — exactly the slot the RFC 9162 reference gives; the batch
is all or nothing, hash-chained, exported and imported byte-identically, and
tampering with it or with its index is found. Evidence writers are never
starved by a busy committer."""

from __future__ import annotations

import io
import json
import sqlite3
import threading
from pathlib import Path

import pytest

from capseal import Ledger, Producer, merkle
from capseal.attest.evidence import evidence_for_batch
from capseal.errors import LedgerCorruptError, LedgerError
from capseal.keys import UnsafeEphemeralSigner
from capseal.ledger import batch_header, batch_root, row_hash
from capseal.record import storage_json

from .test_attest_support import producer, spec  # noqa: F401

SHARED = {
    "kind": "tpm2-quote", "attest": "AAAA", "signature": "BBBB", "pcr_selection": "sha256:0",
    "pcr_values": {"sha256": {"0": "00" * 32}}, "ak_public": "-----BEGIN PUBLIC KEY-----\nX\n-----END PUBLIC KEY-----\n",
    "ak_name": "000b" + "11" * 32, "ak_tpm_public": "CCCC", "ak_qualified_name": "000b" + "22" * 32,
    "device": {"manufacturer": "IBM", "vendor": "SW   TPM", "firmware": "1.2.3.4", "software": True},
    "taken_at": "2026-01-01T00:00:00.000Z",
    "tpm_clock": {"clock": 1, "reset_count": 2, "restart_count": 3, "safe": True, "firmware_version": "00" * 8,
                  "obfuscated": ["firmware_version", "reset_count", "restart_count"]},
}


def _root(ids: list[str]) -> bytes:
    return merkle.root_recursive([bytes.fromhex(c) for c in ids])


def _reference_slot(ids: list[str], i: int) -> dict:
    """The slot as RFC 9162's recursive definitions give it (not the fast path)."""
    leaves = [bytes.fromhex(c) for c in ids]
    return evidence_for_batch(SHARED, merkle.root_recursive(leaves), i, len(ids), tuple(merkle.path_recursive(i, leaves)))


def test_each_record_reads_back_the_slot_of_its_leaf(producer: Producer) -> None:
    ids = [producer.seal(spec(i)).capsule_id for i in range(64)]
    led = producer.ledger
    start = 0
    want: dict[str, dict] = {}
    for n in (1, 2, 3, 17, 41):  # odd sizes carry nodes up unchanged
        batch = ids[start : start + n]
        start += n
        want.update((cid, _reference_slot(batch, i)) for i, cid in enumerate(batch))
        entry = led.add_evidence_batch(batch, _root(batch), SHARED)
        assert entry.is_batch and entry.record_id is None
        assert [rid for rid, _ in entry.slots()] == batch
        for i, cid in enumerate(batch):
            expected = _reference_slot(batch, i)
            assert led.current_evidence(cid) == expected
            assert led.evidence_history(cid) == [None, expected]
            assert entry.slots()[i][1] == expected
            assert merkle.verify_inclusion(bytes.fromhex(cid), i, n, [bytes.fromhex(p) for p in expected["binding"]["inclusion_proof"]],
                                           _root(batch))
    # records() walks more batches than it keeps proofs for: every slot still exact
    by_id = {r.capsule_id: r.hardware_evidence for r in led.records()}
    assert {cid: by_id[cid] for cid in want} == want and by_id[ids[40]] == _reference_slot(ids[23:64], 40 - 23)
    assert led.check_chain() == []
    # one row for the whole batch: the quote is stored once, not once per record
    assert sum(1 for _ in led.evidence_entries()) == 5


def test_a_batch_is_refused_whole(producer: Producer) -> None:
    ids = [producer.seal(spec(i)).capsule_id for i in range(6)]
    led = producer.ledger
    unknown = [*ids[:3], "ff" * 32, *ids[3:]]
    with pytest.raises(LedgerError, match="no record ff"):
        led.add_evidence_batch(unknown, _root(unknown), SHARED)
    cases = [
        ([], _root([]), SHARED, "one or more"),
        ([ids[0], ids[0]], _root([ids[0], ids[0]]), SHARED, "once"),
        (ids, _root(ids[::-1]), SHARED, "merkle_root"),  # leaf order matters
        (ids, _root(ids), {**SHARED, "binding": {}}, "binding"),
        (ids, _root(ids), {}, "filled"),
        ([ids[0].upper()], _root([ids[0]]), SHARED, "lowercase"),
        (["xyz"], bytes(32), SHARED, "hex"),
    ]
    for batch, root, shared, words in cases:
        with pytest.raises(ValueError, match=words):
            led.add_evidence_batch(batch, root, shared)
    assert list(led.evidence_entries()) == []
    assert all(led.evidence_history(c) == [None] for c in ids)


def test_batch_root_hashes_once_and_never_vouches_for_another_root(producer: Producer) -> None:
    ids = [producer.seal(spec(i)).capsule_id for i in range(7)]
    root, first_path = batch_root(ids)
    assert root == _root(ids) and first_path == tuple(merkle.path_recursive(0, [bytes.fromhex(c) for c in ids]))
    led = producer.ledger
    with pytest.raises(ValueError, match="merkle_root"):  # the remembered ids do not excuse another root
        led.add_evidence_batch(ids, _root(ids[::-1]), SHARED)
    with pytest.raises(ValueError, match="merkle_root"):  # nor other ids with the remembered root
        led.add_evidence_batch(ids[::-1], root, SHARED)
    for bad in ([], [ids[0], ids[0]], [ids[0].upper()]):
        with pytest.raises(ValueError):
            batch_root(bad)
    led.add_evidence_batch(ids, root, SHARED)
    assert led.current_evidence(ids[6]) == _reference_slot(ids, 6)


def test_history_chain_and_export_import_with_slots_and_batches(producer: Producer, tmp_path: Path) -> None:
    ids = [producer.seal(spec(i)).capsule_id for i in range(6)]
    led = producer.ledger
    solo = {**SHARED, "binding": {"capsule_id": ids[2]}}
    led.add_evidence(ids[2], solo)
    led.add_evidence_batch(ids, _root(ids), SHARED)
    led.add_evidence(ids[2], None)  # the slot emptied again: kept in history
    assert led.evidence_history(ids[2]) == [None, solo, _reference_slot(ids, 2), None]
    assert led.current_evidence(ids[2]) is None and led.current_evidence(ids[3]) == _reference_slot(ids, 3)
    assert led.check_chain() == []
    out = io.BytesIO()
    led.export_jsonl(out)
    kinds = [json.loads(line)["kind"] for line in out.getvalue().splitlines()]
    assert kinds[-3:] == ["evidence", "evidence-batch", "evidence"]
    with Ledger.import_jsonl(io.BytesIO(out.getvalue()), tmp_path / "copy.db") as copy:
        again = io.BytesIO()
        copy.export_jsonl(again)
        assert again.getvalue() == out.getvalue()
        assert copy.evidence_history(ids[2]) == led.evidence_history(ids[2])
        assert copy.current_evidence(ids[5]) == _reference_slot(ids, 5)
        assert copy.check_chain() == []


def test_import_refuses_a_batch_whose_records_do_not_hash_to_its_root(producer: Producer, tmp_path: Path) -> None:
    """Even with its row hash recomputed (an attacker who can rewrite the
    export), a batch whose leaves are not the quoted root's is refused."""
    ids = [producer.seal(spec(i)).capsule_id for i in range(4)]
    producer.ledger.add_evidence_batch(ids, _root(ids), SHARED)
    out = io.BytesIO()
    producer.ledger.export_jsonl(out)
    lines = out.getvalue().splitlines()
    item = json.loads(lines[-1])
    item["batch"]["leaves"] = item["batch"]["leaves"][::-1]
    h = item["header"]
    h["row_hash"] = row_hash(h["prev_hash"], batch_header(h["eid"]), storage_json(item["batch"]))
    forged = b"\n".join([*lines[:-1], json.dumps(item).encode()]) + b"\n"
    with pytest.raises(LedgerCorruptError, match="merkle_root"):
        Ledger.import_jsonl(io.BytesIO(forged), tmp_path / "copy.db")
    assert not (tmp_path / "copy.db").exists()


def test_tampering_with_a_batch_or_its_index_is_found(tmp_path: Path) -> None:
    path = tmp_path / "l.db"
    with Producer("acme.example", "agent@1", UnsafeEphemeralSigner(), path) as p:
        ids = [p.seal(spec(i)).capsule_id for i in range(5)]
        p.ledger.add_evidence_batch(ids, _root(ids), SHARED)
    with sqlite3.connect(path) as db:
        db.execute("DROP TRIGGER evidence_members_no_delete")
        db.execute("DELETE FROM evidence_members WHERE record_seq = (SELECT seq FROM records WHERE record_id = ?)", (ids[1],))  # hide one record's evidence
    with Ledger(path) as led:
        assert led.current_evidence(ids[1]) is None
        assert any("evidence index" in problem and "1 missing" in problem for problem in led.check_chain())
    with sqlite3.connect(path) as db:  # lend the boundary capsule (seq 1, in no batch) leaf 0's evidence
        db.execute("INSERT INTO evidence_members(record_seq, eid, leaf_index) VALUES (1, 1, 0)")
    with Ledger(path) as led:
        assert any("1 row(s) not backed by the evidence chain" in problem for problem in led.check_chain())
    with sqlite3.connect(path) as db:
        db.execute("DROP TRIGGER evidence_no_update")
        body = db.execute("SELECT body FROM evidence WHERE eid = 1").fetchone()[0]
        db.execute("UPDATE evidence SET body = ? WHERE eid = 1", (body.replace(b'"AAAA"', b'"AAAB"'),))
    with Ledger(path) as led:
        assert any(problem == "evidence 1: hash chain broken" for problem in led.check_chain())


def test_a_ledger_of_another_format_is_refused_untouched(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
        db.execute("INSERT INTO meta VALUES ('format', 'capseal-ledger/1')")
    before = path.read_bytes()
    with pytest.raises(LedgerCorruptError, match="is a capseal-ledger/1 ledger; this capseal reads capseal-ledger/2"):
        Ledger(path)
    assert path.read_bytes() == before
    with pytest.raises(LedgerCorruptError, match="capseal-ledger/1"):
        Ledger(path, readonly=True)


def test_evidence_writes_are_not_starved_by_a_busy_committer(tmp_path: Path) -> None:
    """Liveness: while one thread keeps appending, a batch of evidence gets its
    turn at the write lock (the sealer stops once the evidence is in, or at a
    hard cap). Starvation itself is probabilistic and not forced here; the
    committer steps aside for a waiting evidence writer (Ledger._side_write)."""
    with Producer("acme.example", "agent@1", UnsafeEphemeralSigner(), tmp_path / "l.db") as p:
        ids = [p.submit(spec(i)).capsule_id for i in range(200)]
        p.flush()
        written = threading.Event()
        sealed = [0]

        def sealer() -> None:
            i = 1000
            while not written.is_set() and sealed[0] < 200_000:
                p.submit(spec(i))
                i += 1
                sealed[0] += 1
            p.flush()

        t = threading.Thread(target=sealer)
        t.start()
        p.ledger.add_evidence_batch(ids, _root(ids), SHARED)
        written.set()
        t.join()
        assert sealed[0] < 200_000  # the evidence landed while sealing was still going on
        assert all(p.ledger.current_evidence(c) is not None for c in ids)
        assert p.ledger.check_chain() == []
