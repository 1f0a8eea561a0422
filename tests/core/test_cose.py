"""capseal.cose on its own: what it writes (checked against cbor2 and pycose,
not against itself), what the strict decoder refuses (every rule, and the
order in which several are listed), and the per-algorithm signature check."""

from __future__ import annotations

import os
from typing import Any

import cbor2
import pytest
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519
from hypothesis import given
from hypothesis import strategies as st
from pycose.keys import CoseKey
from pycose.messages import CoseMessage

from capseal.cbor import enc_bytes, enc_head, enc_int, enc_text
from capseal.cose import (
    ALG_NAME,
    COSE_ALG,
    MAX_SIGN1_BYTES,
    SIGNATURE_SIZE,
    Refusal,
    Sign1,
    assemble_sign1,
    decode_sign1,
    encode_protected,
    sig_structure,
    signature_ok,
    small_order_key,
)
from capseal.errors import CapsealError, CoseFormatError
from capseal.keys import UnsafeEphemeralSigner

from ..cose_checks import assert_envelope_verifies_independently

ALGS = ("EdDSA", "ES256", "ES384", "PS256")
_INT64 = st.integers(min_value=-(1 << 64), max_value=(1 << 64) - 1)
_LABELS = st.one_of(st.integers(min_value=-70000, max_value=70000), _INT64)
_VALUES = st.one_of(_INT64, st.binary(max_size=80), st.text(max_size=40))


def _deterministic(header: dict[int, Any]) -> bytes:
    """RFC 8949 §4.2.1 by another encoder: cbor2's shortest forms, labels in
    the bytewise order of their encodings (cbor2's own ``canonical`` sorts
    length first, the older RFC 7049 rule)."""
    ordered = dict(sorted(header.items(), key=lambda item: cbor2.dumps(item[0])))
    return cbor2.dumps(ordered)


def _signed(alg: str, payload: bytes, header: dict[int, Any] | None = None) -> tuple[bytes, UnsafeEphemeralSigner]:
    signer = UnsafeEphemeralSigner(alg)
    protected = encode_protected(header or {1: COSE_ALG[alg], 4: bytes.fromhex(signer.kid)})
    signature = signer.sign(sig_structure(protected, payload)).signature
    return assemble_sign1(protected, payload, signature), signer


def _refused(data: Any, **options: Any) -> CoseFormatError:
    with pytest.raises(CoseFormatError) as caught:
        decode_sign1(data, **options)
    assert isinstance(caught.value, CapsealError) and isinstance(caught.value, ValueError)
    assert caught.value.rule == caught.value.refusals[0][0] and str(caught.value) == caught.value.refusals[0][1]
    return caught.value


def _message(protected: bytes, unprotected: bytes = b"\xa0", payload: bytes = enc_bytes(b"p"),
             signature: bytes = enc_bytes(bytes(64))) -> bytes:
    """A tagged four-member array built from already-encoded members."""
    return b"\xd2\x84" + protected + unprotected + payload + signature


# --------------------------------------------------------------------------- what it writes


@given(st.dictionaries(_LABELS, _VALUES, min_size=1, max_size=6))
def test_a_protected_header_is_deterministic_cbor_and_reads_back(header: dict[int, Any]) -> None:
    encoded = encode_protected(header)
    assert encoded == _deterministic(header)
    assert cbor2.loads(encoded) == header
    payload = os.urandom(8)
    sign1 = decode_sign1(assemble_sign1(encoded, payload, b"sig"), max_bytes=None)
    assert sign1 == Sign1(encoded, header, payload, b"sig")


@given(st.binary(max_size=300), st.binary(max_size=70000), st.binary(max_size=600))
def test_sig_structure_and_the_message_are_the_cbor_rfc_9052_names(protected: bytes, payload: bytes,
                                                                   signature: bytes) -> None:
    assert sig_structure(protected, payload) == cbor2.dumps(["Signature1", protected, b"", payload])
    assert assemble_sign1(protected, payload, signature) == cbor2.dumps(
        cbor2.CBORTag(18, [protected, {}, payload, signature]))


def test_the_header_order_is_bytewise_not_length_first() -> None:
    """24 (0x18 0x18) sorts before -1 (0x20) bytewise; length first it would not."""
    assert encode_protected({-1: 0, 24: 0, 1: -8}) == b"\xa3" + b"\x01\x27" + b"\x18\x18\x00" + b"\x20\x00"


@pytest.mark.parametrize("alg", ALGS)
def test_pycose_verifies_what_these_functions_make(alg: str) -> None:
    payload = os.urandom(32)
    cose, signer = _signed(alg, payload, {1: COSE_ALG[alg], 3: "application/x-test", 4: b"k", -65537: b"c"})
    assert_envelope_verifies_independently(cose, signer.public_key_pem(), payload, alg)
    message = CoseMessage.decode(cose)
    message.key = CoseKey.from_pem_public_key(signer.public_key_pem())
    assert message.phdr[-65537] == b"c" and message.verify_signature()  # type: ignore[attr-defined]
    assert signature_ok(alg, signer.public_key, decode_sign1(cose).signature, sig_structure(decode_sign1(cose).protected,
                                                                                         payload))


@pytest.mark.parametrize(("header", "why"), [
    ({}, "at least one label"),
    ({True: 1}, "not a CBOR integer"),
    ({"a": 1}, "not a CBOR integer"),
    ({1 << 64: 1}, "not a CBOR integer"),
    ({1: 1 << 64}, "header 1 is a int"),
    ({1: -(1 << 64) - 1}, "header 1 is a int"),
    ({1: True}, "header 1 is a bool"),
    ({1: 1.5}, "header 1 is a float"),
    ({1: bytearray(b"x")}, "header 1 is a bytearray"),
    ({1: [1]}, "header 1 is a list"),
    ({1: "\ud800"}, "not UTF-8"),
])
def test_a_header_capseal_does_not_write_is_refused_by_name(header: dict[Any, Any], why: str) -> None:
    with pytest.raises(CoseFormatError, match=why) as caught:
        encode_protected(header)
    assert caught.value.rule in (Refusal.HEADER_VALUE, Refusal.PROTECTED_EMPTY)


def test_members_that_are_not_bytes_are_refused_by_name() -> None:
    with pytest.raises(CoseFormatError, match="payload is str") as caught:
        sig_structure(b"\xa1\x01\x27", "x")  # type: ignore[arg-type]
    assert caught.value.rule == Refusal.NOT_BYTES
    with pytest.raises(CoseFormatError, match="signature is bytearray"):
        assemble_sign1(b"\xa1\x01\x27", b"p", bytearray(64))  # type: ignore[arg-type]
    with pytest.raises(CoseFormatError, match="protected is NoneType"):
        assemble_sign1(None, b"p", b"s")  # type: ignore[arg-type]


# --------------------------------------------------------------------------- what it reads, and refuses


_HEADER = enc_bytes(b"\xa1\x01\x27")  # {1: -8}, as a protected member
_BIG = _message(_HEADER, payload=enc_bytes(bytes(4090)))

#: (rule, message bytes, decode options, the refusal's detail or its start)
REFUSALS: list[tuple[str, Any, dict[str, Any], str]] = [
    (Refusal.NOT_BYTES, "d284", {}, "a COSE_Sign1 is bytes, not str"),
    (Refusal.TOO_LARGE, _BIG, {}, f"envelope is {len(_BIG)} bytes; at most 4096"),
    (Refusal.TOO_LARGE, _message(_HEADER), {"max_bytes": 10}, f"envelope is {len(_message(_HEADER))} bytes; at most 10"),
    (Refusal.NOT_CBOR, b"", {}, "truncated CBOR"),
    (Refusal.NOT_CBOR, _message(_HEADER) + b"\x00", {}, "trailing bytes after the CBOR item"),
    (Refusal.NOT_CBOR, b"\xd2\x9f\xff", {}, "indefinite length or reserved additional info"),
    (Refusal.NOT_CBOR, b"\xd8\x12\x80", {}, "non-shortest integer encoding"),
    (Refusal.NOT_SIGN1, b"\x84\x41\x00\xa0\x40\x40", {}, "top-level value must be a four-element COSE_Sign1 with tag 18"),
    (Refusal.NOT_SIGN1, b"\xd8\x62\x84\x41\x00\xa0\x40\x40", {}, "top-level value must be a four-element"),
    (Refusal.NOT_SIGN1, b"\xd2\x83\x41\x00\xa0\x40", {}, "top-level value must be a four-element"),
    (Refusal.NOT_SIGN1, b"\xd2\xa0", {}, "top-level value must be a four-element"),
    (Refusal.EXTRA_TAG, b"\xd2\x84" + _HEADER + b"\xa0\xc1\x40\x40", {}, "only the outer tag 18 may appear"),
    (Refusal.PROTECTED_NOT_BYTES, _message(b"\xa1\x01\x27"), {}, "protected header must be a non-empty byte string"),
    (Refusal.PROTECTED_EMPTY, _message(b"\x40"), {}, "protected header must be a non-empty byte string"),
    (Refusal.PROTECTED_NOT_CBOR, _message(enc_bytes(b"\xa1\x01")), {}, "truncated CBOR"),
    (Refusal.PROTECTED_NOT_CBOR, _message(enc_bytes(b"\xa2\x01\x27\x01\x26")), {}, "duplicate map label 1"),
    (Refusal.PROTECTED_NOT_CBOR, _message(enc_bytes(b"\xa1\x18\x01\x27")), {}, "non-shortest integer encoding"),
    (Refusal.PROTECTED_TAGGED, _message(enc_bytes(b"\xc1\xa1\x01\x27")), {}, "protected header must not contain a tag"),
    (Refusal.PROTECTED_NOT_MAP, _message(enc_bytes(b"\x81\x01")), {}, "protected header is not a map"),
    (Refusal.LABEL_NOT_INT_OR_TEXT, _message(enc_bytes(b"\xa1\xf5\x27")), {}, "header label True is not an integer or text"),
    (Refusal.LABEL_NOT_INT_OR_TEXT, _message(enc_bytes(b"\xa1\x41\x01\x27")), {}, "header label b'\\x01' is not an"),
    (Refusal.LABEL_NOT_INT, _message(enc_bytes(b"\xa1\x61x\x27")), {}, "protected header labels must be integers"),
    (Refusal.UNPROTECTED_NOT_MAP, _message(_HEADER, unprotected=b"\x80"), {}, "unprotected header is not a map"),
    (Refusal.UNPROTECTED_NOT_EMPTY, _message(_HEADER, unprotected=b"\xa1\x04\x40"), {},
     "unprotected header must be an empty map"),
    (Refusal.PAYLOAD_NOT_BYTES, _message(_HEADER, payload=b"\xf6"), {}, "attached payload must be a byte string"),
    (Refusal.SIGNATURE_NOT_BYTES, _message(_HEADER, signature=enc_text("s")), {}, "signature must be a byte string"),
]


@pytest.mark.parametrize(("rule", "data", "options", "detail"), REFUSALS)
def test_each_refusal_of_the_strict_decoder_names_its_rule(rule: str, data: Any, options: dict[str, Any],
                                                            detail: str) -> None:
    refused = _refused(data, **options)
    assert refused.refusals[0][0] == rule and refused.refusals[0][1].startswith(detail), refused.refusals
    assert len(refused.refusals) == 1


def test_every_decoder_rule_has_a_case_above() -> None:
    rules = {value for name, value in vars(Refusal).items() if name.isupper()} - {Refusal.HEADER_VALUE}
    assert rules == {rule for rule, *_ in REFUSALS}


def test_after_the_outer_array_each_member_names_its_own_problem_in_order() -> None:
    refused = _refused(_message(enc_bytes(b"\xc1\xa0"), unprotected=b"\xa1\x01\x02", payload=enc_text("p"),
                                signature=b"\x80"))
    assert [rule for rule, _ in refused.refusals] == [Refusal.PROTECTED_TAGGED, Refusal.UNPROTECTED_NOT_EMPTY,
                                                       Refusal.PAYLOAD_NOT_BYTES, Refusal.SIGNATURE_NOT_BYTES]
    # the protected header's problems stop at its first: a text label after a bad map is not reached
    refused = _refused(_message(enc_bytes(b"\xa1\xf5\x27"), unprotected=b"\x80"))
    assert [rule for rule, _ in refused.refusals] == [Refusal.LABEL_NOT_INT_OR_TEXT, Refusal.UNPROTECTED_NOT_MAP]


def test_any_label_type_is_read_when_asked_and_no_other_check_is_relaxed() -> None:
    data = _message(enc_bytes(b"\xa3\x61x\x01\x41k\x02\xf5\x03"))
    assert decode_sign1(data, int_labels=False).header == {"x": 1, b"k": 2, True: 3}
    # labels Python holds equal collapse (1 and True): the caller compares bytes, which no such header passes
    assert decode_sign1(_message(enc_bytes(b"\xa2\x01\x27\xf5\x26")), int_labels=False).header == {1: -7}
    assert _refused(_message(enc_bytes(b"\xa2\x01\x27\x01\x26")), int_labels=False).rule == Refusal.PROTECTED_NOT_CBOR
    assert _refused(_message(enc_bytes(b"\xc1\xa0")), int_labels=False).rule == Refusal.PROTECTED_TAGGED
    assert _refused(_message(_HEADER, unprotected=b"\x80"), int_labels=False).rule == Refusal.UNPROTECTED_NOT_MAP


def test_the_size_limit_is_the_default_and_none_lifts_it() -> None:
    big = _message(_HEADER, payload=enc_bytes(bytes(MAX_SIGN1_BYTES)))
    assert _refused(big).rule == Refusal.TOO_LARGE
    assert decode_sign1(big, max_bytes=None).payload == bytes(MAX_SIGN1_BYTES)
    assert decode_sign1(bytearray(_message(_HEADER))).header == {1: -8}


def test_hostile_bytes_get_a_typed_refusal() -> None:
    deep = b"\xd2\x84" + enc_bytes(enc_head(5, 1) + enc_int(1) + b"\x81" * 40 + b"\x00") + b"\xa0\x40\x40"
    assert _refused(deep).rule == Refusal.PROTECTED_NOT_CBOR and "nested too deeply" in _refused(deep).refusals[0][1]
    assert _refused(_message(enc_bytes(b"\xa1\x01\x62\xff\xfe"))).refusals[0][1] == "text string is not UTF-8"
    assert _refused(b"\xd2\x84" + b"\x5b" + (1 << 63).to_bytes(8, "big")).rule == Refusal.NOT_CBOR
    for _ in range(300):
        data = bytearray(_signed("ES256", b"p")[0])
        data[int.from_bytes(os.urandom(2), "big") % len(data)] ^= 1 + os.urandom(1)[0] % 255
        try:
            decode_sign1(bytes(data))
        except CoseFormatError:
            pass


# --------------------------------------------------------------------------- signatures


@pytest.mark.parametrize("alg", ALGS)
def test_signature_ok_accepts_each_algorithm_and_refuses_a_changed_byte(alg: str) -> None:
    signer = UnsafeEphemeralSigner(alg)
    data = os.urandom(40)
    signature = signer.sign(data).signature
    assert len(signature) == SIGNATURE_SIZE.get(alg, getattr(signer.public_key, "key_size", 0) // 8)
    assert ALG_NAME[COSE_ALG[alg]] == alg
    assert signature_ok(alg, signer.public_key, signature, data)
    assert not signature_ok(alg, signer.public_key, signature, data + b"!")
    assert not signature_ok(alg, signer.public_key, bytes([signature[0] ^ 1]) + signature[1:], data)
    other = next(a for a in ALGS if a != alg and not {a, alg} <= {"ES256", "ES384"})
    assert not signature_ok(other, signer.public_key, signature, data)  # the key is not of that algorithm
    assert not signature_ok("RS256", signer.public_key, signature, data)


def test_ecdsa_needs_its_own_curve_and_the_raw_r_s_form() -> None:
    key = ec.generate_private_key(ec.SECP384R1())
    data = b"d"
    der = key.sign(data, ec.ECDSA(hashes.SHA256()))
    assert not signature_ok("ES256", key.public_key(), der, data)  # a P-384 key under ES256
    assert not signature_ok("ES384", key.public_key(), der, data)  # DER is not COSE's r || s


def test_an_ed25519_key_of_small_order_never_verifies() -> None:
    neutral = bytes([1]) + bytes(31)
    key = ed25519.Ed25519PublicKey.from_public_bytes(neutral)
    forged = neutral + bytes(32)  # R = neutral point, S = 0: OpenSSL accepts it for every message
    key.verify(forged, b"any message")
    assert small_order_key(neutral) and not signature_ok("EdDSA", key, forged, b"any message")
    ordinary = ed25519.Ed25519PrivateKey.generate()
    raw = ordinary.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    assert not small_order_key(raw) and not small_order_key(neutral[:31]) and not small_order_key(b"")
    assert signature_ok("EdDSA", ordinary.public_key(), ordinary.sign(b"m"), b"m")


_SIGNERS = {alg: UnsafeEphemeralSigner(alg) for alg in ALGS}


@pytest.mark.parametrize("alg", ALGS)
@given(payload=st.binary(min_size=32, max_size=32))
def test_the_bytes_an_envelope_signs_are_the_sig_structure(alg: str, payload: bytes) -> None:
    """prepare_envelope's bytes to sign, made from a head kept per key, are
    sig_structure's for every payload (the plain path)."""
    from capseal.envelope import prepare_envelope

    signer = _SIGNERS[alg]
    pending = prepare_envelope(signer, payload)
    assert pending.tbs == sig_structure(pending.protected, payload) == cbor2.dumps(
        ["Signature1", pending.protected, b"", payload])



@pytest.mark.parametrize("alg", ALGS)
@given(payload=st.binary(min_size=32, max_size=32))
def test_an_envelope_is_the_sign1_message_assemble_sign1_writes(alg: str, payload: bytes) -> None:
    """complete_envelope's message, made from a head kept per key, is
    assemble_sign1's (the plain path) and cbor2's encoding of it."""
    from capseal.envelope import complete_envelope, prepare_envelope

    signer = _SIGNERS[alg]
    pending = prepare_envelope(signer, payload)
    result = signer.sign(pending.tbs)
    cose = complete_envelope(signer, pending, result).cose
    assert cose == assemble_sign1(pending.protected, payload, result.signature) == cbor2.dumps(
        cbor2.CBORTag(18, [pending.protected, {}, payload, result.signature]))
