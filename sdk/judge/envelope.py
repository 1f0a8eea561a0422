"""COSE_Sign1 over a judgment record's raw 32-byte digest, with any capseal signer.

Content type. The AAC profile's ``application/agent-action-capsule-id`` names a
*capsule* id; a judgment record is not a capsule, so its envelope says
:data:`CONTENT_TYPE` (``application/vnd.capseal.judgment-record-digest``). The
content type is in the protected header, so an envelope over a judgment digest
can never be replayed as a capsule signature (the profile verifier requires its
own content type exactly), nor the reverse.

What is signed. The payload is the record digest (SHA-256 of the body's JCS
bytes, the digest other records cite it by). The protected header also carries,
under the private-use label :data:`HEADER_LABEL`, the SHA-256 of the JCS of the
record's store-header commitment ``{record_type, epistemic_type, links}`` (and
``external``, the digests it was sealed citing in another store, when any). So
the signature covers the body *and* the type and links fixed at commit: an
``epistemic_type`` or a link changed afterwards breaks the signature, while the
digest others cite stays the body's digest.

Protected header, in canonical CBOR order: ``{1: alg, 3: content type, 4: kid,
-65537: header commitment}``; unprotected header empty; tag 18. ``kid`` is the
signer's key id (raw Ed25519 key, or SHA-256 of the SPKI for other keys), and
the stored envelope carries the SPKI so any verifier can check it; whether that
key is *trusted* is the caller's policy (``trusted_keys``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from cryptography.hazmat.primitives import serialization

from capseal.canonical import canonical_bytes
from capseal.cbor import CBORError, Tagged, decode_strict, enc_bytes, enc_int, enc_text
from capseal.envelope import COSE_ALG, signature_ok
from capseal.errors import SignatureFailedError, UnsupportedAlgorithmError
from capseal.findings import Finding

if TYPE_CHECKING:
    from capseal.keys import Signer

__all__ = [
    "CONTENT_TYPE",
    "HEADER_LABEL",
    "JudgmentEnvelope",
    "header_commitment",
    "sign_judgment",
    "verify_judgment_envelope",
]

CONTENT_TYPE = "application/vnd.capseal.judgment-record-digest"
HEADER_LABEL = -65537  # COSE private-use label (< -65536)
_ALG_NAME = {v: k for k, v in COSE_ALG.items()}
_SIG1 = enc_text("Signature1")


def header_commitment(record_type: str, epistemic_type: str, links: Sequence[Mapping[str, str]],
                      external: Sequence[str] = ()) -> bytes:
    """Raw SHA-256 of the JCS of ``{record_type, epistemic_type, links}``, with
    ``external`` (the digests the record was sealed citing in another store)
    as a fourth member when there are any, so what was declared external at
    seal time is signed too and cannot be added or dropped afterwards.

    Args:
        record_type: the store header's record type.
        epistemic_type: the store header's epistemic type.
        links: the store header's links.
        external: the digests declared external at seal time (sorted).

    Returns:
        32 raw bytes.

    Raises:
        CanonicalizationError: a value in them has no JCS form.
    """
    value: dict[str, object] = {"record_type": record_type, "epistemic_type": epistemic_type, "links": [dict(x) for x in links]}
    if external:
        value["external"] = list(external)
    return hashlib.sha256(canonical_bytes(value)).digest()


@dataclass(frozen=True)
class JudgmentEnvelope:
    """One signature over a judgment record, as stored beside its body."""

    alg: str
    kid: str
    public_key: str  # hex DER SubjectPublicKeyInfo
    cose: bytes

    def to_json(self) -> dict[str, str]:
        return {"alg": self.alg, "kid": self.kid, "public_key": self.public_key, "cose": self.cose.hex()}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> JudgmentEnvelope:
        return cls(str(data["alg"]), str(data["kid"]), str(data["public_key"]), bytes.fromhex(str(data["cose"])))


def _protected(alg: str, kid: bytes, commitment: bytes) -> bytes:
    return b"\xa4\x01" + enc_int(COSE_ALG[alg]) + b"\x03" + enc_text(CONTENT_TYPE) + b"\x04" + enc_bytes(kid) + enc_int(HEADER_LABEL) + enc_bytes(commitment)


def _tbs(protected: bytes, payload: bytes) -> bytes:
    return b"\x84" + _SIG1 + enc_bytes(protected) + b"\x40" + enc_bytes(payload)


def sign_judgment(signer: Signer, digest_raw: bytes, commitment: bytes) -> JudgmentEnvelope:
    """Sign ``digest_raw`` (32 bytes) with ``signer`` (software, PKCS#11 or TPM);
    the signature is verified against the signer's public key before it is
    returned, so a token that hands back a bad signature never reaches the store."""
    if len(digest_raw) != 32 or len(commitment) != 32:
        raise ValueError("a record digest and a header commitment are 32 raw bytes each")
    alg = signer.alg
    if alg not in COSE_ALG:
        raise UnsupportedAlgorithmError(f"no COSE algorithm for {alg!r}")
    protected = _protected(alg, bytes.fromhex(signer.kid), commitment)
    tbs = _tbs(protected, digest_raw)
    result = signer.sign(tbs)
    if result.kid != signer.kid or result.alg != alg:
        raise SignatureFailedError(f"signer {signer.kid[:16]}… changed key or algorithm during signing")
    if not signature_ok(alg, signer.public_key, result.signature, tbs):
        raise SignatureFailedError(f"{signer.describe_short()} returned a signature its public key rejects")
    cose = b"\xd2\x84" + enc_bytes(protected) + b"\xa0" + enc_bytes(digest_raw) + enc_bytes(result.signature)
    spki = signer.public_key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return JudgmentEnvelope(alg, signer.kid, spki.hex(), cose)


def verify_judgment_envelope(env: Any, digest_raw: bytes, commitment: bytes) -> tuple[bool, str | None, list[Finding]]:
    """Check one stored envelope against a record digest and header commitment.
    Returns ``(authored, kid, findings)``. Never raises."""
    try:
        return _verify(env, digest_raw, commitment)
    except Exception as exc:  # never raise
        return False, None, [Finding("envelope_malformed", f"{type(exc).__name__}: {exc}")]


def _verify(env: Any, digest_raw: bytes, commitment: bytes) -> tuple[bool, str | None, list[Finding]]:
    from capseal.keys import kid_for

    if not isinstance(env, Mapping):
        return False, None, [Finding("envelope_malformed", "an envelope is an object {alg, kid, public_key, cose}")]
    envelope = JudgmentEnvelope.from_json(env)
    try:
        outer, tags = decode_strict(envelope.cose)
        if not isinstance(outer, Tagged) or outer.tag != 18 or not isinstance(outer.value, list) or len(outer.value) != 4 or tags != 1:
            raise CBORError("not a tagged four-element COSE_Sign1")
        protected_bytes, unprotected, payload, signature = outer.value
        if not isinstance(protected_bytes, bytes) or unprotected != {} or not isinstance(payload, bytes) or not isinstance(signature, bytes):
            raise CBORError("COSE_Sign1 members have the wrong types (or a non-empty unprotected header)")
        header_raw, inner = decode_strict(protected_bytes)
        if inner or not isinstance(header_raw, dict):
            raise CBORError("protected header is not a plain map")
        header = {getattr(k, "value", k): v for k, v in header_raw.items()}
    except (CBORError, ValueError) as exc:
        return False, None, [Finding("envelope_malformed", str(exc))]
    if set(header) != {1, 3, 4, HEADER_LABEL}:
        return False, None, [Finding("envelope_protected_headers_invalid", "protected header must hold exactly alg, content type, kid and the header commitment")]
    alg = _ALG_NAME.get(header[1]) if type(header[1]) is int else None
    if alg is None or alg != envelope.alg:
        return False, None, [Finding("envelope_algorithm_mismatch", f"protected alg {header[1]!r} is not the envelope's {envelope.alg!r}")]
    if header[3] != CONTENT_TYPE:
        return False, None, [Finding("envelope_content_type_mismatch", f"content type must be {CONTENT_TYPE!r}, not {header[3]!r}")]
    if protected_bytes != _protected(alg, header[4] if isinstance(header[4], bytes) else b"", header[HEADER_LABEL] if isinstance(header[HEADER_LABEL], bytes) else b""):
        return False, None, [Finding("envelope_malformed", "protected header is not in capseal's canonical form")]
    key = serialization.load_der_public_key(bytes.fromhex(envelope.public_key))
    kid = kid_for(key)
    if kid != envelope.kid or header[4] != bytes.fromhex(kid):
        return False, None, [Finding("key_id_mismatch", "the envelope's kid is not the key id of its public key")]
    if payload != digest_raw:
        return False, kid, [Finding("envelope_payload_mismatch", "payload is not this record's digest (the body changed after signing)")]
    if header[HEADER_LABEL] != commitment:
        return False, kid, [Finding("header_commitment_mismatch", "record_type, epistemic_type or links differ from what was signed at commit")]
    if not signature_ok(alg, key, signature, _tbs(protected_bytes, payload)):
        return False, kid, [Finding("envelope_signature_invalid", f"{alg} signature does not verify under kid {kid[:16]}…")]
    return True, kid, []
