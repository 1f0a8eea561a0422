"""At interpreter exit: records submitted and not yet durable are written,
then the devices are closed — in that order, in one handler.

Why: ``submit()`` returns before its record is durable (a device signs it and
the ledger commits it in groups, on daemon threads). A program that ended
without ``flush()`` or ``close()`` lost those records without a word: 254 of
2,000 submitted with a software key, the process exiting at once. At exit
capseal now closes every producer and ledger still open, which finishes
what was submitted, and logs a warning saying so (the program should have
closed them) or saying what could not be written.

Why one handler for both steps: ``atexit`` runs handlers in the reverse order
of registration, and a key backend is imported when its first signer is
opened, after capseal registered this handler; had the backends registered
their own, PKCS#11 sessions and TPM connections would close before the
records they must still sign. The backends register their closing here
(:func:`close_devices_last`) instead.

The wait is bounded (:data:`EXIT_WAIT` seconds for devices, in all): a call
into a hung token cannot be cancelled, and an exit must not hang for ever.
Records a device has not signed by then fail, as with ``close(timeout)``.
"""

from __future__ import annotations

import atexit
import logging
import threading
import time
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .producer import Producer

__all__ = ["EXIT_WAIT", "close_devices_last", "track"]

#: Seconds the exit waits, in all, for devices to sign what was submitted.
EXIT_WAIT = 10.0

log = logging.getLogger("capseal")

_PRODUCERS: weakref.WeakSet[Producer] = weakref.WeakSet()
_DEVICE_CLOSERS: list[Callable[[], None]] = []
_LOCK = threading.Lock()


def track(producer: Producer) -> None:
    """A producer just opened: closed at exit if the program does not."""
    with _LOCK:
        _PRODUCERS.add(producer)


def close_devices_last(closer: Callable[[], None]) -> Callable[[], None]:
    """Register a backend's closing of its devices, run at exit after every
    producer and ledger is closed (the last registered first, as atexit does).
    Returns ``closer``: usable as a decorator."""
    with _LOCK:
        _DEVICE_CLOSERS.append(closer)
    return closer


def _unwritten(producer: Producer) -> int:
    """Records submitted to ``producer`` and not yet durable (or refused)."""
    pipeline = producer._pipeline
    on_device = pipeline._outstanding if pipeline is not None else 0
    return on_device + len(producer._unwritten())


def _close_open() -> None:
    from . import _ledger_fork

    deadline = time.monotonic() + EXIT_WAIT
    with _LOCK:
        producers = [p for p in _PRODUCERS if not p._closed]
    for producer in producers:
        where = producer.ledger.path.name
        try:
            unwritten = _unwritten(producer)
            if unwritten:
                log.warning("capseal: %d submitted record(s) for %s were not yet durable at exit; closing the "
                            "producer writes them (call close() or flush() before the program ends)", unwritten, where)
            producer.close(timeout=max(0.0, deadline - time.monotonic()))
        except Exception as exc:  # noqa: BLE001 - every other producer is still closed
            log.warning("capseal: closing the producer for %s at exit: %s: %s", where, type(exc).__name__, exc)
    for ledger in _ledger_fork.open_ledgers():  # used directly (Ledger.submit), or shared by producers
        try:
            unwritten = ledger._unfinished()
            if unwritten:
                log.warning("capseal: %d submitted record(s) for %s were not yet durable at exit; closing the "
                            "ledger writes them (call close() or flush() before the program ends)",
                            unwritten, ledger.path.name)
            ledger.close()
        except Exception as exc:  # noqa: BLE001
            log.warning("capseal: closing the ledger %s at exit: %s: %s", ledger.path.name, type(exc).__name__, exc)


def _at_exit() -> None:
    try:
        _close_open()
    finally:
        with _LOCK:
            closers = list(reversed(_DEVICE_CLOSERS))
        for closer in closers:
            try:
                closer()
            except Exception as exc:  # noqa: BLE001 - the other devices are still closed
                log.warning("capseal: closing devices at exit: %s: %s", type(exc).__name__, exc)


atexit.register(_at_exit)
