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

The COSE_Sign1 mechanics (headers, Sig_structure, strict reading, signature
checks) are :mod:`capseal.cose`'s; this module says what a capsule envelope
holds. Verification never raises: it returns findings whose codes follow the
reference's ``verify_producer_envelope``.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric import ed25519

from . import _sodium
from ._internal.switch import plain_path
from .cbor import enc_bytes
from .cose import (
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
from .errors import CoseFormatError, SignatureFailedError, UnsupportedAlgorithmError
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
    "MAX_ENVELOPE_BYTES",
    "ToBeSigned",
    "prepare_envelope",
    "complete_envelope",
    "signature_ok",
    "small_order_key",
]

CONTENT_TYPE = "application/agent-action-capsule-id"
PROFILE = "aac-producer-envelope"
PLAIN = "cose-sign1"
MAX_ENVELOPE_BYTES = MAX_SIGN1_BYTES
_PROFILE_LABELS = frozenset({1, 3, 4})


@dataclass(frozen=True)
class Envelope:
    """One COSE_Sign1 over a capsule id, as kept in a record's ``envelopes[]``."""

    profile: str
    alg: str
    kid: str
    cose: bytes

    def to_json(self) -> dict[str, str]:
        """The envelope as a record keeps it.

        Returns:
            ``{"profile", "alg", "kid", "cose"}``, the COSE_Sign1 in hex.
        """
        return {"profile": self.profile, "alg": self.alg, "kid": self.kid, "cose": self.cose.hex()}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Envelope:
        """Read an envelope as :meth:`to_json` wrote it.

        Args:
            data: ``{"profile", "alg", "kid", "cose"}``.

        Returns:
            The envelope (its COSE_Sign1 not yet checked).

        Raises:
            KeyError: a member is missing.
            ValueError: ``cose`` is not hex.
        """
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
        """Record an error finding; the result is no longer ok.

        Args:
            code: the finding's code.
            detail: what is wrong.

        Returns:
            This result.
        """
        self.findings.append(Finding(code, detail))
        self.ok = False
        return self


@functools.lru_cache(maxsize=64)
def profile_protected(public_key_raw: bytes) -> bytes:
    """The protected header of the AAC profile (-05 §3.1).

    Args:
        public_key_raw: the raw 32-byte Ed25519 public key (the kid).

    Returns:
        ``{1: -8, 3: CONTENT_TYPE, 4: public_key_raw}`` in deterministic CBOR
        (76 bytes for a 32-byte key).

    Raises:
        CoseFormatError: ``public_key_raw`` is not bytes.
    """
    return encode_protected({1: COSE_ALG["EdDSA"], 3: CONTENT_TYPE, 4: public_key_raw})


@functools.lru_cache(maxsize=64)
def _plain_protected(alg: str, kid: bytes) -> bytes:
    return encode_protected({1: COSE_ALG[alg], 4: kid})


@functools.lru_cache(maxsize=64)
def _sig_structure_head(protected: bytes) -> bytes:
    """What :func:`sig_structure` writes before a 32-byte payload, which
    comes last: a key's envelopes differ only in their payload."""
    return sig_structure(protected, bytes(32))[:-32]


@functools.lru_cache(maxsize=64)
def _sign1_head(protected: bytes) -> bytes:
    """What :func:`assemble_sign1` writes before a 32-byte payload and the
    signature, which come last (the empty signature's one byte cut off)."""
    return assemble_sign1(protected, bytes(32), b"")[:-33]


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
    """First half of :func:`sign_envelope`: what to sign, without signing.

    Args:
        signer: the key that will sign (its algorithm picks the profile).
        capsule_id_raw: the raw 32-byte capsule id, the payload.

    Returns:
        The protected header, payload and Sig_structure bytes to sign.

    Raises:
        ValueError: ``capsule_id_raw`` is not 32 bytes.
        UnsupportedAlgorithmError: the signer's algorithm has no COSE form here.
    """
    if len(capsule_id_raw) != 32:
        raise ValueError("a capsule id is 32 raw bytes")
    alg = signer.alg
    if alg not in COSE_ALG:
        raise UnsupportedAlgorithmError(f"no COSE algorithm for {alg!r}")
    if alg == "EdDSA":
        protected, profile = profile_protected(signer.public_key_raw), PROFILE
    else:
        protected, profile = _plain_protected(alg, bytes.fromhex(signer.kid)), PLAIN
    if type(capsule_id_raw) is bytes:
        tbs = _sig_structure_head(protected) + capsule_id_raw
    else:
        tbs = sig_structure(protected, capsule_id_raw)  # refuses it
    return ToBeSigned(profile, alg, signer.kid, protected, capsule_id_raw, tbs)


def complete_envelope(signer: Signer, pending: ToBeSigned, result: SignatureResult, *, verify: bool = False) -> Envelope:
    """Second half of :func:`sign_envelope`: check the signer's answer and
    assemble the COSE_Sign1.

    Args:
        signer: the key that signed ``pending.tbs``.
        pending: what :func:`prepare_envelope` returned.
        result: the signer's answer.
        verify: also check the signature over the signed bytes under the
            signer's public key (libsodium's Ed25519 check when the system
            has it, which accepts only what OpenSSL accepts).

    Returns:
        The envelope.

    Raises:
        SignatureFailedError: the answer names another key or algorithm, has
            the wrong length, or (with ``verify``) does not verify; the
            signer's cached key is forgotten first.
    """
    if result.kid != pending.kid or result.alg != pending.alg:
        raise SignatureFailedError(f"signer {pending.kid[:16]}… changed key or algorithm during signing")
    expected_len = SIGNATURE_SIZE.get(pending.alg)
    if expected_len is not None and len(result.signature) != expected_len:
        raise SignatureFailedError(
            f"{pending.alg} signature from {signer.describe_short()} is {len(result.signature)} bytes, expected {expected_len}"
        )
    if verify and not _device_signature_ok(signer, pending, result.signature):
        _forget_cached_key(signer)
        raise SignatureFailedError(
            f"{signer.describe_short()} returned a {pending.alg} signature that does not verify under its public key"
        )
    payload, signature = pending.payload, result.signature
    if type(signature) is bytes and type(payload) is bytes and len(payload) == 32:
        cose = _sign1_head(pending.protected) + payload + enc_bytes(signature)
    else:
        cose = assemble_sign1(pending.protected, payload, signature)  # refuses what is not bytes
    return Envelope(pending.profile, pending.alg, result.kid, cose)


def _device_signature_ok(signer: Signer, pending: ToBeSigned, signature: bytes) -> bool:
    """The producer's check of a signature its signer made: libsodium's for
    Ed25519 when the system has it (faster, and stricter than OpenSSL's: see
    :mod:`capseal._sodium`), else cryptography's, as verifiers use."""
    if pending.alg == "EdDSA":
        check = _sodium.verifier()
        if check is not None:
            return check(signature, pending.tbs, signer.public_key_raw)
    return signature_ok(pending.alg, signer.public_key, signature, pending.tbs)


def _forget_cached_key(signer: Signer) -> None:
    """After a device signature that does not verify (``Signer.forget_cached_key``).
    Nothing the signer raises here hides the SignatureFailedError."""
    try:
        signer.forget_cached_key()
    except Exception:  # noqa: BLE001 - the refusal below is what the caller must see
        pass


def sign_envelope(signer: Signer, capsule_id_raw: bytes, *, verify: bool = False) -> Envelope:
    """Sign ``capsule_id_raw`` with ``signer``: the AAC profile for Ed25519 keys,
    a plain COSE_Sign1 otherwise.

    Args:
        signer: the key.
        capsule_id_raw: the raw 32-byte capsule id.
        verify: check the signature against the signer's public key over the
            exact bytes that were signed before returning it (capseal does
            this for every signature from a token or TPM).

    Returns:
        The envelope.

    Raises:
        ValueError: ``capsule_id_raw`` is not 32 bytes.
        SignerError: the signer could not sign (a subclass names why);
            SignatureFailedError for a wrong signature.
    """
    pending = prepare_envelope(signer, capsule_id_raw)
    # checked here when verify: begin_sign skips a backend's own check in sign() (no second verify)
    result = signer.begin_sign(pending.tbs).result() if verify else signer.sign(pending.tbs)
    return complete_envelope(signer, pending, result, verify=verify)


def _decode_sign1(data: Any, result: EnvelopeResult) -> Sign1 | None:
    if not isinstance(data, (bytes, bytearray)):
        result.fail("envelope_malformed", "a producer envelope is bytes")
        return None
    try:
        return decode_sign1(data, max_bytes=MAX_ENVELOPE_BYTES)
    except CoseFormatError as exc:
        result.fail("envelope_too_large" if exc.rule == Refusal.TOO_LARGE else "envelope_malformed", str(exc))
        return None


#: the plain path (``CAPSEAL_NO_DIRECT=1`` when capseal is imported): every envelope read by the strict
#: decoder and checked by cryptography alone
_PLAIN_PATH = plain_path()


@functools.lru_cache(maxsize=64)
def _profile_frame(key: bytes) -> tuple[bytes, bytes, bool]:
    """For one raw Ed25519 key: the bytes of every AAC profile envelope it
    makes up to the payload, the Sig_structure up to the payload, and whether
    the key is of small order."""
    protected = profile_protected(key)
    head = assemble_sign1(protected, bytes(32), bytes(64))[: -(32 + 2 + 64)]
    return head, sig_structure(protected, bytes(32))[:-32], small_order_key(key)


def _profile_shape() -> tuple[int, int]:
    """Where the key sits in an AAC profile envelope, and the envelope's length."""
    marker = bytes(range(1, 33))
    data = assemble_sign1(profile_protected(marker), bytes(32), bytes(64))
    return data.index(marker), len(data)


_KEY_AT, _PROFILE_LEN = _profile_shape()
_SIG_HEAD = enc_bytes(bytes(64))[:-64]


@functools.lru_cache(maxsize=64)
def _ed25519_key(key: bytes) -> Any:
    return ed25519.Ed25519PublicKey.from_public_bytes(key)


def _profile_fast(capsule_id: str, data: Any) -> EnvelopeResult | None:
    """The result for an envelope that is, byte for byte, the one shortest-form
    AAC profile envelope its key makes over ``capsule_id`` and whose signature
    verifies; None for any other (the strict reading then says why).

    Why this is the strict path's answer: the decoder accepts only shortest-form
    CBOR, so a well-formed profile envelope over this payload under this key has
    exactly these bytes, and every check before the signature's holds for them.
    The signature is taken as valid when libsodium accepts it (it accepts a
    subset of what OpenSSL accepts: see :mod:`capseal._sodium`) or else when
    cryptography does, as on the strict path."""
    if type(data) is not bytes or len(data) != _PROFILE_LEN or len(capsule_id) != 64:
        return None
    key = data[_KEY_AT : _KEY_AT + 32]
    head, tbs_head, weak = _profile_frame(key)
    try:
        payload = bytes.fromhex(capsule_id)
    except ValueError:
        return None
    signature = data[-64:]
    if weak or data != head + payload + _SIG_HEAD + signature or capsule_id != payload.hex():
        return None
    tbs = tbs_head + payload
    check = _sodium.verifier()
    if check is None or not check(signature, tbs, key):
        try:
            _ed25519_key(key).verify(signature, tbs)
        except (InvalidSignature, ValueError):
            return None
    return EnvelopeResult(ok=True, public_key=key, alg="EdDSA", kid=key)


def verify_profile_envelope(capsule_id: str, data: Any) -> EnvelopeResult:
    """Check one AAC profile envelope against ``capsule_id``. Never raises.

    Args:
        capsule_id: the capsule id, 64 lowercase hex.
        data: the COSE_Sign1 bytes.

    Returns:
        The result: ``ok``, and the findings (codes as the reference's
        ``verify_producer_envelope``). On success ``public_key`` is the
        authenticated raw Ed25519 key; whether that key is authorized is the
        caller's policy (-05 §3.2).
    """
    if not _PLAIN_PATH:
        try:
            fast = _profile_fast(capsule_id, data)
        except Exception:  # noqa: BLE001 - the strict reading below says what is wrong
            fast = None
        if fast is not None:
            return fast
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
    protected, payload, signature = parts.header, parts.payload, parts.signature
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
        ed25519.Ed25519PublicKey.from_public_bytes(key).verify(signature, sig_structure(parts.protected, payload))
    except (InvalidSignature, ValueError):
        return result.fail("envelope_signature_invalid", "Ed25519 signature does not verify under the kid")
    result.ok, result.public_key, result.alg, result.kid = True, key, "EdDSA", key
    return result


#: header labels a plain COSE_Sign1's ``crit`` may list: alg and kid, the ones capseal reads
_CRIT_UNDERSTOOD = frozenset({1, 4})


def verify_cose_sign1(data: Any, public_key: Any, *, payload: bytes | None = None) -> EnvelopeResult:
    """Verify a plain COSE_Sign1 (EdDSA, ES256, ES384, PS256). Never raises.

    Args:
        data: the COSE_Sign1 bytes.
        public_key: a ``cryptography`` public key.
        payload: the payload required, or None for any.

    Returns:
        The result: ``ok``, the findings, and on success ``alg`` and ``kid``
        (the protected kid when it is a byte string).
    """
    result = EnvelopeResult()
    try:
        parts = _decode_sign1(data, result)
        if parts is None:
            return result
        protected, body, signature = parts.header, parts.payload, parts.signature
        if 2 in protected:  # crit (RFC 9052 §3.1): each label listed must be one this verifier processes
            crit = protected[2]
            if not isinstance(crit, list) or not crit or any(type(c) not in (int, str) for c in crit):
                return result.fail("envelope_malformed", "crit must be a non-empty array of header labels")
            unknown = [c for c in crit if c not in _CRIT_UNDERSTOOD]
            if unknown:
                return result.fail("envelope_crit_unknown", f"crit marks header(s) {unknown!r} as critical, which "
                                   "capseal does not process (RFC 9052 §3.1: such a message is rejected)")
        alg_id = protected.get(1)
        alg = ALG_NAME.get(alg_id) if type(alg_id) is int else None
        if alg is None:
            return result.fail("envelope_algorithm_unsupported", f"protected alg {alg_id!r} is not one capseal verifies")
        if payload is not None and body != payload:
            return result.fail("envelope_payload_mismatch", "payload must equal the raw 32-byte capsule id")
        tbs = sig_structure(parts.protected, body)
        if not signature_ok(alg, public_key, signature, tbs):
            return result.fail("envelope_signature_invalid", f"{alg} signature does not verify under the given key")
        kid = protected.get(4)
        result.ok, result.alg = True, alg
        result.kid = kid if isinstance(kid, bytes) else None
        return result
    except Exception as exc:  # never raise
        return result.fail("envelope_malformed", f"{type(exc).__name__}: {exc}")
