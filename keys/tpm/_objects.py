"""TPM objects as capseal makes and reads them: the templates (SRK, signing
key, attestation key), what a public area says (attributes, algorithm,
signing scheme), auth values, ``TSS2 PRIVATE KEY`` files on disk, and the
persistent objects provisioning reads, makes and evicts.

Templates (why each attribute):

* signing key: ``sign | fixedTPM | fixedParent | sensitiveDataOrigin |
  userWithAuth`` — generated inside the TPM and never duplicable. Keys with an
  empty auth value also get ``noDA``: there is no secret to guess, and a
  DA-protected key on swtpm turns three unclean restarts into a 1000 s lockout.
  A key created with an auth value (``--pin-env``) stays DA-protected.
* attestation key (AK): ``ecc256:ecdsa-sha256:null`` with ``restricted |
  sign | fixedTPM | fixedParent | sensitiveDataOrigin | userWithAuth | noDA``.
  Restricted keys sign only TPM-generated structures (quotes, certify), so a
  signature by the AK is the TPM's own word. ``:null`` because a restricted
  signing key must have no symmetric algorithm (``TPM_RC_SYMMETRIC`` otherwise).
* parent: the TCG ECC P-256 SRK, created transiently from its template under
  the owner hierarchy (deterministic, so it need not be persisted).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import serialization
from tpm2_pytss import TSS2_Exception
from tpm2_pytss.constants import TPM2_ALG, TPM2_ECC, TPMA_OBJECT
from tpm2_pytss.types import TPM2B_PUBLIC, TPMT_SIG_SCHEME

from capseal.errors import KeyNotFoundError, KeyURIError, PinIncorrectError, SignerError, UnsupportedAlgorithmError
from capseal.keys.secret import MAX_KEY_FILE, FileTooLargeError, Secret, as_secret, read_capped

from ._errors import names_no_object
from ._handles import persistent_tr
from ._info import TPMInfo
from ._uri import TPMKeyFile, TPMKeyURI, format_handle

__all__ = [
    "TPM_ALG_EDDSA",
    "SRK_TEMPLATE",
    "SRK_TEMPLATE_TEXT",
    "AK_TEMPLATE",
    "MAX_AUTH_BYTES",
    "CREATE_AUTH_BYTES",
    "HandleInUseError",
    "KeyShape",
    "srk_template",
    "signing_template",
    "ak_template",
    "key_attributes",
    "create_key_hint",
    "auth_value",
    "eddsa_refusal",
    "cose_alg",
    "check_alg_supported",
    "keyfile_public",
    "read_keyfile",
    "write_keyfile",
    "persistent_key_tr",
]

#: TPM_ALG_EDDSA (TPM 2.0 rev 1.83); tpm2-pytss 3.0 has no constant for it.
TPM_ALG_EDDSA = 0x0060
#: TPM_ECC_ED25519 (TPM 2.0 rev 1.83); tpm2-pytss 3.0 has no constant for it.
TPM_ECC_ED25519 = 0x0040
SRK_TEMPLATE = "ecc256:aes128cfb"
_SRK_ATTRS = (TPMA_OBJECT.RESTRICTED | TPMA_OBJECT.DECRYPT | TPMA_OBJECT.FIXEDTPM | TPMA_OBJECT.FIXEDPARENT
              | TPMA_OBJECT.SENSITIVEDATAORIGIN | TPMA_OBJECT.USERWITHAUTH | TPMA_OBJECT.NODA)
_ATTRIBUTE_NAMES = (
    ("fixedTPM", TPMA_OBJECT.FIXEDTPM),
    ("stClear", TPMA_OBJECT.STCLEAR),
    ("fixedParent", TPMA_OBJECT.FIXEDPARENT),
    ("sensitiveDataOrigin", TPMA_OBJECT.SENSITIVEDATAORIGIN),
    ("userWithAuth", TPMA_OBJECT.USERWITHAUTH),
    ("adminWithPolicy", TPMA_OBJECT.ADMINWITHPOLICY),
    ("noDA", TPMA_OBJECT.NODA),
    ("encryptedDuplication", TPMA_OBJECT.ENCRYPTEDDUPLICATION),
    ("restricted", TPMA_OBJECT.RESTRICTED),
    ("decrypt", TPMA_OBJECT.DECRYPT),
    ("sign", TPMA_OBJECT.SIGN_ENCRYPT),
)

AK_TEMPLATE = "ecc256:ecdsa-sha256:null"
_BASE_SIGN = (TPMA_OBJECT.SIGN_ENCRYPT | TPMA_OBJECT.FIXEDTPM | TPMA_OBJECT.FIXEDPARENT
              | TPMA_OBJECT.SENSITIVEDATAORIGIN | TPMA_OBJECT.USERWITHAUTH)
_AK_ATTRS = _BASE_SIGN | TPMA_OBJECT.RESTRICTED | TPMA_OBJECT.NODA
_TEMPLATES = {"ES256": "ecc256:ecdsa-sha256:null", "ES384": "ecc384:ecdsa-sha384:null",
              "PS256": "rsa2048:rsapss-sha256:null"}
CLI_ALGS = {"p256": "ES256", "p384": "ES384", "rsa-pss": "PS256", "ed25519": "EdDSA"}
SRK_TEMPLATE_TEXT = "TCG ECC P-256 SRK (ecc256:aes128cfb, restricted|decrypt|noDA), transient"


class HandleInUseError(SignerError):
    """A persistent handle (or key file) already holds a key and --force was not given,
    or holds an object capseal can neither read nor evict."""


def srk_template() -> TPM2B_PUBLIC:
    """The TCG storage root key template (ECC P-256, AES-128-CFB, empty unique):
    the parent ``0x40000001`` means in a TSS2 PRIVATE KEY, as tpm2-tss-engine,
    tpm2-openssl and ``tpm2_pytss.tsskey`` create it. Primaries are
    deterministic per seed and template, so any process gets the same SRK.

    Returns:
        The template.
    """
    return TPM2B_PUBLIC.parse(SRK_TEMPLATE, objectAttributes=_SRK_ATTRS)


def key_attributes(public: TPM2B_PUBLIC) -> dict[str, bool]:
    """The TPMA_OBJECT bits of a public area, by their TPM specification names.

    Args:
        public: the public area.

    Returns:
        ``{"fixedTPM": True, "noDA": False, …}``.
    """
    attrs = public.publicArea.objectAttributes
    return {name: bool(attrs & bit) for name, bit in _ATTRIBUTE_NAMES}


def create_key_hint(tcti: str, handle: int) -> str:
    """The command that creates a signing key at an empty persistent handle.
    Why not ``capseal tpm provision --handle``: on a TPM that is already
    provisioned that refuses, and its ``--force`` replaces the pinned
    attestation key too. ``keys create`` touches only the one handle.

    Args:
        tcti: the TPM.
        handle: the handle.

    Returns:
        The command line.
    """
    return f"capseal keys create '{TPMKeyURI(tcti=tcti, handle=handle).to_uri()}' --alg p256"


#: Longest auth value ESAPI takes (TPM2B_AUTH holds a SHA-512 digest); a key
#: accepts at most its name algorithm's digest size (32 bytes for SHA-256,
#: which capseal's templates use), so creating checks against that instead.
MAX_AUTH_BYTES = 64
CREATE_AUTH_BYTES = 32


def auth_value(pin: object, where: str, limit: int = MAX_AUTH_BYTES) -> Secret | None:
    """An auth value checked for the TPM. Why here: a non-str, text that is not
    UTF-8 (a UnicodeEncodeError's args would hold the whole value) and an
    overlong value are each refused before tpm2-pytss sees them, naming
    ``where`` and no part of the value.

    Args:
        pin: a str or a :class:`~capseal.keys.secret.Secret` (its UTF-8 bytes go to the TPM).
        where: names the key in errors.
        limit: the most bytes it may have.

    Returns:
        The value as a Secret; None for no pin or "".

    Raises:
        PinIncorrectError: the value is not usable text, or longer than ``limit`` bytes.
    """
    secret = as_secret(pin, "pin=")
    del pin
    if secret is None or secret.empty:
        return None
    secret = secret.with_suffix(f"for {where}").usable_pin()
    if secret.byte_length() > limit:
        raise PinIncorrectError(f"the auth value for {where} is {secret.byte_length()} bytes; a TPM key's auth value "
                                f"is at most {limit} bytes")
    return secret


def eddsa_refusal(info: TPMInfo) -> UnsupportedAlgorithmError:
    """Why this TPM cannot make capseal an Ed25519 key (always an error today).

    Args:
        info: what the TPM reported about itself.

    Returns:
        The error, saying which part is missing.
    """
    who = f"TPM {info.tcti} ({info.manufacturer} {info.vendor.strip()})"
    if not info.supports(TPM_ALG_EDDSA):
        return UnsupportedAlgorithmError(
            f"{who} does not list TPM_ALG_EDDSA (0x0060) in TPM_CAP_ALGS, so it cannot hold an Ed25519 key; "
            "use p256 (ES256) or rsa-pss (PS256)")
    return UnsupportedAlgorithmError(
        f"{who} lists TPM_ALG_EDDSA, but pure EdDSA needs TPM2_SignSequenceComplete (TPM 2.0 rev 1.83), which "
        "libtss2 3.2 / tpm2-pytss 3.0 do not provide; use p256 (ES256)")


class KeyShape:
    """How to sign with a given public area: COSE alg, hash, TPM scheme, sizes."""

    __slots__ = ("alg", "hash_name", "scheme", "size", "public_key", "is_rsa")

    def __init__(self, public: TPM2B_PUBLIC, info: TPMInfo, where: str) -> None:
        area = public.publicArea
        attrs = area.objectAttributes
        if not attrs & TPMA_OBJECT.SIGN_ENCRYPT:
            raise UnsupportedAlgorithmError(f"{where} is not a signing key (attributes {attrs})")
        if attrs & TPMA_OBJECT.RESTRICTED:
            raise UnsupportedAlgorithmError(
                f"{where} is a restricted signing key (an attestation key): it signs only TPM-generated data, "
                "not capsules; use the unrestricted signing key")
        self.is_rsa = int(area.type) == int(TPM2_ALG.RSA)
        if int(area.type) == int(TPM2_ALG.ECC):
            curve = int(area.parameters.eccDetail.curveID)
            if curve == int(TPM2_ECC.NIST_P256):
                self.alg, self.hash_name, hash_alg, self.size = "ES256", "sha256", TPM2_ALG.SHA256, 32
            elif curve == int(TPM2_ECC.NIST_P384):
                self.alg, self.hash_name, hash_alg, self.size = "ES384", "sha384", TPM2_ALG.SHA384, 48
            elif curve == TPM_ECC_ED25519:
                raise eddsa_refusal(info)
            else:
                raise UnsupportedAlgorithmError(f"{where} is on ECC curve 0x{curve:04x}; capseal signs with P-256 or P-384")
            fixed = area.parameters.eccDetail.scheme
            if int(fixed.scheme) not in (int(TPM2_ALG.NULL), int(TPM2_ALG.ECDSA)) or (
                int(fixed.scheme) == int(TPM2_ALG.ECDSA) and int(fixed.details.anySig.hashAlg) != int(hash_alg)
            ):
                raise UnsupportedAlgorithmError(f"{where} has signing scheme {fixed.scheme}; {self.alg} needs ECDSA "
                                                f"with {self.hash_name.upper()} (or no fixed scheme)")
            self.scheme = TPMT_SIG_SCHEME(scheme=TPM2_ALG.ECDSA)
        elif self.is_rsa:
            bits = int(area.parameters.rsaDetail.keyBits)
            if bits < 2048:
                raise UnsupportedAlgorithmError(f"{where} is RSA-{bits}; PS256 needs at least 2048 bits")
            fixed = area.parameters.rsaDetail.scheme
            if int(fixed.scheme) not in (int(TPM2_ALG.NULL), int(TPM2_ALG.RSAPSS)) or (
                int(fixed.scheme) == int(TPM2_ALG.RSAPSS) and int(fixed.details.anySig.hashAlg) != int(TPM2_ALG.SHA256)
            ):
                raise UnsupportedAlgorithmError(f"{where} has RSA scheme {fixed.scheme}; PS256 needs RSASSA-PSS with "
                                                "SHA-256 (or no fixed scheme)")
            self.alg, self.hash_name, hash_alg, self.size = "PS256", "sha256", TPM2_ALG.SHA256, bits // 8
            self.scheme = TPMT_SIG_SCHEME(scheme=TPM2_ALG.RSAPSS)
        else:
            raise UnsupportedAlgorithmError(f"{where} is a TPM object of type {area.type}, not an ECC or RSA key")
        self.scheme.details.any.hashAlg = hash_alg
        self.public_key = serialization.load_der_public_key(public.to_der())




def signing_template(alg: str, *, with_auth: bool) -> TPM2B_PUBLIC:
    """The template of an unrestricted signing key (see the module docstring).

    Args:
        alg: ES256, ES384 or PS256.
        with_auth: the key gets an auth value (and stays dictionary-attack protected).

    Returns:
        The template.

    Raises:
        UnsupportedAlgorithmError: another algorithm.
    """
    template = _TEMPLATES.get(alg)
    if template is None:
        raise UnsupportedAlgorithmError(f"capseal cannot create a TPM key for {alg!r}; use p256, p384 or rsa-pss")
    attrs = _BASE_SIGN if with_auth else _BASE_SIGN | TPMA_OBJECT.NODA
    return TPM2B_PUBLIC.parse(template, objectAttributes=attrs)


def cose_alg(alg: object) -> str:
    """The COSE name for a CLI (``p256``) or COSE (``ES256``) algorithm name.

    Args:
        alg: the name.

    Returns:
        The COSE name (an unknown one unchanged: the caller refuses it).

    Raises:
        KeyURIError: not a str.
    """
    if not isinstance(alg, str):
        raise KeyURIError(f"alg is a {type(alg).__name__}, not an algorithm name; use p256, p384 or rsa-pss")
    return CLI_ALGS.get(alg.lower(), alg)


def check_alg_supported(info: TPMInfo, alg: str) -> None:
    """Refuse an algorithm the TPM cannot make keys for.

    Args:
        info: what the TPM reported about itself.
        alg: the COSE algorithm.

    Raises:
        UnsupportedAlgorithmError: EdDSA, an unknown algorithm, or one whose
            algorithms the TPM does not list in TPM_CAP_ALGS.
    """
    if alg == "EdDSA":
        raise eddsa_refusal(info)
    needs = {"ES256": (TPM2_ALG.ECC, TPM2_ALG.ECDSA, TPM2_ALG.SHA256), "ES384": (TPM2_ALG.ECC, TPM2_ALG.ECDSA, TPM2_ALG.SHA384),
             "PS256": (TPM2_ALG.RSA, TPM2_ALG.RSAPSS, TPM2_ALG.SHA256)}.get(alg)
    if needs is None:
        raise UnsupportedAlgorithmError(f"capseal cannot create a TPM key for {alg!r}")
    missing = [str(a) for a in needs if not info.supports(int(a))]
    if missing:
        raise UnsupportedAlgorithmError(f"TPM {info.tcti} does not list {', '.join(missing)} in TPM_CAP_ALGS; "
                                        f"it cannot make {alg} keys")



def persistent_key_tr(ectx: Any, handle: int, tcti: str, what: str) -> Any:
    """The ESYS_TR of a key at a persistent handle.

    Args:
        ectx: the ESAPI context.
        handle: the handle.
        tcti: the TPM, named in errors.
        what: names the key in errors.

    Returns:
        The ESYS_TR.

    Raises:
        KeyNotFoundError: nothing there, or gone by the time it was read.
    """
    try:
        return persistent_tr(ectx, handle, tcti, what)
    except TSS2_Exception as exc:
        if names_no_object(exc):
            raise KeyNotFoundError(f"no {what} at persistent handle {format_handle(handle)} on TPM {tcti}") from None
        raise


def keyfile_public(kf: TPMKeyFile, where: str) -> TPM2B_PUBLIC:
    """A key file's public area. Why the name is computed: tpm2-pytss unmarshals
    ``00 00`` or a made-up type without complaint, and only hashing it
    (``get_name``) raises a ValueError or a raw TSS2_Exception.

    Args:
        kf: the key file.
        where: names it in errors.

    Returns:
        The public area.

    Raises:
        KeyURIError: the pubkey is not one whole TPM2B_PUBLIC whose name can be computed.
    """
    try:
        public, used = TPM2B_PUBLIC.unmarshal(kf.public)
        if used == len(kf.public):
            public.get_name()
    except (TSS2_Exception, ValueError):
        raise KeyURIError(f"{where}: pubkey is not a TPM2B_PUBLIC capseal can read") from None
    if used != len(kf.public):
        raise KeyURIError(f"{where}: pubkey is not a TPM2B_PUBLIC (trailing bytes after it)")
    return public


def read_keyfile(path: str) -> TPMKeyFile:
    """Read a ``TSS2 PRIVATE KEY`` file, with a bound on its size.

    Args:
        path: the file.

    Returns:
        The key file.

    Raises:
        KeyNotFoundError: no such file, it cannot be read, or it is too large.
        KeyURIError: a path no file can have (a NUL byte), or see :meth:`TPMKeyFile.from_pem`.
    """
    p = Path(path)
    try:
        data, _ = read_capped(p, MAX_KEY_FILE)
    except FileNotFoundError:
        raise KeyNotFoundError(f"no TPM key file at {p}") from None
    except OSError as exc:
        raise KeyNotFoundError(f"cannot read TPM key file {p}: {exc.strerror}") from None
    except FileTooLargeError as exc:
        raise KeyNotFoundError(f"TPM key file {p} holds {exc}: no TSS2 PRIVATE KEY is that large") from None
    except ValueError as exc:  # a path no file can have (an embedded NUL byte)
        raise KeyURIError(f"TPM key file path {path!r} is not a usable path: {exc}") from None
    return TPMKeyFile.from_pem(data, where=str(p))


def write_keyfile(path: str, kf: TPMKeyFile) -> None:
    """Write a new key file (mode 0600, never over an existing one).

    Args:
        path: the new file.
        kf: the key file.

    Raises:
        FileExistsError: something is at ``path``.
        OSError: it cannot be written.
    """
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(kf.to_pem())


def ak_template() -> TPM2B_PUBLIC:
    """The attestation key's template (see the module docstring).

    Returns:
        ``ecc256:ecdsa-sha256:null``, restricted, fixedTPM|fixedParent, noDA.
    """
    return TPM2B_PUBLIC.parse(AK_TEMPLATE, objectAttributes=_AK_ATTRS)
