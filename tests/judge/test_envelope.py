"""The judgment-record envelope on capseal.cose: pycose verifies every one
capseal makes, and a malformed one is named as this verifier has always named
it (its wording, not the capsule verifier's; a wrong array member before a
malformed protected header; no size limit; any label type compared against
the canonical header)."""

from __future__ import annotations

import os

import cbor2
import pytest

from capseal.cose import decode_sign1, encode_protected
from capseal.judge.envelope import CONTENT_TYPE, HEADER_LABEL, JudgmentEnvelope, sign_judgment, verify_judgment_envelope
from capseal.keys import UnsafeEphemeralSigner

from ..cose_checks import assert_envelope_verifies_independently

DIGEST, COMMITMENT = os.urandom(32), os.urandom(32)
enc_bytes = enc_text = cbor2.dumps  # a byte string or text string in CBOR, by another encoder


@pytest.fixture(scope="module")
def signed() -> tuple[UnsafeEphemeralSigner, JudgmentEnvelope]:
    signer = UnsafeEphemeralSigner("ES256")
    return signer, sign_judgment(signer, DIGEST, COMMITMENT)


@pytest.mark.parametrize("alg", ["EdDSA", "ES256", "ES384", "PS256"])
def test_pycose_and_scitt_cose_verify_every_judgment_envelope(alg: str) -> None:
    signer = UnsafeEphemeralSigner(alg)
    envelope = sign_judgment(signer, DIGEST, COMMITMENT)
    assert_envelope_verifies_independently(envelope.cose, signer.public_key_pem(), DIGEST, alg)
    header = decode_sign1(envelope.cose).header
    assert header == {1: {"EdDSA": -8, "ES256": -7, "ES384": -35, "PS256": -37}[alg], 3: CONTENT_TYPE,
                      4: bytes.fromhex(signer.kid), HEADER_LABEL: COMMITMENT}
    assert verify_judgment_envelope(envelope.to_json(), DIGEST, COMMITMENT) == (True, signer.kid, [])


def _findings(signed: tuple[UnsafeEphemeralSigner, JudgmentEnvelope], cose: bytes) -> list[tuple[str, str]]:
    authored, _, findings = verify_judgment_envelope(dict(signed[1].to_json(), cose=cose.hex()), DIGEST, COMMITMENT)
    assert not authored
    return [(f.code, f.detail) for f in findings]


def _members(signed: tuple[UnsafeEphemeralSigner, JudgmentEnvelope]) -> tuple[bytes, bytes, bytes]:
    sign1 = decode_sign1(signed[1].cose)
    return enc_bytes(sign1.protected), enc_bytes(sign1.payload), enc_bytes(sign1.signature)


MEMBERS = "COSE_Sign1 members have the wrong types (or a non-empty unprotected header)"


def test_a_malformed_envelope_keeps_this_verifiers_wording(signed: tuple[UnsafeEphemeralSigner, JudgmentEnvelope]) -> None:
    protected, payload, signature = _members(signed)
    cases = {
        b"\x84" + protected + b"\xa0" + payload + signature: "not a tagged four-element COSE_Sign1",
        b"\xd2\x83" + protected + b"\xa0" + payload: "not a tagged four-element COSE_Sign1",
        b"\xd2\x84" + protected + b"\xa0" + payload + b"\xc1" + signature: "not a tagged four-element COSE_Sign1",
        b"\xd2\x84" + protected + b"\xa1\x04\x40" + payload + signature: MEMBERS,
        b"\xd2\x84" + protected + b"\xa0" + enc_text("p") + signature: MEMBERS,
        b"\xd2\x84\x40\xa0" + payload + signature: "truncated CBOR",
        b"\xd2\x84" + enc_bytes(b"\x81\x01") + b"\xa0" + payload + signature: "protected header is not a plain map",
        b"\xd2\x84" + enc_bytes(b"\xc1\xa0") + b"\xa0" + payload + signature: "protected header is not a plain map",
        b"\xd2\x84" + enc_bytes(b"\xa2\x01\x26\x01\x26") + b"\xa0" + payload + signature: "duplicate map label 1",
        # a wrong member is named before a malformed protected header
        b"\xd2\x84" + enc_bytes(b"\xc1\xa0") + b"\xa0" + payload + b"\x80": MEMBERS,
        signed[1].cose[:-1]: "truncated CBOR",
    }
    for cose, detail in cases.items():
        assert _findings(signed, cose) == [("envelope_malformed", detail)], cose.hex()


def test_any_label_type_meets_the_header_check(signed: tuple[UnsafeEphemeralSigner, JudgmentEnvelope]) -> None:
    signer = signed[0]
    _, payload, signature = _members(signed)
    kid = bytes.fromhex(signer.kid)
    three = encode_protected({1: -7, 3: CONTENT_TYPE, 4: kid})
    text_label = b"\xa4" + three[1:] + enc_text("x") + b"\x00"  # alg, content type, kid, then "x": 0
    assert _findings(signed, b"\xd2\x84" + enc_bytes(text_label) + b"\xa0" + payload + signature) == [
        ("envelope_protected_headers_invalid",
         "protected header must hold exactly alg, content type, kid and the header commitment")]
    canonical = encode_protected({1: -7, 3: CONTENT_TYPE, 4: kid, HEADER_LABEL: COMMITMENT})
    assert canonical[1] == 0x01
    true_label = canonical[:1] + b"\xf5" + canonical[2:]  # label true where 1 belongs: equal in Python, not in CBOR
    assert _findings(signed, b"\xd2\x84" + enc_bytes(true_label) + b"\xa0" + payload + signature) == [
        ("envelope_malformed", "protected header is not in capseal's canonical form")]


def test_a_judgment_envelope_has_no_size_limit_of_its_own(signed: tuple[UnsafeEphemeralSigner, JudgmentEnvelope]) -> None:
    protected, _, signature = _members(signed)
    big = b"\xd2\x84" + protected + b"\xa0" + enc_bytes(bytes(5000)) + signature
    assert _findings(signed, big) == [("envelope_payload_mismatch",
                                       "payload is not this record's digest (the body changed after signing)")]
