"""Key objects on a PKCS#11 token: find them, read their public half, describe
them, generate them. Every function here takes an open python-pkcs11 session
and must be called with ``P11_LOCK`` held (see ``_lock``).

Public keys are rebuilt as ``cryptography`` keys from the token's attributes
(``CKA_EC_PARAMS``/``CKA_EC_POINT``, ``CKA_MODULUS``/``CKA_PUBLIC_EXPONENT``),
never from a file: the key that signs and the key we verify with come from the
same token object pair.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import pkcs11
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from pkcs11 import MGF, Attribute, KeyType, Mechanism, MechanismFlag, ObjectClass
from pkcs11 import exceptions as p11x

from capseal.errors import DeviceError, KeyNotFoundError, KeyURIError, UnsupportedAlgorithmError
from capseal.keys import alg_for_public_key

from ._uri import PKCS11URI

__all__ = [
    "KeyPair", "find_private_keys", "find_public_key", "public_key_of", "key_attributes",
    "mechanism_for", "generate_keypair", "enabled_extra_usages", "ED25519_PARAMS", "CURVE_PARAMS",
    "attribute_shortfalls", "new_key_shortfalls",
]

# DER of CKA_EC_PARAMS values (RFC 8410 / SEC 2 OIDs, and the PKCS#11 3.0
# PrintableString form some tokens use for Ed25519)
ED25519_OID = bytes.fromhex("06032b6570")
ED25519_PRINTABLE = b"\x13\x0cedwards25519"
ED25519_PARAMS = (ED25519_OID, ED25519_PRINTABLE)
CURVE_PARAMS = {
    "ES256": (bytes.fromhex("06082a8648ce3d030107"), ec.SECP256R1()),
    "ES384": (bytes.fromhex("06052b81040022"), ec.SECP384R1()),
}
_CURVES_BY_PARAMS = {der: curve for der, curve in CURVE_PARAMS.values()}
_RAW_POINT_LENGTHS = {32, 65, 97}  # bare Ed25519 key, bare P-256 / P-384 points

#: Usages a signing key must not have. Left out of the template, SoftHSM2 (and
#: others) default them to true: a "signing" key that also decrypts, unwraps
#: or derives. So they are asked for as false, and read back after generation.
PRIVATE_USAGES_OFF = (("CKA_DECRYPT", Attribute.DECRYPT), ("CKA_UNWRAP", Attribute.UNWRAP),
                      ("CKA_DERIVE", Attribute.DERIVE))
PUBLIC_USAGES_OFF = (("CKA_ENCRYPT", Attribute.ENCRYPT), ("CKA_WRAP", Attribute.WRAP))

#: Key attributes a custody statement reports, by their PKCS#11 names, and
#: what else the key can do (a signing key that decrypts is reported as such).
CUSTODY_ATTRIBUTES = (
    ("CKA_SENSITIVE", Attribute.SENSITIVE),
    ("CKA_ALWAYS_SENSITIVE", Attribute.ALWAYS_SENSITIVE),
    ("CKA_NEVER_EXTRACTABLE", Attribute.NEVER_EXTRACTABLE),
    ("CKA_EXTRACTABLE", Attribute.EXTRACTABLE),
    ("CKA_LOCAL", Attribute.LOCAL),
    ("CKA_PRIVATE", Attribute.PRIVATE),
    ("CKA_ALWAYS_AUTHENTICATE", Attribute.ALWAYS_AUTHENTICATE),
    *PRIVATE_USAGES_OFF,
)
_UNAVAILABLE = (1 << 64) - 1  # CK_UNAVAILABLE_INFORMATION

#: What a new private key must report (``check_new_key``, hardware/README.md):
#: the template's private token object, sensitive, not extractable, signing
#: (its other usages: :func:`enabled_extra_usages`), and so never extractable.
NEW_KEY_REQUIRED = (
    ("CKA_TOKEN", Attribute.TOKEN, True),
    ("CKA_PRIVATE", Attribute.PRIVATE, True),
    ("CKA_SENSITIVE", Attribute.SENSITIVE, True),
    ("CKA_EXTRACTABLE", Attribute.EXTRACTABLE, False),
    ("CKA_NEVER_EXTRACTABLE", Attribute.NEVER_EXTRACTABLE, True),
    ("CKA_SIGN", Attribute.SIGN, True),
)


@dataclass(frozen=True)
class KeyPair:
    """A private key handle and the public key that goes with it."""

    private: Any
    public_key: Any  # cryptography public key
    alg: str
    label: str
    key_id: bytes


def _attr(obj: Any, attribute: Attribute) -> Any:
    """An attribute value, or None when the token does not have or show it."""
    try:
        return obj[attribute]
    except (p11x.AttributeTypeInvalid, p11x.AttributeSensitive, p11x.FunctionFailed, KeyError):
        return None


def _search(session: Any, attrs: dict[Attribute, Any]) -> list[Any]:
    # drained (or closed) here, under the lock: an abandoned search iterator
    # calls C_FindObjectsFinal from its finaliser, i.e. outside the lock
    objects = session.get_objects(attrs)
    try:
        return list(objects)
    finally:
        objects.close()


def find_private_keys(session: Any, uri: PKCS11URI) -> list[Any]:
    """Private keys matching the URI's ``object`` (CKA_LABEL) and ``id`` (CKA_ID).

    Args:
        session: a python-pkcs11 session.
        uri: the parsed URI.

    Returns:
        The private-key objects.

    Raises:
        KeyURIError: the URI's ``type`` is not ``private``.
    """
    if uri.type not in (None, "private"):
        raise KeyURIError(f"pkcs11 URI: type={uri.type} cannot sign; a signing key URI names a private key (type=private)")
    attrs: dict[Attribute, Any] = {Attribute.CLASS: ObjectClass.PRIVATE_KEY}
    if uri.object is not None:
        attrs[Attribute.LABEL] = uri.object
    if uri.id is not None:
        attrs[Attribute.ID] = uri.id
    return _search(session, attrs)


def find_public_key(session: Any, private: Any) -> Any | None:
    """The public-key object paired with a private key: same CKA_ID (PKCS#11's
    pairing convention), else same CKA_LABEL, of the same key type.

    Args:
        session: a python-pkcs11 session.
        private: the private-key object.

    Returns:
        The one object found that way, or None.
    """
    key_id = _attr(private, Attribute.ID) or b""
    label = _attr(private, Attribute.LABEL)
    key_type = _attr(private, Attribute.KEY_TYPE)
    for attrs in (
        {Attribute.CLASS: ObjectClass.PUBLIC_KEY, Attribute.ID: key_id} if key_id else None,
        {Attribute.CLASS: ObjectClass.PUBLIC_KEY, Attribute.LABEL: label} if label else None,
    ):
        if attrs is None:
            continue
        if key_type is not None:
            attrs[Attribute.KEY_TYPE] = key_type
        found = _search(session, attrs)
        if len(found) == 1:
            return found[0]
    return None


def _unwrap_point(point: bytes) -> bytes:
    """CKA_EC_POINT: DER OCTET STRING (SoftHSM2, the spec) or a bare point
    (some HSMs). Bare lengths are 32 (Ed25519), 65 (P-256), 97 (P-384)."""
    if len(point) in _RAW_POINT_LENGTHS:
        return point
    if len(point) >= 2 and point[0] == 0x04 and point[1] < 0x80 and point[1] == len(point) - 2:
        return point[2:]
    if len(point) >= 3 and point[0] == 0x04 and point[1] == 0x81 and point[2] == len(point) - 3:
        return point[3:]
    raise DeviceError(f"CKA_EC_POINT of {len(point)} bytes is neither a DER OCTET STRING nor a bare point")


def public_key_of(obj: Any, where: str) -> Any:
    """A ``cryptography`` public key from a public-key object (or an RSA private
    key, whose modulus and exponent are public attributes).

    Args:
        obj: the object.
        where: names the token and key in errors.

    Returns:
        The public key.

    Raises:
        UnsupportedAlgorithmError: another key type or curve (Ed448 included).
        DeviceError: the point or modulus the token reports is malformed.
    """
    key_type = _attr(obj, Attribute.KEY_TYPE)
    if key_type == KeyType.EC_EDWARDS:
        params = _attr(obj, Attribute.EC_PARAMS)
        if params not in ED25519_PARAMS:
            raise UnsupportedAlgorithmError(f"{where}: only Ed25519 Edwards keys are supported (Ed448 is not a COSE alg capseal signs with)")
        raw = _unwrap_point(_attr(obj, Attribute.EC_POINT) or b"")
        if len(raw) != 32:
            raise DeviceError(f"{where}: Ed25519 public key is {len(raw)} bytes")
        return ed25519.Ed25519PublicKey.from_public_bytes(raw)
    if key_type == KeyType.EC:
        curve = _CURVES_BY_PARAMS.get(_attr(obj, Attribute.EC_PARAMS) or b"")
        if curve is None:
            raise UnsupportedAlgorithmError(f"{where}: EC key on a curve other than P-256 or P-384")
        raw = _unwrap_point(_attr(obj, Attribute.EC_POINT) or b"")
        try:
            return ec.EllipticCurvePublicKey.from_encoded_point(curve, raw)
        except ValueError:
            raise DeviceError(f"{where}: CKA_EC_POINT is not a point on {curve.name}") from None
    if key_type == KeyType.RSA:
        n, e = _attr(obj, Attribute.MODULUS), _attr(obj, Attribute.PUBLIC_EXPONENT)
        if not n or not e:
            raise DeviceError(f"{where}: RSA key without CKA_MODULUS/CKA_PUBLIC_EXPONENT")
        return rsa.RSAPublicNumbers(int.from_bytes(e, "big"), int.from_bytes(n, "big")).public_key()
    raise UnsupportedAlgorithmError(f"{where}: key type {key_type!r} is not Ed25519, P-256/P-384 or RSA")


def load_keypair(session: Any, uri: PKCS11URI, where: str) -> KeyPair:
    """The one private key the URI names, with its public key (from the token).

    Args:
        session: a python-pkcs11 session.
        uri: the parsed URI.
        where: names the token in errors.

    Returns:
        The key pair.

    Raises:
        KeyNotFoundError: no such private key, or no public-key object paired with it.
        KeyURIError: several keys match.
        UnsupportedAlgorithmError: a key that cannot sign here (CKA_SIGN false or
            not reported, CKA_ALWAYS_AUTHENTICATE, an algorithm capseal does not sign with).
    """
    found = find_private_keys(session, uri)
    if not found:
        raise KeyNotFoundError(
            f"{where} has no private key {uri.describe_key()}",
            hint="list the keys with `capseal keys list pkcs11:token=…?module-path=…`, or create one with `capseal keys create`",
        )
    if len(found) > 1:
        raise KeyURIError(f"{where}: {len(found)} private keys match {uri.describe_key()}; add id= (or object=) to the URI")
    private = found[0]
    sign = _attr(private, Attribute.SIGN)
    if sign is None:  # unreadable is not false: said as it is
        raise UnsupportedAlgorithmError(f"{where}: the token does not report CKA_SIGN for key {uri.describe_key()}; "
                                        "capseal signs only with a key the token says can sign")
    if not sign:
        raise UnsupportedAlgorithmError(f"{where}: key {uri.describe_key()} has CKA_SIGN false")
    if _attr(private, Attribute.ALWAYS_AUTHENTICATE):
        raise UnsupportedAlgorithmError(
            f"{where}: key {uri.describe_key()} has CKA_ALWAYS_AUTHENTICATE (a PIN per signature); "
            "capseal signs unattended, so use a key without it"
        )
    label = _attr(private, Attribute.LABEL) or ""
    key_id = _attr(private, Attribute.ID) or b""
    public_obj = find_public_key(session, private)
    if public_obj is None and _attr(private, Attribute.KEY_TYPE) == KeyType.RSA:
        public_obj = private  # RSA private keys carry their public components
    if public_obj is None:
        raise KeyNotFoundError(
            f"{where}: no public-key object pairs with private key {uri.describe_key()} "
            "(same CKA_ID or CKA_LABEL); capseal reads the public key from the token"
        )
    named = f"{where}, key {uri.describe_key()}"
    public_key = public_key_of(public_obj, named)
    try:
        alg = alg_for_public_key(public_key)
    except UnsupportedAlgorithmError as exc:  # its rule (RSA ≥ 2048 …) is shared; the token and key are named here
        raise UnsupportedAlgorithmError(f"{named}: {exc}") from None
    return KeyPair(private=private, public_key=public_key, alg=alg, label=label, key_id=key_id)


def key_attributes(private: Any) -> dict[str, Any]:
    """The custody-relevant attributes as the token reports them.

    Args:
        private: the private-key object.

    Returns:
        ``CKA_*`` names → booleans, the key-generation mechanism, label and id
        (an attribute the token does not show is left out).
    """
    out: dict[str, Any] = {}
    for name, attribute in CUSTODY_ATTRIBUTES:
        value = _attr(private, attribute)
        if value is not None:
            out[name] = bool(value)
    mech = _attr(private, Attribute.KEY_GEN_MECHANISM)
    if isinstance(mech, int) and mech != _UNAVAILABLE:
        try:
            out["CKA_KEY_GEN_MECHANISM"] = "CKM_" + Mechanism(mech).name
        except ValueError:
            out["CKA_KEY_GEN_MECHANISM"] = f"0x{mech:x}"
    label = _attr(private, Attribute.LABEL)
    if label is not None:
        out["CKA_LABEL"] = label
    key_id = _attr(private, Attribute.ID)
    if key_id is not None:
        out["CKA_ID"] = key_id.hex()
    return out


def attribute_shortfalls(reported: dict[str, Any], wanted: tuple[tuple[str, bool], ...]) -> list[str]:
    """Each wanted attribute value that the reported ones do not hold, as what
    the token said: ``"CKA_SENSITIVE false"``, or ``"CKA_TOKEN not reported
    by the token"`` — an attribute the token did not report is never
    described as a value.

    Args:
        reported: as :func:`key_attributes` gives them.
        wanted: ``(name, value)`` pairs.

    Returns:
        The shortfalls (empty: none).
    """
    out = []
    for name, want in wanted:
        have = reported.get(name)
        if have is None:
            out.append(f"{name} not reported by the token")
        elif bool(have) != want:
            out.append(f"{name} {'true' if have else 'false'}")
    return out


def new_key_shortfalls(private: Any) -> list[str]:
    """What a just-generated private key does not report as capseal's template
    asked (:data:`NEW_KEY_REQUIRED`), worded by :func:`attribute_shortfalls`.

    Args:
        private: the new private-key object.

    Returns:
        The shortfalls (empty: none).
    """
    reported = {}
    for name, attribute, _ in NEW_KEY_REQUIRED:
        value = _attr(private, attribute)
        if value is not None:
            reported[name] = bool(value)
    return attribute_shortfalls(reported, tuple((name, want) for name, _, want in NEW_KEY_REQUIRED))


@dataclass(frozen=True)
class SignMechanism:
    """How to ask the token for a COSE signature of ``alg``."""

    mechanism: Mechanism
    param: Any
    prehash: Any  # hashlib constructor, or None when the token hashes / EdDSA signs the message
    size: int | None  # expected signature length (ECDSA: r‖s), None for RSA


def mechanism_for(alg: str, available: set[Any] | None) -> SignMechanism:
    """The mechanism for ``alg``. ECDSA is always CKM_ECDSA over a digest made
    here (SoftHSM2 has no CKM_ECDSA_SHA256; every token has CKM_ECDSA).
    RSA-PSS prefers CKM_SHA256_RSA_PKCS_PSS and falls back to
    CKM_RSA_PKCS_PSS over a digest.

    Args:
        alg: the COSE algorithm.
        available: the token's mechanisms (None: unknown).

    Returns:
        The mechanism, its parameter, the prehash and the signature size.

    Raises:
        UnsupportedAlgorithmError: the token lists no mechanism for ``alg``.
    """
    def has(m: Mechanism) -> bool:
        return available is None or m in available

    if alg == "EdDSA":
        if not has(Mechanism.EDDSA):
            raise UnsupportedAlgorithmError("the token has no CKM_EDDSA mechanism")
        return SignMechanism(Mechanism.EDDSA, None, None, 64)
    if alg in ("ES256", "ES384"):
        if not has(Mechanism.ECDSA):
            raise UnsupportedAlgorithmError("the token has no CKM_ECDSA mechanism")
        return SignMechanism(Mechanism.ECDSA, None, hashlib.sha256 if alg == "ES256" else hashlib.sha384,
                             64 if alg == "ES256" else 96)
    if alg == "PS256":
        param = (Mechanism.SHA256, MGF.SHA256, 32)  # COSE PS256: salt = hash length
        if has(Mechanism.SHA256_RSA_PKCS_PSS):
            return SignMechanism(Mechanism.SHA256_RSA_PKCS_PSS, param, None, None)
        if has(Mechanism.RSA_PKCS_PSS):
            return SignMechanism(Mechanism.RSA_PKCS_PSS, param, hashlib.sha256, None)
        raise UnsupportedAlgorithmError("the token has neither CKM_SHA256_RSA_PKCS_PSS nor CKM_RSA_PKCS_PSS")
    raise UnsupportedAlgorithmError(f"no PKCS#11 mechanism for {alg}")


# ---------------------------------------------------------------------- generation

_D = pkcs11.DEFAULT  # leave the attribute out of the template

#: What a token answers when it will not take an explicit false for a usage
#: attribute (tpm2-pkcs11 refuses them): generation is retried without them.
_TEMPLATE_REFUSED = (p11x.TemplateInconsistent, p11x.AttributeValueInvalid, p11x.AttributeTypeInvalid)


def _templates(explicit_off: bool) -> tuple[dict[Attribute, Any], dict[Attribute, Any]]:
    """Public and private templates; ``explicit_off`` asks for the extra
    usages as false, otherwise they are left to the token (read back later)."""
    off = False if explicit_off else _D
    public_template: dict[Attribute, Any] = {Attribute.TOKEN: True, Attribute.VERIFY: True}
    public_template.update({attribute: off for _, attribute in PUBLIC_USAGES_OFF})
    private_template: dict[Attribute, Any] = {
        Attribute.TOKEN: True,
        Attribute.PRIVATE: True,
        Attribute.SENSITIVE: True,
        Attribute.EXTRACTABLE: False,
        Attribute.SIGN: True,
    }
    private_template.update({attribute: off for _, attribute in PRIVATE_USAGES_OFF})
    return public_template, private_template


def generate_keypair(rw_session: Any, alg: str, label: str, key_id: bytes, *, rsa_bits: int = 3072) -> None:
    """Generate a signing key pair on the token: private half sensitive, never
    extractable, token object, sign-only; public half verify-only. The usages
    are asked for as false; a token that refuses that template gets one
    without them, and the caller reads them back (:func:`enabled_extra_usages`)
    either way.

    Args:
        rw_session: a read-write python-pkcs11 session.
        alg: EdDSA, ES256, ES384 or PS256.
        label: the CKA_LABEL of both halves.
        key_id: their CKA_ID.
        rsa_bits: the size of a PS256 key.

    Raises:
        UnsupportedAlgorithmError: another algorithm, or an RSA key under 2048 bits.
        DeviceError: the token would not generate an Ed25519 key.
        pkcs11.exceptions.PKCS11Error: the token's own refusals (the caller maps them).
    """
    if alg == "PS256" and rsa_bits < 2048:
        raise UnsupportedAlgorithmError("RSA keys for PS256 are at least 2048 bits")
    if alg not in ("EdDSA", "PS256") and alg not in CURVE_PARAMS:
        raise UnsupportedAlgorithmError(f"cannot create {alg} keys on a PKCS#11 token; use ed25519, p256, p384 or rsa-pss")
    refused = False
    try:
        _generate(rw_session, alg, label, key_id, rsa_bits, explicit_off=True)
    except _TEMPLATE_REFUSED:
        refused = True
    if refused:  # retried outside the handler: nothing chained to a later error
        _generate(rw_session, alg, label, key_id, rsa_bits, explicit_off=False)


def _generate(rw_session: Any, alg: str, label: str, key_id: bytes, rsa_bits: int, *, explicit_off: bool) -> None:
    """One C_GenerateKeyPair for ``alg`` with the given templates; the
    token's template errors propagate (the caller may retry)."""
    public_template, private_template = _templates(explicit_off)
    common = dict(store=True, label=label, id=key_id, capabilities=MechanismFlag.SIGN | MechanismFlag.VERIFY,
                  public_template=public_template, private_template=private_template)
    if alg == "EdDSA":
        _generate_ed25519(rw_session, common, explicit_off=explicit_off)
    elif alg in CURVE_PARAMS:
        dp = rw_session.create_domain_parameters(KeyType.EC, {Attribute.EC_PARAMS: CURVE_PARAMS[alg][0]}, local=True)
        dp.generate_keypair(mechanism=Mechanism.EC_KEY_PAIR_GEN, **common)
    else:
        rw_session.generate_keypair(KeyType.RSA, rsa_bits, mechanism=Mechanism.RSA_PKCS_KEY_PAIR_GEN, **common)


def _generate_ed25519(rw_session: Any, common: dict[str, Any], *, explicit_off: bool) -> None:
    """Ed25519 with the OID parameters first; some tokens only take the
    PrintableString. A template refusal for both is re-raised (the caller
    retries without the usage attributes); DeviceError when neither works."""
    last: Exception | None = None
    for params in ED25519_PARAMS:
        try:
            dp = rw_session.create_domain_parameters(KeyType.EC_EDWARDS, {Attribute.EC_PARAMS: params}, local=True)
            dp.generate_keypair(mechanism=Mechanism.EC_EDWARDS_KEY_PAIR_GEN, **common)
            return
        except (p11x.DomainParamsInvalid, p11x.AttributeValueInvalid, p11x.TemplateInconsistent) as exc:
            last = exc
    if explicit_off and isinstance(last, _TEMPLATE_REFUSED):
        raise last
    raise DeviceError(f"the token would not generate an Ed25519 key ({type(last).__name__})")


def enabled_extra_usages(private: Any, public: Any | None) -> list[str]:
    """The usages beyond sign/verify that the token reports as true on a new key
    pair. An attribute the token does not show is not counted: only what it
    says is true.

    Args:
        private: the private half.
        public: the public half, if found.

    Returns:
        Among CKA_DECRYPT, CKA_UNWRAP, CKA_DERIVE (private) and CKA_ENCRYPT, CKA_WRAP (public).
    """
    found = [name for name, attribute in PRIVATE_USAGES_OFF if _attr(private, attribute)]
    if public is not None:
        found += [name for name, attribute in PUBLIC_USAGES_OFF if _attr(public, attribute)]
    return found


def objects_with(session: Any, *, label: str | None, key_id: bytes | None) -> list[Any]:
    """Key objects (any class) already using a label or an id.

    Args:
        session: a python-pkcs11 session.
        label: the CKA_LABEL (None: not searched).
        key_id: the CKA_ID (None: not searched).

    Returns:
        The objects (one found by both appears twice).
    """
    found: list[Any] = []
    if label is not None:
        found += _search(session, {Attribute.LABEL: label})
    if key_id is not None:
        found += _search(session, {Attribute.ID: key_id})
    return found
