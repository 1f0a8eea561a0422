"""One TPM, one worker thread, one ESAPI context: callers queue.

Why a worker thread: an ESAPI context is not thread-safe, and a TPM executes
one command at a time anyway. Every caller (signers, ``capseal.attest`` quotes,
provisioning) hands a function to :meth:`TPMDevice.call`; the worker runs it
with the context it owns and hands back the result or the exception. Callers
never touch the context outside such a function.

Why the connection care:

* swtpm (and ``/dev/tpm0``) have no resource manager. Transient objects left
  loaded by a crashed process stay loaded, and swtpm has only three slots, so
  on every connect the worker flushes leftover transient objects and loaded
  sessions (HMAC and policy). While connected it never flushes objects it did
  not load: they may be another running process's (whose cached handles would
  then name other keys). On TPM_RC_OBJECT_MEMORY, when no other process's
  objects are loaded, it gives up its own cached objects and runs the command
  once more; otherwise, or then, TPMObjectMemoryError says how to free the
  slots. Objects capseal loads are flushed in ``finally`` blocks, or kept in
  a per-connection memo (:meth:`TPMDevice.memo`) and flushed on close (or
  when the slots run out, to be reloaded on demand). On a TPM without a
  resource manager capseal assumes one process uses it at a time
  (``/dev/tpmrm0`` isolates processes). A device
  opened with ``flush_others=False`` (``capseal doctor``) never flushes what
  it did not load: a check must not change the TPM.
* When the TPM goes away (swtpm stopped, device reset) the call fails with
  :class:`~capseal.errors.SignerUnavailableError` naming the TCTI and the
  context is dropped; the next call reconnects, so a restarted TPM is used
  again without restarting the process. A call whose function is idempotent
  (the default) is retried once on a fresh connection, which covers "the TPM
  restarted between two calls".

The interface is shown in the package facade's docstring. A device belongs
to the process that opened it. In a process forked from that one (without
exec) the worker thread does not exist and the TPM connection is the parent's:
every call raises SignerForkedError (a SignerUnavailableError) saying so,
``close()`` lets go of that copy without sending the TPM anything, and
:func:`get_device` opens a connection of the child's own (see
:meth:`TPMDevice.mark_inherited` and ``_live``, registered with
:mod:`capseal.process`, whose exit handler also closes every device after the
producers have had their records signed).

Errors: every ``TSS2_Exception`` leaves :meth:`call` as a typed
:mod:`capseal.errors` exception (see ``_errors.map_tss_error``) whose message
names the TCTI. Exceptions that are already capseal errors pass through unchanged.
"""

from __future__ import annotations

import os
import queue
import threading
import time
from collections.abc import Callable, Hashable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as _FutureTimeout
from typing import Any, TypeVar

from tpm2_pytss import ESAPI, TSS2_Exception

from capseal import process
from capseal.errors import CapsealError, DeviceError, SignerForkedError, SignerUnavailableError

from ._errors import is_object_memory, is_transport_error, map_tss_error
from ._handles import StaleHandleError, flush_handles, session_handles, transient_handles
from ._info import TPMInfo, read_info
from ._live import owned_in_process, registered, registered_devices, track, unregister
from ._uri import DEFAULT_TCTI, check_tcti

__all__ = ["TPMDevice", "get_device", "close_all"]

T = TypeVar("T")


_STOP = object()  # the job that stops the worker


class TPMDevice:
    """The single owner of one TCTI's ESAPI context (see the module docstring).

    Obtain with :func:`get_device`; do not construct directly unless you want
    a private connection (tests that fill slots use plain ESAPI instead).

    ``flush_others`` (default True): on connect, flush the transient objects
    (but those other capseal devices of this process hold) and sessions left
    on the TPM (see the module docstring). ``False`` leaves everything this
    device did not load alone; ``capseal doctor`` opens such a private device,
    since looking must not destroy another process's objects.
    """

    def __init__(self, tcti: str, *, flush_others: bool = True) -> None:
        self.tcti = tcti
        self.flush_others = flush_others
        self._jobs: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._ectx: Any = None
        #: memo entries: (value, is_transient, TPM handle of a transient)
        self._memo: dict[Hashable, tuple[Any, bool, int | None]] = {}
        #: TPM handles of the transients in ``_memo``, replaced (never mutated)
        #: so other devices' workers can read it without a lock
        self._owned: frozenset[int] = frozenset()
        self._depth = 0  # nesting of _run (re-entrant calls from inside a job)
        self._info: TPMInfo | None = None
        self._generation = 0
        self._closed = False
        self._lock = threading.Lock()
        #: when the worker started the command it is running (None: idle); the
        #: timeouts of :meth:`wait` count from it
        self._busy_since: float | None = None
        self._pid = os.getpid()  # the process that opened it (named in SignerForkedError)
        self._forked = False  # set in a forked child (mark_inherited)
        self._thread = threading.Thread(target=self._worker, name=f"capseal-tpm[{tcti}]", daemon=True)
        self._thread.start()
        track(self)

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called (or the device is a forked copy that was closed)."""
        return self._closed

    @property
    def owned_handles(self) -> frozenset[int]:
        """TPM handles of the transients this device holds now (none once it is
        closed, or in a forked process)."""
        return frozenset() if self._closed or self._forked else self._owned

    def mark_inherited(self) -> None:
        """In a forked child: each call on a parent's device raises
        SignerForkedError instead of waiting for a worker thread that does not
        exist here (then saying "closed"). Its ESAPI context is never closed
        here (see :meth:`close`); tpm2-pytss does not close one when it is
        freed either."""
        self._forked = True

    def __repr__(self) -> str:
        state = "closed" if self._closed else ("connected" if self._ectx is not None else "idle")
        return f"TPMDevice({self.tcti!r}, {'forked, ' if self._forked else ''}{state})"

    def _fork_error(self) -> SignerForkedError:
        return SignerForkedError(
            f"TPM {self.tcti}: this process ({os.getpid()}) was forked from process {self._pid}, which opened "
            f"this TPM connection: the connection and its worker thread belong to process {self._pid}. Open the "
            "signer again in this process (open_signer(...)); nothing was sent to the TPM")

    # ------------------------------------------------------------------ public

    def call(self, fn: Callable[[Any], T], *, what: str | None = None, timeout: float | None = None,
             retry: bool = True) -> T:
        """Run ``fn(ectx)`` on the worker thread and return its result.

        Args:
            fn: the work, given the ESAPI context; it fetches handles through
                :meth:`memo` rather than keep them between calls.
            what: names the operation in error messages (default: ``fn.__name__``).
            timeout: seconds the TPM may spend on one command (a hung TPM); once the
                running command has taken longer, the job is abandoned (see :meth:`wait`).
            retry: when the connection turns out to be dead, reconnect and run ``fn``
                once more (only for idempotent work; provisioning passes False).

        Returns:
            What ``fn`` returns.

        Raises:
            SignerForkedError: this process was forked from the one that opened the device.
            CapsealError: typed errors only (see ``_errors.map_tss_error``); other
                exceptions from ``fn`` become DeviceError (the original is chained).
        """
        what = what or getattr(fn, "__name__", "TPM command").strip("<>")
        if threading.current_thread() is self._thread:  # re-entrant use from inside a job
            return self._run(fn, retry, what)
        return self.wait(self.submit(fn, what=what, retry=retry), timeout)

    def submit(self, fn: Callable[[Any], T], *, what: str, retry: bool = True) -> Future[T]:
        """Queue ``fn(ectx)`` for the worker and return at once. Why: a caller that
        keeps several commands queued keeps the TPM busy back to back, instead of
        leaving it idle while each result travels to the caller's thread and the
        next command back (the signing pipeline does this).

        Args:
            fn: the work, as for :meth:`call`.
            what: names the operation in error messages.
            retry: as for :meth:`call`.

        Returns:
            The job's future; :meth:`wait` for its result.

        Raises:
            RuntimeError: called from inside a job (it would wait on itself).
            SignerForkedError: this process was forked from the one that opened the device.
            SignerUnavailableError: the device was closed.
        """
        if threading.current_thread() is self._thread:
            raise RuntimeError("TPMDevice.submit from inside a job would wait on itself; use call()")
        if self._forked:  # checked first: in the child a closed device is a forked one
            raise self._fork_error()
        if self._closed:
            raise SignerUnavailableError(f"TPM {self.tcti}: this device handle was closed")
        fut: Future[T] = Future()
        self._jobs.put((fn, retry, what, fut))
        return fut

    def wait(self, fut: Future[T], timeout: float | None = None) -> T:
        """The result of a job queued with :meth:`submit`, as :meth:`call` returns it.
        The timeout bounds how long the TPM may spend on *one* command, not how
        long a job may wait its turn: a deep queue in front of a working TPM never
        times out. Once the command the worker is running has gone on for
        ``timeout`` since it started, the TPM is taken for hung, and every job
        waiting on it — queued or running — is abandoned at once (dropped if it
        has not started).

        Args:
            fut: the job's future.
            timeout: seconds one command may take (None: no limit).

        Returns:
            The job's result.

        Raises:
            SignerUnavailableError: the TPM hung, or the device was closed meanwhile.
            SignerForkedError: this process was forked after the job was queued.
            CapsealError: what the job raised (see :meth:`call`).
        """
        if self._forked:  # a job queued before the fork: no worker here will run it
            raise self._fork_error()
        while True:
            since = self._busy_since
            wait = 1.0 if timeout is None or since is None else min(1.0, max(0.0, since + timeout - time.monotonic()))
            try:
                return fut.result(wait)
            except _FutureTimeout:
                if not self._thread.is_alive():  # closed while this job was being queued
                    raise SignerUnavailableError(f"TPM {self.tcti}: this device handle was closed") from None
                since = self._busy_since
                if timeout is not None and since is not None and time.monotonic() >= since + timeout:
                    fut.cancel()
                    raise SignerUnavailableError(f"TPM {self.tcti} did not answer within {timeout} s") from None

    def info(self) -> TPMInfo:
        """What the TPM reports about itself (read once per connection).

        Returns:
            The TPM's :class:`TPMInfo`.

        Raises:
            SignerUnavailableError: the TPM is unreachable.
        """
        return self.call(lambda _ectx: self._current_info(), what="reading TPM properties")

    def memo(self, key: Hashable, factory: Callable[[Any], Any], *, flush: bool = False) -> Any:
        """Per-connection memo, for use *inside* a :meth:`call` function only.
        ``factory(ectx)`` runs once per connection; a reconnect forgets the value
        (an ESYS_TR from an old context means nothing in a new one). Entries
        marked ``flush`` are also flushed when a call fails with
        TPM_RC_OBJECT_MEMORY (swtpm has three slots); the call is then run once
        more and ``factory`` loads the object again.

        Args:
            key: the entry's key (a signer keeps its own token in it).
            factory: makes the value (an ESYS_TR, say).
            flush: the value is a transient object this device must flush when it
                forgets it (close, reconnect, :meth:`forget`).

        Returns:
            The value.

        Raises:
            RuntimeError: called outside a job.
        """
        self._assert_worker()
        hit = self._memo.get(key)
        if hit is not None:
            return hit[0]
        value = factory(self._ectx)
        handle = int(self._ectx.tr_get_tpm_handle(value)) if flush else None
        self._memo[key] = (value, flush, handle)
        self._note_owned()
        return value

    def cached(self, key: Hashable) -> Any | None:
        """The memo value for ``key`` on this connection; nothing is made. Inside a call only.

        Args:
            key: the entry's key.

        Returns:
            The value, or None.

        Raises:
            RuntimeError: called outside a job.
        """
        self._assert_worker()
        hit = self._memo.get(key)
        return None if hit is None else hit[0]

    def forget(self, key: Hashable, *, flush: bool = True) -> None:
        """Drop a memo entry (flushing it if it is a transient). Inside a call only.

        Args:
            key: the entry's key.
            flush: False only lets go of the ESYS_TR, for a handle that may now
                hold another process's object, which must not be flushed.

        Raises:
            RuntimeError: called outside a job.
        """
        self._assert_worker()
        hit = self._memo.pop(key, None)
        if hit is not None and hit[1]:
            if flush:
                self._flush_quietly(hit[0])
            else:
                self._tr_close_quietly(hit[0])
            self._note_owned()

    def make_room(self) -> None:
        """Flush this device's cached transient objects (they reload on demand),
        so a job that needs several slots (provisioning: SRK + key) gets them.
        Inside a call only.

        Raises:
            RuntimeError: called outside a job.
        """
        self._assert_worker()
        self._evict_cached_transients()

    def foreign_transients(self) -> list[int]:
        """The transient objects that no capseal device of this process holds (another
        process's, or a crashed one's). Inside a call only.

        Returns:
            Their TPM handles.

        Raises:
            RuntimeError: called outside a job.
        """
        self._assert_worker()
        return [h for h in transient_handles(self._ectx) if h not in owned_in_process(self.tcti)]

    @property
    def busy(self) -> bool:
        """Whether the worker is running a command now (diagnostics and tests)."""
        return self._busy_since is not None

    @property
    def waiting(self) -> int:
        """How many jobs wait in the queue behind the one running (diagnostics and tests)."""
        return self._jobs.qsize()

    @property
    def connected(self) -> bool:
        """Whether the device holds an ESAPI context now (it connects on its first call)."""
        return self._ectx is not None

    @property
    def generation(self) -> int:
        """Incremented on every (re)connect; lets callers notice a reconnect."""
        return self._generation

    def close(self) -> None:
        """Flush what this device loaded, close the context, stop the worker. Idempotent; raises nothing.

        In a forked process it only marks this copy closed: the worker is not
        there to stop, and closing the parent's ESAPI context here would end
        the parent's TCTI session (an mssim/swtpm TCTI says goodbye on the
        shared socket).
        """
        if self._forked:
            self._closed = True
            return
        with self._lock:
            if self._closed:
                return
            self._closed = True
        unregister(self)
        done: Future[None] = Future()
        self._jobs.put((_STOP, False, "close", done))  # the worker ends after what is queued before it
        if threading.current_thread() is self._thread:  # closed from inside a job: no waiting on itself
            self._disconnect(flush=True)
            return
        try:
            done.result(10)
        except Exception:  # a hung TPM must not hang interpreter shutdown
            pass

    # ------------------------------------------------------------------ worker side

    def _assert_worker(self) -> None:
        if threading.current_thread() is not self._thread:
            raise RuntimeError("TPMDevice.memo/forget may only be used inside TPMDevice.call")

    def _worker(self) -> None:
        while True:
            fn, retry, what, fut = self._jobs.get()
            if fn is _STOP:
                self._busy_since = time.monotonic()  # a hung TPM times out a job that slipped in, too
                self._disconnect(flush=True)
                fut.set_result(None)
                self._drain_after_close()
                self._busy_since = None
                return
            if not fut.set_running_or_notify_cancel():
                continue
            self._busy_since = time.monotonic()
            try:
                result = self._run(fn, retry, what)
            except BaseException as exc:  # handed to the caller, never lost
                fut.set_exception(exc)
            else:
                fut.set_result(result)
            finally:
                self._busy_since = None

    def _drain_after_close(self) -> None:
        while True:
            try:
                _fn, _retry, _what, fut = self._jobs.get_nowait()
            except queue.Empty:
                return
            if fut.set_running_or_notify_cancel():
                fut.set_exception(SignerUnavailableError(f"TPM {self.tcti}: this device handle was closed"))

    def _run(self, fn: Callable[[Any], T], retry: bool, what: str) -> T:
        """Run ``fn`` on this worker's context. With ``retry``: once more on a
        fresh connection after a transport failure of a stale one, or after a
        persistent object changed behind this context; once more after
        TPM_RC_OBJECT_MEMORY when this device's cached transients
        were given up (they reload on demand). A re-entrant call never frees
        slots: the outer job may hold objects it has not memoized. Objects
        capseal did not load are never flushed here (see OBJECT_MEMORY_HINT)."""
        reconnect = retry
        evict = retry
        stale = retry
        self._depth += 1
        try:
            while True:
                had_connection = self._ectx is not None
                ectx = self._connect()
                try:
                    return fn(ectx)
                except TSS2_Exception as exc:
                    if is_transport_error(exc):
                        self._disconnect(flush=False)
                        if reconnect and had_connection:  # a stale connection (TPM restarted since)
                            reconnect = False
                            continue
                    elif is_object_memory(exc) and evict and self._depth == 1:
                        evict = False
                        # only when our own cached objects are what fills the slots: with
                        # another process's there, evicting ours would stop a signer that
                        # works without making room for this job
                        if not self._others_hold_objects() and self._evict_cached_transients():
                            continue
                    raise map_tss_error(exc, self.tcti, what) from None
                except StaleHandleError as exc:
                    # a fresh context reads every name from the TPM again; not inside a
                    # re-entrant call, whose outer job holds objects of this context
                    if stale and self._depth == 1:
                        stale = False
                        self._disconnect(flush=False)
                        continue
                    raise DeviceError(f"{what} on TPM {self.tcti} failed: {exc}") from None
                except CapsealError:
                    raise
                except Exception as exc:  # tpm2-pytss type/value errors: still a typed error naming the TCTI
                    raise DeviceError(f"{what} on TPM {self.tcti} failed: {type(exc).__name__}: {exc}") from exc
        finally:
            self._depth -= 1

    def _connect(self) -> Any:
        if self._ectx is not None:
            return self._ectx
        check_tcti(self.tcti)  # a TCTI name is a library the TSS loads (cmd: runs a command): never an unknown one
        try:
            ectx = ESAPI(self.tcti)
        except TSS2_Exception as exc:
            raise map_tss_error(exc, self.tcti, "connect") from None
        except Exception as exc:  # bad TCTI string, missing TCTI library
            raise SignerUnavailableError(f"cannot open TCTI {self.tcti}: {type(exc).__name__}: {exc}") from None
        if self.flush_others:
            try:
                self._flush_leftovers(ectx)
            except TSS2_Exception as exc:
                _close_quietly(ectx)
                raise map_tss_error(exc, self.tcti, "flushing leftover transient objects") from None
        self._ectx = ectx
        self._memo = {}
        self._note_owned()
        self._info = None
        self._generation += 1
        return ectx

    def _flush_leftovers(self, ectx: Any) -> None:
        """Flush transient objects and loaded sessions (HMAC and policy) nobody
        owns any more (a crashed run on a TPM without a resource manager).
        Objects other capseal devices of this process keep cached are left
        alone; one another device's job holds only for the job's length (an
        SRK while a key file loads) is not known here: one process keeps one
        device per TPM (:func:`get_device`), doctor's private one aside."""
        owned = owned_in_process(self.tcti)
        flush_handles(ectx, [h for h in transient_handles(ectx) if h not in owned])
        flush_handles(ectx, session_handles(ectx))

    def _others_hold_objects(self) -> bool:
        """Whether transient objects this process did not load are in the TPM
        (asked on the TPM_RC_OBJECT_MEMORY path: a failure to ask counts as
        yes, so nothing is evicted and the original error is raised)."""
        try:
            return bool(self.foreign_transients())
        except Exception:  # noqa: BLE001 - the caller raises the typed error it already has
            return True

    def _evict_cached_transients(self) -> bool:
        """Flush every memoized transient (``flush=True``); True if there was one."""
        victims = [k for k, (_v, is_transient, _h) in self._memo.items() if is_transient]
        for key in victims:
            value, _, _ = self._memo.pop(key)
            self._flush_quietly(value)
        self._note_owned()
        return bool(victims)

    def _note_owned(self) -> None:
        self._owned = frozenset(h for _v, t, h in self._memo.values() if t and h is not None)

    def _current_info(self) -> TPMInfo:
        if self._info is None:
            self._info = read_info(self._ectx, self.tcti)
        return self._info

    def _tr_close_quietly(self, tr: Any) -> None:
        if self._ectx is None:
            return
        try:
            self._ectx.tr_close(tr)
        except Exception:
            pass

    def _flush_quietly(self, tr: Any) -> None:
        if self._ectx is None:
            return
        try:
            self._ectx.flush_context(tr)
        except Exception:
            pass

    def _disconnect(self, *, flush: bool) -> None:
        ectx, self._ectx = self._ectx, None
        memo, self._memo = self._memo, {}
        self._owned = frozenset()
        if ectx is None:
            return
        if flush:
            for value, is_transient, _handle in memo.values():
                if is_transient:
                    try:
                        ectx.flush_context(value)
                    except Exception:
                        pass
        _close_quietly(ectx)


def _close_quietly(ectx: Any) -> None:
    try:
        ectx.close()
    except Exception:
        pass


# ---------------------------------------------------------------------------- registry


def get_device(tcti: str | None = None) -> TPMDevice:
    """The process-wide device for a TPM, created on first use; it connects
    lazily, on the first call.

    Args:
        tcti: the TPM (default ``device:/dev/tpmrm0``).

    Returns:
        The :class:`TPMDevice` (one per TCTI in this process).
    """
    return registered((tcti or DEFAULT_TCTI).strip(), TPMDevice)


def close_all() -> None:
    """Close every device of the registry (each flushes what capseal loaded).
    Run at exit, after every open producer is closed (:mod:`capseal.process`)."""
    for dev in registered_devices():
        dev.close()


process.at_exit("devices", close_all)  # after open producers have had their records signed
