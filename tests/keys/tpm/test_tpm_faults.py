"""TPM faults against a swtpm of each test's own: the TPM stopped in the middle
of a run and restarted, object slots full, leftovers of a crashed process, a
TPM that is not there. Each gives a typed error naming the TCTI, no record is
written for a failed seal, and sealing resumes without restarting the process."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tpm2_pytss import ESAPI, TSS2_Exception
from tpm2_pytss.constants import ESYS_TR, TPM2_CAP, TPM2_HC
from tpm2_pytss.types import TPM2B_SENSITIVE_CREATE

from capseal import Producer, verify_ledger
from capseal.errors import CapsealError, SignerUnavailableError, TPMObjectMemoryError
from capseal.keys import open_signer
from capseal.keys.tpm import create_key, get_device, provision, srk_template

KEY, AK = 0x81000101, 0x81000102


@pytest.fixture()
def tpm(fresh_swtpm: Any) -> Iterator[Any]:
    """A provisioned swtpm of this test's own; the device is closed afterwards."""
    provision(fresh_swtpm.tcti, signing_handle=KEY, ak_handle=AK, alg="p256", force=False)
    yield fresh_swtpm
    get_device(fresh_swtpm.tcti).close()


def _uri(tpm: Any, ak: bool = False) -> str:
    return f"tpm2:handle=0x{KEY:08x}?tcti={tpm.tcti}" + (f"&ak-handle=0x{AK:08x}" if ak else "")


def _spec(i: int) -> dict[str, Any]:
    return {"action_id": f"a-{i}", "action_type": "fyi"}


def _wait(condition: Any, what: str, limit: float = 30.0) -> None:
    """A liveness guard (the test fails instead of hanging), not a timing assertion."""
    deadline = time.monotonic() + limit
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"gave up waiting for {what}")
        time.sleep(0.005)


def _transients(tcti: str) -> list[int]:
    ectx = ESAPI(tcti)
    try:
        _more, data = ectx.get_capability(TPM2_CAP.HANDLES, TPM2_HC.TRANSIENT_FIRST, 64)
        return [int(h) for h in data.data.handles]
    finally:
        ectx.close()


def test_swtpm_stopped_mid_run_then_restarted(tpm: Any, tmp_path: Path) -> None:
    ledger = tmp_path / "l.db"
    device = get_device(tpm.tcti)
    signer = open_signer(_uri(tpm, ak=True))
    sealed: list[str] = []
    failures: list[BaseException] = []
    done = threading.Event()
    with Producer("acme", "agent@1", signer, ledger) as producer:

        def sealing() -> None:
            i = 0
            while not done.is_set():
                try:
                    sealed.append(producer.seal(_spec(i)).capsule_id)
                except CapsealError as exc:
                    failures.append(exc)
                    time.sleep(0.002)
                i += 1

        thread = threading.Thread(target=sealing)
        thread.start()
        try:
            _wait(lambda: len(sealed) >= 50, "the first records")
            generation = device.generation
            tpm.stop()  # in the middle of the run
            _wait(lambda: len(failures) >= 5, "seals to fail while the TPM is down")
            before_restart = len(sealed)
            tpm.start()
            _wait(lambda: len(sealed) >= before_restart + 50, "sealing to resume after the restart")
        finally:
            done.set()
            thread.join()
        producer.flush()
        count = producer.ledger.count()

    unexpected = [f"{type(f).__name__}: {f}" for f in failures if not isinstance(f, SignerUnavailableError)]
    assert unexpected == []
    assert [str(f) for f in failures if tpm.tcti not in str(f)] == []
    assert device.generation > generation  # it reconnected, in this same process
    assert (count, len(failures)) == (len(sealed) + 1, len(failures))  # the epoch boundary + each success, no more
    report = verify_ledger(ledger)
    assert report.ok, [f.to_dict() for f in report.findings] + [r.to_dict() for r in report.records if not r.ok][:3]
    assert report.counts()["records"] == count


def test_submitted_records_while_the_tpm_is_down(tpm: Any, tmp_path: Path) -> None:
    """submit() queues signatures straight on the TPM worker (no signing
    thread): with the TPM stopped, every queued record fails with a typed
    error naming the TCTI and nothing is written for it; after a restart the
    same producer's queued records are sealed again, in order."""
    ledger = tmp_path / "l.db"
    signer = open_signer(_uri(tpm))
    with Producer("acme", "agent@1", signer, ledger) as producer:
        before = [producer.submit(_spec(i)) for i in range(100)]
        producer.flush()
        assert [p.result().seq for p in before] == list(range(2, 102))
        assert not [t for t in threading.enumerate() if t.name.startswith("capseal-sign")]
        tpm.stop()
        down = [producer.submit(_spec(100 + i)) for i in range(20)]
        producer.flush()
        for p in down:
            with pytest.raises(SignerUnavailableError, match=re.escape(tpm.tcti)):
                p.result()
        assert producer.ledger.count() == 101  # the epoch boundary and the 100 signed before
        tpm.start()
        after = [producer.submit(_spec(200 + i)) for i in range(100)]
        producer.flush()
        assert [p.result().seq for p in after] == list(range(102, 202))
    signer.close()
    report = verify_ledger(ledger)
    assert report.ok and report.counts()["records"] == 201


def test_a_hung_tpm_times_out_and_sealing_resumes(tpm: Any, tmp_path: Path) -> None:
    """swtpm frozen (SIGSTOP: the connection stays open, no answer comes):
    seal() fails after the signer's timeout with a typed error naming the
    TCTI, every submit() queued behind the hung command fails at once, and
    nothing is written; once the TPM answers again (SIGCONT) the same
    producer seals again, in the same process."""
    ledger = tmp_path / "l.db"
    signer = open_signer(_uri(tpm), timeout=2.0)  # ordinary commands run under it too: room for a loaded host
    try:
        with Producer("acme", "agent@1", signer, ledger) as producer:
            producer.seal(_spec(0))
            device = get_device(tpm.tcti)
            os.kill(tpm.pid, signal.SIGSTOP)
            try:
                with pytest.raises(SignerUnavailableError, match=re.escape(f"TPM {tpm.tcti} did not answer within 2.0 s")):
                    producer.seal(_spec(1))
                queued = [producer.submit(_spec(2 + i)) for i in range(50)]
                started = time.monotonic()
                producer.flush()
                # behind a command already hung the queue fails at once; one timeout
                # per record would take 50 s (a behaviour bound, not a speed figure)
                assert time.monotonic() - started < 10
                for pending in queued:
                    with pytest.raises(SignerUnavailableError, match=re.escape(tpm.tcti)):
                        pending.result()
                assert producer.ledger.count() == 2  # the epoch boundary and the first record
            finally:
                os.kill(tpm.pid, signal.SIGCONT)
            _wait(lambda: not device.busy, "the hung command to come back")
            after = [producer.submit(_spec(100 + i)) for i in range(20)]
            producer.flush()
            assert [p.result().seq for p in after] == list(range(3, 23))
            producer.seal(_spec(200))
    finally:
        signer.close()
    report = verify_ledger(ledger)
    assert report.ok and report.counts()["records"] == 23


def test_close_with_a_timeout_gives_up_on_a_frozen_tpm(tpm: Any, tmp_path: Path) -> None:
    """swtpm frozen with 20 records submitted (the signer's own timeout is
    long): close(timeout=1) gives up, every record fails with a typed error
    and nothing is written; the 19 TPM2_Sign commands still queued are taken
    off the device's queue, so once the TPM answers (SIGCONT) it does not
    sign for nothing, and a new producer on the same signer seals at once."""
    ledger = tmp_path / "l.db"
    signer = open_signer(_uri(tpm), timeout=60.0)
    queued_on_tpm: list[Any] = []
    real_begin = signer.begin_sign

    def observed_begin(data: bytes) -> Any:  # the real call; the test keeps what it returns
        queued_on_tpm.append(real_begin(data))
        return queued_on_tpm[-1]

    signer.begin_sign = observed_begin  # type: ignore[method-assign]
    try:
        producer = Producer("acme", "agent@1", signer, ledger)
        producer.seal(_spec(0))
        device = get_device(tpm.tcti)
        del queued_on_tpm[:]  # the self-test's and seal()'s signatures (sign() goes through begin_sign too)
        os.kill(tpm.pid, signal.SIGSTOP)
        try:
            pendings = [producer.submit(_spec(1 + i)) for i in range(20)]
            _wait(lambda: device.busy, "the first command to reach the frozen TPM")
            with pytest.raises(SignerUnavailableError, match=r": 20 submitted record\(s\) not signed 1 s into close\(\): not written$"):
                producer.close(timeout=1.0)
            for pending in pendings:
                with pytest.raises(SignerUnavailableError, match="gave up on the device"):
                    pending.result()
            # the jobs behind each pending signature: which were dropped unstarted is what is tested
            assert [q._fut.cancelled() for q in queued_on_tpm] == [False] + [True] * 19
        finally:
            os.kill(tpm.pid, signal.SIGCONT)
        _wait(lambda: not device.busy and device.waiting == 0, "the TPM to finish its one command")
        assert queued_on_tpm[0]._fut.done() and not queued_on_tpm[0]._fut.cancelled()
        with Producer("acme", "agent@1", signer, ledger) as again:
            again.seal(_spec(100))
    finally:
        signer.close()
    report = verify_ledger(ledger)
    assert report.ok and report.counts()["records"] == 4  # two epoch boundaries, record 0 and record 100


def test_a_deep_queue_before_a_slow_tpm_does_not_time_out(tpm: Any) -> None:
    """The timeout bounds the TPM's time per command, not a job's wait in the
    queue: 60 commands of 50 ms each queued at once on the real device worker
    (3 s in all) all succeed with a 2 s timeout, in order."""
    device = get_device(tpm.tcti)

    def slow_command(i: int) -> Any:
        def job(ectx: Any) -> int:
            time.sleep(0.05)  # a slow TPM command (an RSA signature on a discrete TPM)
            ectx.get_random(8)  # and a real one
            return i

        return job

    futures = [device.submit(slow_command(i), what=f"command {i}") for i in range(60)]
    assert device.wait(futures[-1], 2.0) == 59  # waits 3 s behind 59 commands, none of them hung
    assert [device.wait(f, 2.0) for f in futures] == list(range(60))


def test_object_slots_full(tpm: Any, tmp_path: Path) -> None:
    """Another connection fills the three transient slots: sealing with a
    persistent key and with a key file fails with TPMObjectMemoryError naming
    the TCTI, with a hint for a running and an exited holder; nothing is
    written, the other client's objects are left alone (they may be a running
    process's), and both seal again once the slots free up."""
    keyfile = tmp_path / "k.tss"
    create_key(f"tpm2:keyfile={keyfile}?tcti={tpm.tcti}", "p256").close()
    persistent = open_signer(_uri(tpm))
    from_file = open_signer(f"tpm2:keyfile={keyfile}?tcti={tpm.tcti}")
    with Producer("acme", "agent-a@1", persistent, tmp_path / "a.db") as a, \
            Producer("acme", "agent-b@1", from_file, tmp_path / "b.db") as b:
        a.seal(_spec(0))
        b.seal(_spec(0))
        counts = (a.ledger.count(), b.ledger.count())

        other = ESAPI(tpm.tcti)  # a second client on a TPM without a resource manager
        held: list[Any] = []

        def fill() -> None:
            while True:
                try:
                    held.append(other.create_primary(TPM2B_SENSITIVE_CREATE(), srk_template(), ESYS_TR.OWNER)[0])
                except TSS2_Exception:
                    return

        try:
            fill()
            # the key file's loaded copy holds a slot (reloaded on demand): let it go and
            # take that slot too
            device = get_device(tpm.tcti)
            device.call(lambda _ectx: device.make_room())
            fill()
            assert len(held) == 3
            for producer in (a, b):
                with pytest.raises(TPMObjectMemoryError) as exc_info:
                    producer.seal(_spec(1))
                assert tpm.tcti in str(exc_info.value) and "TPM_RC_OBJECT_MEMORY" in str(exc_info.value)
                assert "is running, stop it" in exc_info.value.hint and "tpm2_flushcontext" in exc_info.value.hint
            assert (a.ledger.count(), b.ledger.count()) == counts  # nothing written for the failed seals
            assert sorted(_transients(tpm.tcti)) == sorted(int(other.tr_get_tpm_handle(h)) for h in held)
        finally:
            for handle in held:
                other.flush_context(handle)
            other.close()
        a.seal(_spec(1))
        b.seal(_spec(1))
        assert (a.ledger.count(), b.ledger.count()) == (counts[0] + 1, counts[1] + 1)
    for name in ("a.db", "b.db"):
        assert verify_ledger(tmp_path / name).ok


def test_leftovers_of_a_process_that_crashed_after_capseal_connected(tpm: Any, tmp_path: Path) -> None:
    """A signer is working; then another process loads objects and crashes.
    While connected, capseal does not flush them (it cannot tell a crashed
    process's objects from a running one's): a signer that needs a slot gets
    TPMObjectMemoryError naming the TCTI and the fix, and once the operator
    flushes them (tpm2_flushcontext -t) every signer signs again in this
    same process."""
    paths = [tmp_path / "k1.tss", tmp_path / "k2.tss"]
    for path in paths:
        create_key(f"tpm2:keyfile={path}?tcti={tpm.tcti}", "p256").close()
    with open_signer(f"tpm2:keyfile={paths[0]}?tcti={tpm.tcti}") as first:
        first.sign(b"before")
        assert len(_transients(tpm.tcti)) == 1  # the first signer's cached key
        crash = subprocess.run([sys.executable, "-c", _CRASH, tpm.tcti, "2"], capture_output=True, text=True)
        assert crash.returncode == 3, crash.stderr
        assert len(_transients(tpm.tcti)) == 3  # every slot taken
        first.sign(b"cached key, no new slot")
        with pytest.raises(TPMObjectMemoryError) as exc_info:
            open_signer(f"tpm2:keyfile={paths[1]}?tcti={tpm.tcti}")
        assert tpm.tcti in str(exc_info.value) and "tpm2_flushcontext" in exc_info.value.hint
        assert len(_transients(tpm.tcti)) >= 2  # the crashed process's objects were left alone
        flusher = ESAPI(tpm.tcti)  # what `tpm2_flushcontext -t` does
        try:
            for handle in _transients(tpm.tcti):
                flusher.flush_context(flusher.tr_from_tpmpublic(handle))
        finally:
            flusher.close()
        with open_signer(f"tpm2:keyfile={paths[1]}?tcti={tpm.tcti}") as second:
            assert second.sign(b"second").alg == first.sign(b"first").alg == "ES256"


def test_a_failed_load_does_not_stop_a_working_signer(tpm: Any, tmp_path: Path) -> None:
    """Signer A's key holds one slot and another running client the other two.
    Opening B fails with TPMObjectMemoryError; A's cached key is not given up
    for a retry that could not succeed (it would have stopped A as well)."""
    paths = [tmp_path / "a.tss", tmp_path / "b.tss"]
    for path in paths:
        create_key(f"tpm2:keyfile={path}?tcti={tpm.tcti}", "p256").close()
    with open_signer(f"tpm2:keyfile={paths[0]}?tcti={tpm.tcti}") as a:
        a.sign(b"warm")  # A's key is loaded
        other = ESAPI(tpm.tcti)
        held = [other.create_primary(TPM2B_SENSITIVE_CREATE(), srk_template(), ESYS_TR.OWNER)[0] for _ in range(2)]
        try:
            assert a.sign(b"full TPM, cached key").alg == "ES256"
            with pytest.raises(TPMObjectMemoryError):
                open_signer(f"tpm2:keyfile={paths[1]}?tcti={tpm.tcti}")
            assert a.sign(b"still signing").alg == "ES256"
        finally:
            for handle in held:
                other.flush_context(handle)
            other.close()


_CRASH = """
import os, sys
from tpm2_pytss import ESAPI
from tpm2_pytss.constants import ESYS_TR
from tpm2_pytss.types import TPM2B_SENSITIVE_CREATE
from capseal.keys.tpm import srk_template
e = ESAPI(sys.argv[1])
for _ in range(int(sys.argv[2]) if len(sys.argv) > 2 else 3):
    e.create_primary(TPM2B_SENSITIVE_CREATE(), srk_template(), ESYS_TR.OWNER)
os._exit(3)  # crash: nothing flushed
"""


def test_leftovers_of_a_crashed_process_and_an_absent_tpm(tpm: Any) -> None:
    get_device(tpm.tcti).close()  # this process starts afresh, like a new run
    crash = subprocess.run([sys.executable, "-c", _CRASH, tpm.tcti], capture_output=True, text=True)
    assert crash.returncode == 3, crash.stderr
    assert len(_transients(tpm.tcti)) == 3  # swtpm has no resource manager: the slots stay taken

    with open_signer(_uri(tpm)) as signer:  # connecting flushes the leftovers
        assert signer.sign(b"after a crash").alg == "ES256"
    assert _transients(tpm.tcti) == []

    get_device(tpm.tcti).close()
    tpm.stop()
    with pytest.raises(SignerUnavailableError) as exc_info:
        open_signer(_uri(tpm))
    assert tpm.tcti in str(exc_info.value)
    tpm.start()
    with open_signer(_uri(tpm)) as signer:
        assert signer.sign(b"back").alg == "ES256"


def test_key_file_from_another_tpm(tpm: Any, swtpm: Any, tmp_path: Path) -> None:
    """A TSS2 PRIVATE KEY is bound to the TPM (SRK) that made it: on another
    TPM it is refused with KeyNotFoundError saying so, naming the file and TCTI."""
    path = tmp_path / "elsewhere.tss"
    create_key(f"tpm2:keyfile={path}?tcti={swtpm.tcti}", "p256").close()  # made by the session swtpm
    from capseal.errors import KeyNotFoundError

    with pytest.raises(KeyNotFoundError, match="another TPM") as exc_info:
        open_signer(f"tpm2:keyfile={path}?tcti={tpm.tcti}")
    assert str(path) in str(exc_info.value) and tpm.tcti in str(exc_info.value)
