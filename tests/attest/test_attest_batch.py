# ruff: noqa: F811  (pytest fixtures imported from test_attest_support are redefined as parameters)
"""Batch evidence and the epoch platform record on a real swtpm (issue 4 items 3, 6).

No timing assertions: tests wait for outcomes (flush, close) and check what
was written. Quoters that fail or block are thin wrappers around the real
TPM quoter, never mocks of the TPM.
"""

from __future__ import annotations

import copy
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import agent_action_capsule as ref
import pytest

from capseal import Ledger, Producer
from capseal.attest import BatchEvidence, attach, is_epoch_boundary, verify_evidence
from capseal.audit import verify_ledger
from capseal.errors import EvidenceError, InputError, LedgerCorruptError
from capseal.keys import UnsafeEphemeralSigner

from ..conftest import _start_swtpm
from .test_attest_support import AK_HANDLE, AttestTPM, persist_key, producer, spec, tpm_a  # noqa: F401

pytestmark = pytest.mark.swtpm


def statuses(producer: Producer, trust: Any) -> Counter[str]:
    return Counter(verify_evidence(r, trust=trust).status for r in producer.ledger.records())


class FailingQuoter:
    """The real quoter's identity, but every quote fails (a TPM error)."""

    def __init__(self, real: Any) -> None:
        self.identity = real.identity
        self.calls = 0

    def take(self, nonce: bytes) -> Any:
        self.calls += 1
        raise EvidenceError("TPM2_Quote failed: simulated TPM_RC_FAILURE")


class GateQuoter:
    """Quotes with the real TPM, but the first quote waits for ``release``."""

    def __init__(self, real: Any) -> None:
        self.real = real
        self.identity = real.identity
        self.entered = threading.Event()
        self.release = threading.Event()

    def take(self, nonce: bytes) -> Any:
        self.entered.set()
        self.release.wait(30)
        return self.real.take(nonce)


def quote_all(producer: Producer, quoter: Any, n: int, *, max_records: int = 64,
              max_delay: float = 0.05) -> tuple[BatchEvidence, list[str]]:
    """Submit n records with a batch worker attached, wait until every quote
    is written (or has failed), close the worker; the worker and the ids."""
    worker = attach(producer, quoter, max_records=max_records, max_delay=max_delay)
    ids = [producer.submit(spec(i)).capsule_id for i in range(n)]
    producer.flush()
    assert worker.flush(30)
    worker.close()
    return worker, ids


def test_batches_fill_every_slot_and_verify(producer: Producer, tpm_a: AttestTPM) -> None:
    quoter = tpm_a.quoter()
    worker, ids = quote_all(producer, quoter, 300)
    trust = [quoter.identity.public_pem]
    assert statuses(producer, trust) == {"verified-software-tpm": 301}  # 300 + the epoch boundary
    assert worker.stats.records_quoted == 300 and worker.stats.solo_quoted == 1
    assert worker.stats.largest_batch <= 64 and worker.stats.failed_batches == 0

    boundary = producer.ledger.get(producer.epoch_record.capsule_id)
    assert boundary is not None and is_epoch_boundary(boundary)
    assert boundary.hardware_evidence is not None
    assert boundary.hardware_evidence["binding"] == {"capsule_id": boundary.capsule_id}  # its own quote
    cite = {"type": "agent-action-capsule", "digest_alg": "SHA-256", "digest": boundary.capsule_id,
            "citation_purpose": "ran_under"}
    sizes = set()
    for cid in ids:
        record = producer.ledger.get(cid)
        assert record is not None and record.hardware_evidence is not None
        binding = record.hardware_evidence["binding"]
        assert set(binding) == {"merkle_root", "leaf_index", "tree_size", "inclusion_proof"}
        sizes.add(binding["tree_size"])
        assert cite in record.capsule["references"]  # ran under the epoch's platform record
        assert producer.ledger.evidence_history(cid)[0] is None  # sealed null, kept in history
        assert ref.verify(record.capsule).ok and ref.compute_capsule_id(record.capsule) == cid
    assert max(sizes) <= 64
    # the whole ledger, as an auditor runs it
    report = verify_ledger(producer.ledger.path, evidence=True, evidence_trust=[quoter.identity.public_pem.encode()])
    assert report.ok and report.counts()["evidence:verified-software-tpm"] == 301


def test_submit_refuses_an_id_that_would_fail_its_batch(producer: Producer, tpm_a: AttestTPM) -> None:
    """submit() took any string; an id not in the ledger (or upper-case) then
    failed the whole batch after its quote, leaving every batch-mate null."""
    quoter = tpm_a.quoter()
    ids = [producer.seal(spec(i)).capsule_id for i in range(6)]
    worker = BatchEvidence(producer.ledger, quoter, max_records=64, max_delay=60)
    try:
        for cid in ids[:3]:
            worker.submit(cid)
        for bad in ("ab" * 32, ids[0].upper(), ids[0][:63], None, 7):
            with pytest.raises(InputError) as caught:
                worker.submit(bad)  # type: ignore[arg-type]
            assert "submit()" in str(caught.value) or "is not in" in str(caught.value)
        for cid in ids[3:]:
            worker.submit(cid)
        assert worker.flush(30)
    finally:
        worker.close()
    assert worker.stats.failed_batches == 0 and worker.stats.records_quoted == 6
    trust = [quoter.identity.public_pem]
    assert {verify_evidence(producer.ledger.get(cid), trust=trust).status for cid in ids} == {"verified-software-tpm"}


def test_write_batch_refuses_an_empty_batch_typed(producer: Producer, tpm_a: AttestTPM) -> None:
    from capseal.attest.writer import write_batch

    for first_proof in (None, ()):
        with pytest.raises(EvidenceError, match="at least one record"):
            write_batch(producer.ledger, None, [], {}, b"\0" * 32, first_proof)  # type: ignore[arg-type]


def _editable_copy(producer: Producer, tmp_path: Path) -> tuple[Path, Any]:
    """A copy of the producer's (closed) ledger open in sqlite3 with the
    evidence tables' append-only triggers dropped: an edit at the SQL level."""
    import shutil
    import sqlite3

    copy_path = tmp_path / "edited.db"
    producer.ledger.close()
    shutil.copy(producer.ledger.path, copy_path)
    db = sqlite3.connect(copy_path, isolation_level=None)
    for trigger in ("evidence_no_update", "evidence_members_no_update"):
        db.execute(f"DROP TRIGGER {trigger}")
    return copy_path, db


@pytest.mark.parametrize("edit", ["index_row", "batch_row"])
def test_an_edited_evidence_row_fails_only_what_it_touches(producer: Producer, tpm_a: AttestTPM, tmp_path: Path,
                                                            edit: str) -> None:
    """One edited evidence row made Ledger.get() raise IndexError or KeyError,
    and verify_ledger report the whole file unreadable with no record."""
    quoter = tpm_a.quoter()
    _, ids = quote_all(producer, quoter, 12)
    copy_path, db = _editable_copy(producer, tmp_path)
    if edit == "index_row":
        db.execute("UPDATE evidence_members SET leaf_index=9999 WHERE leaf_index>=0 AND record_seq="
                   "(SELECT seq FROM records WHERE record_id=?)", (ids[3],))
    else:
        db.execute("UPDATE evidence SET body=CAST('{}' AS BLOB) WHERE eid=(SELECT max(eid) FROM evidence)")
    db.close()
    with Ledger(copy_path, readonly=True) as ledger:
        with pytest.raises(LedgerCorruptError):
            ledger.get(ids[3])
    trust = [quoter.identity.public_pem.encode()]
    report = verify_ledger(copy_path, evidence=True, evidence_trust=trust)
    assert len(report.records) == 13 and "ledger_unreadable" not in {f.code for f in report.findings}
    unreadable = {r.record_id for r in report.records if r.evidence == "unreadable"}
    assert ids[3] in unreadable and all(not r.ok for r in report.records if r.record_id in unreadable)
    if edit == "index_row":
        assert unreadable == {ids[3]} and report.counts()["evidence:verified-software-tpm"] == 12


TYPE_EDITS = {
    "slot body to an integer": "UPDATE evidence SET body=5 WHERE record_id=:solo",
    "slot body to text": "UPDATE evidence SET body=CAST(body AS TEXT) WHERE record_id=:solo",
    "batch body to text": "UPDATE evidence SET body=CAST(body AS TEXT) WHERE eid=(SELECT eid FROM evidence_members "
                          "WHERE leaf_index>=0 AND record_seq=(SELECT seq FROM records WHERE record_id=:batched))",
    "leaf_index to text": "UPDATE evidence_members SET leaf_index='three' WHERE leaf_index>=0 AND "
                          "record_seq=(SELECT seq FROM records WHERE record_id=:batched)",
    "leaf_index to a real": "UPDATE evidence_members SET leaf_index=1.5 WHERE leaf_index>=0 AND "
                            "record_seq=(SELECT seq FROM records WHERE record_id=:batched)",
}


@pytest.mark.parametrize("edit", list(TYPE_EDITS))
def test_an_evidence_row_edited_to_another_type_fails_only_its_records(producer: Producer, tpm_a: AttestTPM,
                                                                      tmp_path: Path, edit: str) -> None:
    """An evidence row edited at the SQL level to another type (an integer or
    text body, a text or real leaf_index) let a TypeError out of the ledger's
    readers, and verify_ledger reported the whole file ledger_unreadable with
    no record. Now the records that row gives a state are evidence
    'unreadable' (an error), the chain check names the row, and every other
    record is still verified; a text body holding the very JSON that was
    written is refused too, never read as good."""
    import capseal.attest as attest

    quoter = tpm_a.quoter()
    _, ids = quote_all(producer, quoter, 6)
    solo = attest.quote(producer.seal(spec(50)), quoter, ledger=producer.ledger).capsule_id  # a slot row of its own
    copy_path, db = _editable_copy(producer, tmp_path)
    if edit.startswith("batch"):  # every record of the batch the row holds
        touched = {rid for (rid,) in db.execute(
            "SELECT r.record_id FROM records r JOIN evidence_members m ON m.record_seq = r.seq WHERE m.eid = (SELECT eid "
            "FROM evidence_members WHERE leaf_index>=0 AND record_seq=(SELECT seq FROM records WHERE record_id=?))",
            (ids[3],))}
    else:
        touched = {solo if edit.startswith("slot") else ids[3]}
    assert db.execute(TYPE_EDITS[edit], {"solo": solo, "batched": ids[3]}).rowcount == 1
    db.close()
    with Ledger(copy_path, readonly=True) as ledger:
        for cid in touched:
            with pytest.raises(LedgerCorruptError, match="damaged|not an integer"):
                ledger.get(cid)
        if "body" in edit:
            assert any("damaged row" in problem and "not a blob" in problem for problem in ledger.check_chain())
            with pytest.raises(LedgerCorruptError, match="not a blob"):
                list(ledger.records())
    report = verify_ledger(copy_path, evidence=True, evidence_trust=[quoter.identity.public_pem])
    assert "ledger_unreadable" not in {f.code for f in report.findings} and not report.ok
    assert "ledger_chain_broken" in {f.code for f in report.findings}
    assert len(report.records) == 8  # the epoch boundary, 6 batched, the solo one
    by_id = {r.record_id: r for r in report.records}
    for cid in touched:
        assert by_id[cid].evidence == "unreadable" and not by_id[cid].ok
        assert "evidence_unreadable" in {f.code for f in by_id[cid].findings}
    assert {r.evidence for r in report.records if r.record_id not in touched} == {"verified-software-tpm"}
    assert all(r.ok for r in report.records if r.record_id not in touched)


def test_binding_hex_is_digits_only(producer: Producer, tpm_a: AttestTPM) -> None:
    """bytes.fromhex skips whitespace: a root or proof hash with a space
    inside read as the same bytes and the slot verified."""
    quoter = tpm_a.quoter()
    _, ids = quote_all(producer, quoter, 4)
    trust = [quoter.identity.public_pem]
    record = producer.ledger.get(ids[1])
    assert record is not None and record.hardware_evidence is not None
    assert verify_evidence(record, trust=trust).ok
    for member in ("merkle_root", "inclusion_proof"):
        ev = copy.deepcopy(record.hardware_evidence)
        binding = ev["binding"]
        if member == "merkle_root":
            binding["merkle_root"] = binding["merkle_root"][:2] + " " + binding["merkle_root"][2:]
        else:
            binding["inclusion_proof"][0] = binding["inclusion_proof"][0][:2] + " " + binding["inclusion_proof"][0][2:]
        assert verify_evidence(record.with_evidence(ev), trust=trust).status == "evidence_malformed", member


def test_inclusion_proof_for_another_leaf_is_caught(producer: Producer, tpm_a: AttestTPM) -> None:
    quoter = tpm_a.quoter()
    worker = BatchEvidence(producer.ledger, quoter, max_records=1000, max_delay=60)
    producer.add_observer(worker.observe)
    ids = [producer.submit(spec(i)).capsule_id for i in range(10)]
    producer.flush()
    assert worker.flush(30)  # one batch: the flush closes it early
    worker.close()
    trust = [quoter.identity.public_pem]
    records = [producer.ledger.get(i) for i in ids]
    assert all(r is not None and r.hardware_evidence is not None for r in records)
    r3, r4 = records[3], records[4]
    assert r3 is not None and r4 is not None and r3.hardware_evidence is not None
    assert r3.hardware_evidence["binding"]["merkle_root"] == r4.hardware_evidence["binding"]["merkle_root"]  # type: ignore[index]
    # record 4 presenting record 3's proof: same quote, same root, wrong leaf
    stolen = r4.with_evidence(r3.hardware_evidence)
    result = verify_evidence(stolen, trust=trust)
    assert result.status == "evidence_inclusion_invalid" and result.codes().count("evidence_signature_invalid") == 0
    # a proof edited to another index, or a proof hash changed, is caught the same way
    ev = copy.deepcopy(r4.hardware_evidence)
    assert ev is not None
    ev["binding"]["leaf_index"] = (ev["binding"]["leaf_index"] + 1) % ev["binding"]["tree_size"]  # leaves are sorted by id
    assert verify_evidence(r4.with_evidence(ev), trust=trust).status == "evidence_inclusion_invalid"
    ev = copy.deepcopy(r4.hardware_evidence)
    assert ev is not None
    ev["binding"]["inclusion_proof"][0] = "00" * 32
    assert verify_evidence(r4.with_evidence(ev), trust=trust).status == "evidence_inclusion_invalid"
    # a root that is not the quoted one
    ev = copy.deepcopy(r4.hardware_evidence)
    assert ev is not None
    ev["binding"]["merkle_root"] = "11" * 32
    assert "evidence_nonce_mismatch" in verify_evidence(r4.with_evidence(ev), trust=trust).codes()


def test_failed_quotes_leave_slots_null_and_claim_nothing(producer: Producer, tpm_a: AttestTPM) -> None:
    quoter = FailingQuoter(tpm_a.quoter())
    worker, ids = quote_all(producer, quoter, 20, max_records=8, max_delay=0.01)
    assert quoter.calls >= 3 and worker.stats.records_quoted == 0
    assert worker.stats.records_left_null == 21 and "simulated" in (worker.stats.last_error or "")
    for cid in [producer.epoch_record.capsule_id, *ids]:
        assert producer.ledger.evidence_history(cid) == [None]  # never {} or a partial slot
    assert list(producer.ledger.evidence_entries()) == []
    report = verify_ledger(producer.ledger.path, evidence=True, evidence_trust=[quoter.identity.public_pem.encode()])
    assert report.ok and report.counts()["evidence:no-evidence"] == 21  # missing, not negative, not hardware
    assert not any(f.code.startswith("evidence_") and f.severity == "error" for r in report.records for f in r.findings)


def test_close_without_drain_leaves_the_queue_null_never_half_written(producer: Producer, tpm_a: AttestTPM) -> None:
    gate = GateQuoter(tpm_a.quoter())
    worker = attach(producer, gate, max_records=1000, max_delay=0.0, cite_epoch=False)
    first = [producer.submit(spec(i)).capsule_id for i in range(5)]
    producer.flush()
    assert gate.entered.wait(30)  # a quote is in flight (the boundary's, or a batch's)
    later = [producer.submit(spec(100 + i)).capsule_id for i in range(50)]
    producer.flush()  # these are queued behind the quote in flight
    closer = threading.Thread(target=worker.close, kwargs={"drain": False})
    closer.start()
    while closer.is_alive() and not worker._discard:  # close(drain=False) has flagged the queue (its own flag)
        closer.join(0.01)
    gate.release.set()
    closer.join(30)
    assert not closer.is_alive()
    trust = [gate.identity.public_pem]
    all_ids = [producer.epoch_record.capsule_id, *first, *later]
    outcome = Counter(verify_evidence(producer.ledger.get(c), trust=trust).status for c in all_ids)
    assert set(outcome) <= {"verified-software-tpm", "no-evidence"}  # filled and verified, or null: nothing between
    assert all(producer.ledger.get(c).hardware_evidence is None for c in later)  # type: ignore[union-attr]
    assert worker.stats.records_left_null >= len(later)
    # records sealed after close are not queued: their slots stay null too
    late = producer.seal(spec(999))
    assert producer.ledger.get(late.capsule_id).hardware_evidence is None  # type: ignore[union-attr]


def test_close_says_whether_the_worker_ended(producer: Producer, tpm_a: AttestTPM) -> None:
    """close(timeout=...) returned None whether or not a quote was still under
    way, so a caller could close the ledger under a batch about to be written."""
    gate = GateQuoter(tpm_a.quoter())
    worker = attach(producer, gate, max_records=1000, max_delay=0.0, cite_epoch=False)
    producer.seal(spec(1))
    assert gate.entered.wait(30)  # a quote is in flight and held
    assert worker.close(timeout=0.2) is False
    gate.release.set()
    assert worker.close(timeout=30) is True
    assert worker.close() is True  # once ended, every later close() says so


def test_close_with_drain_quotes_everything_queued(producer: Producer, tpm_a: AttestTPM) -> None:
    gate = GateQuoter(tpm_a.quoter())
    worker = attach(producer, gate, max_records=16, max_delay=60)
    ids = [producer.submit(spec(i)).capsule_id for i in range(40)]
    producer.flush()
    assert gate.entered.wait(30)
    closer = threading.Thread(target=worker.close)  # drain=True
    closer.start()
    gate.release.set()
    closer.join(60)
    assert not closer.is_alive()
    trust = [gate.identity.public_pem]
    assert statuses(producer, trust) == {"verified-software-tpm": 41}
    assert worker.stats.largest_batch <= 16
    assert all(producer.ledger.get(c).hardware_evidence["binding"]["tree_size"] <= 16 for c in ids)  # type: ignore[index,union-attr]


def test_batches_close_by_time_without_a_flush(producer: Producer, tpm_a: AttestTPM) -> None:
    quoter = tpm_a.quoter()
    landed = threading.Event()
    seen: list[str] = []

    def on_batch(ids: list[str], _t: float) -> None:
        seen.extend(ids)
        if len(seen) >= 13:
            landed.set()

    worker = attach(producer, quoter, max_records=10_000, max_delay=0.02, on_batch=on_batch)
    ids = [producer.seal(spec(i)).capsule_id for i in range(12)]
    assert landed.wait(30)  # the time limit closed the batches; nobody called flush
    worker.close()
    assert set(ids) <= set(seen)


def test_epoch_rotation_gets_a_new_platform_quote(producer: Producer, tpm_a: AttestTPM) -> None:
    quoter = tpm_a.quoter()
    worker = attach(producer, quoter, max_records=100, max_delay=0.01)
    producer.seal(spec(1))
    first_boundary = producer.epoch_record.capsule_id
    producer.rotate_epoch()
    record = producer.seal(spec(2))
    producer.flush()
    assert worker.flush(30)
    worker.close()
    second_boundary = producer.epoch_record.capsule_id
    assert first_boundary != second_boundary and worker.stats.solo_quoted == 2
    for b in (first_boundary, second_boundary):
        ev = producer.ledger.get(b).hardware_evidence  # type: ignore[union-attr]
        assert ev is not None and ev["binding"] == {"capsule_id": b}
    digests = [r["digest"] for r in record.capsule["references"] if r["citation_purpose"] == "ran_under"]
    assert digests == [second_boundary]


def test_attach_after_the_epoch_opened_still_quotes_the_boundary(producer: Producer, tpm_a: AttestTPM) -> None:
    producer.seal(spec(1))  # the boundary lands with this record, before evidence is attached
    worker = attach(producer, tpm_a.quoter(), max_records=100, max_delay=0.01)
    assert worker.flush(30)
    worker.close()
    ev = producer.ledger.get(producer.epoch_record.capsule_id).hardware_evidence  # type: ignore[union-attr]
    assert ev is not None and ev["binding"]["capsule_id"] == producer.epoch_record.capsule_id


def test_a_boundary_still_in_its_commit_window_is_quoted_once(tmp_path: Path, tpm_a: AttestTPM) -> None:
    """attach() while the boundary is queued but not yet committed: the commit
    reports it to the worker, and attach() reads it back from the ledger too;
    it gets one quote, not two."""
    ledger = Ledger(tmp_path / "l.db", group_window=0.5)  # a wide window: attach() lands inside it
    with Producer("acme.example", "buyer-agent@1.4", UnsafeEphemeralSigner(), ledger) as p:
        p.submit(spec(1))
        worker = attach(p, tpm_a.quoter(), max_records=100, max_delay=0.01)
        assert worker.flush(30)
        worker.close()
        assert worker.stats.solo_quoted == 1
        history = p.ledger.evidence_history(p.epoch_record.capsule_id)
        assert len(history) == 2 and history[0] is None and history[1] is not None  # sealed null, then one quote
    ledger.close()


def test_a_tpm_that_goes_away_and_comes_back(tmp_path: Path) -> None:
    """swtpm stopped mid-run: its batches stay null; after a restart (same
    state, same port) later batches get evidence again, over a reconnect."""
    from capseal.attest import TPMQuoter
    from capseal.keys.tpm import get_device

    tpm = _start_swtpm(tmp_path / "swtpm")
    try:
        persist_key(tpm.tcti, AK_HANDLE)
        quoter = TPMQuoter(f"tpm2:handle=0x{AK_HANDLE:08x}?tcti={tpm.tcti}")
        with Producer("acme.example", "agent@1", UnsafeEphemeralSigner(), tmp_path / "l.db") as producer:
            worker = attach(producer, quoter, max_records=100, max_delay=0.01)
            before = [producer.seal(spec(i)).capsule_id for i in range(5)]
            assert worker.flush(30)
            tpm.stop()
            during = [producer.seal(spec(100 + i)).capsule_id for i in range(5)]
            assert worker.flush(30)
            tpm.start()
            after = [producer.seal(spec(200 + i)).capsule_id for i in range(5)]
            assert worker.flush(30)
            worker.close()
            trust = [quoter.identity.public_pem]
            got = {c: verify_evidence(producer.ledger.get(c), trust=trust).status for c in before + during + after}
            assert all(got[c] == "verified-software-tpm" for c in before + after), got
            assert all(got[c] == "no-evidence" for c in during), got
            assert worker.stats.failed_batches >= 1
    finally:
        get_device(tpm.tcti).close()
        tpm.stop()



def test_a_hung_tpm_fails_its_batches_typed_then_quotes_again(tmp_path: Path) -> None:
    """A TPM that stops answering (swtpm held with SIGSTOP) blocked TPM2_Quote
    for ever: no error, and the worker's close() never returned. Now a quote
    waits ``timeout`` seconds, its batch is counted failed with an error
    naming the TPM, and quotes resume once the TPM answers again."""
    import os
    import signal

    from capseal.attest import TPMQuoter
    from capseal.keys.tpm import get_device

    tpm = _start_swtpm(tmp_path / "swtpm")
    try:
        persist_key(tpm.tcti, AK_HANDLE)
        # long enough for a quote on a loaded machine once the TPM answers again (and for the
        # commands queued behind the hung one), short enough to give the hung one up
        quoter = TPMQuoter(f"tpm2:handle=0x{AK_HANDLE:08x}?tcti={tpm.tcti}", timeout=6)
        with Producer("acme.example", "agent@1", UnsafeEphemeralSigner(), tmp_path / "l.db") as producer:
            worker = attach(producer, quoter, max_records=100, max_delay=0.01)
            assert worker.flush(30)
            os.kill(tpm.pid, signal.SIGSTOP)
            try:
                during = [producer.seal(spec(100 + i)).capsule_id for i in range(3)]
                assert worker.flush(60)  # returns: the hung quote was given up
                assert worker.stats.failed_batches >= 1
                assert tpm.tcti in (worker.stats.last_error or ""), worker.stats.last_error
            finally:
                os.kill(tpm.pid, signal.SIGCONT)
            after = [producer.seal(spec(200 + i)).capsule_id for i in range(3)]
            assert worker.flush(60)
            worker.close()
            trust = [quoter.identity.public_pem]
            got = {c: verify_evidence(producer.ledger.get(c), trust=trust).status for c in during + after}
            assert all(got[c] == "no-evidence" for c in during), got
            assert all(got[c] == "verified-software-tpm" for c in after), got
    finally:
        get_device(tpm.tcti).close()
        tpm.stop()
