"""PKCS#11 signer against a real SoftHSM2 token: capsules sealed with Ed25519,
P-256 and RSA-PSS keys on the token pass our verifier, the reference verifier,
pycose and scitt-cose; signers share one logged-in session; 8 threads seal
8,000 records through one token into one ledger."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import pytest
from agent_action_capsule import verify as reference_verify
from agent_action_capsule.producer_envelope import verify_producer_envelope, verify_record_signature

from capseal import Ledger, Producer, verify_ledger
from capseal.envelope import signature_ok
from capseal.keys import open_signer
from capseal.keys.direct import direct_calls_allowed
from capseal.keys.pkcs11 import PKCS11Signer
from capseal.keys.provision import create_key

from ...cose_checks import assert_envelope_verifies_independently
from ...secret_files import write_secret
from ...stress import seal_from_threads

ALGS = {"EdDSA": "ed25519", "ES256": "p256", "PS256": "rsa-pss"}


@pytest.fixture(scope="module")
def keys(softhsm: Any) -> dict[str, str]:
    """One key per algorithm on the session token (RSA 2048 to keep keygen short)."""
    tag = os.urandom(3).hex()
    out = {}
    for alg, cli in ALGS.items():
        with create_key(softhsm.uri(f"p11sig-{cli}-{tag}"), cli, pin=softhsm.pin, rsa_bits=2048) as signer:
            assert signer.alg == alg
            out[alg] = signer.uri
    return out


def _seal_two(signer: Any, ledger: Path) -> tuple[Any, Any, Any]:
    with Producer("acme", "buyer-agent@1.4", signer, ledger) as producer:
        planned = producer.planned("po-7", effect_type="write_order", request={"sku": "A1", "qty": 2})
        confirmed = producer.confirmed(planned, response={"order": "O-1"}, effect_attestation="gate_executed")
        return producer.epoch_record, planned, confirmed


@pytest.mark.direct_path
@pytest.mark.parametrize("alg", list(ALGS))
def test_sealed_capsules_verify_everywhere(alg: str, keys: dict[str, str], softhsm: Any, tmp_path: Path) -> None:
    ledger = tmp_path / "ledger.db"
    with open_signer(keys[alg], pin=softhsm.pin) as signer:
        assert isinstance(signer, PKCS11Signer) and signer.external_device
        # Ed25519 and ECDSA sign through the direct C_Sign path; RSA-PSS (a mechanism parameter) does not
        # (none at all under CAPSEAL_NO_DIRECT: python-pkcs11's key.sign only)
        assert (signer.direct_path is not None) == (alg != "PS256" and direct_calls_allowed())
        if signer.direct_path is not None:  # SoftHSM2 is a software token: its quick calls may keep the GIL
            assert all(signer.direct_path.probing.values())
        pem = signer.public_key_pem()
        epoch, planned, confirmed = _seal_two(signer, ledger)

    report = verify_ledger(ledger)
    assert report.ok, [f.to_dict() for f in report.findings] + [r.to_dict() for r in report.records if not r.ok]
    assert report.counts()["records"] == 3
    for record in (epoch, planned, confirmed):
        result = reference_verify(record.capsule)
        assert result.ok, result.findings

    envelope = confirmed.to_json()["envelopes"][0]
    assert envelope["alg"] == alg
    cose = bytes.fromhex(envelope["cose"])
    cid_raw = bytes.fromhex(confirmed.capsule_id)
    if alg == "EdDSA":
        assert envelope["profile"] == "aac-producer-envelope"
        result = verify_producer_envelope(confirmed.capsule_id, bytes.fromhex(confirmed.capsule["signature"]))
        assert result.ok, result.findings
        assert result.public_key == bytes.fromhex(confirmed.capsule["key_id"])
        for record in (epoch, planned, confirmed):
            assert verify_record_signature(record.capsule) == ("authored", [])
        return

    assert envelope["profile"] == "cose-sign1"
    assert "signature" not in confirmed.capsule and "key_id" not in confirmed.capsule
    assert_envelope_verifies_independently(cose, pem, cid_raw, alg)


def test_epoch_boundary_carries_observed_custody(keys: dict[str, str], softhsm: Any, tmp_path: Path) -> None:
    with open_signer(keys["EdDSA"], pin=softhsm.pin) as signer:
        epoch, _, _ = _seal_two(signer, tmp_path / "l.db")
        kid = signer.kid
    custody = epoch.capsule["model_attestation"]["compute_attestation"]["x-capseal-key-custody"]
    assert custody["backend"] == "pkcs11" and custody["kid"] == kid and custody["alg"] == "EdDSA"
    assert custody["software_device"] is True
    assert custody["device"]["manufacturer"] == "SoftHSM project"
    assert custody["device"]["token_label"] == softhsm.label
    attrs = custody["key_attributes"]
    assert attrs["CKA_SENSITIVE"] is True and attrs["CKA_ALWAYS_SENSITIVE"] is True
    assert attrs["CKA_NEVER_EXTRACTABLE"] is True and attrs["CKA_EXTRACTABLE"] is False
    assert attrs["CKA_LOCAL"] is True
    assert softhsm.pin not in repr(custody)

    def no_floats(value: Any) -> None:
        assert not isinstance(value, float)
        for child in value.values() if isinstance(value, dict) else value if isinstance(value, list) else ():
            no_floats(child)

    no_floats(custody)


def test_raw_signatures_are_cose_form(keys: dict[str, str], softhsm: Any) -> None:
    for alg, size in (("EdDSA", 64), ("ES256", 64), ("PS256", 256)):
        with open_signer(keys[alg], pin=softhsm.pin) as signer:
            result = signer.sign(b"message")
            assert (result.alg, result.kid, len(result.signature)) == (alg, signer.kid, size)
            assert signature_ok(alg, signer.public_key, result.signature, b"message")
            assert not signature_ok(alg, signer.public_key, result.signature, b"other message")


def test_signers_share_one_logged_in_session(keys: dict[str, str], softhsm: Any) -> None:
    a = open_signer(keys["EdDSA"], pin=softhsm.pin)
    assert isinstance(a, PKCS11Signer)
    b = open_signer(keys["ES256"], pin=softhsm.pin)
    assert isinstance(b, PKCS11Signer)
    c = open_signer(keys["EdDSA"], pin=softhsm.pin)
    assert isinstance(c, PKCS11Signer)
    try:
        ts = a.token_session
        assert b.token_session is ts and c.token_session is ts
        session = ts.session
        for _ in range(20):
            a.sign(b"x"), b.sign(b"y"), c.sign(b"z")
        assert ts.session is session  # never a session per signature
        a.close()
        a.close()  # idempotent
        assert c.sign(b"still here").alg == "EdDSA"
        with pytest.raises(Exception, match="closed"):
            a.sign(b"after close")
    finally:
        b.close()
        c.close()
    assert ts.session is None  # the last signer logged out and closed it
    with open_signer(keys["EdDSA"], pin=softhsm.pin) as again:  # and a new one logs in again
        assert again.sign(b"x").alg == "EdDSA"


def test_pin_sources_and_uri_without_pin(keys: dict[str, str], softhsm: Any, tmp_path: Path) -> None:
    pin_file = write_secret(tmp_path / "pin", softhsm.pin + "\n")
    base, query = keys["ES256"].split("?", 1)
    prompts: list[str] = []

    def handler(prompt: str) -> str:
        prompts.append(prompt)
        return softhsm.pin

    uris = [
        f"{base}?{query}&pin-value={softhsm.pin}",
        f"{base}?{query}&pin-source=file:{pin_file}",
        f"{base}?{query}&pin-source={pin_file}",
    ]
    for uri in uris:
        with open_signer(uri) as signer:
            assert signer.sign(b"x").alg == "ES256"
            assert f"pin-value={softhsm.pin}" not in signer.uri and "pin-value" not in repr(signer)
    with open_signer(keys["ES256"], secrets_handler=handler) as signer:
        assert signer.sign(b"x").alg == "ES256"
    assert prompts == [f"PIN for PKCS#11 token {softhsm.label!r}"]


@pytest.mark.parametrize("how", ["seal", "submit"])
def test_eight_threads_seal_8000_records_through_one_token(keys: dict[str, str], softhsm: Any, tmp_path: Path, how: str) -> None:
    """8 threads × 1,000 records, two producers (an Ed25519 and a P-256 key on
    the same token, so two signers share the token's one session) into one
    ledger, by ``seal()`` and by ``submit()`` (the signing pipelines and the
    direct C_Sign path): no crash, no PKCS#11 error, every record verifies."""
    path = tmp_path / "threads.db"
    with Ledger(path) as ledger:
        ed = open_signer(keys["EdDSA"], pin=softhsm.pin)
        assert isinstance(ed, PKCS11Signer)
        p256 = open_signer(keys["ES256"], pin=softhsm.pin)
        assert isinstance(p256, PKCS11Signer)
        ts = ed.token_session
        assert p256.token_session is ts
        reconnects = ts.reconnects
        producers = [Producer("acme", "agent-ed@1", ed, ledger), Producer("acme", "agent-p256@1", p256, ledger)]

        errors = seal_from_threads(producers, submit=how == "submit")
        for p in producers:
            p.close()
        ed.close()
        p256.close()
        assert errors == []
        assert ts.reconnects == reconnects  # no session was lost on the way
        # contended calls went through the one PKCS#11 worker thread
        assert any(t.name == "capseal-pkcs11" for t in threading.enumerate())
        assert ledger.count() == 8000 + 2  # plus each producer's epoch boundary
    report = verify_ledger(path)
    assert report.ok
    assert report.counts()["records"] == 8002 and report.counts()["ok"] == 8002
