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

The COSE_Sign1 mechanics are :mod:`capseal.cose`'s, shared with the capsule
envelopes; this module says what a judgment envelope holds.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from cryptography.hazmat.primitives import serialization

from capseal.canonical import canonical_bytes
from capseal.cose import (
    ALG_NAME,
    COSE_ALG,
    Refusal,
    assemble_sign1,
    decode_sign1,
    encode_protected,
    sig_structure,
    signature_ok,
)
from capseal.errors import CoseFormatError, SignatureFailedError, UnsupportedAlgorithmError
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
        """The envelope as the store keeps it.

        Returns:
            ``{"alg", "kid", "public_key", "cose"}``, the key and COSE_Sign1 in hex.
        """
        return {"alg": self.alg, "kid": self.kid, "public_key": self.public_key, "cose": self.cose.hex()}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> JudgmentEnvelope:
        """Read an envelope as :meth:`to_json` wrote it.

        Args:
            data: ``{"alg", "kid", "public_key", "cose"}``.

        Returns:
            The envelope (nothing in it checked yet).

        Raises:
            KeyError: a member is missing.
            ValueError: ``cose`` is not hex.
        """
        return cls(str(data["alg"]), str(data["kid"]), str(data["public_key"]), bytes.fromhex(str(data["cose"])))


def _protected(alg: str, kid: bytes, commitment: bytes) -> bytes:
    return encode_protected({1: COSE_ALG[alg], 3: CONTENT_TYPE, 4: kid, HEADER_LABEL: commitment})


def sign_judgment(signer: Signer, digest_raw: bytes, commitment: bytes) -> JudgmentEnvelope:
    """Sign a judgment record's digest with any capseal signer.

    The signature is verified against the signer's public key before it is
    returned, so a token that hands back a bad signature never reaches the
    store.

    Args:
        signer: the key (software, PKCS#11 or TPM).
        digest_raw: the record digest, 32 raw bytes (the payload).
        commitment: :func:`header_commitment` of the record's store header.

    Returns:
        The envelope, with the signer's SPKI.

    Raises:
        ValueError: ``digest_raw`` or ``commitment`` is not 32 bytes.
        UnsupportedAlgorithmError: the signer's algorithm has no COSE form here.
        SignatureFailedError: the signature names another key or algorithm, or
            does not verify under the signer's public key.
        SignerError: the signer could not sign (a subclass names why).
    """
    if len(digest_raw) != 32 or len(commitment) != 32:
        raise ValueError("a record digest and a header commitment are 32 raw bytes each")
    alg = signer.alg
    if alg not in COSE_ALG:
        raise UnsupportedAlgorithmError(f"no COSE algorithm for {alg!r}")
    protected = _protected(alg, bytes.fromhex(signer.kid), commitment)
    tbs = sig_structure(protected, digest_raw)
    result = signer.sign(tbs)
    if result.kid != signer.kid or result.alg != alg:
        raise SignatureFailedError(f"signer {signer.kid[:16]}… changed key or algorithm during signing")
    if not signature_ok(alg, signer.public_key, result.signature, tbs):
        raise SignatureFailedError(f"{signer.describe_short()} returned a signature its public key rejects")
    cose = assemble_sign1(protected, digest_raw, result.signature)
    spki = signer.public_key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return JudgmentEnvelope(alg, signer.kid, spki.hex(), cose)


def verify_judgment_envelope(env: Any, digest_raw: bytes, commitment: bytes) -> tuple[bool, str | None, list[Finding]]:
    """Check one stored envelope against a record digest and header commitment.
    Never raises.

    Args:
        env: the stored envelope, ``{"alg", "kid", "public_key", "cose"}``.
        digest_raw: the record's digest, 32 raw bytes.
        commitment: :func:`header_commitment` of the record's store header.

    Returns:
        ``(authored, kid, findings)``: whether the envelope is a valid
        signature over both, the key id it names once that matches its
        public key (else None), and the error findings.
    """
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
        # any label type, any length: what this envelope requires is its exact canonical header, checked below
        sign1 = decode_sign1(envelope.cose, max_bytes=None, int_labels=False)
    except CoseFormatError as exc:
        return False, None, [Finding("envelope_malformed", _malformed_detail(exc))]
    protected_bytes, header, payload, signature = sign1.protected, sign1.header, sign1.payload, sign1.signature
    if set(header) != {1, 3, 4, HEADER_LABEL}:
        return False, None, [Finding("envelope_protected_headers_invalid", "protected header must hold exactly alg, content type, kid and the header commitment")]
    alg = ALG_NAME.get(header[1]) if type(header[1]) is int else None
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
    if not signature_ok(alg, key, signature, sig_structure(protected_bytes, payload)):
        return False, kid, [Finding("envelope_signature_invalid", f"{alg} signature does not verify under kid {kid[:16]}…")]
    return True, kid, []


#: a wrong member of the COSE_Sign1 array, which this verifier names before a malformed protected header
_MEMBER_REFUSALS = frozenset({Refusal.PROTECTED_NOT_BYTES, Refusal.UNPROTECTED_NOT_MAP, Refusal.UNPROTECTED_NOT_EMPTY,
                              Refusal.PAYLOAD_NOT_BYTES, Refusal.SIGNATURE_NOT_BYTES})


def _malformed_detail(exc: CoseFormatError) -> str:
    """This verifier's wording of the strict decoder's refusal."""
    rules = [rule for rule, _ in exc.refusals]
    if exc.rule in (Refusal.NOT_SIGN1, Refusal.EXTRA_TAG):
        return "not a tagged four-element COSE_Sign1"
    if _MEMBER_REFUSALS.intersection(rules):
        return "COSE_Sign1 members have the wrong types (or a non-empty unprotected header)"
    if exc.rule == Refusal.PROTECTED_EMPTY:
        return "truncated CBOR"  # what the CBOR reader says of zero bytes
    if exc.rule in (Refusal.PROTECTED_TAGGED, Refusal.PROTECTED_NOT_MAP):
        return "protected header is not a plain map"
    return str(exc)  # the CBOR reader's own reason
