"""The GIL policy of the direct C_Sign path (keys/_pkcs11_fast.py), on real C
functions whose duration is known: libc's ``usleep``. A call that answers in
microseconds keeps the GIL; one of half a millisecond releases it after
its probes; one that takes milliseconds releases it at once and for
good, and while it runs other threads run Python."""

from __future__ import annotations

import ctypes
import ctypes.util
import threading

from capseal.keys._pkcs11_fast import _GILPolicy

_LIBC = ctypes.CDLL(ctypes.util.find_library("c"))
_USLEEP = ctypes.cast(_LIBC.usleep, ctypes.c_void_p).value
_ARGS = (ctypes.c_int, ctypes.c_uint)


def test_a_quick_call_keeps_the_gil_after_its_probes() -> None:
    quick = _GILPolicy(_USLEEP, _ARGS)  # type: ignore[arg-type]
    for _ in range(16):
        assert quick(0) == 0
    assert quick.keeps_gil and not quick.probing  # usleep(0) answers far under 200 µs
    quick(5000)  # one slow answer later (5 ms: a preempted call) does not flip the choice...
    assert quick.keeps_gil
    quick(60_000)  # ...a kept call over 50 ms (a device gone slow) releases the GIL for good
    assert not quick.keeps_gil
    for _ in range(8):
        quick(0)
    assert not quick.keeps_gil


def test_a_call_of_half_a_millisecond_releases_the_gil_after_its_probes() -> None:
    medium = _GILPolicy(_USLEEP, _ARGS)  # type: ignore[arg-type]
    for _ in range(16):
        medium(500)  # 0.5 ms each: under the 1 ms probe limit, over the 200 µs median limit
    assert not medium.probing and not medium.keeps_gil


def test_a_slow_call_releases_the_gil_at_once_and_for_good() -> None:
    slow = _GILPolicy(_USLEEP, _ARGS)  # type: ignore[arg-type]
    assert slow.keeps_gil  # probing starts with the GIL kept
    progress = 0
    stop = threading.Event()

    def python_work() -> None:
        nonlocal progress
        while not stop.is_set():
            progress += 1

    def python_progress_during(call_us: int) -> int:
        before = progress
        slow(call_us)
        return progress - before

    worker = threading.Thread(target=python_work)
    worker.start()
    try:
        kept = python_progress_during(200_000)  # the first call is a probe: the GIL is kept...
        assert not slow.keeps_gil and not slow.probing  # ...and 0.2 s is over the 1 ms limit: released from now on
        released = python_progress_during(200_000)
    finally:
        stop.set()
        worker.join()
    # with the GIL released the other thread ran Python throughout the call;
    # with it kept, at most a switch interval's worth after the call returned
    assert released > 1000 and released > 5 * kept
    for _ in range(8):
        slow(0)  # quick answers later do not bring the GIL back
    assert not slow.keeps_gil
