"""A program that ends without flush() or close(): what it submitted is
written at exit, before the key backends close their devices, and the exit
says so; a device that does not answer holds the exit for EXIT_WAIT seconds
at most, and what it did not sign is named, never written (capseal.process).

Each case runs a real program in a subprocess and reads the ledger it left."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from capseal import verify_ledger
from capseal.keys.provision import create_key
from capseal.keys.tpm import create_key as create_tpm_key

PROGRAM = """
import sys
from capseal import Ledger, Producer
from capseal.keys import UnsafeEphemeralSigner, open_signer
import capseal.process

uri, ledger, n, shared = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4] == "shared"
capseal.process.EXIT_WAIT = float(sys.argv[5])
options = {"signing_process": True} if uri.startswith("pkcs11:") and "sp" in sys.argv[6:7] else {}
signer = UnsafeEphemeralSigner() if uri == "software" else open_signer(uri, pin=sys.stdin.readline().strip() or None,
                                                                        **options)
# a shared ledger whose group window is longer than the run: every record is still queued at exit
target = Ledger(ledger, group_window=600.0, group_max=10**6) if shared else ledger
producer = Producer("acme", "agent@1", signer, target)
for i in range(n):
    producer.submit({"action_id": f"act-{i}", "action_type": "fyi"})
print("submitted", flush=True)
if "wait" in sys.argv[6:7]:  # wait until the test has stopped the device
    sys.stdin.readline()
"""


def _run(tmp_path: Path, uri: str, n: int, *, shared: bool = False, pin: str = "", exit_wait: float = 10.0,
         signing_process: bool = False) -> str:
    ledger = tmp_path / "l.db"
    done = subprocess.run([sys.executable, "-c", PROGRAM, uri, str(ledger), str(n), "shared" if shared else "own",
                           str(exit_wait)] + (["sp"] if signing_process else []),
                          input=pin + "\n", capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "submitted" in done.stdout
    return done.stderr


def _written(tmp_path: Path) -> int:
    report = verify_ledger(tmp_path / "l.db")
    assert report.ok, report.to_dict()
    return len(report.records) - 1  # the epoch boundary


def test_records_still_queued_at_exit_are_written_and_the_exit_says_so(tmp_path: Path) -> None:
    """Every record sits in the ledger's queue when the program ends (a group
    window longer than the run). Before, they were lost without a word."""
    stderr = _run(tmp_path, "software", 50, shared=True)
    assert _written(tmp_path) == 50
    assert re.search(r"capseal: 50 submitted record\(s\) for l\.db were not yet durable at exit", stderr), stderr


def test_a_pkcs11_signers_records_are_signed_before_its_session_closes(softhsm: Any, tmp_path: Path) -> None:
    """The token signs slower than the program submits: at exit its signing
    pipeline is full. Before, the PKCS#11 backend's own atexit handler
    (registered after capseal's, so run first) closed the session under the
    pipeline and those records were lost."""
    uri = softhsm.uri(f"exit-{os.urandom(3).hex()}")
    create_key(uri, "ed25519", pin=softhsm.pin).close()
    stderr = _run(tmp_path, uri, 1500, pin=softhsm.pin)
    assert _written(tmp_path) == 1500
    assert "were not yet durable at exit" in stderr, stderr
    assert softhsm.pin not in stderr


def test_a_signing_process_is_stopped_only_after_the_records_it_signs(softhsm: Any, tmp_path: Path) -> None:
    """The same with the signatures made by a signing process: its child must
    not be stopped (by weakref's own exit hook, which runs before capseal's)
    while the producers phase still sends it records."""
    uri = softhsm.uri(f"exit-sp-{os.urandom(3).hex()}")
    create_key(uri, "ed25519", pin=softhsm.pin).close()
    stderr = _run(tmp_path, uri, 1500, pin=softhsm.pin, signing_process=True)
    assert _written(tmp_path) == 1500
    assert softhsm.pin not in stderr


FINALIZE_ORDER = """
import capseal.process as process

class Device:
    pass

device, early = Device(), Device()
process.finalize("devices", device, print, "device finalized", flush=True)
process.close_at_exit("producers", device, lambda obj, deadline: print("producers closed", flush=True))
once = process.finalize("devices", early, print, "early finalized", flush=True)
once()  # already run: not again at exit
"""


def test_a_finalizer_runs_at_exit_in_its_phase_once() -> None:
    """``process.finalize`` runs in the devices phase, after the producers
    phase; a plain ``weakref.finalize`` would run first, from weakref's own
    exit hook."""
    done = subprocess.run([sys.executable, "-c", FINALIZE_ORDER], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["early finalized", "producers closed", "device finalized"]


def test_a_finalizer_runs_once_when_its_object_is_collected() -> None:
    import gc

    import capseal.process as process

    class Device:
        pass

    calls: list[int] = []
    device = Device()
    done = process.finalize("devices", device, calls.append, 1)
    assert done.alive
    del device
    gc.collect()
    assert calls == [1] and not done.alive
    done()
    assert calls == [1]


def test_a_finalizer_for_an_unknown_phase_is_refused() -> None:
    import capseal.process as process
    with pytest.raises(ValueError, match="exit phase 'later'"):
        process.finalize("later", object(), print)


def test_a_tpm_signers_records_are_signed_before_the_device_closes(swtpm: Any, tmp_path: Path) -> None:
    keyfile = tmp_path / "exit.tss"
    create_tpm_key(f"tpm2:keyfile={keyfile}?tcti={swtpm.tcti}", "p256").close()
    stderr = _run(tmp_path, f"tpm2:keyfile={keyfile}?tcti={swtpm.tcti}", 1000)
    assert _written(tmp_path) == 1000, stderr


def test_a_hung_device_holds_the_exit_for_exit_wait_at_most(fresh_swtpm: Any, tmp_path: Path) -> None:
    """swtpm frozen (SIGSTOP) with signatures queued on it: the exit gives up
    after EXIT_WAIT (1 s here), names the records it did not write, and
    the ledger holds only signed, verifying records. The subprocess timeout
    is a guard against a hang, not a timing assertion."""
    keyfile = tmp_path / "exit.tss"
    create_tpm_key(f"tpm2:keyfile={keyfile}?tcti={fresh_swtpm.tcti}", "p256").close()
    uri = f"tpm2:keyfile={keyfile}?tcti={fresh_swtpm.tcti}"
    program = subprocess.Popen([sys.executable, "-c", PROGRAM, uri, str(tmp_path / "l.db"), "2000", "own", "1", "wait"],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert program.stdin is not None and program.stdout is not None
    try:
        program.stdin.write("\n")
        program.stdin.flush()
        assert program.stdout.readline().strip() == "submitted"
        os.kill(fresh_swtpm.pid, signal.SIGSTOP)
        try:
            _, stderr = program.communicate("\n", timeout=120)
        finally:
            os.kill(fresh_swtpm.pid, signal.SIGCONT)
    finally:
        if program.poll() is None:
            program.kill()
            program.wait()
    assert program.returncode == 0, stderr
    # the exit's wait left for this producer: 1 s, or a hair less once the first steps ran
    assert re.search(r"submitted record\(s\) not signed (1|0\.9\d*) s into close\(\): not written", stderr), stderr
    assert _written(tmp_path) < 2000
