"""COSE_Sign1 producer envelopes over the raw 32-byte capsule id (-05 §3.1).

Two kinds, one module:

* the **AAC profile envelope** (Ed25519 only): protected header exactly
  ``{1: -8, 3: "application/agent-action-capsule-id", 4: <raw 32-byte key>}``,
  empty unprotected map, shortest-form CBOR, tag 18. It is written inline in the
  record as ``signature``/``key_id`` hex, as the reference's
  ``verify_record_signature`` reads them;
* a **plain COSE_Sign1** (ES256, PS256, or EdDSA with a hash kid) over the same
  payload for keys that cannot make the profile; kept only in ``envelopes[]``,
  never inline, where the reference would read it as invalid.

Verification never raises: it returns findings whose codes follow the reference's
``verify_producer_envelope``.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, padding, rsa
from cryptography.hazmat.primitives.asymmetric.utils import encode_dss_signature

from . import _sodium
from .cbor import CBORError, Tagged, decode_strict, enc_bytes, enc_int, enc_text, plain_map
from .errors import SignatureFailedError, UnsupportedAlgorithmError
from .findings import Finding

if TYPE_CHECKING:
    from capseal.keys import SignatureResult, Signer

__all__ = [
    "CONTENT_TYPE",
    "COSE_ALG",
    "PROFILE",
    "PLAIN",
    "Envelope",
    "EnvelopeResult",
    "sign_envelope",
    "profile_protected",
    "verify_profile_envelope",
    "verify_cose_sign1",
]

CONTENT_TYPE = "application/agent-action-capsule-id"
COSE_ALG = {"EdDSA": -8, "ES256": -7, "ES384": -35, "PS256": -37}
_ALG_NAME = {v: k for k, v in COSE_ALG.items()}
PROFILE = "aac-producer-envelope"
PLAIN = "cose-sign1"
MAX_ENVELOPE_BYTES = 4096
_PROFILE_LABELS = frozenset({1, 3, 4})
_SIG1 = enc_text("Signature1")
_EMPTY_BSTR = b"\x40"


@dataclass(frozen=True)
class Envelope:
    """One COSE_Sign1 over a capsule id, as kept in a record's ``envelopes[]``."""

    profile: str
    alg: str
    kid: str
    cose: bytes

    def to_json(self) -> dict[str, str]:
        return {"profile": self.profile, "alg": self.alg, "kid": self.kid, "cose": self.cose.hex()}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Envelope:
        return cls(str(data["profile"]), str(data["alg"]), str(data["kid"]), bytes.fromhex(str(data["cose"])))


@dataclass
class EnvelopeResult:
    """Never-raising envelope verification result."""

    ok: bool = False
    findings: list[Finding] = field(default_factory=list)
    public_key: bytes | None = None
    alg: str | None = None
    kid: bytes | None = None

    def fail(self, code: str, detail: str) -> EnvelopeResult:
        self.findings.append(Finding(code, detail))
        self.ok = False
        return self


@functools.lru_cache(maxsize=64)
def profile_protected(public_key_raw: bytes) -> bytes:
    """The 76-byte protected header of the AAC profile (-05 §3.1)."""
    return b"\xa3\x01\x27\x03" + enc_text(CONTENT_TYPE) + b"\x04" + enc_bytes(public_key_raw)


@functools.lru_cache(maxsize=64)
def _plain_protected(alg: str, kid: bytes) -> bytes:
    # labels 1 (alg) then 4 (kid): already in canonical order
    return b"\xa2\x01" + enc_int(COSE_ALG[alg]) + b"\x04" + enc_bytes(kid)


def _to_be_signed(protected: bytes, payload: bytes) -> bytes:
    """Sig_structure = ["Signature1", protected, h'', payload] (RFC 9052 §4.4)."""
    return b"\x84" + _SIG1 + enc_bytes(protected) + _EMPTY_BSTR + enc_bytes(payload)


def _assemble(protected: bytes, payload: bytes, signature: bytes) -> bytes:
    return b"\xd2\x84" + enc_bytes(protected) + b"\xa0" + enc_bytes(payload) + enc_bytes(signature)


@dataclass(frozen=True)
class ToBeSigned:
    """An envelope waiting for its signature: the protected header and the exact
    Sig_structure bytes the signer must sign."""

    profile: str
    alg: str
    kid: str
    protected: bytes
    payload: bytes
    tbs: bytes


def prepare_envelope(signer: Signer, capsule_id_raw: bytes) -> ToBeSigned:
    """First half of :func:`sign_envelope`: what to sign, without signing."""
    if len(capsule_id_raw) != 32:
        raise ValueError("a capsule id is 32 raw bytes")
    alg = signer.alg
    if alg not in COSE_ALG:
        raise UnsupportedAlgorithmError(f"no COSE algorithm for {alg!r}")
    if alg == "EdDSA":
        protected, profile = profile_protected(signer.public_key_raw), PROFILE
    else:
        protected, profile = _plain_protected(alg, bytes.fromhex(signer.kid)), PLAIN
    return ToBeSigned(profile, alg, signer.kid, protected, capsule_id_raw, _to_be_signed(protected, capsule_id_raw))


def complete_envelope(signer: Signer, pending: ToBeSigned, result: SignatureResult, *, verify: bool = False) -> Envelope:
    """Second half of :func:`sign_envelope`: check the signer's answer (key,
    algorithm, length and — with ``verify`` — the signature itself over the
    bytes that were signed) and assemble the COSE_Sign1."""
    if result.kid != pending.kid or result.alg != pending.alg:
        raise SignatureFailedError(f"signer {pending.kid[:16]}… changed key or algorithm during signing")
    expected_len = {"EdDSA": 64, "ES256": 64, "ES384": 96}.get(pending.alg)
    if expected_len is not None and len(result.signature) != expected_len:
        raise SignatureFailedError(
            f"{pending.alg} signature from {signer.describe_short()} is {len(result.signature)} bytes, expected {expected_len}"
        )
    if verify and not _device_signature_ok(signer, pending, result.signature):
        _forget_cached_key(signer)
        raise SignatureFailedError(
            f"{signer.describe_short()} returned a {pending.alg} signature that does not verify under its public key"
        )
    return Envelope(pending.profile, pending.alg, result.kid, _assemble(pending.protected, pending.payload, result.signature))


def _device_signature_ok(signer: Signer, pending: ToBeSigned, signature: bytes) -> bool:
    """The producer's check of a signature its signer made: libsodium's for
    Ed25519 when the system has it (faster, and stricter than OpenSSL's: see
    :mod:`capseal._sodium`), else cryptography's, as verifiers use."""
    if pending.alg == "EdDSA":
        check = _sodium.verifier()
        if check is not None:
            return check(signature, pending.tbs, signer.public_key_raw)
    return _signature_ok(pending.alg, signer.public_key, signature, pending.tbs)


def _forget_cached_key(signer: Signer) -> None:
    """After a device signature that does not verify (``Signer.forget_cached_key``).
    Nothing the signer raises here hides the SignatureFailedError."""
    try:
        signer.forget_cached_key()
    except Exception:  # noqa: BLE001 - the refusal below is what the caller must see
        pass


def sign_envelope(signer: Signer, capsule_id_raw: bytes, *, verify: bool = False) -> Envelope:
    """Sign ``capsule_id_raw`` with ``signer``: the AAC profile for Ed25519 keys,
    a plain COSE_Sign1 otherwise. Raises SignerError subclasses.

    With ``verify=True`` the signature is checked against the signer's public
    key over the exact bytes that were signed before the envelope is returned
    (capseal does this for every signature from a token or TPM): a device that
    answers with a wrong signature raises SignatureFailedError."""
    pending = prepare_envelope(signer, capsule_id_raw)
    # checked here when verify: begin_sign skips a backend's own check in sign() (no second verify)
    result = signer.begin_sign(pending.tbs).result() if verify else signer.sign(pending.tbs)
    return complete_envelope(signer, pending, result, verify=verify)


def _decode_sign1(data: Any, result: EnvelopeResult) -> tuple[bytes, dict[Any, Any], bytes, bytes] | None:
    if not isinstance(data, (bytes, bytearray)):
        result.fail("envelope_malformed", "a producer envelope is bytes")
        return None
    data = bytes(data)
    if len(data) > MAX_ENVELOPE_BYTES:
        result.fail("envelope_too_large", f"envelope is {len(data)} bytes; at most {MAX_ENVELOPE_BYTES}")
        return None
    try:
        outer, tags = decode_strict(data)
        if not isinstance(outer, Tagged) or outer.tag != 18 or not isinstance(outer.value, list) or len(outer.value) != 4:
            raise CBORError("top-level value must be a four-element COSE_Sign1 with tag 18")
        if tags != 1:
            raise CBORError("only the outer tag 18 may appear")
        protected_bytes, unprotected, payload, signature = outer.value
        if not isinstance(protected_bytes, bytes) or not protected_bytes:
            raise CBORError("protected header must be a non-empty byte string")
        protected_raw, inner_tags = decode_strict(protected_bytes)
        if inner_tags:
            raise CBORError("protected header must not contain a tag")
        if not isinstance(protected_raw, dict):
            raise CBORError("protected header is not a map")
        protected = plain_map(protected_raw)
        if any(type(label) is not int for label in protected):
            raise CBORError("protected header labels must be integers")
        if not isinstance(unprotected, dict):
            raise CBORError("unprotected header is not a map")
        if unprotected:
            raise CBORError("unprotected header must be an empty map")
        if not isinstance(payload, bytes):
            raise CBORError("attached payload must be a byte string")
        if not isinstance(signature, bytes):
            raise CBORError("signature must be a byte string")
    except CBORError as exc:
        result.fail("envelope_malformed", str(exc))
        return None
    return protected_bytes, protected, payload, signature


def verify_profile_envelope(capsule_id: str, data: Any) -> EnvelopeResult:
    """Check one AAC profile envelope against ``capsule_id``. Never raises.

    On success ``public_key`` is the authenticated raw Ed25519 key; whether that
    key is authorized is the caller's policy (-05 §3.2)."""
    result = EnvelopeResult()
    try:
        return _verify_profile(capsule_id, data, result)
    except Exception as exc:  # never raise
        return result.fail("envelope_malformed", f"{type(exc).__name__}: {exc}")


def _verify_profile(capsule_id: str, data: Any, result: EnvelopeResult) -> EnvelopeResult:
    from .canonical import is_hex64

    if not is_hex64(capsule_id):
        return result.fail("capsule_id_malformed", "capsule_id must be 64 lowercase hex")
    parts = _decode_sign1(data, result)
    if parts is None:
        return result
    protected_bytes, protected, payload, signature = parts
    alg = protected.get(1)
    if type(alg) is not int or alg != -8:
        return result.fail("envelope_algorithm_mismatch", "protected alg (label 1) must be EdDSA (-8)")
    if type(protected.get(3)) is not str or protected.get(3) != CONTENT_TYPE:
        return result.fail("envelope_content_type_mismatch", f"protected content type (label 3) must be {CONTENT_TYPE!r}")
    key = protected.get(4)
    if not isinstance(key, bytes) or len(key) != 32:
        return result.fail("envelope_kid_invalid", "protected kid (label 4) must be the raw 32-byte Ed25519 key")
    if set(protected) != _PROFILE_LABELS:
        return result.fail("envelope_protected_headers_invalid", "protected header must hold exactly alg, content type and kid")
    if payload != bytes.fromhex(capsule_id):
        return result.fail("envelope_payload_mismatch", "payload must equal the raw 32-byte capsule id")
    if len(signature) != 64:
        return result.fail("envelope_signature_invalid", "an Ed25519 signature is 64 bytes")
    if small_order_key(key):
        return result.fail("envelope_kid_weak", "the kid is an Ed25519 key of small order: a signature under it "
                           "verifies for many messages (the neutral point's, for every message) and proves nothing")
    try:
        ed25519.Ed25519PublicKey.from_public_bytes(key).verify(signature, _to_be_signed(protected_bytes, payload))
    except (InvalidSignature, ValueError):
        return result.fail("envelope_signature_invalid", "Ed25519 signature does not verify under the kid")
    result.ok, result.public_key, result.alg, result.kid = True, key, "EdDSA", key
    return result


#: header labels a plain COSE_Sign1's ``crit`` may list: alg and kid, the ones capseal reads
_CRIT_UNDERSTOOD = frozenset({1, 4})


def verify_cose_sign1(data: Any, public_key: Any, *, payload: bytes | None = None) -> EnvelopeResult:
    """Verify a plain COSE_Sign1 (EdDSA, ES256, ES384, PS256) under ``public_key``
    (a ``cryptography`` public key), optionally requiring ``payload``. Never raises."""
    result = EnvelopeResult()
    try:
        parts = _decode_sign1(data, result)
        if parts is None:
            return result
        protected_bytes, protected, body, signature = parts
        if 2 in protected:  # crit (RFC 9052 §3.1): each label listed must be one this verifier processes
            crit = protected[2]
            if not isinstance(crit, list) or not crit or any(type(c) not in (int, str) for c in crit):
                return result.fail("envelope_malformed", "crit must be a non-empty array of header labels")
            unknown = [c for c in crit if c not in _CRIT_UNDERSTOOD]
            if unknown:
                return result.fail("envelope_crit_unknown", f"crit marks header(s) {unknown!r} as critical, which "
                                   "capseal does not process (RFC 9052 §3.1: such a message is rejected)")
        alg_id = protected.get(1)
        alg = _ALG_NAME.get(alg_id) if type(alg_id) is int else None
        if alg is None:
            return result.fail("envelope_algorithm_unsupported", f"protected alg {alg_id!r} is not one capseal verifies")
        if payload is not None and body != payload:
            return result.fail("envelope_payload_mismatch", "payload must equal the raw 32-byte capsule id")
        tbs = _to_be_signed(protected_bytes, body)
        if not _signature_ok(alg, public_key, signature, tbs):
            return result.fail("envelope_signature_invalid", f"{alg} signature does not verify under the given key")
        kid = protected.get(4)
        result.ok, result.alg = True, alg
        result.kid = kid if isinstance(kid, bytes) else None
        return result
    except Exception as exc:  # never raise
        return result.fail("envelope_malformed", f"{type(exc).__name__}: {exc}")


_P = 2**255 - 19
# the y-coordinates of the eight points of order 1, 2, 4 and 8 (x = 0 or its
# negation is the top bit of an encoding), with y = p and p + 1, the two
# non-canonical encodings below 2**255 of such a y (0 and 1) — libsodium's list
_SMALL_ORDER_Y = frozenset({
    0, 1, _P - 1, _P, _P + 1,
    2707385501144840649318225287225658788936804267575313519463743609750303402022,
    _P - 2707385501144840649318225287225658788936804267575313519463743609750303402022,
})


def small_order_key(raw: bytes) -> bool:
    """Is ``raw`` the encoding of an Ed25519 point of small order?

    Why refused: RFC 8032's (cofactorless) verify, as OpenSSL and the
    reference verifier run it, accepts R = the neutral point and S = 0 under
    the neutral point's key for every message, and a key of order 2, 4 or 8
    for many; a "signature" by such a key proves nothing. libsodium refuses
    them too (the same list, the sign bit ignored)."""
    return len(raw) == 32 and int.from_bytes(raw, "little") & ((1 << 255) - 1) in _SMALL_ORDER_Y


def _signature_ok(alg: str, key: Any, signature: bytes, tbs: bytes) -> bool:
    try:
        if alg == "EdDSA" and isinstance(key, ed25519.Ed25519PublicKey):
            if small_order_key(key.public_bytes_raw()):
                return False
            key.verify(signature, tbs)
        elif alg in ("ES256", "ES384") and isinstance(key, ec.EllipticCurvePublicKey):
            size = 32 if alg == "ES256" else 48
            if len(signature) != 2 * size or key.curve.key_size != size * 8:
                return False
            der = encode_dss_signature(int.from_bytes(signature[:size], "big"), int.from_bytes(signature[size:], "big"))
            key.verify(der, tbs, ec.ECDSA(hashes.SHA256() if alg == "ES256" else hashes.SHA384()))
        elif alg == "PS256" and isinstance(key, rsa.RSAPublicKey):
            key.verify(signature, tbs, padding.PSS(mgf=padding.MGF1(hashes.SHA256()), salt_length=32), hashes.SHA256())
        else:
            return False
    except InvalidSignature:
        return False
    return True


def signature_ok(alg: str, key: Any, signature: bytes, data: bytes) -> bool:
    """Public helper: does ``signature`` (COSE form) over ``data`` verify?"""
    return _signature_ok(alg, key, signature, data)
