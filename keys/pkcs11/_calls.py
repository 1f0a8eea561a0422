"""How PKCS#11 calls are made: under the process-wide lock, with one
reconnect-and-retry, on the caller's thread or — when threads contend — on one
worker thread (see :class:`_TokenWorker` for why that is faster).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from capseal import process
from capseal.errors import SignerError, SignerUnavailableError

from ._lock import P11_LOCK, RECONNECT_ERRORS, check_alive, device_error, is_shut_down, p11x
from ._session import TokenSession

__all__ = ["run"]

_T = TypeVar("_T")


def run(ts: TokenSession, fn: Callable[[Any], _T], where: str) -> _T:
    """``fn(session)`` under the lock, reconnecting once if the session died.

    Uncontended, the call runs on the caller's thread. When another thread
    holds the lock, the call is handed to :data:`_WORKER` instead of waiting
    for the lock here: see :class:`_TokenWorker` for why that is faster.

    Args:
        ts: the token session.
        fn: the work, given the logged-in python-pkcs11 session.
        where: names the token and key in errors.

    Returns:
        What ``fn`` returns.

    Raises:
        SignerUnavailableError: the session died again after reconnecting, or
            PKCS#11 is refused in this process (shut down, forked mid-call).
        SignerError: the typed error for what python-pkcs11 raised (no exception chained).
    """
    if P11_LOCK.acquire(blocking=False):  # also true when this thread already holds it
        try:
            return _run_locked(ts, fn, where)
        finally:
            P11_LOCK.release()
    return _WORKER.call(ts, fn, where)


def _run_locked(ts: TokenSession, fn: Callable[[Any], _T], where: str) -> _T:
    with P11_LOCK:
        for attempt in (0, 1):
            session = ts.ensure()
            failure: SignerError | None = None
            try:
                return fn(session)
            except RECONNECT_ERRORS as exc:
                ts.invalidate(exc)
                if attempt:
                    failure = SignerUnavailableError(
                        f"{where}: {ts.name} failed again after reconnecting ({type(exc).__name__})")
            except p11x.PKCS11Error as exc:
                # python-pkcs11 raises its bare base class for CKR_CRYPTOKI_NOT_INITIALIZED: other
                # code finalised the module; it is initialised again and the call retried after a new login
                if attempt or type(exc) is not p11x.PKCS11Error or not ts.module.recover_if_finalized(exc):
                    failure = device_error(exc, where)
            if failure is not None:
                # raised outside the handler, so the typed error has no
                # __context__: no python-pkcs11 frame travels with it
                raise failure
    raise AssertionError("unreachable")  # pragma: no cover


class _Request:
    __slots__ = ("ts", "fn", "where", "done", "value", "error")

    def __init__(self, ts: TokenSession, fn: Callable[[Any], Any], where: str) -> None:
        self.ts, self.fn, self.where = ts, fn, where
        self.done = threading.Event()
        self.value: Any = None
        self.error: BaseException | None = None


class _TokenWorker:
    """One thread that makes PKCS#11 calls for threads that would otherwise
    queue on :data:`P11_LOCK`.

    Why: python-pkcs11 drops the GIL inside ``C_Sign``, so in principle one
    thread's Python work (canonical form, checks, ledger) overlaps another's
    signature. With threads queueing on the lock that does not happen: the
    thread that gets the lock must then also get the GIL back from a thread
    busy with Python, and by the time it does, that thread is queueing for the
    lock in turn — signing and Python alternate instead of overlapping. A
    caller that hands its call to this worker and *waits on an event* gives
    the GIL away for good, so the worker can sign while the other callers run
    Python. Calls still run one at a time, under the same lock."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[_Request | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._start = threading.Lock()

    def call(self, ts: TokenSession, fn: Callable[[Any], _T], where: str) -> _T:
        check_alive()
        self._ensure_thread()
        request = _Request(ts, fn, where)
        self._queue.put(request)
        request.done.wait()
        if request.error is not None:
            raise request.error
        return request.value  # type: ignore[no-any-return]

    def _ensure_thread(self) -> None:
        if self._thread is not None and self._thread.is_alive():
            return
        with self._start:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._loop, name="capseal-pkcs11", daemon=True)
                self._thread.start()

    def _loop(self) -> None:
        while True:
            request = self._queue.get()
            if request is None:
                return
            try:
                if is_shut_down():
                    raise SignerUnavailableError("the interpreter is shutting down; PKCS#11 sessions are closed")
                request.value = _run_locked(request.ts, request.fn, request.where)
            except BaseException as exc:  # handed to the caller, raised there
                request.error = exc
            request.done.set()

    def stop(self) -> None:
        if self._thread is not None and self._thread.is_alive():
            self._queue.put(None)

    def forget_after_fork(self) -> None:
        """In a forked process: the worker thread is not there, and the
        requests queued for it are the parent's (their callers wait there).
        Start afresh: a new thread on first use, an empty queue."""
        self._queue = queue.SimpleQueue()
        self._thread = None
        self._start = threading.Lock()


_WORKER = _TokenWorker()
process.on_fork("devices", after_in_child=_WORKER.forget_after_fork)
