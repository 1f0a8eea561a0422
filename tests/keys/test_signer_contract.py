"""One contract, every backend: the same checks over a key in memory, a PEM
file, SoftHSM2 (Ed25519 and P-256) and swtpm (P-256), each opened the way a
caller opens it (``open_signer`` with the key's URI and its PIN).

What every signer must do (:class:`capseal.keys.Signer`): sign the message
and return the signature with the kid and alg of the key that made it; a
signature that the key's own public key verifies, checked here with
``cryptography`` alone; a custody statement that says what was observed and
labels a software device as software; the self-test; a close that ends
signing and can be repeated; and no PIN, passphrase or auth value in any
repr, str, URI or custody statement; signatures asked for from several
threads at once all verify.

``make test`` runs this module a second time with CAPSEAL_NO_DIRECT=1 (the
``direct_path`` mark): the hardware backends then sign on their libraries'
plain paths, and the contract must hold there too.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, padding, rsa
from cryptography.hazmat.primitives.asymmetric.utils import encode_dss_signature

from capseal.errors import SignatureFailedError, SignerError
from capseal.keys import (
    CUSTODY_SCHEMA,
    SignatureResult,
    Signer,
    SignerSelfTest,
    alg_for_public_key,
    generate_private_key,
    kid_for,
    open_signer,
    write_pkcs8,
)
from capseal.keys.direct import NO_DIRECT_ENV, direct_calls_allowed
from capseal.keys.pkcs11 import PKCS11Signer
from capseal.keys.provision import create_key

pytestmark = pytest.mark.direct_path

MESSAGE = b"the contract's message \x00\xff"
PASSPHRASE = "contract-pass-Zr~5"  # cannot turn up by chance in hex, base64 or JSON output
TPM_AUTH = "contract-auth-Wq~8"


@dataclass(frozen=True)
class Made:
    """A key made for the contract: how to open it, what it must say."""

    uri: str
    pin: str | None
    alg: str
    backend: str


_BACKENDS = [
    pytest.param("memory", id="software"),
    pytest.param("file", id="file"),
    pytest.param("softhsm-ed25519", id="softhsm-ed25519", marks=pytest.mark.softhsm),
    pytest.param("softhsm-p256", id="softhsm-p256", marks=pytest.mark.softhsm),
    pytest.param("swtpm-p256", id="swtpm-p256", marks=pytest.mark.swtpm),
]


@pytest.fixture(scope="module")
def keys() -> dict[str, Made]:
    """The keys made so far: one per backend, made when a test first asks for it
    (a hardware backend's device starts then)."""
    return {}


def _make(kind: str, keys: dict[str, Made], request: pytest.FixtureRequest,
          tmp_path_factory: pytest.TempPathFactory) -> Made:
    if kind in keys:
        return keys[kind]
    if kind == "memory":
        made = Made("unsafe-ephemeral:ES256", None, "ES256", "software")
    elif kind == "file":
        path = tmp_path_factory.mktemp("contract") / "key.pem"
        write_pkcs8(generate_private_key("EdDSA"), path, passphrase=PASSPHRASE.encode())
        made = Made(f"file:{path}", PASSPHRASE, "EdDSA", "software")
    elif kind.startswith("softhsm-"):
        softhsm = request.getfixturevalue("softhsm")
        alg = {"softhsm-ed25519": ("ed25519", "EdDSA"), "softhsm-p256": ("p256", "ES256")}[kind]
        uri = softhsm.uri(f"contract-{alg[0]}")
        create_key(uri, alg[0], pin=softhsm.pin).close()
        made = Made(uri, softhsm.pin, alg[1], "pkcs11")
    else:
        swtpm = request.getfixturevalue("swtpm")
        path = tmp_path_factory.mktemp("contract-tpm") / "key.tss"
        uri = f"tpm2:keyfile={path}?tcti={swtpm.tcti}"
        create_key(uri, "p256", pin=TPM_AUTH).close()
        made = Made(uri, TPM_AUTH, "ES256", "tpm2")
    keys[kind] = made
    return made


@pytest.fixture(params=_BACKENDS)
def made(request: pytest.FixtureRequest, keys: dict[str, Made], tmp_path_factory: pytest.TempPathFactory) -> Made:
    return _make(request.param, keys, request, tmp_path_factory)


@pytest.fixture()
def signer(made: Made) -> Iterator[Signer]:
    with open_signer(made.uri, pin=made.pin) as opened:
        yield opened


def _verifies(public_key: Any, alg: str, signature: bytes, message: bytes) -> bool:
    """The COSE signature checked with cryptography alone (ECDSA as raw r‖s)."""
    try:
        if isinstance(public_key, ed25519.Ed25519PublicKey):
            public_key.verify(signature, message)
        elif isinstance(public_key, ec.EllipticCurvePublicKey):
            half = len(signature) // 2
            der = encode_dss_signature(int.from_bytes(signature[:half], "big"), int.from_bytes(signature[half:], "big"))
            public_key.verify(der, message, ec.ECDSA(hashes.SHA256() if alg == "ES256" else hashes.SHA384()))
        elif isinstance(public_key, rsa.RSAPublicKey):
            public_key.verify(signature, message, padding.PSS(mgf=padding.MGF1(hashes.SHA256()), salt_length=32),
                              hashes.SHA256())
        else:
            return False
    except InvalidSignature:
        return False
    return True


def test_it_signs_and_the_public_key_verifies_the_signature(signer: Signer, made: Made) -> None:
    result = signer.sign(MESSAGE)
    assert isinstance(result, SignatureResult)
    assert _verifies(signer.public_key, result.alg, result.signature, MESSAGE)
    assert not _verifies(signer.public_key, result.alg, result.signature, MESSAGE + b"!")
    size = {"EdDSA": 64, "ES256": 64, "ES384": 96}.get(made.alg)
    assert size is None or len(result.signature) == size  # COSE form: raw r‖s, never DER
    pending = signer.begin_sign(MESSAGE).result()  # the queued path gives the same kind of answer
    assert (pending.kid, pending.alg) == (result.kid, result.alg)
    assert _verifies(signer.public_key, pending.alg, pending.signature, MESSAGE)


def test_kid_and_alg_belong_to_the_key_that_signed(signer: Signer, made: Made) -> None:
    result = signer.sign(MESSAGE)
    assert signer.alg == result.alg == made.alg == alg_for_public_key(signer.public_key)
    assert signer.kid == result.kid == kid_for(signer.public_key)
    if made.alg == "EdDSA":  # the AAC profile's kid is the raw Ed25519 public key
        assert bytes.fromhex(signer.kid) == signer.public_key_raw
    pem = serialization.load_pem_public_key(signer.public_key_pem().encode())
    assert kid_for(pem) == signer.kid


def test_describe_says_what_was_observed_and_labels_software_as_software(signer: Signer, made: Made) -> None:
    custody = signer.describe()
    assert custody["schema"] == CUSTODY_SCHEMA and custody["backend"] == made.backend
    assert custody["alg"] == signer.alg and custody["kid"] == signer.kid
    spki = signer.public_key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    assert custody["public_key"] == spki.hex()
    # memory, a file, SoftHSM2 and swtpm all hold the key in software: said so, never as hardware
    assert custody["software_device"] is True
    assert not any(isinstance(number, float) for number in _numbers(custody))  # hashed into capsules: no float
    assert made.pin is None or made.pin not in json.dumps(custody)


def _numbers(value: Any) -> Iterator[Any]:
    if isinstance(value, dict):
        for item in value.values():
            yield from _numbers(item)
    elif isinstance(value, list):
        for item in value:
            yield from _numbers(item)
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        yield value


def test_the_self_test_passes_and_catches_a_public_key_of_another_key(signer: Signer) -> None:
    SignerSelfTest.run(signer)

    other = generate_private_key(signer.alg).public_key()

    class OtherPublicKey(Signer):
        """The same private key, reporting another key's public key (a token
        object pairing a private key with the wrong public-key object)."""

        @property
        def alg(self) -> str:
            return signer.alg

        @property
        def public_key(self) -> Any:
            return other

        @property
        def uri(self) -> str:
            return signer.uri

        def sign(self, data: bytes) -> SignatureResult:
            return signer.sign(data)

        def describe(self) -> dict[str, Any]:
            return signer.describe()

    with pytest.raises(SignatureFailedError, match="its own public key rejects"):
        SignerSelfTest.run(OtherPublicKey())


def test_close_ends_signing_and_can_be_repeated(made: Made) -> None:
    opened = open_signer(made.uri, pin=made.pin)
    assert opened.sign(MESSAGE).alg == made.alg
    opened.close()
    opened.close()  # idempotent
    with pytest.raises(SignerError):
        opened.sign(MESSAGE)


def test_signatures_asked_for_from_several_threads_at_once_all_verify(signer: Signer, made: Made) -> None:
    """Four threads sign at once through one signer (on a token or TPM they
    queue on its one worker): each gets the signature of its own message."""
    start = threading.Barrier(4)
    results: dict[bytes, SignatureResult] = {}
    errors: list[BaseException] = []

    def sign_some(n: int) -> None:
        try:
            start.wait(timeout=30)
            for i in range(12):
                message = MESSAGE + bytes([n, i])
                results[message] = signer.sign(message)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)

    threads = [threading.Thread(target=sign_some, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert errors == [] and not any(t.is_alive() for t in threads)
    assert len(results) == 48
    for message, result in results.items():
        assert (result.kid, result.alg) == (signer.kid, made.alg)
        assert _verifies(signer.public_key, result.alg, result.signature, message), message


def test_the_pin_is_never_shown(signer: Signer, made: Made) -> None:
    shown = [repr(signer), str(signer), signer.describe_short(), signer.uri, json.dumps(signer.describe())]
    assert made.pin is None or not any(made.pin in text for text in shown), shown
    assert "pin-value" not in signer.uri


def test_a_pin_in_the_uri_is_not_shown_either(softhsm: Any, keys: dict[str, Made], request: pytest.FixtureRequest,
                                               tmp_path_factory: pytest.TempPathFactory) -> None:
    made = _make("softhsm-ed25519", keys, request, tmp_path_factory)
    with open_signer(f"{made.uri}&pin-value={softhsm.pin}") as signer:
        shown = [repr(signer), str(signer), signer.describe_short(), signer.uri, json.dumps(signer.describe())]
        assert signer.sign(MESSAGE).alg == "EdDSA"
    assert not any(softhsm.pin in text for text in shown), shown


@pytest.mark.parametrize("switch", ["1", ""], ids=["CAPSEAL_NO_DIRECT=1", "unset"])
def test_the_switch_decides_the_path_and_the_signatures_are_the_same(made: Made, switch: str,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """CAPSEAL_NO_DIRECT=1 leaves every backend on its library's plain path
    (python-pkcs11's key.sign, tpm2-pytss's ESAPI.sign): no direct path at
    all; unset, the hardware backends take theirs (Ed25519 and ECDSA keys).
    Either way the signatures verify, with the same kid and alg."""
    monkeypatch.setenv(NO_DIRECT_ENV, switch)
    assert direct_calls_allowed() is (switch == "")
    with open_signer(made.uri, pin=made.pin) as opened:
        result = opened.sign(MESSAGE)
        direct = getattr(opened, "direct_path", None)
        assert _verifies(opened.public_key, result.alg, result.signature, MESSAGE)
        assert (result.kid, result.alg) == (opened.kid, made.alg)
    if made.backend in ("pkcs11", "tpm2"):
        assert (direct is not None) is (switch == "")
        if switch == "" and isinstance(opened, PKCS11Signer):
            assert direct is not None and direct.signatures > 0  # the signature above went the direct way
    else:
        assert direct is None  # software keys have no other path


@pytest.mark.softhsm
def test_a_signing_process_under_the_switch_signs_in_its_child_on_the_plain_path(
        softhsm: Any, keys: dict[str, Made], request: pytest.FixtureRequest,
        tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """The child reads the switch from the environment it inherits: it signs
    with key.sign, and every signature still comes from it, none from here."""
    made = _make("softhsm-p256", keys, request, tmp_path_factory)
    monkeypatch.setenv(NO_DIRECT_ENV, "1")
    with open_signer(made.uri, pin=made.pin, signing_process=True) as opened:
        assert isinstance(opened, PKCS11Signer) and opened.direct_path is None
        results = [opened.begin_sign(MESSAGE + bytes([i])) for i in range(20)]
        signed = [pending.result() for pending in results]
        assert all(_verifies(opened.public_key, r.alg, r.signature, MESSAGE + bytes([i])) for i, r in enumerate(signed))
        assert opened.signatures_in_process == 0
