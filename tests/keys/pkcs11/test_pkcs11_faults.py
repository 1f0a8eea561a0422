"""Faults with a real SoftHSM2 token: each one is a typed error that names the
token, key or module, never shows the PIN (message, repr, diagnostics,
exception chain, log), writes no record, and sealing resumes once the fault is
gone — in the same process.

Faults induced for real: a wrong PIN (at open, and a PIN changed on the token
mid-run), a missing or non-PKCS#11 module, an unknown token or key label,
every session closed underneath the signer (``C_CloseAllSessions`` through a
second handle on the module), the token's storage vanishing and returning,
and its file caught mid-rewrite (as another process's login leaves it).
"""

from __future__ import annotations

import ctypes
import logging
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pkcs11
import pytest

from capseal import Producer, verify_ledger
from capseal.errors import (
    CapsealError,
    KeyNotFoundError,
    PinIncorrectError,
    SignerError,
    SignerUnavailableError,
    TokenNotFoundError,
)
from capseal.keys import open_signer
from capseal.keys.pkcs11 import P11_LOCK, PKCS11Signer
from capseal.keys.provision import create_key

PIN = "p11f-4711-pin"  # distinctive, so a leak anywhere is found by substring
WRONG = "p11f-0000-bad"


def _spec(i: int) -> dict[str, Any]:
    return {"action_id": f"fault-{i}", "action_type": "decide",
            "disposition": {"decision": "accept", "approver": "policy", "human_disposed": False, "verdict_class": "executed"}}


def _assert_secret_free(exc: BaseException, caplog: pytest.LogCaptureFixture, *secrets: str) -> None:
    texts = [str(exc), repr(exc), caplog.text]
    if isinstance(exc, CapsealError):
        texts.append(exc.diagnostics())
    assert exc.__cause__ is None and exc.__context__ is None  # no exception chain at all
    for secret in secrets:
        for text in texts:
            assert secret not in text


@pytest.fixture()
def fault_token(softhsm: Any) -> Iterator[dict[str, Any]]:
    """A token of its own (so moving its storage disturbs no other test) with an Ed25519 key."""
    tokens = Path(softhsm.dir) / "tokens"
    before = set(os.listdir(tokens))
    label = f"p11f-{os.urandom(3).hex()}"
    softhsm.add_token(label, pin=PIN)
    (token_dir,) = set(os.listdir(tokens)) - before
    uri = softhsm.uri("seal-key", label=label)
    create_key(uri, "ed25519", pin=PIN).close()
    yield {"label": label, "uri": uri, "dir": tokens / token_dir}


@pytest.fixture()
def logs(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.DEBUG)
    return caplog


# ---------------------------------------------------------------------- at open


def test_wrong_pin_names_the_token_and_hides_the_pin(softhsm: Any, logs: pytest.LogCaptureFixture) -> None:
    label = f"p11w-{os.urandom(3).hex()}"
    softhsm.add_token(label, pin=PIN)
    uri = softhsm.uri("k", label=label)
    with pytest.raises(PinIncorrectError) as err:  # nobody is logged in: the token itself refuses it
        open_signer(uri, pin=WRONG)
    assert repr(label) in str(err.value)
    _assert_secret_free(err.value, logs, WRONG, PIN)
    with pytest.raises(PinIncorrectError) as err:  # the same through pin-value in the URI
        open_signer(uri.replace("?", f"?pin-value={WRONG}&"))
    _assert_secret_free(err.value, logs, WRONG, PIN)

    create_key(uri, "p256", pin=PIN).close()
    with open_signer(uri, pin=PIN) as signer:
        assert isinstance(signer, PKCS11Signer)
        # logged in: the token cannot be asked again, the PIN is compared with the one that worked
        with pytest.raises(PinIncorrectError) as err:
            open_signer(uri, pin=WRONG)
        assert repr(label) in str(err.value)
        _assert_secret_free(err.value, logs, WRONG, PIN)
        with pytest.raises(PinIncorrectError):
            open_signer(uri)  # and no PIN at all does not ride on the existing login
        assert signer.sign(b"still fine").alg == "ES256"
        assert PIN not in repr(signer) and PIN not in repr(signer.token_session) and PIN not in signer.uri


def test_missing_module_names_the_path(tmp_path: Path, logs: pytest.LogCaptureFixture) -> None:
    missing = tmp_path / "libnothing-pkcs11.so"
    with pytest.raises(SignerUnavailableError) as err:
        open_signer(f"pkcs11:token=t;object=k?module-path={missing}&pin-value={PIN}")
    assert str(missing) in str(err.value)
    _assert_secret_free(err.value, logs, PIN)

    not_a_module = tmp_path / "libjunk.so"
    not_a_module.write_bytes(b"\x7fELF this is not a shared object")
    with pytest.raises(SignerUnavailableError) as err:
        open_signer(f"pkcs11:token=t;object=k?module-path={not_a_module}", pin=PIN)
    assert str(not_a_module) in str(err.value)
    _assert_secret_free(err.value, logs, PIN)


def test_unknown_token_names_it(softhsm: Any, logs: pytest.LogCaptureFixture) -> None:
    with pytest.raises(TokenNotFoundError) as err:
        open_signer(softhsm.uri("k", label="no-such-token"), pin=PIN)
    assert "'no-such-token'" in str(err.value)
    assert repr(softhsm.label) in str(err.value)  # and says which tokens are there
    _assert_secret_free(err.value, logs, PIN)


def test_unknown_key_names_token_and_key(fault_token: dict[str, Any], logs: pytest.LogCaptureFixture) -> None:
    with pytest.raises(KeyNotFoundError) as err:
        open_signer(fault_token["uri"].replace("object=seal-key", "object=no-such-key"), pin=PIN)
    assert repr(fault_token["label"]) in str(err.value) and "no-such-key" in str(err.value)
    _assert_secret_free(err.value, logs, PIN)


# ---------------------------------------------------------------------- mid-run


def _close_all_sessions(slot_id: int) -> None:
    """C_CloseAllSessions through a second (ctypes) handle on the same module:
    every session of the slot dies, as when another part of the process resets it."""
    dll = ctypes.CDLL("/usr/lib/softhsm/libsofthsm2.so")
    dll.C_CloseAllSessions.argtypes = [ctypes.c_ulong]
    dll.C_CloseAllSessions.restype = ctypes.c_ulong
    with P11_LOCK:
        assert dll.C_CloseAllSessions(slot_id) == 0


def test_sessions_closed_underneath_reconnect(fault_token: dict[str, Any], tmp_path: Path, logs: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "l.db"
    with open_signer(fault_token["uri"], pin=PIN) as signer, Producer("acme", "agent@1", signer, path) as producer:
        assert isinstance(signer, PKCS11Signer)
        producer.seal(_spec(0))
        ts = signer.token_session
        before = ts.reconnects
        for i in range(1, 4):
            _close_all_sessions(ts.token.slot.slot_id)
            producer.seal(_spec(i))  # reconnects, logs in again, retries: no error reaches the caller
        assert ts.reconnects == before + 3
        assert producer.ledger.count() == 5
    assert verify_ledger(path).ok
    assert "reconnecting" in logs.text and PIN not in logs.text


def test_direct_c_sign_hands_every_failure_to_python_pkcs11(fault_token: dict[str, Any], tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """The direct C_Sign path (Ed25519 and ECDSA keys) answers None for any
    return value but CKR_OK, on a dead session as on a wrong key handle, and
    leaves no signing operation active: the same signature then goes through
    python-pkcs11, which raises its typed error and the signer reconnects."""
    monkeypatch.delenv("CAPSEAL_NO_DIRECT", raising=False)  # the direct path is what is tested
    with open_signer(fault_token["uri"], pin=PIN) as signer:
        assert isinstance(signer, PKCS11Signer)
        fast = signer.direct_path
        assert fast is not None  # an Ed25519 key on SoftHSM2 signs directly
        message = b"direct C_Sign"
        with P11_LOCK:
            session = signer.token_session.ensure()
            key = signer.key_object(session)
            direct = fast.sign(session.handle, key.handle, message)
            assert direct is not None and len(direct) == 64
            signer.public_key.verify(direct, message)
            assert fast.sign(session.handle, 0xFFFF_FFF0, message) is None  # CKR_KEY_HANDLE_INVALID: refused
            again = fast.sign(session.handle, key.handle, message)  # no operation was left active
            assert again == direct  # Ed25519 is deterministic
            dead = session.handle
        _close_all_sessions(signer.token_session.token.slot.slot_id)
        with P11_LOCK:
            assert fast.sign(dead, key.handle, message) is None  # CKR_SESSION_HANDLE_INVALID: refused
        before = signer.token_session.reconnects
        result = signer.sign(message)  # python-pkcs11 raises SessionHandleInvalid; the signer reconnects
        assert signer.token_session.reconnects == before + 1
        signer.public_key.verify(result.signature, message)


class _InterruptedCSign:
    """Stands in for the direct path's C_Sign and raises KeyboardInterrupt
    before calling it: as if Ctrl-C landed between C_SignInit and C_Sign."""

    def __init__(self, real: Any) -> None:
        self.real = real
        self._released = real._released  # what FastSign uses to end an operation

    def __call__(self, *args: Any) -> int:
        raise KeyboardInterrupt


def test_no_signing_operation_is_left_active(fault_token: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """Neither an interrupt between C_SignInit and C_Sign nor an operation
    someone else left active on the shared session stops later signatures."""
    monkeypatch.delenv("CAPSEAL_NO_DIRECT", raising=False)  # the direct path is what is tested
    message = b"operation state"
    with open_signer(fault_token["uri"], pin=PIN) as signer:
        assert isinstance(signer, PKCS11Signer)
        fast = signer.direct_path
        assert fast is not None
        ts = signer.token_session
        real = fast._sign  # the direct path's own C_Sign, replaced to stop between the two calls
        fast._sign = _InterruptedCSign(real)  # type: ignore[assignment]
        try:
            with pytest.raises(KeyboardInterrupt):
                signer.sign(message)
        finally:
            fast._sign = real
        with P11_LOCK:  # the interrupted operation was ended: a new one starts at once
            session = ts.ensure()
            key = signer.key_object(session)
            # C_SignInit through the same table entry: succeeds only if no operation was left active
            assert fast._init._released(session.handle, ctypes.byref(fast._mechanism), key.handle) == 0
            # ...and is left active now, as a crashed caller elsewhere in the process would leave it
        result = signer.sign(message)  # CKR_OPERATION_ACTIVE: ended once, C_SignInit again
        signer.public_key.verify(result.signature, message)
        assert signer.sign(message).signature == result.signature  # Ed25519 is deterministic
        assert ts.reconnects == 0  # recovered in the session, no reconnect needed


class _PSSParams(ctypes.Structure):
    _fields_ = [("hashAlg", ctypes.c_ulong), ("mgf", ctypes.c_ulong), ("sLen", ctypes.c_ulong)]


def test_a_multi_part_operation_left_on_the_shared_session(fault_token: dict[str, Any],
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """Another key of the same token (so the same logged-in session) has a
    multi-part RSA-PSS signature left half done (C_SignInit + C_SignUpdate,
    never finished): the Ed25519 signer ends it and signs, without a reconnect."""
    monkeypatch.delenv("CAPSEAL_NO_DIRECT", raising=False)  # the direct path is what is tested
    from capseal.keys.pkcs11._direct import (  # the module's table, to leave an operation active
        _FunctionList,
        _Mechanism,
    )

    rsa_uri = fault_token["uri"].replace("object=seal-key", "object=half-done-rsa")
    with create_key(rsa_uri, "rsa-pss", pin=PIN, rsa_bits=2048) as rsa, open_signer(fault_token["uri"], pin=PIN) as signer:
        assert isinstance(signer, PKCS11Signer) and isinstance(rsa, PKCS11Signer)
        ts = signer.token_session
        assert rsa.token_session is ts
        lib = ctypes.CDLL("/usr/lib/softhsm/libsofthsm2.so")
        table = ctypes.POINTER(_FunctionList)()
        assert lib.C_GetFunctionList(ctypes.byref(table)) == 0
        sign_init = ctypes.CFUNCTYPE(ctypes.c_ulong, ctypes.c_ulong, ctypes.POINTER(_Mechanism), ctypes.c_ulong)(table.contents.f42)
        sign_update = ctypes.CFUNCTYPE(ctypes.c_ulong, ctypes.c_ulong, ctypes.c_char_p, ctypes.c_ulong)(table.contents.f44)
        params = _PSSParams(0x250, 2, 32)  # CKM_SHA256, CKG_MGF1_SHA256, salt 32
        mechanism = _Mechanism(0x43, ctypes.cast(ctypes.pointer(params), ctypes.c_void_p), ctypes.sizeof(params))  # CKM_SHA256_RSA_PKCS_PSS
        with P11_LOCK:
            session = ts.ensure()
            assert sign_init(session.handle, ctypes.byref(mechanism), rsa.key_object(session).handle) == 0
            assert sign_update(session.handle, b"half", 4) == 0  # ...and never finished
        before = ts.reconnects
        result = signer.sign(b"after a half-done operation")
        signer.public_key.verify(result.signature, b"after a half-done operation")
        assert ts.reconnects == before
        assert rsa.sign(b"and the RSA key signs again").alg == "PS256"


def test_token_storage_vanishes_and_returns(fault_token: dict[str, Any], tmp_path: Path, logs: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "l.db"
    away = tmp_path / "token-away"
    with open_signer(fault_token["uri"], pin=PIN) as signer, Producer("acme", "agent@1", signer, path) as producer:
        producer.seal(_spec(0))
        count = producer.ledger.count()
        shutil.move(fault_token["dir"], away)
        try:
            for i in (1, 2):  # the signer keeps trying; each attempt fails cleanly
                with pytest.raises(SignerError) as err:
                    producer.seal(_spec(i))
                assert isinstance(err.value, (TokenNotFoundError, SignerUnavailableError))
                assert repr(fault_token["label"]) in str(err.value)
                _assert_secret_free(err.value, logs, PIN)
                assert producer.ledger.count() == count  # nothing written for a failed seal
        finally:
            shutil.move(away, fault_token["dir"])
        producer.seal(_spec(3))  # the token is back: sealing resumes in this process
        producer.seal(_spec(4))
        assert producer.ledger.count() == count + 2
    assert verify_ledger(path).ok
    assert PIN not in logs.text


def test_a_token_whose_file_another_process_is_rewriting_is_found(softhsm: Any) -> None:
    """SoftHSM2 rewrites a token's ``token.object`` at every ``C_Login``,
    truncating it first, and a ``C_Initialize`` that reads it meanwhile
    leaves the token out until the next ``C_Initialize``. Fork-pool workers
    logging in did this to each other: "token … is not present" for a token
    that was there (test_fork_pool_workers_open_their_own_signers failed so,
    once). Here the file is held truncated for 120 ms, as such a writer holds
    it, while a key is created on the token (a token added since the module's
    last C_Initialize, so capseal must initialise it again to see it): the
    token is found once the write is done, and the key is made."""
    import threading
    import time

    tokens = Path(softhsm.dir) / "tokens"
    before = set(os.listdir(tokens))
    label = f"p11f-{os.urandom(3).hex()}"
    softhsm.add_token(label, pin=PIN)
    (token_dir,) = set(os.listdir(tokens)) - before
    token_object = tokens / token_dir / "token.object"
    content = token_object.read_bytes()
    truncated = threading.Event()

    def rewrite() -> None:  # as SoftHSM2 writes it: open truncating, then write
        with open(token_object, "wb") as fh:
            truncated.set()
            time.sleep(0.12)
            fh.write(content)

    writer = threading.Thread(target=rewrite)
    writer.start()
    try:
        truncated.wait(5)
        with create_key(softhsm.uri("made-meanwhile", label=label), "ed25519", pin=PIN) as signer:
            assert signer.sign(b"found").alg == "EdDSA"
    finally:
        writer.join()


def test_pin_changed_on_the_token_mid_run(fault_token: dict[str, Any], tmp_path: Path, logs: pytest.LogCaptureFixture) -> None:
    """An operator changes the PIN while capseal runs; the next reconnect's
    login is refused (PinIncorrectError, nothing written); once the PIN is
    changed back, sealing resumes."""
    path = tmp_path / "l.db"
    new_pin = "p11f-5150-new"
    with open_signer(fault_token["uri"], pin=PIN) as signer, Producer("acme", "agent@1", signer, path) as producer:
        assert isinstance(signer, PKCS11Signer)
        producer.seal(_spec(0))
        ts = signer.token_session
        with P11_LOCK:  # C_SetPIN needs a read-write session; it shares the signer's login
            rw = ts.token.open(rw=True)
            try:
                rw.set_pin(PIN, new_pin)
            finally:
                rw.close()
        _close_all_sessions(ts.token.slot.slot_id)
        count = producer.ledger.count()
        with pytest.raises(PinIncorrectError) as err:
            producer.seal(_spec(1))
        assert repr(fault_token["label"]) in str(err.value)
        _assert_secret_free(err.value, logs, PIN, new_pin)
        assert producer.ledger.count() == count
        with P11_LOCK:  # the operator puts the PIN back
            session = ts.token.open(rw=True, user_pin=new_pin)
            try:
                session.set_pin(new_pin, PIN)
            finally:
                session.close()
        producer.seal(_spec(2))
        assert producer.ledger.count() == count + 1
    assert verify_ledger(path).ok


def test_key_destroyed_mid_run(fault_token: dict[str, Any], tmp_path: Path, logs: pytest.LogCaptureFixture) -> None:
    """The key object disappears from the token under a running producer: the
    stale handle fails, the signer reconnects, looks the key up again and
    raises KeyNotFoundError naming token and key; nothing is written."""
    path = tmp_path / "l.db"
    with open_signer(fault_token["uri"], pin=PIN) as signer, Producer("acme", "agent@1", signer, path) as producer:
        assert isinstance(signer, PKCS11Signer)
        producer.seal(_spec(0))
        count = producer.ledger.count()
        ts = signer.token_session
        with P11_LOCK:
            rw = ts.token.open(rw=True)
            try:
                for obj in list(rw.get_objects({pkcs11.Attribute.LABEL: "seal-key"})):
                    obj.destroy()
            finally:
                rw.close()
        with pytest.raises(KeyNotFoundError) as err:
            producer.seal(_spec(1))
        assert repr(fault_token["label"]) in str(err.value) and "seal-key" in str(err.value)
        _assert_secret_free(err.value, logs, PIN)
        assert producer.ledger.count() == count
