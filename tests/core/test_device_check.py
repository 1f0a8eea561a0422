"""The producer's check of each device signature (design §3 principle 3):
libsodium's Ed25519 verify when the system has it (``capseal._sodium``), else
cryptography's. libsodium must accept only signatures OpenSSL accepts, so
the faster check never lets through what a verifier refuses; with either
check a wrong signature is refused and nothing is written."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric import ed25519

from capseal import Producer, _sodium, verify_ledger
from capseal.errors import SignatureFailedError
from capseal.keys import SignatureResult, SoftwareSigner, generate_private_key

_L = 2**252 + 27742317777372353535851937790883648493


def test_the_check_is_libsodiums_on_a_machine_set_up_by_install_deps() -> None:
    """hardware/install-deps.sh installs libsodium; a CI run that fell back
    to cryptography without saying so would hide the figure the benchmark
    reports. Not a skip: this fails."""
    assert _sodium.ed25519_check() == "libsodium", "libsodium not loaded: run hardware/install-deps.sh (libsodium23)"


def _openssl_accepts(signature: bytes, message: bytes, public: bytes) -> bool:
    try:
        ed25519.Ed25519PublicKey.from_public_bytes(public).verify(signature, message)
    except (InvalidSignature, ValueError):
        return False
    return True


def _cases() -> list[tuple[str, bytes, bytes, bytes]]:
    key = ed25519.Ed25519PrivateKey.generate()
    public = key.public_key().public_bytes_raw()
    message = b"a COSE Sig_structure over a capsule id"
    good = key.sign(message)
    s = int.from_bytes(good[32:], "little")
    identity = bytes([1]) + bytes(31)  # the neutral point: order 1
    return [
        ("good", good, message, public),
        ("other message", good, message + b".", public),
        ("R altered", bytes([good[0] ^ 4]) + good[1:], message, public),
        ("S altered", good[:63] + bytes([good[63] ^ 1]), message, public),
        ("S + L", good[:32] + (s + _L).to_bytes(32, "little"), message, public),
        ("S + 8L", good[:32] + (s + 8 * _L).to_bytes(32, "little"), message, public),
        ("short", good[:63], message, public),
        # a key of small order "signs" every message for OpenSSL (R = identity, S = 0)
        ("small-order key", identity + bytes(32), b"any message at all", identity),
        ("other key", good, message, ed25519.Ed25519PrivateKey.generate().public_key().public_bytes_raw()),
    ]


@pytest.mark.parametrize("case", [c[0] for c in _cases()])
def test_libsodium_accepts_nothing_openssl_refuses(case: str) -> None:
    check = _sodium.verifier()
    assert check is not None
    _, signature, message, public = next(c for c in _cases() if c[0] == case)
    sodium, openssl = check(signature, message, public), _openssl_accepts(signature, message, public)
    assert not sodium or openssl, f"{case}: libsodium accepted what OpenSSL refuses"
    assert sodium == (case == "good")  # it takes the good signature and only that one
    if case == "small-order key":
        assert openssl  # why libsodium's check is the stricter one


class _WrongSignatures(SoftwareSigner):
    """A real software key whose signatures come back wrong once armed (a
    device that answers with bytes that do not verify)."""

    def __init__(self) -> None:
        super().__init__(generate_private_key("EdDSA"), uri="ephemeral:wrong", key_store="memory")
        self.armed = False

    def sign(self, data: bytes) -> SignatureResult:
        result = super().sign(data)
        if not self.armed:
            return result
        flipped = result.signature[:10] + bytes([result.signature[10] ^ 1]) + result.signature[11:]
        return SignatureResult(flipped, result.kid, result.alg)


@pytest.mark.parametrize("library", ["libsodium", "cryptography"])
def test_a_wrong_device_signature_is_refused_with_either_check(library: str, tmp_path: Path,
                                                              monkeypatch: Any) -> None:
    if library == "cryptography":  # the path of a system without libsodium
        monkeypatch.setattr(_sodium, "_loaded", True)
        monkeypatch.setattr(_sodium, "_check", None)
    assert _sodium.ed25519_check() == library
    signer = _WrongSignatures()
    with Producer("acme", "agent@1", signer, tmp_path / "l.db", verify_signatures="always") as producer:
        producer.seal({"action_id": "before", "action_type": "fyi"})
        signer.armed = True
        with pytest.raises(SignatureFailedError, match="does not verify under its public key"):
            producer.seal({"action_id": "wrong", "action_type": "fyi"})
        signer.armed = False
        producer.seal({"action_id": "after", "action_type": "fyi"})
    report = verify_ledger(tmp_path / "l.db")
    assert report.ok and len(report.records) == 3  # the epoch boundary, before and after: nothing for the refused one
