"""Independent checks of a COSE_Sign1 envelope, shared by the software, PKCS#11
and TPM signer tests: pycose and scitt-cose, not capseal's own verifier."""

from __future__ import annotations

import pytest
from pycose.keys import CoseKey
from pycose.messages import CoseMessage
from scitt_cose.cose_sign1 import CoseError, verify_sign1


def assert_envelope_verifies_independently(cose: bytes, pem: str, payload: bytes, alg: str) -> None:
    """pycose verifies ``cose`` under the public key ``pem`` and refuses it with
    another payload; scitt-cose verifies it too where it can. scitt-cose 0.5.0
    (the newest release) knows EdDSA, ES256 and ES384 only and refuses PS256 by
    name: that refusal is asserted, so an upgrade that adds PS256 is noticed."""
    msg = CoseMessage.decode(cose)
    msg.key = CoseKey.from_pem_public_key(pem)
    assert msg.payload == payload
    assert msg.verify_signature()  # type: ignore[attr-defined]
    forged = CoseMessage.decode(cose)
    forged.key = msg.key
    forged.payload = bytes(len(payload))
    assert not forged.verify_signature()  # type: ignore[attr-defined]
    if alg == "PS256":
        with pytest.raises(CoseError, match="unsupported alg code point -37"):
            verify_sign1(cose, public_key_pem=pem)
        return
    assert verify_sign1(cose, public_key_pem=pem).payload == payload
    with pytest.raises(CoseError):
        verify_sign1(cose[:-1] + bytes([cose[-1] ^ 1]), public_key_pem=pem)
