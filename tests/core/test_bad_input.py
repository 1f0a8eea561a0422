"""Bad input: each refusal is a clear, typed error, and the ledger's record count
and bytes are unchanged."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from capseal import Producer
from capseal.errors import (
    AssuranceOverclaimError,
    CapsuleValidationError,
    DeviceError,
    FloatInDigestError,
    InputError,
    MalformedJSONError,
    NonJSONValueError,
    SignatureFailedError,
    UnsafeIntegerError,
)
from capseal.keys import SignatureResult, SoftwareSigner, UnsafeEphemeralSigner, generate_private_key

CLI = str(Path(sys.executable).parent / "capseal")


class BrokenSigner(SoftwareSigner):
    """A real software key whose device fails in one of two ways (fault injection)."""

    def __init__(self, mode: str) -> None:
        super().__init__(generate_private_key("EdDSA"), uri="ephemeral:broken", key_store="memory")
        self.mode = mode
        self.armed = False

    def sign(self, data: bytes) -> SignatureResult:
        result = super().sign(data)
        if not self.armed:
            return result
        if self.mode == "raise":
            raise DeviceError("token returned CKR_DEVICE_ERROR (injected)")
        return SignatureResult(bytes(64), result.kid, result.alg)  # a well-formed but wrong signature


def _state(path: Path) -> tuple[int, str]:
    digest = hashlib.sha256()
    for suffix in ("", "-wal"):
        p = Path(str(path) + suffix)
        digest.update(p.read_bytes() if p.exists() else b"")
    import sqlite3

    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
        count = db.execute("SELECT count(*) FROM records").fetchone()[0]
    return count, digest.hexdigest()


@pytest.fixture()
def producer(tmp_path: Path) -> Iterator[Producer]:
    with Producer("acme", "agent@1", UnsafeEphemeralSigner(), tmp_path / "l.db") as p:
        p.seal({"action_id": "first", "action_type": "fyi"})  # the ledger holds the epoch + one record
        yield p


GOOD_EFFECT = {"status": "confirmed", "response_digest": "b" * 64, "effect_attestation": "gate_executed"}

BAD_SPECS: list[tuple[str, dict[str, Any], type[Exception], str]] = [
    ("float", {"action_id": "f", "action_type": "decide", "x-order": {"amount": 12.5}}, FloatInDigestError, "$[\"x-order\"].amount"),
    ("unsafe-int", {"action_id": "u", "action_type": "decide", "x-order": {"qty": 2**53}}, UnsafeIntegerError, "$[\"x-order\"].qty"),
    ("approver", {"action_id": "a", "action_type": "decide",
                  "disposition": {"decision": "accept", "approver": "robot", "human_disposed": False}},
     CapsuleValidationError, "$.disposition.approver"),
    ("human-disposed", {"action_id": "h", "action_type": "decide",
                        "disposition": {"decision": "accept", "approver": "policy", "human_disposed": True}},
     CapsuleValidationError, "human_disposed is true only when a human acted"),
    ("overclaim", {"action_id": "o", "action_type": "decide", "effect": {"status": "planned"},
                   "assurance": {"attestation_mode": "self_attested", "effect_mode": "confirmed", "ledger_mode": "standalone"}},
     AssuranceOverclaimError, "assurance.effect_mode='confirmed' overclaims"),
    ("anchored", {"action_id": "n", "action_type": "decide", "effect": GOOD_EFFECT,
                  "assurance": {"attestation_mode": "anchored", "effect_mode": "confirmed", "ledger_mode": "standalone"}},
     AssuranceOverclaimError, "attestation_mode"),
    ("cross-party-overclaim", {"action_id": "c", "action_type": "decide", "cross_party": {"initiator_ref": "a" * 64},
                               "assurance": {"attestation_mode": "self_attested", "effect_mode": "not_applicable",
                                             "ledger_mode": "standalone", "cross_party_rung": "full_bilateral"}},
     AssuranceOverclaimError, "cross_party_rung"),
    ("confirmed-no-response", {"action_id": "r", "action_type": "decide",
                               "effect": {"status": "confirmed", "effect_attestation": "gate_executed"}},
     CapsuleValidationError, "response_digest"),
    ("null-for-absent", {"action_id": "z", "action_type": "decide", "effect": {"status": "planned", "type": None}},
     CapsuleValidationError, "$.effect.type"),
]


@pytest.mark.parametrize(("name", "spec", "error", "says"), BAD_SPECS, ids=[b[0] for b in BAD_SPECS])
def test_refused_and_ledger_unchanged(producer: Producer, name: str, spec: dict[str, Any], error: type[Exception], says: str) -> None:
    before = _state(producer.ledger.path)
    with pytest.raises(error) as info:
        producer.seal(spec)
    assert says in str(info.value)
    assert isinstance(info.value, InputError)
    assert _state(producer.ledger.path) == before


def test_a_bad_value_in_a_digested_argument_names_the_argument(producer: Producer) -> None:
    """request, response and reason are digested apart from the capsule: an
    error in one names the argument ("response.scores[1]"), where it said
    "$.scores[1]" and left the caller to guess which of a call's values held
    the float. Nothing is written."""
    planned = producer.planned("po-1", effect_type="write_order", request={"sku": "A"})
    before = _state(producer.ledger.path)
    with pytest.raises(FloatInDigestError) as info:
        producer.confirmed(planned, request={"sku": "A"}, response={"scores": [1, 0.93]})
    assert info.value.path == "response.scores[1]" and str(info.value).endswith("at response.scores[1]")
    with pytest.raises(UnsafeIntegerError) as unsafe:
        producer.planned("po-2", request={"qty": 2**60})
    assert unsafe.value.path == "request.qty"
    with pytest.raises(FloatInDigestError) as why:
        producer.refused(action_id="pay-1", verdict_class="denied", reason={"x-limit": 1.5})
    assert why.value.path == 'reason["x-limit"]'
    with pytest.raises(NonJSONValueError) as surrogate:
        producer.failed(planned, response=["ok", "\ud800"])
    assert surrogate.value.path == "response[1]"
    assert _state(producer.ledger.path) == before


def test_failing_signer_raises_and_writes_nothing(tmp_path: Path) -> None:
    signer = BrokenSigner("raise")
    with Producer("acme", "agent@1", signer, tmp_path / "l.db") as producer:
        producer.seal({"action_id": "ok", "action_type": "fyi"})
        before = _state(producer.ledger.path)
        signer.armed = True
        with pytest.raises(DeviceError, match="CKR_DEVICE_ERROR"):
            producer.seal({"action_id": "fails", "action_type": "fyi"})
        assert _state(producer.ledger.path) == before
        signer.armed = False
        producer.seal({"action_id": "fails", "action_type": "fyi"})  # same action id: nothing was taken
        assert producer.ledger.count() == before[0] + 1


def test_wrong_signature_is_caught_before_writing(tmp_path: Path) -> None:
    signer = BrokenSigner("garbage")
    with Producer("acme", "agent@1", signer, tmp_path / "l.db", verify_signatures="always") as producer:
        producer.seal({"action_id": "ok", "action_type": "fyi"})
        before = _state(producer.ledger.path)
        signer.armed = True
        with pytest.raises(SignatureFailedError):
            producer.seal({"action_id": "bad-sig", "action_type": "fyi"})
        assert _state(producer.ledger.path) == before


def test_a_producer_given_no_signer_or_no_ledger_path_is_refused_before_any_file(tmp_path: Path) -> None:
    """The misuse a framework makes first (a key URI where a Signer goes, None
    for either) is InputError naming the expected type, raised before the
    ledger file is created; before, AttributeError ('str' object has no
    attribute 'sign') came from the self-test with the file already made, and
    a ledger of None was a bare TypeError. A URI is never echoed: it may hold a PIN."""
    uri = "pkcs11:token=agents;object=seal-key?pin-value=123456"
    for signer in (uri, None):
        with pytest.raises(InputError, match="signer is a capseal.keys.Signer") as info:
            Producer("acme", "agent@1", signer, tmp_path / "l.db")  # type: ignore[arg-type]
        assert "123456" not in str(info.value) and "123456" not in repr(info.value)
    for ledger in (None, 3):
        with pytest.raises(InputError, match="ledger is a file path or a capseal.Ledger"):
            Producer("acme", "agent@1", UnsafeEphemeralSigner(), ledger)  # type: ignore[arg-type]
    assert list(tmp_path.iterdir()) == []


def test_a_model_id_without_its_provider_is_refused_saying_both(tmp_path: Path) -> None:
    """model_attestation holds model_id and provider together or neither;
    Producer(model_id=…) alone was refused as "$.model_attestation.provider:
    Input should be a valid string" (the None it put there), with the ledger
    file already made. Now InputError says both go together, before any file."""
    for model_id, provider in (("judge@1", None), (None, "example-provider")):
        with pytest.raises(InputError, match="model_id and provider are given together or not at all"):
            Producer("acme", "agent@1", UnsafeEphemeralSigner(), tmp_path / "l.db", model_id=model_id, provider=provider)
    assert list(tmp_path.iterdir()) == []
    with Producer("acme", "agent@1", UnsafeEphemeralSigner(), tmp_path / "l.db", model_id="judge@1",
                  provider="example-provider") as producer:
        attestation = producer.epoch_record.capsule["model_attestation"]
        assert (attestation["model_id"], attestation["provider"]) == ("judge@1", "example-provider")


def test_failed_first_seal_leaves_a_new_ledger_empty(tmp_path: Path) -> None:
    path = tmp_path / "new.db"
    with Producer("acme", "agent@1", UnsafeEphemeralSigner(), path) as producer:
        with pytest.raises(FloatInDigestError):
            producer.seal({"action_id": "x", "action_type": "fyi", "x-v": 0.5})
        assert producer.ledger.count() == 0  # not even the epoch boundary
        producer.seal({"action_id": "x", "action_type": "fyi"})
        assert producer.ledger.count() == 2


def test_duplicate_action_id_refused_and_unchanged(producer: Producer) -> None:
    from capseal.errors import DuplicateRecordError

    before = _state(producer.ledger.path)
    with pytest.raises(DuplicateRecordError, match="first"):
        producer.seal({"action_id": "first", "action_type": "fyi"})
    assert _state(producer.ledger.path) == before


@pytest.mark.parametrize(
    "payload",
    [b'{"action_id": "a", "action_type": ', b'{"action_id": "a", "action_id": "b", "action_type": "fyi"}',
     b'{"action_id": "a", "action_type": "fyi", "x-n": NaN}', b"\xff\xfe", b'{"action_id": "a", "action_type": "fyi", "x-v": 1.5}'],
    ids=["truncated", "duplicate-key", "nan", "not-utf8", "float"],
)
def test_cli_refuses_bad_json_and_leaves_ledger_unchanged(tmp_path: Path, payload: bytes) -> None:
    key = tmp_path / "k.pem"
    subprocess.run([CLI, "keys", "create", f"file:{key}", "--alg", "ed25519"], check=True, capture_output=True)
    good = tmp_path / "good.json"
    good.write_text(json.dumps({"action_id": "g", "action_type": "fyi"}))
    ledger = tmp_path / "l.db"
    base = [CLI, "seal", "--key", f"file:{key}", "--ledger", str(ledger), "--operator", "acme", "--developer", "a@1"]
    subprocess.run([*base, str(good)], check=True, capture_output=True)
    before = _state(ledger)
    bad = tmp_path / "bad.json"
    bad.write_bytes(payload)
    proc = subprocess.run([*base, str(bad)], capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stderr.startswith("capseal: error:")
    assert "Traceback" not in proc.stderr
    assert _state(ledger) == before


def test_malformed_json_error_is_typed() -> None:
    from capseal.record import strict_json

    with pytest.raises(MalformedJSONError, match="duplicate member 'a'"):
        strict_json(b'{"a": 1, "a": 2}', "spec.json")
    with pytest.raises(MalformedJSONError, match="NaN is not JSON"):
        strict_json(b'{"a": NaN}', "spec.json")


@pytest.mark.parametrize("epoch_id", ["", 5, b"e-1"])
def test_an_epoch_id_that_is_no_name_is_refused_before_any_file(tmp_path: Path, epoch_id: Any) -> None:
    """``""`` quietly got a generated id; an integer was refused by the
    capsule model after the ledger file was made."""
    with pytest.raises(InputError, match="epoch_id is a non-empty string"):
        Producer("acme", "agent@1", UnsafeEphemeralSigner(), tmp_path / "l.db", epoch_id=epoch_id)
    assert not (tmp_path / "l.db").exists()
    with Producer("acme", "agent@1", UnsafeEphemeralSigner(), tmp_path / "l.db") as producer:
        opened = producer.epoch_id
        with pytest.raises(InputError, match="epoch_id is a non-empty string"):
            producer.rotate_epoch(epoch_id)
        assert producer.epoch_id == opened


@pytest.mark.parametrize("value", ["1", float("nan"), float("inf"), -1, True, None])
def test_a_wait_that_is_no_number_of_seconds_is_refused_by_name(tmp_path: Path, value: Any) -> None:
    """A string failed deep in threading with a bare TypeError, inf raised
    OverflowError from a wait, NaN made every wait return at once, and a
    ledger's group_window=-1 was a bare ValueError. None is 'no limit' for a
    timeout, never a window."""
    from capseal import Ledger

    with pytest.raises(InputError, match="group_window is a number of seconds"):
        Ledger(tmp_path / "w.db", group_window=value)
    with pytest.raises(InputError, match="lock_timeout is a number of seconds"):
        Ledger(tmp_path / "w.db", lock_timeout=value)
    assert not (tmp_path / "w.db").exists()
    with Producer("acme", "agent@1", UnsafeEphemeralSigner(), tmp_path / "l.db") as producer:
        pending = producer.submit({"action_id": "a", "action_type": "fyi"})
        if value is None:  # no limit: the waits work
            producer.flush(value)
            assert pending.result(value).seq == 2
            return
        for wait in (producer.flush, pending.result, producer.ledger.flush, producer.close):
            with pytest.raises(InputError, match="timeout is a number of seconds from 0 to .* or None"):
                wait(value)
        assert pending.result().seq == 2  # nothing was closed by the refused close()
        assert producer.seal({"action_id": "b", "action_type": "fyi"}).seq == 3


@pytest.mark.parametrize("value", [0, -3, 2.0, True, "8"])
def test_a_group_max_that_is_no_count_is_refused(tmp_path: Path, value: Any) -> None:
    from capseal import Ledger

    with pytest.raises(InputError, match="group_max is a whole number from 1"):
        Ledger(tmp_path / "w.db", group_max=value)


@pytest.mark.parametrize("clock", [lambda: 1764547200, lambda: "2026-12-01 08:00:00", lambda: "2026-12-01T08:00:00+01:00"])
def test_a_bad_clock_is_refused_before_any_file(tmp_path: Path, clock: Any) -> None:
    """The clock was first read for the epoch boundary, after the ledger file
    was made: its refusal left an empty ledger behind."""
    with pytest.raises(InputError, match=r"clock\(\) returned"):
        Producer("acme", "agent@1", UnsafeEphemeralSigner(), tmp_path / "l.db", clock=clock)
    assert not (tmp_path / "l.db").exists()


@pytest.mark.parametrize(("given", "suggested"), [("tool_call", "x-tool-call"), ("delete_file", "x-delete-file")])
def test_an_unregistered_effect_type_names_the_namespaced_form(producer: Producer, given: str, suggested: str) -> None:
    with pytest.raises(CapsuleValidationError) as refused:
        producer.planned("tc-1", effect_type=given)
    assert f"e.g. '{suggested}'" in str(refused.value)
    assert f"effect_type='{suggested}'" in refused.value.hint
    assert producer.planned("tc-1", effect_type=suggested).capsule["effect"]["type"] == suggested


@pytest.mark.parametrize("index", [-1, 3, 10**30])
def test_a_merkle_leaf_outside_the_leaves_is_a_typed_refusal_naming_it(index: int) -> None:
    from capseal import merkle
    from capseal.errors import InputError

    leaves = [b"a", b"b", b"c"]
    with pytest.raises(InputError, match=r"index=.* is not a leaf of the 3 leaves"):
        merkle.root_and_path(leaves, index)
    with pytest.raises(InputError, match=r"m=.* is not a leaf of the 3 leaves"):
        merkle.path_recursive(index, leaves)


def test_an_empty_evidence_object_is_a_typed_refusal_and_the_record_is_unchanged(tmp_path: Path) -> None:
    from capseal.errors import InputError

    with Producer("acme", "agent@1", UnsafeEphemeralSigner(), tmp_path / "l.db") as producer:
        record = producer.seal({"action_id": "a-1", "action_type": "decide"})
    with pytest.raises(InputError, match="evidence="):
        record.with_evidence({})
    assert record.hardware_evidence is None
