"""``signing_process=True``: a PKCS#11 signer whose signatures are made by a
child process of its own (keys/_pkcs11_helper.py), against a real SoftHSM2
token. Capsules verify everywhere, the parent process never signs while the
child works, the PIN reaches the child only through its stdin, a child that
is killed or refused loses no record (the parent signs, with its own typed
errors), a new child takes over, and closing stops the child."""

from __future__ import annotations

import collections
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, cast

import pytest
from agent_action_capsule import verify as reference_verify
from agent_action_capsule.producer_envelope import verify_producer_envelope
from pkcs11 import Mechanism

from capseal import Producer, verify_ledger
from capseal.envelope import signature_ok
from capseal.errors import (
    DeviceError,
    KeyNotFoundError,
    SignerUnavailableError,
    UnsupportedAlgorithmError,
)
from capseal.keys import open_signer
from capseal.keys.pkcs11 import P11_LOCK, PKCS11Signer, parse_pkcs11_uri
from capseal.keys.pkcs11._signing_process import SigningProcess
from capseal.keys.provision import create_key

from ...cose_checks import assert_envelope_verifies_independently
from ...stress import seal_from_threads


def _key(softhsm: Any, alg: str, *, rsa_bits: int = 2048) -> str:
    with create_key(softhsm.uri(f"proc-{alg}-{os.urandom(3).hex()}"), alg, pin=softhsm.pin, rsa_bits=rsa_bits) as s:
        return s.uri


def _parent_signed(signer: PKCS11Signer) -> bool:
    """Has this process asked the token for a signature itself (on either path)?"""
    return signer.signatures_in_process > 0


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is gone as a signer
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] != "Z"


def _wait_for(predicate: Any, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


@pytest.mark.direct_path
@pytest.mark.parametrize("alg", ["ed25519", "p256"])
def test_capsules_sealed_through_a_signing_process_verify_everywhere(alg: str, softhsm: Any, tmp_path: Path) -> None:
    uri = _key(softhsm, alg)
    ledger = tmp_path / "l.db"
    with open_signer(uri, pin=softhsm.pin, signing_process=True) as signer:
        assert isinstance(signer, PKCS11Signer) and signer.queues_signatures and signer.external_device
        pid = signer.signing_process.pid if signer.signing_process is not None else None
        assert pid is not None and pid != os.getpid() and _alive(pid)
        pem = signer.public_key_pem()
        with Producer("acme", "proc-agent@1", signer, ledger) as producer:
            sealed = [producer.submit({"action_id": f"p-{i}", "action_type": "fyi"}) for i in range(200)]
            producer.flush()
            last = producer.seal({"action_id": "p-last", "action_type": "fyi"})
            records = [p.result() for p in sealed] + [last]
        assert not _parent_signed(signer)  # every signature came from the child
        assert signer.signing_process is not None and signer.signing_process.pid == pid  # and from the one child
        assert signer.describe()["software_device"] is True  # custody is the token's, as before
    assert not _alive(pid)  # closing the signer stopped its child

    report = verify_ledger(ledger)
    assert report.ok and report.counts()["records"] == 202  # the epoch boundary, 200, and the last
    for record in (records[0], records[-1]):
        assert reference_verify(record.capsule).ok
    envelope = last.to_json()["envelopes"][0]
    if alg == "ed25519":
        result = verify_producer_envelope(last.capsule_id, bytes.fromhex(last.capsule["signature"]))
        assert result.ok, result.findings
    else:
        assert envelope["alg"] == "ES256"
        assert_envelope_verifies_independently(bytes.fromhex(envelope["cose"]), pem, bytes.fromhex(last.capsule_id),
                                               "ES256")


def test_the_pin_reaches_the_child_only_through_its_stdin(softhsm: Any, monkeypatch: Any) -> None:
    """Not even when the application keeps the PIN in its own environment:
    the child's environment is this process's without any variable holding it."""
    monkeypatch.setenv("CAPSEAL_PIN", softhsm.pin)
    monkeypatch.setenv("CAPSEAL_TEST_URI", f"pkcs11:token=x?pin-value={softhsm.pin}")  # the PIN inside a value
    monkeypatch.setenv("CAPSEAL_TEST_NOT_A_PIN", "kept")
    monkeypatch.setenv("CAPSEAL_TEST_PATH_WITH_PIN_DIGITS", f"/tmp/x{softhsm.pin}y/conf")  # a path is passed on
    with open_signer(_key(softhsm, "ed25519"), pin=softhsm.pin, signing_process=True) as signer:
        assert isinstance(signer, PKCS11Signer)
        pid = signer.signing_process.pid if signer.signing_process is not None else 0
        pin = softhsm.pin.encode()
        with open(f"/proc/{pid}/cmdline", "rb") as f:  # readable by other users
            assert pin not in f.read()
        with open(f"/proc/{pid}/environ", "rb") as f:  # readable by the same user and root
            passed = f.read()
        assert b"=" + pin + b"\0" not in passed and b"pin-value=" + pin not in passed
        assert b"CAPSEAL_TEST_NOT_A_PIN=kept" in passed  # the rest of the environment is passed on
        assert b"CAPSEAL_TEST_PATH_WITH_PIN_DIGITS=" in passed and b"CAPSEAL_TEST_URI=" not in passed
        assert softhsm.pin not in repr(signer) and softhsm.pin not in repr(signer.signing_process.__dict__)


def test_a_killed_signing_process_loses_no_record_and_is_replaced(softhsm: Any, tmp_path: Path) -> None:
    ledger = tmp_path / "l.db"
    with open_signer(_key(softhsm, "ed25519"), pin=softhsm.pin, signing_process=True) as signer:
        assert isinstance(signer, PKCS11Signer)
        process = signer.signing_process
        assert process is not None
        process.respawn_after = 0.2  # seconds before a new child is started (default 1)
        first = process.pid
        assert first is not None
        with Producer("acme", "proc-agent@1", signer, ledger) as producer:
            sealed = [producer.submit({"action_id": f"a-{i}", "action_type": "fyi"}) for i in range(300)]
            os.kill(first, signal.SIGKILL)  # records still in its pipe, and more to come
            sealed += [producer.submit({"action_id": f"b-{i}", "action_type": "fyi"}) for i in range(300)]
            producer.flush()
            assert _parent_signed(signer)  # the child's share of the work came back to this process
            _wait_for(lambda: process.pid not in (None, first))
            second = process.pid
            assert second is not None and _alive(second) and not _alive(first)
            sealed += [producer.submit({"action_id": f"c-{i}", "action_type": "fyi"}) for i in range(100)]
            producer.flush()
            assert [p.result().seq for p in sealed] == list(range(2, 702))
    assert not _alive(second)
    report = verify_ledger(ledger)
    assert report.ok and report.counts()["records"] == 701


def test_a_refused_signature_is_made_in_process_with_its_typed_error(softhsm: Any, tmp_path: Path) -> None:
    """The key is deleted from the token behind the signer's back: the child is
    refused, the parent makes the signature itself and raises the typed error
    that names the token and key; nothing is written for that record."""
    uri = _key(softhsm, "ed25519")
    ledger = tmp_path / "l.db"
    with open_signer(uri, pin=softhsm.pin, signing_process=True) as signer:
        assert isinstance(signer, PKCS11Signer)
        first = signer.signing_process.pid if signer.signing_process is not None else None
        with Producer("acme", "proc-agent@1", signer, ledger) as producer:
            producer.seal({"action_id": "before", "action_type": "fyi"})
            label = parse_pkcs11_uri(signer.uri).object
            assert label is not None
            with P11_LOCK, signer.token_session.token.open(rw=True) as session:
                for obj in session.get_objects({}):
                    if obj.label == label:
                        obj.destroy()
            with pytest.raises(KeyNotFoundError) as caught:
                producer.seal({"action_id": "after", "action_type": "fyi"})
            message = str(caught.value)
            assert softhsm.label in message and label in message and softhsm.pin not in message
            assert first is not None
            _wait_for(lambda: not _alive(first))  # the refused child was retired
    report = verify_ledger(ledger)
    assert report.ok and report.counts()["records"] == 2  # the epoch boundary and "before"


def test_a_child_that_finds_another_key_is_refused(softhsm: Any) -> None:
    """The child checks that the key it found is the signer's (by kid) and
    answers with the typed reason; the PIN is in no message."""
    with open_signer(_key(softhsm, "ed25519"), pin=softhsm.pin) as signer:
        assert isinstance(signer, PKCS11Signer)
        ts = signer.token_session
        config = {"module": ts.module.real, "token_label": ts.label, "serial": ts.serial,
                  "key_label": parse_pkcs11_uri(signer.uri).object, "key_id": "",
                  "kid": "00" * 32, "mechanism": int(Mechanism.EDDSA), "size": 64}
        with pytest.raises(DeviceError) as caught:  # neither sign_here nor finish is reached: the start fails
            SigningProcess(config, ts, lambda: (b"m", lambda sig: True), "the test's key", sign_here=signer.sign,
                           finish=signer.sign)
    message = str(caught.value)
    assert "KeyNotFoundError" in message and "not the signer's key" in message and softhsm.pin not in message


def test_a_signing_process_refuses_mechanisms_with_parameters(softhsm: Any) -> None:
    uri = _key(softhsm, "rsa-pss")
    with pytest.raises(UnsupportedAlgorithmError, match="signing process needs a mechanism without parameters"):
        open_signer(uri, pin=softhsm.pin, signing_process=True)
    with open_signer(uri, pin=softhsm.pin) as signer:  # nothing was left open: the key still works
        assert signer.sign(b"x").alg == "PS256"


@pytest.mark.direct_path
def test_eight_threads_seal_through_one_signing_process(softhsm: Any, tmp_path: Path) -> None:
    path = tmp_path / "threads.db"
    with open_signer(_key(softhsm, "ed25519"), pin=softhsm.pin, signing_process=True) as signer:
        assert isinstance(signer, PKCS11Signer)
        producer = Producer("acme", "proc-agent@1", signer, path)
        errors = seal_from_threads([producer], submit=True, per_thread=250)
        producer.close()
        assert errors == [] and not _parent_signed(signer)
    report = verify_ledger(path)
    assert report.ok and report.counts()["records"] == 8 * 250 + 1


def test_closing_kills_a_child_that_hangs_and_frees_a_writer_stuck_on_its_pipe(softhsm: Any) -> None:
    """A child that stops answering (SIGSTOP: a token that hangs) while a
    caller is blocked writing into its full pipe: closing kills it after the
    timeout, the writer is freed, and every request is settled (made in this
    process, or refused as a closed signer's) — nothing waits for ever."""
    signer = open_signer(_key(softhsm, "ed25519"), pin=softhsm.pin, signing_process=True)
    assert isinstance(signer, PKCS11Signer)
    process = signer.signing_process
    assert process is not None and process.child is not None
    child, pid = process.child, process.pid
    assert pid is not None
    os.kill(pid, signal.SIGSTOP)
    outcomes: list[str] = []

    def flood() -> None:
        pending = [signer.begin_sign(b"m" * 120) for _ in range(2000)]  # ~250 KB: more than a pipe holds
        for p in pending:
            try:
                p.result()
                outcomes.append("signed")
            except SignerUnavailableError:
                outcomes.append("closed")

    writer = threading.Thread(target=flood)
    writer.start()
    try:
        # the writer is blocked inside a write, holding the child's lock
        # the child's writer lock and queue: the state under test, with no public view
        _wait_for(lambda: child._lock.locked() and len(child._waiting) > 100)
        time.sleep(0.3)
        assert child._lock.locked() and writer.is_alive()
        process.close(timeout=1.0)
        writer.join(60)
        assert not writer.is_alive()
        assert not _alive(pid)
    finally:
        signer.close()
        os.kill(pid, signal.SIGCONT) if _alive(pid) else None
    assert len(outcomes) == 2000 and set(outcomes) <= {"signed", "closed"}


class _AppendThenInterrupt(collections.deque):  # type: ignore[type-arg]
    """A request queue whose next append lands and then raises KeyboardInterrupt:
    a Ctrl-C arriving between the append and the write of the frame."""

    armed = True

    def append(self, item: Any) -> None:
        super().append(item)
        if self.armed:
            self.armed = False
            raise KeyboardInterrupt


def test_a_ctrl_c_between_queueing_and_writing_a_request_shifts_no_answer(softhsm: Any) -> None:
    """The request is queued but never written: were the child kept, its
    answers would each go to the request before theirs (and the last would
    wait for ever). The child is retired instead; every later signature is
    over its own message."""
    with open_signer(_key(softhsm, "ed25519"), pin=softhsm.pin, signing_process=True) as signer:
        assert isinstance(signer, PKCS11Signer)
        process = signer.signing_process
        assert process is not None and process.child is not None
        child = process.child
        signer.sign(b"warm")
        child._waiting = _AppendThenInterrupt(child._waiting)  # the interrupt lands inside the child's bookkeeping
        with pytest.raises(KeyboardInterrupt):
            signer.begin_sign(b"interrupted")
        assert not child.accepting  # retired: nothing more goes down its pipe
        messages = [f"after-{i}".encode() for i in range(50)]
        pending = [signer.begin_sign(m) for m in messages]
        for message, p in zip(messages, pending):
            assert signature_ok("EdDSA", signer.public_key, p.result().signature, message)


def test_a_child_that_cannot_be_spawned_is_a_typed_error_and_is_retried(softhsm: Any, monkeypatch: Any) -> None:
    uri = _key(softhsm, "ed25519")
    monkeypatch.setattr(sys, "executable", "/nonexistent/python3")
    with pytest.raises(DeviceError, match="the signing process could not start .FileNotFoundError"):
        open_signer(uri, pin=softhsm.pin, signing_process=True)
    monkeypatch.undo()
    with open_signer(uri, pin=softhsm.pin, signing_process=True) as signer:
        assert isinstance(signer, PKCS11Signer)
        process = signer.signing_process
        assert process is not None
        process.respawn_after = 0.05
        first = process.pid
        assert first is not None
        monkeypatch.setattr(sys, "executable", "/nonexistent/python3")
        os.kill(first, signal.SIGKILL)
        _wait_for(lambda: process.child is None and not _alive(first))
        assert signer.sign(b"meanwhile").alg == "EdDSA"  # signed in-process
        time.sleep(0.3)  # a few failed attempts (0.05, 0.1, 0.2 s apart)
        assert process.child is None and process.replacing
        monkeypatch.undo()
        _wait_for(lambda: process.pid is not None)  # the next attempt (at most 0.4 s on) succeeds
        second = process.pid
        assert second is not None and second != first and _alive(second)


def test_closing_stops_a_child_that_is_still_starting(softhsm: Any) -> None:
    signer = open_signer(_key(softhsm, "ed25519"), pin=softhsm.pin, signing_process=True)
    assert isinstance(signer, PKCS11Signer)
    process = signer.signing_process
    assert process is not None
    process.respawn_after = 0.05
    first = process.pid
    assert first is not None
    os.kill(first, signal.SIGKILL)
    starting: list[int] = []

    def a_new_child_exists() -> bool:
        starting[:] = [c.proc.pid for c in process.children if c.proc.pid != first]
        return bool(starting)

    _wait_for(a_new_child_exists)
    os.kill(starting[0], signal.SIGSTOP)  # held mid-start: its start would wait for its answer
    try:
        assert process.child is None
        process.close(timeout=0.5)
        assert not _alive(starting[0])  # stopped by close(), not left logged in
    finally:
        signer.close()
        if _alive(starting[0]):
            os.kill(starting[0], signal.SIGKILL)


_FORKING_PARENT = r"""
import os, signal, sys, time
from capseal.keys import open_signer
signer = open_signer(sys.argv[1], pin=os.environ["CAPSEAL_TEST_PIN"], signing_process=True)
signer.sign(b"x")
worker = os.fork()
if worker == 0:  # a worker forked without exec, as multiprocessing's fork does
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1), os.dup2(null, 2)  # the test reads this process's output until it ends
    time.sleep(60)
    os._exit(0)
print(signer.signing_process.pid, worker, flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_the_child_does_not_outlive_a_parent_that_forked(softhsm: Any) -> None:
    uri = _key(softhsm, "ed25519")
    env = {**os.environ, "CAPSEAL_TEST_PIN": softhsm.pin}
    proc = subprocess.run([sys.executable, "-c", _FORKING_PARENT, uri], env=env, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    helper, worker = (int(pid) for pid in proc.stdout.split())
    try:
        assert _alive(worker)  # the fork outlives its parent, as it would in production
        _wait_for(lambda: not _alive(helper), timeout=10)
    finally:
        os.kill(worker, signal.SIGKILL)


def _protocol_fd(child_pid: int, parent_read_fd: int) -> int:
    """The child's fd that writes the answers: the other end of the pipe this
    process reads (fd 1 of the child points at /dev/null)."""
    pipe = os.readlink(f"/proc/self/fd/{parent_read_fd}")
    for fd in os.listdir(f"/proc/{child_pid}/fd"):
        if os.readlink(f"/proc/{child_pid}/fd/{fd}") == pipe:
            return int(fd)
    raise AssertionError("no protocol fd")


def test_bytes_printed_by_the_child_or_out_of_step_lose_no_record(softhsm: Any, tmp_path: Path) -> None:
    """What a module prints on stdout goes to /dev/null; bytes that reach the
    answer stream all the same (written straight into it here) put answers
    out of step: the child is killed, no answer is paired with the wrong
    request, every record is sealed (in-process meanwhile), and a new child
    takes over."""
    ledger = tmp_path / "l.db"
    with open_signer(_key(softhsm, "ed25519"), pin=softhsm.pin, signing_process=True) as signer:
        assert isinstance(signer, PKCS11Signer)
        process = signer.signing_process
        assert process is not None and process.child is not None
        process.respawn_after = 0.05
        pid = process.pid
        assert pid is not None
        with Producer("acme", "proc-agent@1", signer, ledger) as producer:
            with open(f"/proc/{pid}/fd/1", "wb", buffering=0) as stdout:
                stdout.write(b"a module says hello\n")
            sealed = [producer.submit({"action_id": f"a-{i}", "action_type": "fyi"}) for i in range(50)]
            producer.flush()
            assert process.pid == pid and not _parent_signed(signer)  # printing changed nothing

            os.kill(pid, signal.SIGSTOP)
            sealed += [producer.submit({"action_id": f"b-{i}", "action_type": "fyi"}) for i in range(5)]
            answers_fd = _protocol_fd(pid, process.child._rfd)  # the pipe the answers come on, to write into it
            with open(f"/proc/{pid}/fd/{answers_fd}", "wb", buffering=0) as answers:
                answers.write(b"\x00" * 9)  # an answer no one asked for
            os.kill(pid, signal.SIGCONT)
            sealed += [producer.submit({"action_id": f"c-{i}", "action_type": "fyi"}) for i in range(200)]
            producer.flush()
            assert [p.result().seq for p in sealed] == list(range(2, 257))
            _wait_for(lambda: not _alive(pid) and process.pid not in (None, pid))
    report = verify_ledger(ledger)
    assert report.ok and report.counts()["records"] == 256


def test_a_child_that_stops_answering_is_killed_and_replaced(softhsm: Any, tmp_path: Path) -> None:
    """A child that hangs (SIGSTOP) while requests wait: after answer_timeout
    it is killed, its requests are made in-process, and a new child takes
    over; nothing waits for ever."""
    with open_signer(_key(softhsm, "ed25519"), pin=softhsm.pin, signing_process=True) as signer:
        assert isinstance(signer, PKCS11Signer)
        process = signer.signing_process
        assert process is not None and process.child is not None
        process.respawn_after = 0.05
        process.child.answer_timeout = 0.3
        pid = process.pid
        assert pid is not None
        os.kill(pid, signal.SIGSTOP)
        pending = [signer.begin_sign(f"m-{i}".encode()) for i in range(20)]
        for i, p in enumerate(pending):
            assert signature_ok("EdDSA", signer.public_key, p.result().signature, f"m-{i}".encode())
        assert _parent_signed(signer)
        _wait_for(lambda: not _alive(pid) and process.pid not in (None, pid))
        new = process.pid
        assert new is not None
        assert signer.sign(b"after").alg == "EdDSA" and process.pid == new


def test_a_pin_refused_to_a_child_is_not_offered_again_in_the_background(softhsm: Any, caplog: Any) -> None:
    """The token's PIN changes under two running signers of one token: the
    first replacement child is refused the PIN, and no child of either signer
    is started with it again (a token locks a PIN after a few wrong tries;
    nobody asked for these logins); signing goes on in-process on the
    session still logged in. Once a login with the PIN succeeds again (the
    operator changed it back; a signer opened by a caller starts its child),
    the other signers' children are started again."""
    caplog.set_level(logging.INFO, logger="capseal.keys.pkcs11")
    new_pin = "changed-pin-Zq~9"
    signers = [cast(PKCS11Signer, open_signer(_key(softhsm, "ed25519"), pin=softhsm.pin, signing_process=True))
               for _ in range(2)]
    ts = signers[0].token_session
    assert signers[1].token_session is ts
    changed = False
    try:
        processes = [s.signing_process for s in signers]
        pids = [p.pid if p is not None else None for p in processes]
        for p in processes:
            assert p is not None
            p.respawn_after = 0.05
        with P11_LOCK, ts.token.open(rw=True) as session:
            session.set_pin(softhsm.pin, new_pin)
        changed = True
        os.kill(pids[0] or 0, signal.SIGKILL)

        def refusals() -> int:  # log lines of children refused the PIN
            return sum("was refused the PIN" in m or ("could not start" in m and "PinIncorrectError" in m)
                       for m in (r.getMessage() for r in caplog.records))

        _wait_for(lambda: refusals() > 0)
        assert ts.pin_refused
        os.kill(pids[1] or 0, signal.SIGKILL)  # the other signer's child ends too
        time.sleep(1.5)  # room for several more attempts (a start takes ~0.5 s; pauses 0.05, 0.1, 0.2 s)
        assert refusals() == 1
        assert all(p is not None and p.child is None for p in processes)
        assert all(s.sign(b"in-process").alg == "EdDSA" for s in signers)
        assert softhsm.pin not in caplog.text and new_pin not in caplog.text

        with P11_LOCK, ts.token.open(rw=True) as session:  # the operator puts the PIN back
            session.set_pin(new_pin, softhsm.pin)
        changed = False
        signers.append(cast(PKCS11Signer, open_signer(_key(softhsm, "ed25519"), pin=softhsm.pin, signing_process=True)))
        assert not ts.pin_refused  # a caller's signer: its child logged in with the PIN
        for s, p in zip(signers, processes):
            s.sign(b"wakes the replacement")
            _wait_for(lambda p=p: p is not None and p.pid is not None)
        assert refusals() == 1
    finally:
        for s in signers:
            s.close()
        if changed:
            with P11_LOCK, ts.token.open(rw=True, user_pin=new_pin) as session:
                session.set_pin(new_pin, softhsm.pin)


def test_a_long_burst_on_the_child_is_not_taken_for_a_hang(softhsm: Any) -> None:
    """Thousands of tiny requests in one read take the child seconds to sign;
    it writes what it has every 20 ms, so the parent (answer_timeout 1 s
    here) hears from it and never kills it."""
    with open_signer(_key(softhsm, "ed25519"), pin=softhsm.pin, signing_process=True) as signer:
        assert isinstance(signer, PKCS11Signer)
        process = signer.signing_process
        assert process is not None and process.child is not None
        process.child.answer_timeout = 1.0
        pid = process.pid
        pending = [signer.begin_sign(b"x") for _ in range(8000)]  # 5-byte frames: ~13,000 fit in the pipe
        for p in pending:
            assert len(p.result().signature) == 64
        assert process.pid == pid and not _parent_signed(signer)


def test_a_process_forked_while_a_request_was_being_written_does_not_hang(softhsm: Any) -> None:
    """A fork taken while another thread held the child's lock (mid-write):
    in the fork the lock would stay held for ever. The fork signs in-process
    (with a login of its own: tests/keys/pkcs11/test_pkcs11_fork.py) and never waits on
    the parent's child."""
    with open_signer(_key(softhsm, "ed25519"), pin=softhsm.pin, signing_process=True) as signer:
        assert isinstance(signer, PKCS11Signer)
        process = signer.signing_process
        assert process is not None and process.child is not None
        with process.child._lock:  # as a writer in the middle of a write (the lock itself is what is tested)
            pid = os.fork()
            if pid == 0:  # the fork
                try:
                    pending = signer.begin_sign(b"in the fork")
                    os._exit(0 if type(pending).__name__ == "_SignOnResult" and not process.child._lock.locked()
                             else 1)
                except BaseException:
                    os._exit(2)
        deadline = time.monotonic() + 30
        while (done := os.waitpid(pid, os.WNOHANG))[0] == 0:
            assert time.monotonic() < deadline, "the fork hangs"
            time.sleep(0.02)
        assert os.waitstatus_to_exitcode(done[1]) == 0
        assert signer.sign(b"parent").alg == "EdDSA"  # the parent's child is unharmed


def test_a_child_retired_while_a_writer_holds_the_lock_is_still_retired(softhsm: Any) -> None:
    """The reader retires a refused child without blocking on a writer that
    holds the lock; the retirement (closing the child's stdin) still
    happens when the writer lets go, so the child exits."""
    with open_signer(_key(softhsm, "ed25519"), pin=softhsm.pin, signing_process=True) as signer:
        assert isinstance(signer, PKCS11Signer)
        process = signer.signing_process
        assert process is not None and process.child is not None
        child = process.child
        with child._lock:  # as a writer
            child._retire_from_reader()  # the reader's own step, made while a writer holds the lock
            assert not child.accepting
        _wait_for(lambda: child.proc.poll() is not None)  # its stdin was closed: the child exited


def test_closing_during_a_start_never_writes_to_a_reused_file_descriptor(softhsm: Any, tmp_path: Path) -> None:
    """close() while a replacement child is between its login and its
    self-test: the starting thread must not write (the self-test, or worse
    the login frame with the PIN) to fd numbers that close() freed and that
    files opened meanwhile now hold."""
    signer = open_signer(_key(softhsm, "ed25519"), pin=softhsm.pin, signing_process=True)
    assert isinstance(signer, PKCS11Signer)
    process = signer.signing_process
    assert process is not None
    process.respawn_after = 0.05
    reached, go_on = threading.Event(), threading.Event()
    self_test = process._self_test  # the next start's self-test, held to stop the start mid-way

    def held_self_test() -> Any:  # the starting thread, paused between login and self-test
        reached.set()
        go_on.wait(10)
        return self_test()

    process._self_test = held_self_test
    pid = process.pid
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    assert reached.wait(30)
    process.close(timeout=0.5)
    victims = [open(tmp_path / f"victim-{i}.log", "wb") for i in range(16)]  # noqa: SIM115 - closed below
    try:
        go_on.set()
        _wait_for(lambda: not any(t.name == "capseal-signing-process-start" for t in threading.enumerate()))
    finally:
        for f in victims:
            f.close()
        signer.close()
    assert all((tmp_path / f"victim-{i}.log").read_bytes() == b"" for i in range(16))


def test_the_child_never_imports_from_the_working_directory(softhsm: Any, tmp_path: Path, monkeypatch: Any) -> None:
    """``python -m`` puts the working directory first on the import path: a
    stray ``pkcs11.py`` there would run in the child, next to the PIN. The
    child drops that entry before it imports anything."""
    uri = _key(softhsm, "ed25519")
    marker = tmp_path / "imported"
    (tmp_path / "pkcs11.py").write_text(f"open({str(marker)!r}, 'w').close()\nraise ImportError('not this one')\n")
    monkeypatch.chdir(tmp_path)
    with open_signer(uri, pin=softhsm.pin, signing_process=True) as signer:
        assert isinstance(signer, PKCS11Signer)
        assert signer.sign(b"x").alg == "EdDSA"
        assert not _parent_signed(signer)
    assert not marker.exists()


def test_a_child_whose_reader_cannot_start_is_discarded_and_replaced(softhsm: Any, monkeypatch: Any) -> None:
    """No thread to read a new child's answers (RuntimeError: no threads left):
    the child is not kept as current (its requests would wait for ever); it
    is stopped, signing goes in-process, and a later replacement is used."""
    from capseal.keys.pkcs11._child import Child

    with open_signer(_key(softhsm, "ed25519"), pin=softhsm.pin, signing_process=True) as signer:
        assert isinstance(signer, PKCS11Signer)
        process = signer.signing_process
        assert process is not None
        process.respawn_after = 0.05
        first = process.pid
        assert first is not None
        started: list[int] = []
        real_start_reader = Child.start_reader

        def start_reader_once_failing(child: Any, on_end: Any) -> None:
            started.append(child.proc.pid)
            if len(started) == 1:
                raise RuntimeError("can't start new thread")
            real_start_reader(child, on_end)

        monkeypatch.setattr(Child, "start_reader", start_reader_once_failing)
        os.kill(first, signal.SIGKILL)
        _wait_for(lambda: len(started) >= 1)
        pending = [signer.begin_sign(f"m-{i}".encode()) for i in range(20)]
        for i, p in enumerate(pending):
            assert signature_ok("EdDSA", signer.public_key, p.result().signature, f"m-{i}".encode())
        _wait_for(lambda: len(started) >= 2 and process.pid == started[1])
        assert not _alive(started[0])  # the child without a reader was stopped
        assert signer.sign(b"after").alg == "EdDSA"


def test_a_pct_encoded_pin_value_is_left_out_of_the_childs_environment(monkeypatch: Any) -> None:
    """A URI carrying the PIN as RFC 7512 writes it, pct-encoded (a PIN with
    '&', a space or '%' must be), in any case of hex digit or attribute name:
    left out like the plain spelling. Only ``pin-value=<the PIN as typed>``
    was recognised, so these went to the child."""
    from capseal.keys.pkcs11 import pct_encode
    from capseal.keys.pkcs11._signing_process import _child_environment  # what the child's environment holds
    from capseal.keys.secret import Secret

    pin = "Zq7 & 50%;"
    encoded = pct_encode(pin, query=True)
    assert encoded == "Zq7%20%26%2050%25%3B"
    monkeypatch.setenv("CAPSEAL_TEST_URI_UPPER", f"pkcs11:token=x?pin-value={encoded}&module-path=/m.so")
    monkeypatch.setenv("CAPSEAL_TEST_URI_LOWER", f"pkcs11:token=x?PIN-VALUE={encoded.replace('%3B', '%3b')}")
    monkeypatch.setenv("CAPSEAL_TEST_OTHER_PIN", "pkcs11:token=x?pin-value=Zq7%20%26%2051%25")
    env = _child_environment(Secret(pin, "a test"))
    assert "CAPSEAL_TEST_URI_UPPER" not in env and "CAPSEAL_TEST_URI_LOWER" not in env
    assert env["CAPSEAL_TEST_OTHER_PIN"] == "pkcs11:token=x?pin-value=Zq7%20%26%2051%25"  # another PIN: kept


def test_a_request_written_to_a_full_pipe_waits_for_room_and_arrives_whole() -> None:
    """Requests go to the child with libc's write and the GIL held (a pipe
    takes a write below PIPE_BUF whole or refuses it at once); when the pipe
    is full, _send waits for the reader, with the GIL released, and the
    bytes arrive whole and in order. A pipe whose reader is gone raises
    BrokenPipeError, as os.write does (send() treats it as a dead child)."""
    from capseal.keys.pkcs11._child import _send  # the pipe write itself, on a pipe of the test's own

    r, w = os.pipe()
    try:
        os.set_blocking(w, False)
        filler = b"x" * 4096
        queued = 0
        while True:  # fill the pipe to the brim
            try:
                queued += os.write(w, filler)
            except BlockingIOError:
                break
        frame = bytes(range(256)) * 2
        got = bytearray()
        writer_done = threading.Event()

        def drain() -> None:
            while len(got) < queued + len(frame):
                got.extend(os.read(r, 65536))

        def write() -> None:
            _send(w, frame)
            writer_done.set()

        writer = threading.Thread(target=write, daemon=True)
        writer.start()
        assert not writer_done.wait(0.2)  # it waits: the pipe has no room (a liveness check, not a timing one)
        reader = threading.Thread(target=drain, daemon=True)
        reader.start()
        reader.join(30)
        writer.join(30)
        assert writer_done.is_set() and bytes(got[queued:]) == frame and bytes(got[:queued]) == filler * (queued // 4096) + filler[:queued % 4096]
    finally:
        os.close(r)
        os.close(w)
    r, w = os.pipe()
    os.close(r)
    try:
        os.set_blocking(w, False)
        with pytest.raises(BrokenPipeError):
            _send(w, b"request")
    finally:
        os.close(w)
