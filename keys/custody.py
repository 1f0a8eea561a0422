"""Custody statements: what capseal *observed* about a signing key.

A custody statement is sealed into each epoch-boundary capsule
(``model_attestation.compute_attestation["x-capseal-key-custody"]``), so it is
signed, hashed and permanent. It therefore says only what the backend read from
the key's holder: attributes a token reports, TPM object attributes, device
strings. Rules:

* ``software_device`` is ``True`` for keys held by software: files, process
  memory, SoftHSM2 and swtpm. It is ``False`` only when the device identified
  itself as something else. Unknown is ``None``, never ``False``.
* No value is ever a float; no secret (PIN, key bytes) ever appears.
"""

from __future__ import annotations

from typing import Any

__all__ = ["CUSTODY_SCHEMA", "custody_statement", "SOFTWARE_TOKEN_MANUFACTURERS"]

CUSTODY_SCHEMA = "capseal-key-custody/1"

#: PKCS#11 token manufacturer strings of software tokens.
SOFTWARE_TOKEN_MANUFACTURERS = frozenset({"SoftHSM project", "SoftHSM"})


def custody_statement(
    *,
    backend: str,
    alg: str,
    kid: str,
    software_device: bool | None,
    key_store: str,
    device: dict[str, Any] | None = None,
    key_attributes: dict[str, Any] | None = None,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Build a custody statement; absent facts are left out, never nulled."""
    out: dict[str, Any] = {
        "schema": CUSTODY_SCHEMA,
        "backend": backend,
        "alg": alg,
        "kid": kid,
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
