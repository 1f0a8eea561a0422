"""The GIL policy of the direct C_Sign path (keys/_pkcs11_fast.py), on real C
functions whose duration is known: libc's ``usleep``. A call that answers in
microseconds keeps the GIL, judged by the lower quartile of its probes; one
that takes milliseconds releases it at once and for good, and while it runs
other threads run Python; a module that is not a software token never keeps
it."""

from __future__ import annotations

import ctypes
import ctypes.util
import threading

from capseal.keys._pkcs11_fast import _GILPolicy

_LIBC = ctypes.CDLL(ctypes.util.find_library("c"))
_USLEEP = ctypes.cast(_LIBC.usleep, ctypes.c_void_p).value
_ARGS = (ctypes.c_int, ctypes.c_uint)


def test_a_quick_call_keeps_the_gil_after_its_probes() -> None:
    quick = _GILPolicy(_USLEEP, _ARGS, may_keep=True)  # type: ignore[arg-type]
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


def test_the_choice_follows_the_lower_quartile_of_the_probes() -> None:
    """Interference only ever adds time, so the quick probes tell a call's
    cost: 5 quick probes of 16 keep the GIL (the median alone would not),
    4 do not."""
    five_quick = _GILPolicy(_USLEEP, _ARGS, may_keep=True)  # type: ignore[arg-type]
    for i in range(16):
        five_quick(0 if i in (0, 3, 6, 9, 12) else 300)  # 5 × usleep(0), 11 × 0.3 ms: under the 1 ms probe limit
    assert not five_quick.probing and five_quick.keeps_gil
    four_quick = _GILPolicy(_USLEEP, _ARGS, may_keep=True)  # type: ignore[arg-type]
    for i in range(16):
        four_quick(0 if i in (0, 4, 8, 12) else 300)  # 4 × usleep(0), 12 × 0.3 ms
    assert not four_quick.probing and not four_quick.keeps_gil


def test_a_module_that_is_not_a_software_token_never_keeps_the_gil() -> None:
    device = _GILPolicy(_USLEEP, _ARGS, may_keep=False)  # type: ignore[arg-type]
    assert not device.keeps_gil and not device.probing
    for _ in range(16):
        device(0)  # however quick its answers
    assert not device.keeps_gil


def test_a_slow_call_releases_the_gil_at_once_and_for_good() -> None:
    slow = _GILPolicy(_USLEEP, _ARGS, may_keep=True)  # type: ignore[arg-type]
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
