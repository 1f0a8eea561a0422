"""The Producer: lifecycle chains, derived assurance, epochs, custody, citing."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import agent_action_capsule as ref
import pytest

import capseal
from capseal import Ledger, Producer
from capseal.errors import AssuranceMismatchError, CapsuleValidationError, DuplicateRecordError, InputError, LedgerError
from capseal.keys import UnsafeEphemeralSigner


@pytest.fixture()
def producer(tmp_path: Path):
    with Producer("acme", "buyer-agent@1.4", UnsafeEphemeralSigner(), tmp_path / "l.db") as p:
        yield p


def test_lifecycle_relations_and_digests(producer: Producer) -> None:
    order = {"sku": "A-1", "qty": 2}
    planned = producer.planned("po-1", effect_type="write_order", request=order, irreversibility_class="one_way_recoverable")
    assert planned.capsule["effect"] == {"status": "planned", "type": "write_order", "irreversibility_class": "one_way_recoverable"}
    assert "chain" not in planned.capsule  # a flow's first capsule stands alone
    dispatched = producer.dispatched(planned)
    assert dispatched.capsule["chain"] == {"parent_capsule_id": planned.capsule_id, "relation": "follows"}
    assert dispatched.capsule["effect"]["request_digest"] == capseal.json_digest(order)
    assert dispatched.capsule["effect"]["effect_attestation"] == "runtime_claimed"  # the honest default
    confirmed = producer.confirmed(dispatched, response={"id": "O-1"}, effect_attestation="gate_executed")
    assert confirmed.capsule["chain"]["relation"] == "confirms"
    assert confirmed.capsule["effect"]["response_digest"] == capseal.json_digest({"id": "O-1"})
    assert confirmed.capsule["assurance"] == {"attestation_mode": "self_attested", "effect_mode": "confirmed", "ledger_mode": "chained"}
    assert [r.capsule["action_id"] for r in (planned, dispatched, confirmed)] == ["po-1", "po-1/dispatched", "po-1/confirmed"]
    failed_plan = producer.planned("po-2", effect_type="send_payment")
    failed = producer.failed(producer.dispatched(failed_plan), response={"error": "card declined"})
    assert failed.capsule["assurance"]["effect_mode"] == "dispatched_unconfirmed"
    assert failed.capsule["disposition"]["verdict_class"] == "errored"
    assert failed.capsule["chain"]["relation"] == "follows"


def test_refusal_and_resolution(producer: Producer) -> None:
    planned = producer.planned("pay-1", effect_type="send_payment")
    blocked = producer.refused(planned, verdict_class="blocked", reason={"limit": "exceeded"})
    assert blocked.capsule["disposition"]["reason_digest"] == capseal.json_digest({"limit": "exceeded"})
    assert "effect" not in blocked.capsule and blocked.capsule["assurance"]["effect_mode"] == "not_applicable"
    resolved = producer.resolved(blocked, decision="accept", approver="human")
    assert resolved.capsule["chain"] == {"parent_capsule_id": blocked.capsule_id, "relation": "supersedes"}
    assert resolved.capsule["disposition"] == {"decision": "accept", "approver": "human", "human_disposed": True, "verdict_class": "resolved"}
    with pytest.raises(InputError, match="needs action_id"):
        producer.refused(verdict_class="denied")


def test_confirmed_requires_the_response(producer: Producer) -> None:
    planned = producer.planned("p", effect_type="write_order")
    with pytest.raises(InputError, match="response actually received"):
        producer.confirmed(planned, response=None)


def test_verify_given_the_sealed_record_says_to_pass_its_capsule(producer: Producer) -> None:
    """capseal.verify(record) with what seal() returns is the first call a
    newcomer makes; its finding said only "a capsule is a JSON object", which
    reads as if the sealed record were bad. It now names the type and where
    the capsule is (still not ok: verify() checks a capsule, never raising)."""
    record = producer.seal({"action_id": "v", "action_type": "fyi"})
    result = capseal.verify(record)
    assert not result.ok and [f.code for f in result.findings] == ["not_an_object"]
    assert result.findings[0].detail == "a capsule is a JSON object, not a SealedRecord; verify record.capsule"
    assert capseal.verify([1]).findings[0].detail == "a capsule is a JSON object, not a list"
    assert capseal.verify(record.capsule).ok


def test_assurance_is_derived_never_accepted(producer: Producer) -> None:
    derived = {"attestation_mode": "self_attested", "effect_mode": "not_applicable", "ledger_mode": "standalone"}
    record = producer.seal({"action_id": "same", "action_type": "fyi", "assurance": derived})  # equal: accepted
    assert record.capsule["assurance"] == derived
    with pytest.raises(AssuranceMismatchError):  # lower-but-different is refused too: leave it out
        producer.seal({"action_id": "x", "action_type": "fyi", "effect": {"status": "dispatched", "effect_attestation": "runtime_claimed"},
                       "assurance": {**derived, "effect_mode": "not_applicable"}})


def test_producer_owned_members(producer: Producer) -> None:
    for spec in ({"capsule_id": "0" * 64}, {"timestamp": "2026-01-01T00:00:00Z"}, {"operator": "other"},
                 {"epoch_id": "epoch-old"}, {"signature": "00"}):
        with pytest.raises(InputError):
            producer.seal({"action_id": "o", "action_type": "fyi", **spec})


def test_epoch_boundary_custody_and_rotation(tmp_path: Path) -> None:
    signer = UnsafeEphemeralSigner()
    path = tmp_path / "l.db"
    with Producer("acme", "agent@1", signer, path, model_id="m-1", provider="p") as producer:
        first = producer.seal({"action_id": "a", "action_type": "fyi"})
        boundary = producer.epoch_record.capsule
        assert boundary["disposition"]["verdict_class"] == "epoch_boundary" and boundary["action_type"] == "fyi"
        assert "chain" not in boundary  # the first epoch of this stream
        custody = boundary["model_attestation"]["compute_attestation"]["x-capseal-key-custody"]
        assert custody["kid"] == signer.kid and custody["software_device"] is True and custody["key_store"] == "memory"
        assert boundary["model_attestation"]["model_id"] == "m-1"
        assert first.capsule["epoch_id"] == boundary["epoch_id"]
        old = producer.epoch_record
        new = producer.rotate_epoch()
        second = producer.seal({"action_id": "b", "action_type": "fyi"})
        assert new.capsule["chain"] == {"parent_capsule_id": old.capsule_id, "relation": "epoch_opens"}
        assert second.capsule["epoch_id"] == new.capsule["epoch_id"] != first.capsule["epoch_id"]
    with Producer("acme", "agent@1", UnsafeEphemeralSigner(), path) as again:  # a new process: a new epoch
        again.seal({"action_id": "c", "action_type": "fyi"})
        assert again.epoch_record.capsule["chain"]["parent_capsule_id"] == new.capsule_id
    assert capseal.verify_ledger(path).ok


def test_cite_epoch_adds_ran_under(tmp_path: Path) -> None:
    with Producer("acme", "agent@1", UnsafeEphemeralSigner(), tmp_path / "l.db", cite_epoch=True) as producer:
        record = producer.seal({"action_id": "a", "action_type": "fyi"})
        assert record.capsule["references"] == [{"type": "agent-action-capsule", "digest_alg": "SHA-256",
                                                 "digest": producer.epoch_record.capsule_id, "citation_purpose": "ran_under"}]
        assert "references" not in producer.epoch_record.capsule
        assert ref.verify(record.capsule).ok


def test_observers_see_durable_records(tmp_path: Path) -> None:
    seen: list[str] = []
    with Producer("acme", "agent@1", UnsafeEphemeralSigner(), tmp_path / "l.db") as producer:
        producer.add_observer(lambda r: seen.append(r.capsule_id))
        producer.add_observer(lambda r: 1 / 0)  # a failing observer never undoes a seal
        a = producer.seal({"action_id": "a", "action_type": "fyi"})
        b = producer.submit({"action_id": "b", "action_type": "fyi"}).result()
    assert seen == [producer.epoch_record.capsule_id, a.capsule_id, b.capsule_id]


@pytest.mark.parametrize("with_record_observer", [False, True])  # alone, and beside a record observer
def test_id_observers_see_id_seq_and_the_epoch_boundary(tmp_path: Path, with_record_observer: bool) -> None:
    def failing(cid: str, seq: int, boundary: bool) -> None:
        raise RuntimeError("a failing observer never undoes a seal")

    seen: list[tuple[str, int, bool]] = []
    records: list[str] = []
    with Producer("acme", "agent@1", UnsafeEphemeralSigner(), tmp_path / "l.db") as producer:
        producer.add_id_observer(lambda cid, seq, boundary: seen.append((cid, seq, boundary)))
        producer.add_id_observer(failing)
        if with_record_observer:
            producer.add_observer(lambda r: records.append(r.capsule_id))
        a = producer.seal({"action_id": "a", "action_type": "fyi"})
        b = producer.submit({"action_id": "b", "action_type": "fyi"}).result()
        first = producer.epoch_record.capsule_id
        boundary = producer.rotate_epoch()
        c = producer.seal({"action_id": "c", "action_type": "fyi"})
    assert seen == [(first, 1, True), (a.capsule_id, 2, False), (b.capsule_id, 3, False),
                    (boundary.capsule_id, 4, True), (c.capsule_id, 5, False)]
    assert records == ([cid for cid, _, _ in seen] if with_record_observer else [])


def test_id_observers_on_a_shared_ledger_see_only_their_producer(tmp_path: Path) -> None:
    seen: dict[str, list[str]] = {"a": [], "b": [], "a2": []}
    with Ledger(tmp_path / "shared.db") as ledger:
        ledger.add_commit_listener(lambda entries: 1 / 0)  # a failing listener never undoes a commit
        a = Producer("acme", "agent-a@1", UnsafeEphemeralSigner(), ledger)
        b = Producer("acme", "agent-b@1", UnsafeEphemeralSigner(), ledger)
        a.add_id_observer(lambda cid, seq, boundary: seen["a"].append(cid))
        b.add_id_observer(lambda cid, seq, boundary: seen["b"].append(cid))
        ra = a.seal({"action_id": "a-1", "action_type": "fyi"})
        rb = b.seal({"action_id": "b-1", "action_type": "fyi"})
        a.close()  # stops listening; a later producer of the same stream is not reported to it
        a2 = Producer("acme", "agent-a@1", UnsafeEphemeralSigner(), ledger)
        a2.add_id_observer(lambda cid, seq, boundary: seen["a2"].append(cid))
        ra2 = a2.seal({"action_id": "a-2", "action_type": "fyi"})
        b.close()
        a2.close()
        assert ledger.count() == 6
    assert seen == {"a": [a.epoch_record.capsule_id, ra.capsule_id], "b": [b.epoch_record.capsule_id, rb.capsule_id],
                    "a2": [a2.epoch_record.capsule_id, ra2.capsule_id]}


def test_submit_refuses_before_queueing(tmp_path: Path) -> None:
    with Producer("acme", "agent@1", UnsafeEphemeralSigner(), tmp_path / "l.db") as producer:
        with pytest.raises(capseal.errors.FloatInDigestError):
            producer.submit({"action_id": "f", "action_type": "fyi", "x-v": 1.5})
        ok = producer.submit({"action_id": "g", "action_type": "fyi"})
        dup = producer.submit({"action_id": "g", "action_type": "fyi"})
        producer.flush()
        assert ok.result().seq is not None
        with pytest.raises(DuplicateRecordError):
            dup.result()
        assert producer.ledger.count() == 2


def test_ledger_records_read_back_equal(tmp_path: Path) -> None:
    with Producer("acme", "agent@1", UnsafeEphemeralSigner(), tmp_path / "l.db") as producer:
        sealed = producer.seal({"action_id": "a", "action_type": "fyi"})
        stored = producer.ledger.get(sealed.capsule_id)
        assert stored is not None and stored.capsule == sealed.capsule and stored.envelopes == sealed.envelopes
        entry = producer.ledger.entry(sealed.capsule_id)
        assert entry is not None
        header = entry.header()
        assert header["record_type"] == "capsule" and header["epistemic_type"] == "producer_claim"
        assert len(bytes.fromhex(header["nonce"])) == 16  # 128 bits of fresh randomness per record


@pytest.mark.parametrize("how", ["seal", "submit"])
def test_an_observer_that_waits_for_a_commit_is_refused_not_hung(tmp_path: Path, how: str) -> None:
    """Observers run inside the commit that made their record durable. One
    that calls close(), seal() or flush() there would wait on that very
    commit (it used to hang for ever): it gets LedgerError instead, nothing
    is closed under it, and the producer goes on and closes normally."""
    import threading

    from capseal.errors import LedgerError

    seen: list[BaseException] = []

    def observer(record: capseal.SealedRecord) -> None:
        if record.capsule["action_id"] != "trigger":
            return
        for call in (sealer.close, lambda: sealer.seal({"action_id": "inner", "action_type": "fyi"}), sealer.flush):
            try:
                call()
            except BaseException as exc:  # noqa: BLE001 - the test reads it
                seen.append(exc)

    sealer = Producer("acme", "agent@1", UnsafeEphemeralSigner("EdDSA"), tmp_path / "l.db")
    sealer.add_observer(observer)
    worker = threading.Thread(
        target=lambda: getattr(sealer, how)({"action_id": "trigger", "action_type": "fyi"}), daemon=True)
    worker.start()
    worker.join(10)
    assert not worker.is_alive()
    sealer.flush()
    assert [type(e) for e in seen] == [LedgerError] * 3
    assert all("from inside a commit" in str(e) for e in seen)
    after = sealer.seal({"action_id": "after", "action_type": "fyi"})
    sealer.close()
    with Ledger(tmp_path / "l.db") as ledger:
        # the epoch boundary, the trigger and the record after: the refused seal() wrote nothing
        assert [e.action_id for e in ledger.entries()][1:] == ["trigger", "after"] and after.seq == 3


def test_an_observer_may_read_a_durable_record_and_close_another_producer(tmp_path: Path) -> None:
    """What waits for nothing stays allowed inside a commit: ``result()`` of
    a record already durable, and closing a producer that shares the ledger
    (it owns no ledger and has no id observers, so its close() waits for no
    commit)."""
    with Ledger(tmp_path / "l.db") as ledger:
        watcher = Producer("acme", "watcher@1", UnsafeEphemeralSigner("EdDSA"), ledger)
        agent = Producer("acme", "agent@1", UnsafeEphemeralSigner("EdDSA"), ledger)
        first = watcher.submit({"action_id": "first", "action_type": "fyi"})
        first_seq = first.result().seq
        seen: list[Any] = []

        def observer(record: capseal.SealedRecord) -> None:
            if record.capsule["action_id"] == "second":
                seen.append(first.result().seq)
                agent.close()
                seen.append("agent closed")

        watcher.add_observer(observer)
        watcher.seal({"action_id": "second", "action_type": "fyi"})
        assert seen == [first_seq, "agent closed"]
        watcher.close()


def test_a_commit_listener_that_writes_to_the_ledger_is_refused_before_anything_is_queued(tmp_path: Path) -> None:
    """A commit listener runs inside the commit: an append() or an evidence
    write there would wait on it (an evidence write used to hang for ever).
    Each is refused with LedgerError, and nothing is written for it."""
    import threading

    from capseal.errors import LedgerError
    from capseal.ledger import LedgerEntry

    ledger = Ledger(tmp_path / "l.db")
    seen: list[BaseException] = []

    def listener(entries: list[Any]) -> None:
        if any(e.record_id == "trigger" for e in entries):
            for write in (lambda: ledger.append(LedgerEntry("follow-up", "note", "producer_claim", b"{}")),
                          lambda: ledger.add_evidence("trigger", {"kind": "x-test"})):
                try:
                    write()
                except BaseException as exc:  # noqa: BLE001 - the test reads it
                    seen.append(exc)

    ledger.add_commit_listener(listener)
    writer = threading.Thread(target=ledger.append, args=(LedgerEntry("trigger", "note", "producer_claim", b"{}"),),
                              daemon=True)
    writer.start()
    writer.join(10)
    assert not writer.is_alive()
    assert [type(e) for e in seen] == [LedgerError, LedgerError]
    assert "append() from inside a commit" in str(seen[0]) and "writing evidence from inside a commit" in str(seen[1])
    ledger.flush()
    assert [e.record_id for e in ledger.entries()] == ["trigger"]
    assert list(ledger.evidence_entries()) == []
    ledger.close()


class _GatedSigner(UnsafeEphemeralSigner):
    """A software key that goes through the device pipeline (``external_device``)
    and signs only once ``release`` is set: it holds a submitted record between
    ``submit()`` and its assembly, where a caller's later change would land."""

    external_device = True

    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()
        self.release.set()

    def sign(self, data: bytes) -> Any:
        assert self.release.wait(10), "never released"
        return super().sign(data)


def _order(i: int) -> dict[str, Any]:
    return {"action_id": f"order-{i}", "action_type": "decide",
            "effect": {"status": "confirmed", "type": "write_order", "request_digest": "a" * 64,
                       "response_digest": "b" * 64, "effect_attestation": "gate_executed"}}


def test_a_spec_changed_after_submit_or_seal_changes_nothing_sealed(tmp_path: Path) -> None:
    """The producer seals its own copy: a nested object of the caller's spec
    changed after submit() (record still on its way) or after seal() (through
    the returned record) must not reach the stored body, which would no longer
    hash to its signed capsule_id."""
    signer = _GatedSigner()
    path = tmp_path / "l.db"
    with Producer("acme", "agent@1", signer, path) as p:
        signer.release.clear()
        spec = _order(1)
        pending = p.submit(spec)
        spec["effect"]["response_digest"] = "f" * 64  # the caller reuses its dict
        spec["effect"]["type"] = "send_payment"
        signer.release.set()
        record = pending.result()
        assert record.capsule["effect"]["response_digest"] == "b" * 64
        assert record.capsule["effect"]["type"] == "write_order"
        sealed_spec = _order(2)
        sealed_spec["constraints"] = ({"id": "com.example.c", "check_type": "com.example.t", "result": "pass",
                                   "severity": "low", "blocking": False},)
        sealed = p.seal(sealed_spec)
        sealed_spec["effect"]["response_digest"] = "e" * 64
        assert capseal.verify(sealed.capsule).ok  # the returned capsule is the producer's, not the caller's
        assert isinstance(sealed.capsule["constraints"], list)  # a tuple becomes the list a verifier reads
        assert ref.verify(sealed.capsule).ok
    report = capseal.verify_ledger(path)
    assert report.ok, [(r.seq, [f.code for f in r.findings]) for r in report.records if not r.ok]


def test_what_only_the_producer_writes_is_refused_in_a_spec(producer: Producer) -> None:
    before = producer.ledger.count()
    custody = {"model_attestation": {"compute_attestation": {
        "x-capseal-key-custody": {"backend": "pkcs11", "software_device": False}}}}
    with pytest.raises(InputError, match="x-capseal-key-custody"):
        producer.seal({"action_id": "forged-custody", "action_type": "fyi", **custody})
    with pytest.raises(InputError, match="epoch_boundary"):
        producer.seal({"action_id": "forged-epoch", "action_type": "fyi", "disposition": {
            "decision": "accept", "approver": "policy", "human_disposed": False, "verdict_class": "epoch_boundary"}})
    assert producer.ledger.count() == before


def test_a_capsule_that_says_it_opens_an_epoch_is_refused_from_a_caller(producer: Producer) -> None:
    """``chain.relation: epoch_opens`` was sealed from a caller's spec (and from
    ``seal(relation="epoch_opens")``) on a capsule of an epoch the producer's
    boundary had already opened: two capsules each saying they open it. Only
    ``rotate_epoch()`` writes the relation now; every way in is refused before
    anything is signed or written."""
    first = producer.seal({"action_id": "before", "action_type": "fyi"})
    before = producer.ledger.count()
    chained = {"action_id": "opens", "action_type": "fyi",
               "chain": {"parent_capsule_id": first.capsule_id, "relation": "epoch_opens"}}
    calls = [lambda: producer.seal(chained), lambda: producer.check(chained),
             lambda: producer.seal({"action_id": "opens-2", "action_type": "fyi"}, parent=first, relation="epoch_opens"),
             lambda: producer.submit({"action_id": "opens-3", "action_type": "fyi"}, parent=first, relation="epoch_opens")]
    for call in calls:
        with pytest.raises(InputError, match="chain.relation 'epoch_opens' is written by the producer"):
            call()
    producer.flush()
    assert producer.ledger.count() == before
    boundary = producer.epoch_record
    opened = producer.rotate_epoch()  # the producer's own boundary still carries it
    assert opened.capsule["chain"] == {"parent_capsule_id": boundary.capsule_id, "relation": "epoch_opens"}


def test_an_epoch_id_is_never_reused(tmp_path: Path) -> None:
    path = tmp_path / "l.db"
    with Producer("acme", "agent@1", UnsafeEphemeralSigner(), path, epoch_id="e1") as first:
        first.seal({"action_id": "x", "action_type": "fyi"})
        with pytest.raises(InputError, match="'e1' was opened before"):
            first.rotate_epoch("e1")
        assert first.epoch_id == "e1"  # the refused rotation left the open epoch open
        first.seal({"action_id": "x2", "action_type": "fyi"})
    with pytest.raises(InputError, match="'e1' was opened before"):
        Producer("acme", "agent@1", UnsafeEphemeralSigner(), path, epoch_id="e1")
    with Ledger(path) as ledger:
        assert ledger.count() == 3
    assert capseal.verify_ledger(path).ok


def test_a_refused_first_record_writes_no_epoch_boundary(tmp_path: Path) -> None:
    """The boundary goes in only with the epoch's first record: a refused one
    (a duplicate action id) leaves the ledger as it was, and the next record
    carries the boundary."""
    path = tmp_path / "l.db"
    with Producer("acme", "agent@1", UnsafeEphemeralSigner(), path) as first:
        first.seal({"action_id": "dup", "action_type": "fyi"})
    before = path.read_bytes()
    with Producer("acme", "agent@1", UnsafeEphemeralSigner(), path) as second:
        with pytest.raises(DuplicateRecordError, match="dup"):
            second.seal({"action_id": "dup", "action_type": "fyi"})
        with pytest.raises(DuplicateRecordError, match="dup"):
            second.submit({"action_id": "dup", "action_type": "fyi"})
        with Ledger(path) as ledger:
            assert ledger.count() == 2
        record = second.seal({"action_id": "fresh", "action_type": "fyi"})
        boundary = second.epoch_record
    assert before  # the file existed with two rows
    with Ledger(path) as ledger:
        assert ledger.count() == 4
        assert ledger.entry(boundary.capsule_id) is not None and ledger.entry(record.capsule_id) is not None
    assert capseal.verify_ledger(path).ok


def test_a_chain_parent_must_be_in_the_ledger(producer: Producer) -> None:
    before = producer.ledger.count()
    with pytest.raises(InputError, match="not in l.db"):
        producer.seal({"action_id": "orphan", "action_type": "fyi"}, parent="ab" * 32)
    with pytest.raises(InputError, match="not in l.db"):
        producer.submit({"action_id": "orphan", "action_type": "fyi", "chain": {"parent_capsule_id": "cd" * 32,
                                                                                "relation": "follows"}})
    assert producer.ledger.count() == before
    parent = producer.submit({"action_id": "p", "action_type": "fyi"})  # submitted, maybe not yet durable
    child = producer.submit({"action_id": "c", "action_type": "fyi"}, parent=parent.capsule_id)
    assert child.result().capsule["chain"]["parent_capsule_id"] == parent.capsule_id
    first_boundary = producer.epoch_record.capsule_id  # the epoch's own boundary is always a known parent
    assert producer.seal({"action_id": "b", "action_type": "fyi"}, parent=first_boundary).capsule["chain"]


def test_resolved_needs_the_caller_to_say_who_approved(producer: Producer) -> None:
    deferred = producer.refused(action_id="d-1", verdict_class="deferred")
    with pytest.raises(TypeError, match="approver"):
        producer.resolved(deferred, decision="accept")  # type: ignore[call-arg]
    resolved = producer.resolved(deferred, decision="accept", approver="policy")
    assert resolved.capsule["disposition"]["human_disposed"] is False


def test_no_record_of_an_epoch_goes_in_before_its_boundary(tmp_path: Path) -> None:
    """Two producers share one ledger. The second one's first record
    duplicates a record the first has queued, so the (boundary, record) pair
    is refused in the commit. A record the second submitted meanwhile was
    queued behind that pair, needing it: it is refused with it (nothing
    written, a typed error), never written without its boundary; the next
    record carries the boundary."""
    # a window far longer than the test: "x" must still be queued when the second producer submits it
    with Ledger(tmp_path / "l.db", group_window=5.0) as ledger:
        first = Producer("op1", "dev1@1", UnsafeEphemeralSigner(), ledger)
        first.seal({"action_id": "warmup", "action_type": "fyi"})
        second = Producer("op2", "dev2@1", UnsafeEphemeralSigner(), ledger)
        queued = first.submit({"action_id": "x", "action_type": "fyi"})  # not durable yet
        duplicate = second.submit({"action_id": "x", "action_type": "fyi"})
        behind = second.submit({"action_id": "y", "action_type": "fyi"})
        queued.result()
        with pytest.raises(DuplicateRecordError):
            duplicate.result()
        with pytest.raises(LedgerError, match="was refused"):
            behind.result()
        assert ledger.entry(second.epoch_record.capsule_id) is None and ledger.entry(behind.capsule_id) is None
        later = second.seal({"action_id": "y", "action_type": "fyi"})
        boundary = ledger.entry(second.epoch_record.capsule_id)
        record = ledger.entry(later.capsule_id)
        assert boundary is not None and record is not None and boundary.seq < record.seq
        first.close()
        second.close()
    assert capseal.verify_ledger(tmp_path / "l.db").ok


def test_a_child_of_a_record_still_on_its_way(tmp_path: Path) -> None:
    """A chain to a record submitted but not yet durable is accepted without
    waiting (from an observer too, inside the commit), and keeps group commit;
    a child whose parent is refused is refused with it, nothing written."""
    path = tmp_path / "l.db"
    with Producer("acme", "agent@1", UnsafeEphemeralSigner(), path) as p:
        seen: list[str] = []

        def observer(record: capseal.SealedRecord) -> None:
            if record.capsule["action_id"] == "trigger":
                follow = p.submit({"action_id": "follow-up", "action_type": "fyi"})
                p.submit({"action_id": "follow-up-2", "action_type": "fyi"}, parent=follow.capsule_id)
                seen.append("submitted")

        p.add_observer(observer)
        p.seal({"action_id": "trigger", "action_type": "fyi"})
        p.flush()
        assert seen == ["submitted"]
        commits = p.ledger.stats.commits
        parents = [p.submit({"action_id": f"parent-{i}", "action_type": "fyi"}) for i in range(50)]
        children = [p.submit({"action_id": f"child-{i}", "action_type": "fyi"}, parent=parent.capsule_id)
                    for i, parent in enumerate(parents)]
        p.flush()
        assert all(c.result().capsule["chain"]["parent_capsule_id"] == parents[i].capsule_id
                   for i, c in enumerate(children))
        assert p.ledger.stats.commits - commits < 20  # grouped, not one commit per chained record
        count = p.ledger.count()
        refused_parent = p.submit({"action_id": "parent-0", "action_type": "fyi"})  # a duplicate: refused at commit
        orphan = p.submit({"action_id": "orphan", "action_type": "fyi"}, parent=refused_parent.capsule_id)
        with pytest.raises(DuplicateRecordError):
            refused_parent.result()
        with pytest.raises(LedgerError, match="was refused"):
            orphan.result()
        assert p.ledger.count() == count
    assert capseal.verify_ledger(path).ok


def test_two_producers_opening_one_epoch_id(tmp_path: Path) -> None:
    """Opened with the same epoch_id before either wrote: the second learns
    it when its boundary is refused, and every record it seals is then
    refused with a typed error saying to rotate the epoch; nothing written."""
    with Ledger(tmp_path / "l.db") as ledger:
        first = Producer("op", "dev1@1", UnsafeEphemeralSigner(), ledger, epoch_id="epoch-shared")
        second = Producer("op", "dev2@1", UnsafeEphemeralSigner(), ledger, epoch_id="epoch-shared")
        first.seal({"action_id": "a", "action_type": "fyi"})
        count = ledger.count()
        for i in range(3):
            with pytest.raises((InputError, LedgerError), match="epoch-shared"):
                second.seal({"action_id": f"b{i}", "action_type": "fyi"})
        with pytest.raises(InputError, match="rotate_epoch"):
            second.seal({"action_id": "b9", "action_type": "fyi"})
        assert ledger.count() == count
        second.rotate_epoch()
        second.seal({"action_id": "b-after-rotation", "action_type": "fyi"})
        first.close()
        second.close()
    assert capseal.verify_ledger(tmp_path / "l.db").ok


def test_nesting_has_one_fixed_limit_for_producer_and_verifier(producer: Producer) -> None:
    """The producer refuses nesting deeper than MAX_DEPTH with a typed error
    (nothing written); anything it seals, its verifier can hash, however deep
    the verifier's own call stack (the limit does not depend on the caller)."""
    from capseal.canonical import MAX_DEPTH
    from capseal.errors import NonJSONValueError

    def nested(levels: int) -> dict[str, Any]:
        value: dict[str, Any] = {}
        for _ in range(levels - 1):
            value = {"a": value}
        return value

    count = producer.ledger.count()
    with pytest.raises(NonJSONValueError, match=f"deeper than {MAX_DEPTH}"):
        producer.seal({"action_id": "too-deep", "action_type": "fyi", "x-deep": nested(MAX_DEPTH)})
    assert producer.ledger.count() == count
    record = producer.seal({"action_id": "deep", "action_type": "fyi", "x-deep": nested(MAX_DEPTH - 1)})

    def from_deep_in_the_stack(frames: int) -> Any:
        return capseal.verify(record.capsule) if frames == 0 else from_deep_in_the_stack(frames - 1)

    assert from_deep_in_the_stack(600).ok
    assert capseal.verify_ledger(producer.ledger.path).ok
    # the bound is the capsule's only: content kept as a digest may nest deeper, as before
    planned = producer.planned("deep-response", effect_type="write_order")
    assert producer.confirmed(planned, response=nested(MAX_DEPTH + 60)).capsule["effect"]["response_digest"]


def test_observers_on_the_device_path_never_wedge_the_pipeline(tmp_path: Path) -> None:
    """With a device (the signing pipeline), records behind the epoch's first
    pair are queued behind it, not waited for: the finishing thread never
    commits or runs observers itself, so an observer that submits, or that
    calls flush() (refused inside a commit), cannot wedge the pipeline."""
    signer = _GatedSigner()
    path = tmp_path / "l.db"
    outcomes: list[str] = []
    with Producer("acme", "agent@1", signer, path) as p:
        def observer(record: capseal.SealedRecord) -> None:
            if record.capsule["action_id"].startswith("r-"):
                p.submit({"action_id": f"follow-{record.capsule['action_id']}", "action_type": "fyi"})
                try:
                    p.flush()
                    outcomes.append("flushed")
                except LedgerError:
                    outcomes.append("refused inside the commit")

        p.add_observer(observer)
        pendings = [p.submit({"action_id": f"r-{i}", "action_type": "fyi"}) for i in range(5)]
        done = threading.Event()

        def flush_then_say_so() -> None:
            p.flush()
            done.set()

        threading.Thread(target=flush_then_say_so, daemon=True).start()
        assert done.wait(30), "the pipeline wedged"
        assert [x.result().capsule["action_id"] for x in pendings] == [f"r-{i}" for i in range(5)]
        assert outcomes and set(outcomes) <= {"flushed", "refused inside the commit"}
        p.flush()
    assert capseal.verify_ledger(path).ok


def test_a_device_path_child_of_a_refused_parent_is_refused(tmp_path: Path) -> None:
    signer = _GatedSigner()
    path = tmp_path / "l.db"
    with Producer("acme", "agent@1", signer, path) as p:
        p.seal({"action_id": "dup", "action_type": "fyi"})
        count = p.ledger.count()
        signer.release.clear()
        parent = p.submit({"action_id": "dup", "action_type": "fyi", "x-note": "again"})  # refused at commit
        child = p.submit({"action_id": "child", "action_type": "fyi"}, parent=parent.capsule_id)
        signer.release.set()
        with pytest.raises(DuplicateRecordError):
            parent.result()
        with pytest.raises(LedgerError, match="was refused"):
            child.result()
        assert p.ledger.count() == count
    assert capseal.verify_ledger(path).ok


def test_a_long_chain_keeps_no_bodies_alive(tmp_path: Path) -> None:
    """A child's append refers to its parent's only until it is decided: a
    chain of records submitted one after another keeps nothing of the older
    ones reachable (each held its record body)."""
    with Producer("acme", "agent@1", UnsafeEphemeralSigner(), tmp_path / "l.db") as p:
        first = previous = p.submit({"action_id": "chain-0", "action_type": "fyi"})
        for i in range(1, 50):
            previous = p.submit({"action_id": f"chain-{i}", "action_type": "fyi"}, parent=previous.capsule_id)
        p.flush()
        assert first.append is not None and previous.append is not None
        assert previous.append.after == () and previous.append.lead is None
        p.submit({"action_id": "unrelated", "action_type": "fyi"})  # the settled ones leave as the next arrives
        # private: what the writer keeps findable is the memory bound this test is about
        assert len(p._writer._recent) <= 1


def test_a_record_of_an_epoch_rotated_away_before_its_boundary_is_refused(tmp_path: Path) -> None:
    """A thread assembles a record in epoch E1 (it is still being signed) while
    another rotates to E2 and seals: E1's boundary never went in, so the E1
    record is refused with a typed error instead of being written in an epoch
    with no boundary; a record of an epoch whose boundary is in goes in."""
    held, signing = threading.Event(), threading.Event()

    class HeldSigner(UnsafeEphemeralSigner):
        def sign(self, data: bytes) -> Any:
            if threading.current_thread().name == "held":
                signing.set()
                assert held.wait(10)
            return super().sign(data)

    path = tmp_path / "l.db"
    outcome: list[Any] = []
    with Producer("acme", "agent@1", HeldSigner(), path, epoch_id="E1") as p:
        def seal_in_e1() -> None:
            try:
                outcome.append(p.seal({"action_id": "a1", "action_type": "fyi"}))
            except LedgerError as exc:
                outcome.append(exc)

        worker = threading.Thread(target=seal_in_e1, name="held")
        worker.start()
        assert signing.wait(10)
        p.rotate_epoch("E2")
        p.seal({"action_id": "b1", "action_type": "fyi"})
        held.set()
        worker.join(10)
        assert len(outcome) == 1 and isinstance(outcome[0], LedgerError) and "'E1' was rotated" in str(outcome[0])
        assert [e.action_id for e in p.ledger.entries()] == ["E2/opens", "b1"]
    assert capseal.verify_ledger(path).ok


def test_a_lifecycle_parent_from_another_ledger_is_refused(tmp_path: Path) -> None:
    """-05 §6 check 6: a chain parent must be in the same ledger. The
    lifecycle calls took a SealedRecord parent on trust and sealed a record
    chained to a capsule this ledger does not hold."""
    with Producer("acme", "a@1", UnsafeEphemeralSigner(), tmp_path / "a.db") as mine, \
            Producer("acme", "b@1", UnsafeEphemeralSigner(), tmp_path / "b.db") as theirs:
        foreign = theirs.planned("f-1", effect_type="write_order")
        dispatched = theirs.dispatched(foreign)
        mine.seal({"action_id": "first", "action_type": "fyi"})
        before = mine.ledger.count()
        calls: list[Any] = [
            lambda: mine.dispatched(foreign),
            lambda: mine.confirmed(dispatched, response={"ok": True}),
            lambda: mine.failed(dispatched),
            lambda: mine.refused(foreign, verdict_class="denied"),
            lambda: mine.resolved(foreign, decision="accept", approver="policy"),
        ]
        calls.append(lambda: mine.planned("p-1", chain={"parent_capsule_id": foreign.capsule_id, "relation": "follows"}))
        for call in calls:
            with pytest.raises(InputError, match="not in a.db"):
                call()
        assert mine.ledger.count() == before
    assert capseal.verify_ledger(tmp_path / "a.db").ok


def test_confirmed_carries_the_request_actually_dispatched(producer: Producer) -> None:
    """-05 §5.3: the digests describe what was sent and received. A request
    given to dispatched() is the one sent; confirmed() after it repeated the
    planned request's digest (or none) instead."""
    planned = producer.planned("rq-1", effect_type="write_order", request={"qty": 1})
    dispatched = producer.dispatched(planned, request={"qty": 2})
    assert dispatched.capsule["effect"]["request_digest"] == capseal.json_digest({"qty": 2})
    confirmed = producer.confirmed(dispatched, response={"id": "O-1"})
    assert confirmed.capsule["effect"]["request_digest"] == capseal.json_digest({"qty": 2})
    planned = producer.planned("rq-2", effect_type="write_order")  # no request known when planned
    failed = producer.failed(producer.dispatched(planned, request={"qty": 3}))
    assert failed.capsule["effect"]["request_digest"] == capseal.json_digest({"qty": 3})


def test_a_malformed_disposition_extra_is_a_typed_error(producer: Producer) -> None:
    """A disposition given to failed()/confirmed() that is not an object
    raised a bare TypeError ('str' object is not a mapping)."""
    dispatched = producer.dispatched(producer.planned("md-1", effect_type="write_order"))
    before = producer.ledger.count()
    with pytest.raises(InputError, match="disposition"):
        producer.failed(dispatched, disposition="oops")
    with pytest.raises(InputError, match="disposition"):
        producer.confirmed(dispatched, response={"ok": 1}, verdict_class="executed", disposition=["oops"])
    assert producer.ledger.count() == before


def test_extra_blocks_are_merged_never_replace_what_the_call_records(producer: Producer) -> None:
    """A helper's own block (planned()'s effect, refused()'s disposition) was
    replaced wholesale by an extra of the same name: planned() sealed a
    confirmed effect, refused() lost its verdict_class and reason_digest.
    Extra members are now added to the block; a member that contradicts the
    call is refused."""
    before = producer.ledger.count()
    with pytest.raises(InputError, match="effect.status"):
        producer.planned("ex-1", effect={"status": "confirmed", "response_digest": "a" * 64, "effect_attestation": "gate_executed"})
    with pytest.raises(InputError, match="disposition.verdict_class"):
        producer.refused(action_id="ex-2", verdict_class="denied", disposition={"verdict_class": "blocked"})
    with pytest.raises(InputError, match="effect"):
        producer.planned("ex-3", effect="planned")
    assert producer.ledger.count() == before
    deferred = producer.refused(action_id="ex-4", verdict_class="deferred", decision="deferred", reason={"why": "await"},
                                disposition={"expiry_policy": {"ttl_seconds": 3600, "on_expiry": "escalated"}})
    disposition = deferred.capsule["disposition"]
    assert disposition["verdict_class"] == "deferred" and disposition["reason_digest"] == capseal.json_digest({"why": "await"})
    assert disposition["expiry_policy"] == {"ttl_seconds": 3600, "on_expiry": "escalated"}
    planned = producer.planned("ex-5", effect_type="write_order", effect={"external_ref": "INV-5"})
    assert planned.capsule["effect"] == {"status": "planned", "type": "write_order", "external_ref": "INV-5"}
    assert ref.verify(deferred.capsule).ok and ref.verify(planned.capsule).ok


def test_errored_is_never_sealed_with_a_confirmed_effect(producer: Producer) -> None:
    """-05 §5.5.2: ``errored`` pairs with dispatched_unconfirmed. A confirmed
    effect with its response digest derives ``confirmed``, and was sealed
    beside verdict_class 'errored' (the reference's check 4 does not look)."""
    errored = {"decision": "accept", "approver": "policy", "human_disposed": False, "verdict_class": "errored"}
    dispatched = producer.dispatched(producer.planned("err-2", effect_type="write_order"))
    before = producer.ledger.count()
    with pytest.raises(CapsuleValidationError, match="errored"):
        producer.seal({"action_id": "err-1", "action_type": "decide", "disposition": errored,
                       "effect": {"status": "confirmed", "response_digest": "a" * 64, "effect_attestation": "gate_executed"}})
    with pytest.raises(CapsuleValidationError, match="errored"):
        producer.confirmed(dispatched, response={"ok": 1}, verdict_class="errored")
    assert producer.ledger.count() == before
    for status in ("dispatched", "failed", "reverted"):  # dispatched_unconfirmed: sealed
        record = producer.seal({"action_id": f"err-{status}", "action_type": "decide", "disposition": errored,
                                "effect": {"status": status, "effect_attestation": "runtime_claimed"}})
        assert record.capsule["assurance"]["effect_mode"] == "dispatched_unconfirmed"


@pytest.mark.parametrize(("stamp", "ok"), [
    ("2016-12-31T23:59:60Z", True),  # a leap second (RFC 3339 §5.6/§5.7: time-second is 00-60)
    ("2016-12-31T23:59:60.5Z", True),
    ("2016-12-31T12:00:60Z", False),  # a leap second is the last second of a UTC day
    ("2016-12-31T23:59:61Z", False),
    ("2016-02-30T23:59:60Z", False),
])
def test_leap_second_timestamps(tmp_path: Path, stamp: str, ok: bool) -> None:
    """RFC 3339 allows second 60 (a leap second) and the reference verifier
    accepts it; capseal refused every one as "not a valid calendar date/time"."""
    now = ["2016-12-31T00:00:00Z"]  # the epoch boundary, made with the producer, has an ordinary time
    with Producer("acme", "agent@1", UnsafeEphemeralSigner(), tmp_path / "l.db", clock=lambda: now[0]) as p:
        now[0] = stamp
        if ok:
            record = p.seal({"action_id": "leap", "action_type": "fyi"})
            assert record.capsule["timestamp"] == stamp and ref.verify(record.capsule).ok
        else:
            with pytest.raises(CapsuleValidationError, match="timestamp"):
                p.seal({"action_id": "leap", "action_type": "fyi"})
            assert p.ledger.count() == 0


@pytest.mark.parametrize("options", [
    {"clock": lambda: 1764547200},  # a number where a timestamp string belongs (AttributeError before)
    {"clock": "2026-10-01T12:00:00Z"},  # not a function
    {"verify_signatures": "never"},  # a plain ValueError before
])
def test_bad_producer_options_are_typed_errors(tmp_path: Path, options: dict[str, Any]) -> None:
    with pytest.raises(InputError):
        Producer("acme", "agent@1", UnsafeEphemeralSigner(), tmp_path / "l.db", **options)


def test_check_refuses_what_seal_would_and_writes_nothing(producer: Producer) -> None:
    """Producer.check runs seal()'s refusals without signing or writing (the
    CLI checks a whole batch with it before sealing any)."""
    capsule = producer.check({"action_id": "later", "action_type": "fyi"})
    assert capsule["action_id"] == "later" and "signature" not in capsule and producer.ledger.count() == 0
    with pytest.raises(InputError):
        producer.check({"action_id": "f", "action_type": "fyi", "x-amount": 1.5})
    with pytest.raises(InputError):
        producer.check({"action_id": "c", "action_type": "fyi"}, parent="ab" * 32)  # a parent this ledger lacks
    producer.seal({"action_id": "once", "action_type": "fyi"})
    with pytest.raises(DuplicateRecordError):
        producer.check({"action_id": "once", "action_type": "fyi"})
    assert producer.ledger.count() == 2  # the epoch boundary and "once"


def test_close_makes_its_records_durable_in_a_shared_ledger(tmp_path: Path) -> None:
    """close() says what was submitted becomes durable; with a ledger it does
    not own (shared, its group window longer than the run) it returned with
    every record still queued, and they were written only when the ledger's
    owner closed it, or lost if the program ended first."""
    with Ledger(tmp_path / "l.db", group_window=600.0, group_max=10**6) as ledger:
        producer = Producer("acme", "agent@1", UnsafeEphemeralSigner("EdDSA"), ledger)
        pending = [producer.submit({"action_id": f"a-{i}", "action_type": "fyi"}) for i in range(10)]
        producer.close()
        assert ledger.count() == 11  # the epoch boundary and the ten
        assert [p.result(0).seq for p in pending] == list(range(2, 12))
