"""Custody statements: what capseal *observed* about a signing key.

A custody statement is sealed into each epoch-boundary capsule
(``model_attestation.compute_attestation["x-capseal-key-custody"]``), so it is
signed, hashed and permanent. It therefore says only what the backend read from
the key's holder: attributes a token reports, TPM object attributes, device
strings. Rules:

* ``software_device`` is ``True`` for keys held by software: files, process
  memory, SoftHSM2 and swtpm. It is ``False`` only when the device identified
  itself as something else. Unknown is ``None``, never ``False``.
* No value is ever a float; no secret (PIN, private key bytes) ever appears.
* ``public_key`` (DER SubjectPublicKeyInfo, hex) lets verifiers resolve a kid.
"""

from __future__ import annotations

from typing import Any

from cryptography.hazmat.primitives import serialization

__all__ = ["CUSTODY_SCHEMA", "custody_statement", "SOFTWARE_TOKEN_MANUFACTURERS"]

CUSTODY_SCHEMA = "capseal-key-custody/1"

#: PKCS#11 token manufacturer strings of software tokens.
SOFTWARE_TOKEN_MANUFACTURERS = frozenset({"SoftHSM project", "SoftHSM"})


def custody_statement(
    *,
    backend: str,
    alg: str,
    kid: str,
    public_key: Any,
    software_device: bool | None,
    key_store: str,
    device: dict[str, Any] | None = None,
    key_attributes: dict[str, Any] | None = None,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Build a custody statement; absent facts are left out, never nulled.

    Args:
        backend: ``software``, ``pkcs11``, ``tpm2`` or a registered backend's name.
        alg: the COSE algorithm.
        kid: the key id.
        public_key: the ``cryptography`` public key, recorded as hex DER
            SubjectPublicKeyInfo, so verifiers can check ES256/PS256 envelopes
            whose kid is a hash of that key.
        software_device: True for a key held by software, False only when the
            device identified itself as hardware, None when unknown (left out).
        key_store: where the key lives (``file``, ``memory``, ``pkcs11-token``, …).
        device: what the device reported about itself.
        key_attributes: what the device reported about the key.
        extra: more members.

    Returns:
        The statement.
    """
    spki = public_key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    out: dict[str, Any] = {
        "schema": CUSTODY_SCHEMA,
        "backend": backend,
        "alg": alg,
        "kid": kid,
        "public_key": spki.hex(),
        "key_store": key_store,
    }
    if software_device is not None:
        out["software_device"] = software_device
    if device:
        out["device"] = {k: v for k, v in device.items() if v is not None}
    if key_attributes:
        out["key_attributes"] = {k: v for k, v in key_attributes.items() if v is not None}
    if extra:
        out.update({k: v for k, v in extra.items() if v is not None})
    return out
