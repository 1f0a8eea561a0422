"""The TPMDevice contract (capseal.attest relies on it): one worker thread per
TCTI runs every job, re-entrant calls work, memo entries live per connection,
every failure leaves as a typed capseal error naming the TCTI, and a closed
device refuses work instead of hanging."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from tpm2_pytss.constants import TPM2_CAP, TPM2_HC

from capseal.errors import DeviceError, KeyNotFoundError, SignerUnavailableError
from capseal.keys.tpm import TPMDevice, get_device


def test_one_worker_thread_runs_every_job(swtpm: Any) -> None:
    device = get_device(swtpm.tcti)
    assert get_device(swtpm.tcti) is device  # process-wide, one per TCTI
    seen: set[str] = set()
    lock = threading.Lock()

    def job(ectx: Any) -> int:
        with lock:
            seen.add(threading.current_thread().name)
        return len(ectx.get_random(8))

    results: list[int] = []

    def caller() -> None:
        for _ in range(50):
            results.append(device.call(job))

    threads = [threading.Thread(target=caller) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [8] * 200
    assert seen == {f"capseal-tpm[{swtpm.tcti}]"}
    assert device.call(lambda ectx: device.call(lambda inner: inner is ectx))  # re-entrant: same context
    info = device.info()
    assert info.tcti == swtpm.tcti and info.software is True
    assert info.evidence_device() == {"manufacturer": "IBM", "vendor": info.vendor, "firmware": info.firmware,
                                      "software": True}


def test_memo_is_per_connection_and_errors_are_typed(swtpm: Any) -> None:
    device = get_device(swtpm.tcti)
    made: list[int] = []

    def job(ectx: Any) -> Any:
        def make(e: Any) -> int:
            made.append(1)
            return len(made)

        return device.memo("test-memo", make)

    assert device.call(job) == device.call(job) == 1  # made once per connection
    with pytest.raises(RuntimeError):
        device.memo("outside", lambda e: None)  # only inside a call
    with pytest.raises(KeyNotFoundError) as exc_info:
        device.call(lambda ectx: ectx.tr_from_tpmpublic(0x81000ddd), what="opening 0x81000ddd")
    assert swtpm.tcti in str(exc_info.value) and "opening 0x81000ddd" in str(exc_info.value)
    with pytest.raises(DeviceError, match="ZeroDivisionError"):
        device.call(lambda ectx: 1 // 0)
    device.call(lambda ectx: device.forget("test-memo"))


def test_a_private_device_flushes_what_it_loaded_and_refuses_work_when_closed(swtpm: Any) -> None:
    from tpm2_pytss.constants import ESYS_TR
    from tpm2_pytss.types import TPM2B_SENSITIVE_CREATE

    from capseal.keys.tpm import srk_template

    device = TPMDevice(swtpm.tcti)  # a connection of its own, outside the registry

    def load(ectx: Any) -> int:
        device.memo("srk", lambda e: e.create_primary(TPM2B_SENSITIVE_CREATE(), srk_template(), ESYS_TR.OWNER)[0],
                    flush=True)
        _more, data = ectx.get_capability(TPM2_CAP.HANDLES, TPM2_HC.TRANSIENT_FIRST, 64)
        return len(list(data.data.handles))

    loaded = device.call(load)
    assert loaded >= 1 and _raw_transient_count(swtpm.tcti) == loaded
    device.close()
    device.close()  # idempotent
    with pytest.raises(SignerUnavailableError, match="closed"):
        device.call(lambda ectx: None)
    assert _raw_transient_count(swtpm.tcti) == loaded - 1  # closing flushed the SRK it had loaded


def _raw_transient_count(tcti: str) -> int:
    """Count transient objects over a plain ESAPI connection (which flushes nothing)."""
    from tpm2_pytss import ESAPI

    ectx = ESAPI(tcti)
    try:
        _more, data = ectx.get_capability(TPM2_CAP.HANDLES, TPM2_HC.TRANSIENT_FIRST, 64)
        return len(list(data.data.handles))
    finally:
        ectx.close()


def test_closed_from_inside_a_job_the_worker_still_stops(swtpm: Any) -> None:
    """close() called by a job on the worker itself: the job finishes, a job
    queued before the close still runs (as with close() from outside), then
    the worker closes what it opened and ends; later work is refused."""
    device = TPMDevice(swtpm.tcti)  # a connection of its own, outside the registry
    gate = threading.Event()

    def closing_job(ectx: Any) -> str:
        assert gate.wait(5)  # the next job is queued behind this one by now
        device.close()
        return "closed from inside"

    first = device.submit(closing_job, what="closing job")
    behind = device.submit(lambda ectx: ectx.get_random(8), what="queued behind")
    gate.set()
    assert device.wait(first, 10) == "closed from inside"
    assert len(device.wait(behind, 10)) == 8
    device._thread.join(10)  # the worker thread itself: that it ends is what is tested
    assert not device._thread.is_alive()  # it used to keep running, its connection open
    assert not device.connected
    with pytest.raises(SignerUnavailableError, match="closed"):
        device.call(lambda ectx: None)


def test_connect_flushes_leftover_hmac_and_policy_sessions(fresh_swtpm: Any) -> None:
    """A crashed process's sessions stay loaded on a TPM without a resource
    manager. Asked for loaded sessions the TPM lists policy sessions
    (0x03xxxxxx) with the HMAC ones (0x02xxxxxx); both must go at connect
    (policy sessions used to be skipped)."""
    from tpm2_pytss import ESAPI
    from tpm2_pytss.constants import ESYS_TR, TPM2_ALG, TPM2_SE
    from tpm2_pytss.types import TPMT_SYM_DEF

    from capseal.keys.tpm._handles import session_handles

    crashed = ESAPI(fresh_swtpm.tcti)
    for kind in (TPM2_SE.HMAC, TPM2_SE.POLICY):
        crashed.start_auth_session(ESYS_TR.NONE, ESYS_TR.NONE, kind, TPMT_SYM_DEF(algorithm=TPM2_ALG.NULL),
                                   TPM2_ALG.SHA256)
    crashed.close()  # like a crash: nothing flushed
    assert sorted(h >> 24 for h in _raw_sessions(fresh_swtpm.tcti)) == [0x02, 0x03]
    device = TPMDevice(fresh_swtpm.tcti)
    try:
        assert device.call(session_handles) == []
    finally:
        device.close()
    assert _raw_sessions(fresh_swtpm.tcti) == []


def _raw_sessions(tcti: str) -> list[int]:
    """Loaded sessions, HMAC and policy, over a plain ESAPI connection."""
    from tpm2_pytss import ESAPI

    ectx = ESAPI(tcti)
    try:
        _more, data = ectx.get_capability(TPM2_CAP.HANDLES, TPM2_HC.LOADED_SESSION_FIRST, 64)
        return [int(h) for h in data.data.handles]
    finally:
        ectx.close()
