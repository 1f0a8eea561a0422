"""COSE_Sign1 (RFC 9052 §4.2) as capseal writes and reads it.

The one implementation under both of capseal's envelopes: the capsule's
(:mod:`capseal.envelope`: the AAC producer-envelope profile of -05 §3.1 and
plain COSE_Sign1) and the judgment record's (:mod:`capseal.judge.envelope`).
What an envelope *means* (its content type, the header labels it requires,
whose key may sign it) is theirs; the mechanics are here:

* :func:`encode_protected`: a protected header in deterministic CBOR
  (RFC 8949 §4.2.1: shortest form, labels in the bytewise order of their
  encodings);
* :func:`sig_structure`: the bytes a signer signs,
  ``["Signature1", protected, h'', payload]`` (RFC 9052 §4.4);
* :func:`assemble_sign1`: the tag-18 message, unprotected header empty,
  payload attached;
* :func:`decode_sign1`: the strict reader. Shortest-form, definite-length
  CBOR, no tag but the outer 18, no duplicate map label, an empty unprotected
  header; a refusal is a :class:`~capseal.errors.CoseFormatError` listing
  every rule broken (:class:`Refusal`), so each envelope can word its own
  finding;
* :func:`signature_ok`: the per-algorithm check (EdDSA, ES256, ES384,
  PS256), which refuses an Ed25519 key of small order
  (:func:`small_order_key`).

Why a strict reader of our own: a general CBOR decoder accepts long-form
integers, indefinite lengths, extra tags and duplicate labels, all of which
the profile forbids; this one refuses each with a reason.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, padding, rsa
from cryptography.hazmat.primitives.asymmetric.utils import encode_dss_signature

from .cbor import CBORError, Tagged, decode_strict, enc_bytes, enc_head, enc_int, enc_text, plain_map, unwrap_map
from .errors import CoseFormatError

__all__ = [
    "ALG_NAME",
    "COSE_ALG",
    "MAX_SIGN1_BYTES",
    "SIGNATURE_SIZE",
    "SMALL_ORDER_Y",
    "Refusal",
    "Sign1",
    "assemble_sign1",
    "decode_sign1",
    "encode_protected",
    "sig_structure",
    "signature_ok",
    "small_order_key",
]

#: JOSE/COSE algorithm name -> COSE algorithm identifier (IANA COSE Algorithms)
COSE_ALG: Final[Mapping[str, int]] = {"EdDSA": -8, "ES256": -7, "ES384": -35, "PS256": -37}
#: COSE algorithm identifier -> name, for the algorithms :func:`signature_ok` checks
ALG_NAME: Final[Mapping[int, str]] = {v: k for k, v in COSE_ALG.items()}
#: the fixed signature sizes (PS256's is the RSA key's size)
SIGNATURE_SIZE: Final[Mapping[str, int]] = {"EdDSA": 64, "ES256": 64, "ES384": 96}
#: :func:`decode_sign1` reads at most this many bytes unless told otherwise
MAX_SIGN1_BYTES: Final = 4096

_SIGNATURE1 = enc_text("Signature1")
_EMPTY_BSTR = b"\x40"
_TAG18_ARRAY4 = b"\xd2\x84"
_EMPTY_MAP = b"\xa0"


class Refusal:
    """The rules the strict decoder (and the header encoder) refuse by:
    ``CoseFormatError.rule`` and each ``CoseFormatError.refusals`` entry.
    Listed in the order :func:`decode_sign1` checks them."""

    NOT_BYTES: Final = "not_bytes"
    TOO_LARGE: Final = "too_large"
    NOT_CBOR: Final = "not_cbor"
    NOT_SIGN1: Final = "not_sign1"
    EXTRA_TAG: Final = "extra_tag"
    PROTECTED_NOT_BYTES: Final = "protected_not_bytes"
    PROTECTED_EMPTY: Final = "protected_empty"
    PROTECTED_NOT_CBOR: Final = "protected_not_cbor"
    PROTECTED_TAGGED: Final = "protected_tagged"
    PROTECTED_NOT_MAP: Final = "protected_not_map"
    LABEL_NOT_INT_OR_TEXT: Final = "label_not_int_or_text"
    LABEL_NOT_INT: Final = "label_not_int"
    UNPROTECTED_NOT_MAP: Final = "unprotected_not_map"
    UNPROTECTED_NOT_EMPTY: Final = "unprotected_not_empty"
    PAYLOAD_NOT_BYTES: Final = "payload_not_bytes"
    SIGNATURE_NOT_BYTES: Final = "signature_not_bytes"
    #: :func:`encode_protected` only: a label or value capseal does not write
    HEADER_VALUE: Final = "header_value"


@dataclass(frozen=True)
class Sign1:
    """A COSE_Sign1 read by :func:`decode_sign1` (its unprotected header is empty).

    Attributes:
        protected: the protected header's bytes, exactly as read (what
            :func:`sig_structure` takes).
        header: the protected header decoded, label -> value.
        payload: the attached payload.
        signature: the signature bytes.
    """

    protected: bytes
    header: dict[Any, Any]
    payload: bytes
    signature: bytes


def _header_item(label: Any, value: Any) -> tuple[bytes, bytes]:
    if type(label) is not int or not -(1 << 64) <= label < 1 << 64:
        raise CoseFormatError([(Refusal.HEADER_VALUE, f"header label {label!r} is not a CBOR integer")])
    if type(value) is int and -(1 << 64) <= value < 1 << 64:
        encoded = enc_int(value)
    elif type(value) is bytes:
        encoded = enc_bytes(value)
    elif type(value) is str:
        try:
            encoded = enc_text(value)
        except UnicodeEncodeError:
            raise CoseFormatError([(Refusal.HEADER_VALUE, f"header {label} is text that is not UTF-8")]) from None
    else:
        raise CoseFormatError([(Refusal.HEADER_VALUE, f"header {label} is a {type(value).__name__}; capseal writes "
                                "a CBOR integer, byte string or text string")])
    return enc_int(label), encoded


def encode_protected(header: Mapping[int, int | str | bytes]) -> bytes:
    """A protected header map in deterministic CBOR.

    Args:
        header: label -> value; labels are integers, values integers, byte
            strings or text. At least one entry (an empty protected header is
            a zero-length byte string, which :func:`decode_sign1` refuses).

    Returns:
        The map's bytes: shortest-form heads, labels in the bytewise order of
        their encodings (RFC 8949 §4.2.1).

    Raises:
        CoseFormatError: a label or value of another type, an integer beyond
            64 bits, text that is not UTF-8, or an empty header.
    """
    if not isinstance(header, Mapping) or not header:
        raise CoseFormatError([(Refusal.PROTECTED_EMPTY, "a protected header holds at least one label")])
    items = sorted(_header_item(label, value) for label, value in header.items())
    return enc_head(5, len(items)) + b"".join(label + value for label, value in items)


def _require_bytes(**values: Any) -> None:
    for name, value in values.items():
        if type(value) is not bytes:
            raise CoseFormatError([(Refusal.NOT_BYTES, f"{name} is {type(value).__name__}, not bytes")])


def sig_structure(protected: bytes, payload: bytes) -> bytes:
    """The bytes a COSE_Sign1's signature covers (RFC 9052 §4.4).

    Args:
        protected: the protected header's bytes.
        payload: the payload.

    Returns:
        ``["Signature1", protected, h'', payload]`` in CBOR (no external data).

    Raises:
        CoseFormatError: ``protected`` or ``payload`` is not bytes.
    """
    if type(protected) is not bytes or type(payload) is not bytes:
        _require_bytes(protected=protected, payload=payload)
    return b"\x84" + _SIGNATURE1 + enc_bytes(protected) + _EMPTY_BSTR + enc_bytes(payload)


def assemble_sign1(protected: bytes, payload: bytes, signature: bytes) -> bytes:
    """A tagged COSE_Sign1 message (RFC 9052 §4.2).

    Args:
        protected: the protected header's bytes (as signed).
        payload: the payload, attached.
        signature: the signature over :func:`sig_structure` of the two.

    Returns:
        ``18([protected, {}, payload, signature])`` in CBOR.

    Raises:
        CoseFormatError: a member is not bytes.
    """
    if type(protected) is not bytes or type(payload) is not bytes or type(signature) is not bytes:
        _require_bytes(protected=protected, payload=payload, signature=signature)
    return _TAG18_ARRAY4 + enc_bytes(protected) + _EMPTY_MAP + enc_bytes(payload) + enc_bytes(signature)


def decode_sign1(data: bytes | bytearray, *, max_bytes: int | None = MAX_SIGN1_BYTES, int_labels: bool = True) -> Sign1:
    """Read a tagged COSE_Sign1 strictly.

    Args:
        data: the message's bytes (``bytes`` or ``bytearray``).
        max_bytes: refuse a message longer than this; None reads any length.
        int_labels: refuse protected-header labels that are not integers.
            False returns the labels as read (keys Python holds equal, such as
            1 and True, collapse): for a caller that then compares the
            protected bytes with its own encoding, which no such header passes.

    Returns:
        The message's members (:class:`Sign1`).

    Raises:
        CoseFormatError: not a COSE_Sign1 capseal reads. Until the outer
            structure is read (bytes, size, CBOR, tag 18 around four members,
            no other tag) the first refusal is the only one; after that,
            ``refusals`` lists the first problem of the protected header and
            then each of the other members', in :class:`Refusal` order.
    """
    if not isinstance(data, (bytes, bytearray)):
        raise CoseFormatError([(Refusal.NOT_BYTES, f"a COSE_Sign1 is bytes, not {type(data).__name__}")])
    data = bytes(data)
    if max_bytes is not None and len(data) > max_bytes:
        raise CoseFormatError([(Refusal.TOO_LARGE, f"envelope is {len(data)} bytes; at most {max_bytes}")])
    try:
        outer, tags = decode_strict(data)
    except CBORError as exc:
        raise CoseFormatError([(Refusal.NOT_CBOR, str(exc))]) from None
    if not isinstance(outer, Tagged) or outer.tag != 18 or not isinstance(outer.value, list) or len(outer.value) != 4:
        raise CoseFormatError([(Refusal.NOT_SIGN1, "top-level value must be a four-element COSE_Sign1 with tag 18")])
    if tags != 1:
        raise CoseFormatError([(Refusal.EXTRA_TAG, "only the outer tag 18 may appear")])
    protected, unprotected, payload, signature = outer.value
    refusals: list[tuple[str, str]] = []
    header = _protected_header(protected, int_labels, refusals)
    if not isinstance(unprotected, dict):
        refusals.append((Refusal.UNPROTECTED_NOT_MAP, "unprotected header is not a map"))
    elif unprotected:
        refusals.append((Refusal.UNPROTECTED_NOT_EMPTY, "unprotected header must be an empty map"))
    if not isinstance(payload, bytes):
        refusals.append((Refusal.PAYLOAD_NOT_BYTES, "attached payload must be a byte string"))
    if not isinstance(signature, bytes):
        refusals.append((Refusal.SIGNATURE_NOT_BYTES, "signature must be a byte string"))
    if refusals or header is None:
        raise CoseFormatError(refusals)
    return Sign1(protected, header, payload, signature)


def _protected_header(protected: Any, int_labels: bool, refusals: list[tuple[str, str]]) -> dict[Any, Any] | None:
    """The protected header decoded, or None with its first problem appended."""
    if not isinstance(protected, bytes):
        refusals.append((Refusal.PROTECTED_NOT_BYTES, "protected header must be a non-empty byte string"))
        return None
    if not protected:
        refusals.append((Refusal.PROTECTED_EMPTY, "protected header must be a non-empty byte string"))
        return None
    try:
        decoded, inner_tags = decode_strict(protected)
    except CBORError as exc:
        refusals.append((Refusal.PROTECTED_NOT_CBOR, str(exc)))
        return None
    if inner_tags:
        refusals.append((Refusal.PROTECTED_TAGGED, "protected header must not contain a tag"))
        return None
    if not isinstance(decoded, dict):
        refusals.append((Refusal.PROTECTED_NOT_MAP, "protected header is not a map"))
        return None
    if not int_labels:
        return unwrap_map(decoded)
    try:
        header = plain_map(decoded)
    except CBORError as exc:
        refusals.append((Refusal.LABEL_NOT_INT_OR_TEXT, str(exc)))
        return None
    if any(type(label) is not int for label in header):
        refusals.append((Refusal.LABEL_NOT_INT, "protected header labels must be integers"))
        return None
    return header


_P = 2**255 - 19
#: the y-coordinates of the eight Ed25519 points of order 1, 2, 4 and 8 (the
#: sign of x is the top bit of an encoding), with y = p and p + 1, the two
#: non-canonical encodings below 2**255 of such a y (0 and 1): libsodium's list
SMALL_ORDER_Y: Final = frozenset({
    0, 1, _P - 1, _P, _P + 1,
    2707385501144840649318225287225658788936804267575313519463743609750303402022,
    _P - 2707385501144840649318225287225658788936804267575313519463743609750303402022,
})


def small_order_key(raw: bytes) -> bool:
    """Is ``raw`` the encoding of an Ed25519 point of small order?

    Why such keys are refused: RFC 8032's (cofactorless) verify, as OpenSSL
    and the reference verifier run it, accepts R = the neutral point and
    S = 0 under the neutral point's key for every message, and a key of order
    2, 4 or 8 for many; a "signature" by such a key proves nothing. libsodium
    refuses them too (the same list, the sign bit ignored).

    Args:
        raw: a raw public key.

    Returns:
        True for a 32-byte encoding whose y (sign bit ignored) is in
        :data:`SMALL_ORDER_Y`; False otherwise (any other length included).
    """
    return len(raw) == 32 and int.from_bytes(raw, "little") & ((1 << 255) - 1) in SMALL_ORDER_Y


def signature_ok(alg: str, key: Any, signature: bytes, data: bytes) -> bool:
    """Does ``signature`` (in COSE form) over ``data`` verify under ``key``?

    Args:
        alg: ``EdDSA``, ``ES256``, ``ES384`` or ``PS256``.
        key: a ``cryptography`` public key of that algorithm's type (and, for
            ECDSA, its curve).
        signature: the signature as COSE carries it (ECDSA: ``r || s``, each
            the curve's size; PS256: SHA-256, MGF1, salt of 32 bytes).
        data: the signed bytes (for an envelope, its :func:`sig_structure`).

    Returns:
        True when it verifies. False for a signature that does not, an
        algorithm and key that do not match, an unknown algorithm, or an
        Ed25519 key of small order (:func:`small_order_key`).
    """
    try:
        if alg == "EdDSA" and isinstance(key, ed25519.Ed25519PublicKey):
            if small_order_key(key.public_bytes_raw()):
                return False
            key.verify(signature, data)
        elif alg in ("ES256", "ES384") and isinstance(key, ec.EllipticCurvePublicKey):
            size = 32 if alg == "ES256" else 48
            if len(signature) != 2 * size or key.curve.key_size != size * 8:
                return False
            der = encode_dss_signature(int.from_bytes(signature[:size], "big"), int.from_bytes(signature[size:], "big"))
            key.verify(der, data, ec.ECDSA(hashes.SHA256() if alg == "ES256" else hashes.SHA384()))
        elif alg == "PS256" and isinstance(key, rsa.RSAPublicKey):
            key.verify(signature, data, padding.PSS(mgf=padding.MGF1(hashes.SHA256()), salt_length=32), hashes.SHA256())
        else:
            return False
    except InvalidSignature:
        return False
    return True
