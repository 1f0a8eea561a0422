"""Keys on a real SoftHSM2 token: what ``keys create`` makes (sign-only), what
``keys show`` / ``keys create`` / ``doctor`` check before they print a key (the
private key and its public-key object are one pair), and signers that are
still half-built when they fail."""

from __future__ import annotations

import os
import subprocess
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest
from pkcs11 import Attribute, KeyType, Mechanism, MechanismFlag, ObjectClass
from pkcs11.exceptions import AttributeTypeInvalid

from capseal.errors import DeviceError, KeyNotFoundError, SignatureFailedError, UnsupportedAlgorithmError
from capseal.keys import open_signer
from capseal.keys.pkcs11 import PKCS11Signer, doctor_checks, parse_pkcs11_uri
from capseal.keys.pkcs11._calls import run
from capseal.keys.pkcs11._objects import CURVE_PARAMS, find_public_key
from capseal.keys.pkcs11._session import open_token, release_token
from capseal.keys.provision import create_key, show_key

PRIVATE_OFF = (Attribute.DECRYPT, Attribute.UNWRAP, Attribute.DERIVE)
PUBLIC_OFF = (Attribute.ENCRYPT, Attribute.WRAP)


def _usages(signer: PKCS11Signer) -> dict[str, bool]:
    """The usage attributes of the signer's key pair, read from the token."""
    ts = signer.token_session

    def read(session: Any) -> dict[str, bool]:
        private = signer.key_object(session)
        public = find_public_key(session, private)
        assert public is not None
        out = {f"private {a.name}": bool(private[a]) for a in (Attribute.SIGN, *PRIVATE_OFF)}
        out.update({f"public {a.name}": bool(public[a]) for a in (Attribute.VERIFY, *PUBLIC_OFF)})
        return out

    return run(ts, read, "test")


@pytest.mark.parametrize("alg", ["ed25519", "p256", "rsa-pss"])
def test_created_keys_only_sign(alg: str, softhsm: Any) -> None:
    """SoftHSM2 defaults CKA_DECRYPT/UNWRAP/DERIVE (and ENCRYPT/WRAP) to true
    when the template leaves them out: they are asked for as false."""
    uri = softhsm.uri(f"usage-{alg}-{os.urandom(3).hex()}")
    with create_key(uri, alg, pin=softhsm.pin, rsa_bits=2048) as signer:
        assert isinstance(signer, PKCS11Signer)
        usages = _usages(signer)
        attrs = signer.describe()["key_attributes"]
    assert usages == {"private SIGN": True, "private DECRYPT": False, "private UNWRAP": False, "private DERIVE": False,
                      "public VERIFY": True, "public ENCRYPT": False, "public WRAP": False}
    assert (attrs["CKA_DECRYPT"], attrs["CKA_UNWRAP"], attrs["CKA_DERIVE"]) == (False, False, False)


_T = TypeVar("_T")


def on_token(softhsm: Any, work: Callable[[Any], _T]) -> _T:
    """``work(rw)`` in a read-write session on the test token, under the
    process-wide lock (objects made the way a careless tool would)."""
    ts = open_token(parse_pkcs11_uri(softhsm.uri()), pin=softhsm.pin)
    try:
        def job(session: Any) -> _T:
            rw = ts.token.open(rw=True)
            try:
                return work(rw)
            finally:
                rw.close()

        return run(ts, job, "test")
    finally:
        release_token(ts)


def test_a_new_key_that_can_decrypt_is_destroyed(softhsm: Any) -> None:
    """The read-back: a pair generated with the token's defaults (decrypt,
    unwrap, derive on) is destroyed and refused with a typed error."""
    from capseal.keys.pkcs11._provision import check_new_key  # the read-back create_key runs

    label, key_id = f"loose-{os.urandom(3).hex()}", os.urandom(4)

    def make_and_check(rw: Any) -> None:
        rw.generate_keypair(KeyType.RSA, 2048, store=True, label=label, id=key_id,
                            mechanism=Mechanism.RSA_PKCS_KEY_PAIR_GEN,
                            capabilities=MechanismFlag.SIGN | MechanismFlag.VERIFY | MechanismFlag.DECRYPT,
                            private_template={Attribute.SENSITIVE: True, Attribute.EXTRACTABLE: False})
        check_new_key(rw, label, key_id, "the test token")

    with pytest.raises(DeviceError) as err:
        on_token(softhsm, make_and_check)
    assert "CKA_DECRYPT" in str(err.value) and "destroyed" in str(err.value)
    assert on_token(softhsm, lambda rw: list(rw.get_objects({Attribute.LABEL: label}))) == []


def test_half_built_signer_has_a_repr(softhsm: Any) -> None:
    """A signer whose __init__ failed still has a repr (tracebacks with
    captured locals print it), and the repr holds no PIN."""
    assert "PKCS11Signer" in repr(PKCS11Signer.__new__(PKCS11Signer))
    with pytest.raises(KeyNotFoundError) as err:
        open_signer(softhsm.uri("no-such-key-repr"), pin=softhsm.pin)
    text = "".join(traceback.TracebackException.from_exception(err.value, capture_locals=True).format())
    assert "PKCS11Signer" in text


def _mismatched_pair(softhsm: Any) -> str:
    """A private key whose public-key object (same CKA_ID and label) is another
    key's, as /tmp/review-keys/mismatch.py made it; returns its URI."""
    label, key_id = f"mm-{os.urandom(3).hex()}", os.urandom(4)

    def make(rw: Any) -> None:
        dp = rw.create_domain_parameters(KeyType.EC, {Attribute.EC_PARAMS: CURVE_PARAMS["ES256"][0]}, local=True)
        pub_a, _ = dp.generate_keypair(store=True, label=label, id=key_id,
                                       private_template={Attribute.SENSITIVE: True, Attribute.EXTRACTABLE: False})
        pub_b, priv_b = dp.generate_keypair(store=True, label=label + "-b", id=key_id + b"b")
        pub_a.destroy()
        priv_b.destroy()
        pub_b[Attribute.ID], pub_b[Attribute.LABEL] = key_id, label

    on_token(softhsm, make)
    return softhsm.uri(label)


def test_a_mismatched_pair_is_caught_by_show_and_doctor(softhsm: Any) -> None:
    uri = _mismatched_pair(softhsm)
    label = parse_pkcs11_uri(uri).object
    with pytest.raises(SignatureFailedError) as err:
        show_key(uri, pin=softhsm.pin)
    assert softhsm.label in str(err.value) and repr(label) in str(err.value) and err.value.hint

    checks = doctor_checks(uri, pin=softhsm.pin)
    assert [c.name for c in checks if not c.ok] == ["key found"]
    assert "rejects" in checks[-1].detail and softhsm.label in checks[-1].detail

    shown = subprocess.run([str(Path(sys.executable).with_name("capseal")), "keys", "show", uri],
                           capture_output=True, text=True, env={**os.environ, "CAPSEAL_PIN": softhsm.pin}, timeout=60)
    assert shown.returncode == 2 and "BEGIN PUBLIC KEY" not in shown.stdout
    assert repr(label) in shown.stderr and softhsm.pin not in shown.stdout + shown.stderr


def test_custody_names_the_module_file_loaded_and_allowlist_takes_a_path(softhsm: Any, tmp_path: Path) -> None:
    """device.module is the real file loaded, not the URI's spelling of it (here
    a symlink); module_allowlist= takes one Path; type=PRIVATE is type=private."""
    uri = softhsm.uri(f"mod-{os.urandom(3).hex()}")
    create_key(uri, "p256", pin=softhsm.pin).close()
    alias = tmp_path / "libalias-pkcs11.so"
    alias.symlink_to(softhsm.module)
    aliased = uri.replace(f"module-path={softhsm.module}", f"module-path={alias}").replace("?", ";type=PRIVATE?")
    with open_signer(aliased, pin=softhsm.pin, module_allowlist=Path(softhsm.module)) as signer:
        assert signer.describe()["device"]["module"] == os.path.realpath(softhsm.module)


def test_a_new_key_that_fails_its_self_test_is_named_for_removal(softhsm: Any, monkeypatch: Any) -> None:
    """keys create signs and verifies once; if that fails (a device pairing the
    new private key with another public key), the error names the key left on
    the token, so the operator can remove it before creating one again."""
    import capseal.cose

    label = f"selftest-{os.urandom(3).hex()}"
    monkeypatch.setattr(capseal.cose, "signature_ok", lambda *a, **k: False)
    with pytest.raises(SignatureFailedError, match="is kept") as err:
        create_key(softhsm.uri(label), "p256", pin=softhsm.pin)
    assert label in str(err.value) and softhsm.pin not in str(err.value)
    monkeypatch.undo()
    with open_signer(softhsm.uri(label), pin=softhsm.pin) as signer:  # it is there, as the error says
        assert signer.alg == "ES256"


def test_create_key_with_a_secrets_handler_asks_once_and_opens_the_key(softhsm: Any) -> None:
    """``create_key(…, secrets_handler=…)``: the PIN the handler gave (asked
    once) also opens the new key. It used to be forgotten after generation:
    the key was made, then opening it raised PinIncorrectError ("needs a PIN"),
    and a second try was refused because the label was taken."""
    label = f"handler-{os.urandom(3).hex()}"
    prompts: list[str] = []

    def handler(prompt: str) -> str:
        prompts.append(prompt)
        return softhsm.pin

    with create_key(softhsm.uri(label), "ed25519", secrets_handler=handler) as signer:
        assert signer.alg == "EdDSA" and len(signer.sign(b"m").signature) == 64
    assert len(prompts) == 1 and softhsm.label in prompts[0]


def test_a_key_capseal_cannot_sign_with_is_named_with_its_token(softhsm: Any) -> None:
    """An RSA key under 2048 bits (PS256 needs at least that): the typed error
    names the token and the key, and says why. It said only "keys of type
    RSAPublicKey are not supported", naming neither (and RSA is supported)."""
    label = f"rsa1024-{os.urandom(3).hex()}"
    on_token(softhsm, lambda rw: rw.generate_keypair(
        KeyType.RSA, 1024, store=True, label=label, id=os.urandom(4), mechanism=Mechanism.RSA_PKCS_KEY_PAIR_GEN,
        private_template={Attribute.SENSITIVE: True, Attribute.EXTRACTABLE: False}))
    with pytest.raises(UnsupportedAlgorithmError) as err:
        open_signer(softhsm.uri(label), pin=softhsm.pin)
    message = str(err.value)
    assert softhsm.label in message and repr(label) in message and "1024" in message and "2048" in message, message


def test_a_key_that_wants_a_pin_per_signature_is_refused(softhsm: Any) -> None:
    """hardware/README.md: keys with CKA_ALWAYS_AUTHENTICATE (a PIN for every
    signature, as on PIV slot 9c) are refused, since capseal signs unattended.
    The refusal is typed and names the token and the key; nothing is signed."""
    label = f"always-auth-{os.urandom(3).hex()}"

    def make(rw: Any) -> None:
        dp = rw.create_domain_parameters(KeyType.EC, {Attribute.EC_PARAMS: CURVE_PARAMS["ES256"][0]}, local=True)
        dp.generate_keypair(store=True, label=label, id=os.urandom(4),
                            private_template={Attribute.SENSITIVE: True, Attribute.EXTRACTABLE: False,
                                              Attribute.SIGN: True, Attribute.ALWAYS_AUTHENTICATE: True})

    on_token(softhsm, make)
    assert on_token(softhsm, lambda rw: bool(rw.get_key(label=label, object_class=ObjectClass.PRIVATE_KEY)
                                             [Attribute.ALWAYS_AUTHENTICATE]))
    with pytest.raises(UnsupportedAlgorithmError) as err:
        open_signer(softhsm.uri(label), pin=softhsm.pin)
    message = str(err.value)
    assert "CKA_ALWAYS_AUTHENTICATE" in message and softhsm.label in message and repr(label) in message, message


# ---------------------------------------------------------------------- attributes the token did not report


@pytest.mark.parametrize(("template", "store", "named"), [
    ({Attribute.PRIVATE: False}, True, "CKA_PRIVATE false"),
    ({}, False, "CKA_TOKEN false"),
])
def test_a_new_key_that_is_not_a_private_token_object_is_destroyed(
        template: dict[Attribute, Any], store: bool, named: str, softhsm: Any) -> None:
    """hardware/README.md says the new private key is a token object with
    CKA_PRIVATE true and that every attribute asked for is read back; the
    read-back checked neither CKA_PRIVATE nor CKA_TOKEN, and took a key the
    token made readable without a login, or a session object gone at
    logout."""
    from capseal.keys.pkcs11._provision import check_new_key

    label, key_id = f"public-{os.urandom(3).hex()}", os.urandom(4)

    def make_and_check(rw: Any) -> None:
        dp = rw.create_domain_parameters(KeyType.EC, {Attribute.EC_PARAMS: CURVE_PARAMS["ES256"][0]}, local=True)
        dp.generate_keypair(store=store, label=label, id=key_id,
                            public_template={Attribute.ENCRYPT: False, Attribute.WRAP: False},
                            private_template={Attribute.SENSITIVE: True, Attribute.EXTRACTABLE: False,
                                              Attribute.SIGN: True, Attribute.DECRYPT: False,
                                              Attribute.UNWRAP: False, Attribute.DERIVE: False, **template})
        check_new_key(rw, label, key_id, "the test token")

    with pytest.raises(DeviceError) as err:
        on_token(softhsm, make_and_check)
    assert named in str(err.value) and "destroyed" in str(err.value)
    assert on_token(softhsm, lambda rw: list(rw.get_objects({Attribute.LABEL: label}))) == []


class _FakeKey:
    """A key object whose token shows only ``shown`` (the others raise as
    python-pkcs11 does for an attribute the token does not have)."""

    def __init__(self, shown: dict[Attribute, Any]) -> None:
        self.shown = shown

    def __getitem__(self, attribute: Attribute) -> Any:
        if attribute not in self.shown:
            raise AttributeTypeInvalid()
        return self.shown[attribute]


class _FakeSession:
    """Lists one key object (SoftHSM2 always shows CKA_SIGN: only the wording is tested here)."""

    def __init__(self, key: _FakeKey) -> None:
        self.key = key

    def get_objects(self, attrs: dict[Attribute, Any]) -> Any:
        class _Found(list[Any]):
            def close(self) -> None:
                pass

        return _Found([self.key] if attrs.get(Attribute.CLASS) == ObjectClass.PRIVATE_KEY else [])


def test_an_unreported_cka_sign_is_not_called_false() -> None:
    from capseal.keys.pkcs11 import PKCS11URI
    from capseal.keys.pkcs11._objects import load_keypair

    for shown, said in (({Attribute.SIGN: False}, "CKA_SIGN false"), ({}, "does not report CKA_SIGN")):
        with pytest.raises(UnsupportedAlgorithmError) as err:
            load_keypair(_FakeSession(_FakeKey(shown)), PKCS11URI(object="k"), "token 't'")
        assert said in str(err.value) and "token 't'" in str(err.value), str(err.value)
        if not shown:
            assert "false" not in str(err.value)


def test_protection_wording_says_not_reported() -> None:
    """What the doctor's "key protected" check and the new-key read-back say:
    an attribute the token did not report is "not reported", never a value."""
    from capseal.keys.pkcs11._objects import attribute_shortfalls

    wanted = (("CKA_SENSITIVE", True), ("CKA_NEVER_EXTRACTABLE", True), ("CKA_EXTRACTABLE", False))
    assert attribute_shortfalls({"CKA_SENSITIVE": True, "CKA_NEVER_EXTRACTABLE": True, "CKA_EXTRACTABLE": False},
                                wanted) == []
    assert attribute_shortfalls({"CKA_SENSITIVE": False, "CKA_EXTRACTABLE": True}, wanted) == [
        "CKA_SENSITIVE false", "CKA_NEVER_EXTRACTABLE not reported by the token", "CKA_EXTRACTABLE true"]
    assert attribute_shortfalls({}, wanted[:1]) == ["CKA_SENSITIVE not reported by the token"]


def test_doctor_key_protected_names_what_the_token_reported(softhsm: Any) -> None:
    """A real key that is neither sensitive nor never-extractable: the doctor
    says which attributes are false (it said "extractable or not
    sensitive", the same words for attributes the token never reported)."""
    label = f"loose-doctor-{os.urandom(3).hex()}"

    def make(rw: Any) -> None:
        dp = rw.create_domain_parameters(KeyType.EC, {Attribute.EC_PARAMS: CURVE_PARAMS["ES256"][0]}, local=True)
        dp.generate_keypair(store=True, label=label, id=os.urandom(4),
                            private_template={Attribute.SENSITIVE: False, Attribute.EXTRACTABLE: True})

    on_token(softhsm, make)
    checks = doctor_checks(softhsm.uri(label), pin=softhsm.pin)
    protected = checks[-1]
    assert protected.name == "key protected" and not protected.ok
    assert "CKA_SENSITIVE false" in protected.detail and "CKA_NEVER_EXTRACTABLE false" in protected.detail, protected.detail
    assert "not reported" not in protected.detail
    found = [c for c in checks if c.name == "key found"][0]
    assert "no protection attributes reported" not in found.detail, found.detail
