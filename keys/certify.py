"""capseal.keys.certify — checking a TPM2_Certify record: the TPM's own statement, signed by an
attestation key (AK), that a signing key with this public area is held in it.

A TPM signer opened with an ``ak-handle`` seals such a record into its custody
statement (``custody["tpm_certify"]``); anyone can check it again here:

>>> from capseal.keys import verify_certify
>>> problems = verify_certify(custody["tpm_certify"], public_key=signer_public_key)   # doctest: +SKIP
>>> problems == []                                                                  # doctest: +SKIP
True

Checking needs ``tpm2-pytss`` (``pip install 'capseal[tpm]'``) to read the TPM
structures, but no TPM.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa

from capseal.errors import InputError

from ._registry import load_target

__all__ = ["verify_certify"]

_PUBLIC_KEY_TYPES = (ec.EllipticCurvePublicKey, rsa.RSAPublicKey, ed25519.Ed25519PublicKey)


def verify_certify(record: Any, *, public_key: Any = None, trusted_ak_names: Iterable[str] | None = None) -> list[str]:
    """Check a ``tpm2-certify`` record; the problems found (empty: verified).

    Checks that the AK's public area hashes to ``ak_name`` and is a restricted
    signing key that cannot leave its TPM, that its PEM is that key, that the
    AK's signature over the attest bytes verifies, that the attest structure
    is a TPM-generated TPM_ST_ATTEST_CERTIFY whose extraData is SHA-256 of the
    certified key's SubjectPublicKeyInfo, and that the certified name is the
    hash of ``key_public_area``, a fixedTPM|fixedParent key.

    Args:
        record: the record (a dict, as in a custody statement's ``tpm_certify``).
            Anything wrong with it is a problem in the list, never an exception.
        public_key: the signing key the record must be about: a ``cryptography``
            public key, or its PEM (str or bytes). None: any key.
        trusted_ak_names: hex TPM names of the AKs you enrolled; an AK not among
            them is a problem. None: the AK is not checked against a list.

    Returns:
        The problems, each a sentence; an empty list when the record verifies.

    Raises:
        InputError: ``public_key`` or ``trusted_ak_names`` is not what is
            described above (a caller's mistake, never the record's).
    """
    key = _public_key_argument(public_key)
    names = _names_argument(trusted_ak_names)
    try:  # by name, as the backends are reached: the TPM backend needs tpm2-pytss
        check = load_target("tpm2", "capseal.keys.tpm:verify_certify")
    except ImportError as exc:  # MissingExtraError is one: without tpm2-pytss nothing can be checked
        return [f"cannot check a TPM2_Certify record without tpm2-pytss (pip install 'capseal[tpm]'): {exc}"]
    return list(check(record, public_key=key, trusted_ak_names=names))


def _public_key_argument(value: Any) -> Any:
    """``public_key=`` as a cryptography public key (PEM text is loaded)."""
    if value is None or isinstance(value, _PUBLIC_KEY_TYPES):
        return value
    if isinstance(value, (str, bytes, bytearray)):
        try:
            raw = value.encode("ascii") if isinstance(value, str) else bytes(value)
            return serialization.load_pem_public_key(raw)
        except Exception as exc:  # ValueError, UnicodeEncodeError, cryptography's UnsupportedAlgorithm
            problem = type(exc).__name__
        raise InputError(f"public_key is a {type(value).__name__} that is not a PEM public key ({problem}); give "
                         "a cryptography public key or its PEM (-----BEGIN PUBLIC KEY-----)")
    raise InputError(f"public_key is a {type(value).__name__}, not a cryptography public key or its PEM")


def _names_argument(value: Any) -> list[str] | None:
    """``trusted_ak_names=`` as a list of hex names (a lone str would be read
    as a set of its characters, and every AK would be untrusted)."""
    if value is None:
        return None
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise InputError(f"trusted_ak_names is a {type(value).__name__}; give a list of AK names (hex strings)")
    names = list(value)
    for name in names:
        if not isinstance(name, str):
            raise InputError(f"trusted_ak_names holds a {type(name).__name__}; AK names are hex strings")
    return names
