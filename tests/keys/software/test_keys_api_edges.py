"""Edges of the keys API a caller meets first: a misspelled option to
``open_signer`` (or to a provisioning call) is refused by every backend,
naming it, the closest valid spelling and the valid options (a typo once
dropped a module allow-list without a word); ``SoftwareSigner`` takes a bare
private key; ``verify_certify`` is public and names a wrong argument instead
of blaming the record. Hardware backends against a real SoftHSM2 token and a
real swtpm."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric import ec, ed25519

from capseal import Producer, verify_ledger
from capseal.envelope import signature_ok
from capseal.errors import InputError, UnknownOptionError, UnsupportedAlgorithmError
from capseal.keys import SoftwareSigner, open_signer, verify_certify
from capseal.keys.provision import create_key, list_keys, show_key

SIGN, AK = 0x81000F01, 0x81000F02  # a range of this module's own on the session swtpm


def _refused(call: Any, wrong: str, guess: str | None, *valid: str) -> str:
    with pytest.raises(UnknownOptionError) as info:
        call()
    text = str(info.value)
    assert repr(wrong) in text, text
    if guess is not None:
        assert f"did you mean {guess!r}" in text, text
    for name in valid:
        assert name in text, text
    assert isinstance(info.value, TypeError)  # as Python's own refusal of an unexpected keyword
    return text


def test_file_and_ephemeral_keys_refuse_unknown_options(tmp_path: Path) -> None:
    uri = f"file:{tmp_path / 'k.pem'}"
    create_key(uri, "ed25519").close()
    _refused(lambda: open_signer(uri, passphrase="x"), "passphrase", None, "pin", "secrets_handler")
    from capseal.keys import SIGNER_FOR_URI_SCHEME

    throwaway = "unsafe-ephemeral:EdDSA" if "unsafe-ephemeral" in SIGNER_FOR_URI_SCHEME else "ephemeral:EdDSA"
    _refused(lambda: open_signer(throwaway, signing_process=True), "signing_process", None, "pin")
    _refused(lambda: create_key(f"file:{tmp_path / 'new.pem'}", "ed25519", rsa_bits=2048), "rsa_bits", None, "pin")
    assert not (tmp_path / "new.pem").exists()  # refused before anything was written
    _refused(lambda: list_keys(f"file:{tmp_path}", module_allowlist=[]), "module_allowlist", None, "pin")
    _refused(lambda: show_key(uri, tcti="x"), "tcti", None, "pin")


def test_pkcs11_refuses_a_misspelled_option_instead_of_dropping_it(softhsm: Any) -> None:
    with create_key(softhsm.uri(f"opt-{os.urandom(3).hex()}"), "ed25519", pin=softhsm.pin) as made:
        uri = made.uri
    text = _refused(lambda: open_signer(uri, pin=softhsm.pin, signing_proces=True), "signing_proces",
                    "signing_process", "module_allowlist", "signing_process", "timeout")
    assert softhsm.pin not in text
    # the allow-list typo: refused, so the module is never loaded without the list the caller meant
    _refused(lambda: open_signer(uri, pin=softhsm.pin, modul_allowlist=["/nonexistent.so"]), "modul_allowlist",
             "module_allowlist")
    with pytest.raises(UnknownOptionError) as both:
        open_signer(uri, pin=softhsm.pin, signing_proces=True, modul_allowlist=[])
    assert "'modul_allowlist' (did you mean 'module_allowlist'?), 'signing_proces'" in str(both.value)
    label = f"never-{os.urandom(3).hex()}"
    _refused(lambda: create_key(softhsm.uri(label), "rsa-pss", pin=softhsm.pin, rsa_bit=2048), "rsa_bit", "rsa_bits")
    assert not [k for k in list_keys(softhsm.uri(), pin=softhsm.pin) if k["label"] == label]  # nothing made
    _refused(lambda: list_keys(softhsm.uri(), pin=softhsm.pin, signing_process=True), "signing_process", None,
             "module_allowlist")
    with open_signer(uri, pin=softhsm.pin, timeout=5) as signer:  # a valid option still works
        assert signature_ok("EdDSA", signer.public_key, signer.sign(b"m").signature, b"m")
    with pytest.raises(InputError, match="timeout"):
        open_signer(uri, pin=softhsm.pin, timeout=0)


def test_tpm_refuses_unknown_options_and_lists_the_valid_ones(swtpm: Any) -> None:
    uri = f"tpm2:handle=0x{SIGN:08x}?tcti={swtpm.tcti}"
    _refused(lambda: open_signer(uri, tcit=swtpm.tcti), "tcit", "tcti", "ak_handle", "timeout", "tcti")
    _refused(lambda: create_key(uri, "p256", handle=SIGN), "handle", None, "tcti")
    _refused(lambda: list_keys(f"tpm2:?tcti={swtpm.tcti}", timout=3), "timout", None, "tcti")


def test_a_software_signer_takes_a_bare_private_key(tmp_path: Path) -> None:
    for key, alg in ((ed25519.Ed25519PrivateKey.generate(), "EdDSA"), (ec.generate_private_key(ec.SECP256R1()), "ES256")):
        signer = SoftwareSigner(key)
        assert signer.alg == alg and signer.uri == "memory:"
        custody = signer.describe()
        assert custody["key_store"] == "memory" and custody["software_device"] is True
        with Producer("acme", "agent@1", signer, tmp_path / f"{alg}.db") as producer:
            producer.planned("a-1", effect_type="x-tool-call", request={"q": 1})
        assert verify_ledger(tmp_path / f"{alg}.db").ok
    with pytest.raises(UnsupportedAlgorithmError, match="private_key is a str"):
        SoftwareSigner("-----BEGIN PRIVATE KEY-----")


def test_verify_certify_is_public_and_names_a_wrong_argument(swtpm: Any) -> None:
    from capseal.keys.tpm import provision

    provision(swtpm.tcti, signing_handle=SIGN, ak_handle=AK, force=True)
    with open_signer(f"tpm2:handle=0x{SIGN:08x}?tcti={swtpm.tcti}&ak-handle=0x{AK:08x}") as signer:
        record = signer.describe()["tpm_certify"]
        key, pem = signer.public_key, signer.public_key_pem()
    assert verify_certify(record, public_key=key, trusted_ak_names=[record["ak_name"]]) == []
    assert verify_certify(record, public_key=pem) == [] == verify_certify(record, public_key=pem.encode())
    other = ec.generate_private_key(ec.SECP256R1()).public_key()
    assert any("not this signer's public key" in p for p in verify_certify(record, public_key=other))
    for bad in (42, "not a PEM", b"-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n"):
        with pytest.raises(InputError, match="public_key is a"):
            verify_certify(record, public_key=bad)
    with pytest.raises(InputError, match="trusted_ak_names is a str"):
        verify_certify(record, trusted_ak_names=record["ak_name"])
    assert verify_certify({"kind": "tpm2-certify"}) != []  # a bad record is still a finding, never an exception
