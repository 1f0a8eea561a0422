"""A PKCS#11 signer recovers from what other code in the process, or the
machine, does to it, against a real SoftHSM2 token: the module finalised
underneath it (another library in the process calls ``C_Finalize``) is
initialised again and logged in to again, as PKCS#11 requires; a signing
process that is stopped (SIGSTOP) is replaced at once instead of holding the
next ``Producer()`` for half a minute; one that runs but gets no answer from
the token (its files held locked by another process, so SoftHSM2 blocks
inside ``C_Sign``) fails within the signer's ``timeout`` with a typed error
naming the token, never the PIN."""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from capseal import Producer, verify_ledger
from capseal.envelope import signature_ok
from capseal.errors import SignerUnavailableError
from capseal.keys import open_signer
from capseal.keys.pkcs11 import PKCS11Signer
from capseal.keys.provision import create_key

PIN = "p11r-4711-pin"


def _spec(i: int) -> dict[str, Any]:
    return {"action_id": f"recover-{i}", "action_type": "decide",
            "disposition": {"decision": "accept", "approver": "policy", "human_disposed": False,
                            "verdict_class": "executed"}}


@pytest.fixture()
def token(softhsm: Any) -> Iterator[dict[str, Any]]:
    """A token of its own (its files are locked below) with two Ed25519 keys."""
    tokens = Path(softhsm.dir) / "tokens"
    before = set(os.listdir(tokens))
    label = f"p11r-{os.urandom(3).hex()}"
    softhsm.add_token(label, pin=PIN)
    (token_dir,) = set(os.listdir(tokens)) - before
    uris = []
    for name in ("first", "second"):
        with create_key(softhsm.uri(name, label=label), "ed25519", pin=PIN) as made:
            uris.append(made.uri)
    yield {"uris": uris, "dir": tokens / token_dir, "module": softhsm.module}


def _finalize_from_other_code(module: str) -> None:
    """What another library in this process does when it is done with the
    module: ``C_Finalize``, through a handle of its own."""
    assert ctypes.CDLL(module).C_Finalize(None) == 0


def _within(seconds: float, fn: Any) -> Any:
    """``fn()``'s result (or exception), failing the test if it takes longer
    than ``seconds``: a bound on a wait, not a speed measurement."""
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            out["error"] = exc

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(seconds)
    assert not worker.is_alive(), f"still waiting after {seconds} s"
    if "error" in out:
        raise out["error"]
    return out.get("value")


@pytest.mark.direct_path
def test_a_module_finalised_underneath_is_initialised_and_logged_in_again(token: dict[str, Any],
                                                                           tmp_path: Path) -> None:
    path = tmp_path / "l.db"
    first, second = token["uris"]
    with open_signer(first, pin=PIN) as signer, Producer("acme", "agent@1", signer, path) as producer:
        producer.seal(_spec(0))
        _finalize_from_other_code(token["module"])
        producer.seal(_spec(1))  # was DeviceError ('the token returned PKCS11Error') at every seal
        _finalize_from_other_code(token["module"])
        with open_signer(second, pin=PIN) as other:  # a new signer, while the module is finalised
            assert signature_ok("EdDSA", other.public_key, other.sign(b"m").signature, b"m")
        producer.seal(_spec(2))
    report = verify_ledger(path)
    assert report.ok and report.counts()["records"] == 4
    _finalize_from_other_code(token["module"])  # with no signer open: the next one opens
    with open_signer(first, pin=PIN) as signer:
        assert signature_ok("EdDSA", signer.public_key, signer.sign(b"n").signature, b"n")


def test_a_stopped_signing_process_does_not_hold_the_next_producer(token: dict[str, Any], tmp_path: Path) -> None:
    with open_signer(token["uris"][0], pin=PIN, signing_process=True) as signer:
        assert isinstance(signer, PKCS11Signer) and signer.signing_process is not None
        with Producer("acme", "agent@1", signer, tmp_path / "a.db") as producer:
            producer.seal(_spec(0))
        pid = signer.signing_process.pid
        assert pid is not None
        os.kill(pid, signal.SIGSTOP)  # frozen: it will never answer
        try:
            def next_producer() -> None:
                with Producer("acme", "agent@1", signer, tmp_path / "b.db") as again:
                    again.seal(_spec(1))

            _within(10.0, next_producer)  # was about 30 s (the answer timeout), with no way to bound it
        finally:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
    assert verify_ledger(tmp_path / "b.db").ok


# holds the locks until its stdin closes, or for 25 s at most: a signer that
# waited on the token in-process (with the GIL kept, as SoftHSM2's quick calls
# are made) would otherwise freeze the test process for good
_LOCKER = r"""
import fcntl, os, select, sys
fds = []
for name in sorted(os.listdir(sys.argv[1])):
    fd = os.open(os.path.join(sys.argv[1], name), os.O_RDWR)
    fcntl.lockf(fd, fcntl.LOCK_EX)
    fds.append(fd)
print("locked", flush=True)
select.select([sys.stdin], [], [], 25.0)
"""


def test_a_signing_process_that_waits_on_a_hung_token_fails_within_its_timeout(token: dict[str, Any]) -> None:
    """Another process holds the token's files locked: SoftHSM2 waits inside
    C_Sign for as long as it likes. The signature fails within the signer's
    timeout, naming token and key (never the PIN), the process is killed,
    and once the token answers again so does the signer."""
    with open_signer(token["uris"][0], pin=PIN, signing_process=True, timeout=1.0) as signer:
        assert isinstance(signer, PKCS11Signer) and signer.signing_process is not None
        process = signer.signing_process
        process.respawn_after = 0.05
        pid = process.pid
        assert pid is not None and signer.sign(b"before").alg == "EdDSA"
        locker = subprocess.Popen([sys.executable, "-c", _LOCKER, str(token["dir"])], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True)
        try:
            assert locker.stdout is not None and locker.stdout.readline().strip() == "locked"
            with pytest.raises(SignerUnavailableError) as info:
                _within(20.0, lambda: signer.sign(b"while the token hangs"))
            text = f"{info.value} {info.value!r} {info.value.diagnostics()}"
            assert "answered nothing" in text and "timeout 1 s" in text
            assert "token 'p11r-" in text and "object='first'" in text and PIN not in text
            assert info.value.__cause__ is None and info.value.__context__ is None
            deadline = time.monotonic() + 10
            while process.pid == pid and time.monotonic() < deadline:
                time.sleep(0.02)
            assert process.pid != pid  # killed (and being replaced)
        finally:
            locker.communicate("", timeout=10)
        result = _within(20.0, lambda: signer.sign(b"after"))
        assert signature_ok("EdDSA", signer.public_key, result.signature, b"after")


def test_a_signature_under_way_when_the_signer_closes_leaves_no_login_behind(token: dict[str, Any]) -> None:
    """A sign() that took the signer's session before close() and waits for
    the PKCS#11 lock while close() logs out must not log in again once it
    runs: that login would belong to no signer, never be logged out, and
    make the token answer every later open with 'already logged in'."""
    from capseal.keys.pkcs11 import P11_LOCK

    uri = token["uris"][0]
    signer = open_signer(uri, pin=PIN)
    outcome: list[BaseException | bytes] = []

    def sign() -> None:
        try:
            outcome.append(signer.sign(b"late").signature)
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            outcome.append(exc)

    with P11_LOCK:  # the signature waits here, past the signer's check that it is open
        late = threading.Thread(target=sign)
        late.start()
        time.sleep(0.2)
        signer.close()  # P11_LOCK is re-entrant: close() logs out and lets go of the session now
    late.join(10)
    assert not late.is_alive()
    (result,) = outcome
    assert isinstance(result, SignerUnavailableError), result
    with open_signer(uri, pin=PIN) as again:  # the token asks for the PIN: nobody is logged in
        assert again.sign(b"next").signature
