"""PKCS#11 across ``os.fork()`` without exec (multiprocessing's ``fork``, a
pre-forking server), against a real SoftHSM2 token.

PKCS#11 v2.40 §5.5.1: a forked process is another application; it must call
``C_Initialize`` itself before anything else and log in itself. capseal's
fork hooks (keys/_pkcs11_session.py) wait for a call running in another
thread, then initialise every module again in the fork on its first use.
Each fork here runs under ``alarm``: a fork that hangs is killed and fails
the test instead of hanging the suite.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from agent_action_capsule import verify as reference_verify

from capseal import Producer, process, verify_ledger
from capseal.envelope import signature_ok
from capseal.errors import SignerForkedError
from capseal.keys import open_signer
from capseal.keys.pkcs11 import P11_LOCK, PKCS11Signer
from capseal.keys.provision import create_key

from ...forking import ForkedChild, attempt, held_elsewhere

_ALARM = 20  # s: far above a fork's re-initialisation and login (milliseconds)


def _key(softhsm: Any, alg: str = "ed25519") -> str:
    with create_key(softhsm.uri(f"fork-{alg}-{os.urandom(3).hex()}"), alg, pin=softhsm.pin) as signer:
        return signer.uri


def _in_fork(work: Callable[[], Any]) -> tuple[int, Any]:
    """Run ``work`` in a forked process; its exit code (-SIGALRM when it hung)
    and what it answered (``{"error": [type, message]}`` if it raised)."""
    code, report = ForkedChild(work, _ALARM).outcome()
    if report is not None and "error" in report:
        return code, {"error": [report["error"]["type"], report["error"]["message"]]}
    return code, None if report is None else report["value"]


def test_forks_taken_while_another_thread_signs_sign_with_their_own_login(softhsm: Any) -> None:
    """The parent signs without pause on another thread while it forks: before
    the hooks, about one fork in ten was taken inside a call and hung on the
    lock for ever. Each fork now signs through the signer it inherited, after
    initialising the module again and logging in (a new session epoch), and
    the parent's session is untouched."""
    signer = open_signer(_key(softhsm), pin=softhsm.pin)
    assert isinstance(signer, PKCS11Signer)
    try:
        ts = signer.token_session
        stop, failures, made = threading.Event(), [], [0]

        def sign_without_pause() -> None:
            while not stop.is_set():
                try:
                    signer.sign(b"parent")
                    made[0] += 1
                except Exception as exc:  # noqa: BLE001 - asserted below
                    failures.append(exc)

        thread = threading.Thread(target=sign_without_pause)
        thread.start()
        try:
            epoch, generation, reconnects = ts.epoch, ts.module.generation, ts.reconnects

            def sign_in_fork() -> dict[str, Any]:
                message = f"fork {os.getpid()}".encode()
                result = signer.sign(message)
                return {"message": message.decode(), "signature": result.signature.hex(),
                        "epoch": ts.epoch, "generation": ts.module.generation}

            for _ in range(24):
                code, answer = _in_fork(sign_in_fork)
                assert code == 0, "the fork hung (killed by its alarm)" if code == -signal.SIGALRM else code
                assert "error" not in answer, answer
                assert signature_ok("EdDSA", signer.public_key, bytes.fromhex(answer["signature"]),
                                    answer["message"].encode())
                assert answer["epoch"] > epoch  # logged in again, on a session of its own
                assert answer["generation"] > generation  # after initialising the module again
        finally:
            stop.set()
            thread.join()
        assert not failures and made[0] > 0
        assert ts.epoch == epoch and ts.reconnects == reconnects  # the parent never lost its session
        assert signature_ok("EdDSA", signer.public_key, signer.sign(b"after").signature, b"after")
    finally:
        signer.close()


def _seal_in_worker(args: tuple[str, str, str]) -> dict[str, Any]:
    """A fork-pool worker: its own signer (the parent's module and token session
    are cached in its memory) and its own producer and ledger."""
    uri, pin, ledger = args
    with open_signer(uri, pin=pin) as signer, Producer("acme", f"worker-{os.getpid()}@1", signer, ledger) as producer:
        planned = producer.planned("po-1", effect_type="write_order", request={"sku": "A1"})
        return {"capsule": planned.capsule, "pid": os.getpid()}


def test_fork_pool_workers_open_their_own_signers(softhsm: Any, tmp_path: Path) -> None:
    uri = _key(softhsm)
    with open_signer(uri, pin=softhsm.pin) as signer:  # the parent has the module loaded and is logged in
        signer.sign(b"before the pool")
        jobs = [(uri, softhsm.pin, str(tmp_path / f"worker-{i}.db")) for i in range(4)]
        with multiprocessing.get_context("fork").Pool(2) as pool:
            results = pool.map(_seal_in_worker, jobs, chunksize=1)
        assert signature_ok("EdDSA", signer.public_key, signer.sign(b"after").signature, b"after")
    assert {r["pid"] for r in results} and all(r["pid"] != os.getpid() for r in results)
    for (_, _, ledger), result in zip(jobs, results):
        assert verify_ledger(ledger).ok
        assert reference_verify(result["capsule"]).ok


def test_a_fork_that_cannot_wait_for_a_call_refuses_pkcs11_instead_of_hanging(
        softhsm: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another thread is inside a call that does not return (a hung device;
    here a thread holds the process-wide lock as such a call would). The fork
    waits FORK_WAIT s, then goes ahead; in the fork every PKCS#11 use raises
    SignerForkedError naming the module, at once, instead of waiting for a thread
    that does not exist there."""
    uri = _key(softhsm)
    monkeypatch.setattr(process, "FORK_WAIT", 0.3)  # the one deadline of every fork
    signer = open_signer(uri, pin=softhsm.pin)
    try:
        with held_elsewhere(P11_LOCK):
            def use_pkcs11_in_fork() -> dict[str, Any]:
                return {"sign": attempt(lambda: signer.sign(b"x")),
                        "open": attempt(lambda: open_signer(uri, pin=softhsm.pin))}

            code, answers = _in_fork(use_pkcs11_in_fork)
        assert code == 0, "the fork hung (killed by its alarm)" if code == -signal.SIGALRM else code
        for name in ("sign", "open"):
            kind, message = answers[name]["type"], answers[name]["message"]
            assert kind == SignerForkedError.__name__, answers
            assert "forked" in message and softhsm.module in message and softhsm.pin not in message
        assert signature_ok("EdDSA", signer.public_key, signer.sign(b"parent").signature, b"parent")
    finally:
        signer.close()


def test_a_ctrl_c_during_a_forks_wait_is_handed_on_after_it(softhsm: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C while a fork waits for a call in another thread. Raised inside
    the hook, CPython would report and drop it, and (it did) leave the hooks'
    bookkeeping half done: the child released a lock it never took, then hung
    or signed on the parent's session, and a lock could stay held in the
    parent for good. Now the Ctrl-C waits for the hooks to finish and is
    raised in the code that forked; the fork, which could not wait, refuses
    PKCS#11; the parent's lock is free again."""
    uri = _key(softhsm)
    monkeypatch.setattr(process, "FORK_WAIT", 1.0)  # the one deadline of every fork
    signer = open_signer(uri, pin=softhsm.pin)
    try:
        code, answer = _in_fork(lambda: "a fork that took the lock")  # this thread's last fork: lock taken
        assert code == 0

        def sign_in_fork() -> dict[str, Any]:
            threading.Thread(target=threading.Event().wait, daemon=True).start()  # a thread of its own first
            return {"signature": signer.sign(b"x").signature.hex()}

        main = threading.get_ident()

        def interrupt_the_forks_wait() -> None:
            """Ctrl-C once this thread waits in the fork hook (a fixed delay
            could come before the fork on a loaded machine)."""
            for _ in range(1000):
                frame = sys._current_frames().get(main)
                if frame is not None and frame.f_code.co_name == "_before_fork" \
                        and frame.f_code.co_filename.endswith(os.path.join("pkcs11", "_session.py")):
                    os.kill(os.getpid(), signal.SIGINT)
                    return
                time.sleep(0.005)

        interrupted = False
        with held_elsewhere(P11_LOCK):
            threading.Thread(target=interrupt_the_forks_wait, daemon=True).start()
            try:
                child = ForkedChild(sign_in_fork, _ALARM)
                for _ in range(1000):  # the Ctrl-C arrives once the fork's hooks are done
                    time.sleep(0.01)
            except KeyboardInterrupt:
                interrupted = True
        assert interrupted
        code, report = child.outcome()
        assert code == 0, "the fork hung (killed by its alarm)" if code == -signal.SIGALRM else code
        assert report["error"]["type"] == SignerForkedError.__name__, report
        assert softhsm.module in report["error"]["message"]
        assert P11_LOCK.acquire(blocking=False)  # not left held by the interrupted hooks
        P11_LOCK.release()
        assert signature_ok("EdDSA", signer.public_key, signer.sign(b"parent").signature, b"parent")
    finally:
        signer.close()


def _processes_started_by_this_one() -> list[int]:
    children: list[int] = []
    for task in os.listdir("/proc/self/task"):
        with open(f"/proc/self/task/{task}/children") as f:
            children += [int(pid) for pid in f.read().split()]
    return children


def test_a_fork_never_starts_a_signing_process_of_its_own(softhsm: Any) -> None:
    """A signer with a signing process, forked while it had no current child
    and no replacement under way (as after a refused PIN): the fork signs
    in-process and never starts a child of its own (one that would be sent
    the PIN and never used); closing the signer there leaves the parent's
    child alone."""
    signer = open_signer(_key(softhsm), pin=softhsm.pin, signing_process=True)
    assert isinstance(signer, PKCS11Signer)
    try:
        process = signer.signing_process
        assert process is not None and process.child is not None
        helper = process.child.proc.pid
        # no current child, no replacement under way: the state itself is set (no public way to reach it)
        current, process._child = process.child, None
        process.respawn_after = 0.01

        def sign_in_fork() -> dict[str, Any]:
            signatures = [signer.sign(b"in the fork").signature.hex() for _ in range(3)]
            started: list[int] = []
            for _ in range(100):  # 2 s: far longer than a start takes to begin
                started = _processes_started_by_this_one()
                if started:
                    break
                threading.Event().wait(0.02)
            signer.close()
            return {"signatures": signatures, "started": started}

        code, answer = _in_fork(sign_in_fork)
        process._child = current
        assert code == 0, "the fork hung (killed by its alarm)" if code == -signal.SIGALRM else code
        assert "error" not in answer, answer
        assert answer["started"] == []
        assert all(signature_ok("EdDSA", signer.public_key, bytes.fromhex(s), b"in the fork")
                   for s in answer["signatures"])
        assert process.child.proc.pid == helper and process.child.proc.poll() is None  # the parent's child lives
        assert signature_ok("EdDSA", signer.public_key, signer.sign(b"parent").signature, b"parent")
    finally:
        signer.close()
