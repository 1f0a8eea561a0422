"""A signing pipeline for devices that sign outside the GIL (tokens, TPMs).

Why: a PKCS#11 token or TPM spends much of each signature in C code that
releases the GIL, while capseal's own work per record (canonical form, model,
Class-1 self-check, the ledger) needs the GIL. Done one after the other the
two add up; done in three stages they overlap, and the device sets the pace:

1. the caller's thread prepares the capsule and the bytes to be signed (every
   refusal of the caller's input happens here, before anything is queued);
2. one signing thread does nothing but call the device, so it is never idle
   while there is work;
3. one finishing thread checks each signature, assembles the envelope and
   hands the record to the ledger's group commit.

A device with its own command queue (a TPM: ``Signer.queues_signatures``)
needs no signing thread: ``begin(job)`` queues the signature on the device
from the caller's thread and the finishing thread takes the results in order,
so the device's commands run back to back instead of waiting for each result
to travel to a thread and the next command back.

Order is kept end to end (single-threaded FIFO stages), a device error fails
only its own record (nothing is written for it), and the jobs under way are
bounded (``depth``) so a slow device pushes back on callers instead of growing
memory.

The hand-offs are ``queue.SimpleQueue`` (C, one lock: ``queue.Queue`` makes a
``Condition`` waiter per blocking call) and the bound is kept on the
pipeline's own count of jobs under way. A caller that finds the pipeline full
waits for one job to finish, not for a batch, and each finished job wakes one
waiting caller, so the GIL goes to the signing thread once per record instead
of staying with a caller refilling in bursts while the token idles.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from typing import Any, NamedTuple, TypeVar

from ..errors import LedgerClosedError, SignerUnavailableError

__all__ = ["CloseOnce", "CloseOutcome", "SigningPipeline"]

_STOP = object()
_QUEUED, _CLAIMED, _WITHDRAWN = 0, 1, 2
_CLOSE_WAIT = 30.0  # s close() waits for puts under way before it stops the pipeline
_FINISHING_WAIT = 5.0  # s close(timeout), giving up on the device, waits for jobs already past it


def _left(deadline: float | None, cap: float | None = None) -> float | None:
    """Seconds to ``deadline`` (never below 0), at most ``cap``; None = no limit."""
    if deadline is None:
        return cap
    left = max(0.0, deadline - time.monotonic())
    return left if cap is None else min(left, cap)


_T = TypeVar("_T")


class CloseOnce:
    """A close done once for every caller, and done again by the next caller
    when a Ctrl-C stopped it halfway (so each step of it must repeat).

    Why: a close may wait long (PKCS#11 cannot cancel a call into a hung
    token); a second caller must neither return before the first has
    finished nor wait for ever behind one an interrupt stopped. Used by
    :meth:`SigningPipeline.close` and ``Producer.close``."""

    def __init__(self, lock: Any) -> None:
        self._lock = lock  # the owner's lock: ``start`` runs under it
        self._running = False
        self.done = threading.Event()

    def run(self, body: Callable[[], _T], deadline: float | None,
            start: Callable[[], None] | None = None) -> _T | None:
        """``body()``'s result, or None when a close has already finished.
        ``start()`` runs under the lock as this caller takes the close on (if
        it raises, nothing is taken). While another caller's close is under
        way this one waits for it; TimeoutError when ``deadline`` passes first."""
        mine = False
        try:
            while True:
                with self._lock:
                    if self.done.is_set():
                        return None
                    if not self._running:
                        if start is not None:
                            start()
                        self._running = mine = True  # one statement: an interrupt cannot split them
                        break
                # another close is under way: wait for it, and take over if a Ctrl-C stops it
                if self.done.wait(_left(deadline, 0.1)):
                    return None
                if deadline is not None and time.monotonic() >= deadline:
                    raise TimeoutError
            result = body()
        except BaseException:
            if mine:
                self._running = False  # interrupted: the next caller does it again
            raise
        self.done.set()
        return result


class _Ticket:
    """One job on its way. ``state`` (changed under the pipeline's lock) says
    who accounts for it: whoever *claimed* it (the finishing thread, or
    close() giving up on the device), or ``put`` when an interrupt made it
    *withdraw* the job — only ever one of them."""

    __slots__ = ("job", "state", "pending", "seq", "unregistered", "signed")

    def __init__(self, job: Any) -> None:
        self.job, self.state = job, _QUEUED
        self.pending: Any = None  # begin mode: the signature queued on the device
        self.seq = 0  # order of registration (drain() waits for the jobs put before it)
        self.unregistered = False  # put's bookkeeping done (it may be retried after an interrupt)
        self.signed = False  # the signing thread has the device's answer (close() lets it finish)

    def cancel(self) -> None:
        """The job will not be finished: drop its command from the device's
        queue if it has not started (a TPM would otherwise sign for nothing,
        holding up every later user of the device)."""
        if self.pending is not None:
            try:
                self.pending.cancel()
            except Exception:  # noqa: BLE001 - a best effort; the job is settled either way
                pass


class CloseOutcome(NamedTuple):
    """What close(timeout) had to give up: jobs the device had not answered
    (failed, not written), and jobs past the device still finishing when the
    wait for them ran out (they may yet be written)."""

    given_up: int
    finishing: int


class SigningPipeline:
    """Three-stage pipeline: ``put(job)``; ``sign(job)`` runs on the signing
    thread and ``finish(job, signature)`` on the finishing thread; ``fail(job,
    exc)`` is called instead when either raises.

    With ``begin`` instead of ``sign``: ``put`` calls ``begin(job)`` (which
    must return at once with an object whose ``result()`` gives the
    signature) and there is no signing thread."""

    def __init__(
        self,
        name: str,
        sign: Callable[[Any], Any] | None,
        finish: Callable[[Any, Any], None],
        fail: Callable[[Any, BaseException], None],
        *,
        begin: Callable[[Any], Any] | None = None,
        depth: int = 256,
    ) -> None:
        if (sign is None) == (begin is None):
            raise ValueError("a signing pipeline takes exactly one of sign and begin")
        if depth < 1:
            raise ValueError("depth >= 1")
        self._sign, self._begin, self._finish, self._fail = sign, begin, finish, fail
        self._to_sign: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._to_finish: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._depth = depth
        mutex = threading.Lock()
        self._lock = threading.Condition(mutex)  # drain() and close() wait on it
        self._room = threading.Condition(mutex)  # callers waiting for the pipeline to drain below depth
        # jobs put and not yet finished, failed or withdrawn, in the order they were put
        self._live: dict[_Ticket, None] = {}
        self._seq = 0
        self._putting = 0
        self._waiting_for_room = 0
        # marks of the threads waiting in drain() or for close()'s last jobs: each
        # waits until every job put before its mark is done
        self._drain_marks: list[int] = []
        self._closed = False
        self._abandoning: list[_Ticket] = []  # claimed by close() giving up, not yet failed
        self._given_up = 0  # jobs close() gave up on (kept across a close() taking over)
        self._closing = CloseOnce(self._lock)
        self._outcome = CloseOutcome(0, 0)  # what the close that finished gave up
        self._stopped = False  # the threads have ended, or close() gave up waiting for them
        self._threads = [threading.Thread(target=self._finish_loop, name=f"capseal-finish:{name}", daemon=True)]
        if begin is None:
            self._threads.append(threading.Thread(target=self._sign_loop, name=f"capseal-sign:{name}", daemon=True))
        for t in self._threads:
            t.start()

    def put(self, job: Any) -> None:
        """Hand ``job`` to the device; waits while ``depth`` jobs are under way."""
        ticket = _Ticket(job)
        registered = handed = False
        try:  # opened before the counts go up: an interrupt anywhere after that undoes them
            with self._lock:
                if len(self._live) >= self._depth and not self._closed:
                    self._waiting_for_room += 1
                    try:
                        self._room.wait_for(lambda: self._closed or len(self._live) < self._depth)
                    except BaseException:
                        # interrupted: pass on the wake-up this caller may have
                        # taken, so no other caller sleeps beside a free place
                        if len(self._live) < self._depth:
                            self._room.notify()
                        raise
                    finally:
                        self._waiting_for_room -= 1
                if self._closed:
                    raise LedgerClosedError("the signing pipeline is closed")
                self._putting += 1  # close() queues its stop only after every put under way
                ticket.seq, self._seq = self._seq, self._seq + 1
                self._live[ticket] = None
                registered = True
            if self._begin is None:
                self._to_sign.put(ticket)
            else:
                try:
                    ticket.pending = self._begin(job)
                except Exception as exc:  # noqa: BLE001 - failed like a signature that failed, in order
                    self._to_finish.put((ticket, None, exc))
                else:
                    self._to_finish.put((ticket, ticket.pending, None))
            handed = True
            if ticket.state != _QUEUED:  # given up by close() while begin() ran: its command is not wanted
                ticket.cancel()
            if self._stopped:  # close() gave up waiting for this put: nobody will finish the job
                self._fail_leftovers()
        finally:
            if registered:
                interrupt: BaseException | None = None
                while True:  # a second Ctrl-C must not skip the bookkeeping (flush would wait for ever)
                    try:
                        self._unregister(ticket, handed)
                        break
                    except KeyboardInterrupt as exc:
                        interrupt = exc
                if interrupt is not None:
                    raise interrupt

    def _unregister(self, ticket: _Ticket, handed: bool) -> None:
        """The end of a put: it is no longer under way, and a job it could not
        hand over is withdrawn. Each step can be repeated (put retries this
        after an interrupt) and checks its own state, so an interrupt between
        two steps leaves nothing half done."""
        with self._lock:
            if not ticket.unregistered:
                self._putting -= 1
                ticket.unregistered = True  # no call between these two: an interrupt cannot split them
            if not handed and ticket.state == _QUEUED:
                # interrupted (KeyboardInterrupt): the caller learns it and the job
                # is withdrawn unless the finishing thread has taken it already
                # (then it is sealed, though the caller saw the interrupt)
                ticket.state = _WITHDRAWN
            if ticket.state == _WITHDRAWN and ticket in self._live:
                self._retire(ticket)
            if self._closed and self._putting == 0:
                self._lock.notify_all()  # close() may be waiting for this
        if ticket.state == _WITHDRAWN:
            ticket.cancel()

    def _retire(self, ticket: _Ticket) -> None:
        """A job is done with (the lock held): wake whoever waits on that.
        The wake-ups come first: interrupted between them, the job is still
        live and the caller's retry does it all again. Retiring a job twice
        does nothing the second time."""
        if ticket not in self._live:
            return
        if self._waiting_for_room:
            self._room.notify()  # one place freed, one caller woken (not all of them, each record)
        if self._drain_marks:
            live = iter(self._live)
            if next(live) is ticket:  # the oldest job: a drain may be over (else it is not)
                after = next(live, None)
                if after is None or after.seq >= min(self._drain_marks):
                    self._lock.notify_all()
        del self._live[ticket]

    @property
    def busy(self) -> bool:
        """Jobs are on their way (put and not yet in the ledger's queue or failed)."""
        return bool(self._live)

    @property
    def outstanding(self) -> int:
        """Jobs put and not yet finished, failed or withdrawn."""
        return len(self._live)

    def drain(self, timeout: float | None = None) -> bool:
        """Wait until every job put so far has been finished or failed (not
        those put meanwhile: under a steady stream from other threads, waiting
        for an empty pipeline could last for ever)."""
        with self._lock:
            return self._wait_done_before(self._seq, timeout)

    def _wait_done_before(self, mark: int, timeout: float | None) -> bool:
        """Wait (the lock held) until every job put before ``mark`` is done.
        ``_retire`` wakes waiters only when the oldest job goes and the next
        is past the smallest mark: not at every record of a long flush."""
        self._drain_marks.append(mark)
        try:
            return self._lock.wait_for(lambda: not self._live or next(iter(self._live)).seq >= mark, timeout)
        finally:
            self._drain_marks.remove(mark)

    def close(self, timeout: float | None = None) -> CloseOutcome:
        """Finish what was put, then stop both threads. Idempotent. A job that
        still arrives after the stop (a put whose hand-over to the device took
        longer than close() waits) is failed, never left unresolved; a caller
        waiting for room gets LedgerClosedError.

        ``timeout`` bounds the wait for the device: a call into a token
        cannot be cancelled (PKCS#11 has no way), so a hung one would hold
        close() for ever. When it runs out, every job the device has not
        answered — queued, or on the device now — fails with
        SignerUnavailableError (its command dropped from a device's own queue
        if it has not started); jobs already past the device are let finish
        (up to 5 s more), and the threads end by themselves if the device
        ever answers. Returns what it gave up (all 0 when the device finished
        in time)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            self._closing.run(lambda: self._close(timeout, deadline), deadline)
        except TimeoutError:  # another close() is still finishing these
            with self._lock:
                return CloseOutcome(0, len(self._live))
        return self._outcome

    def _close(self, timeout: float | None, deadline: float | None) -> None:
        """The steps of close(); each can be repeated (see :class:`CloseOnce`)."""
        with self._lock:
            self._closed = True
            self._room.notify_all()  # callers waiting for room learn that it is closed
            # their jobs go in before the stop
            self._lock.wait_for(lambda: self._putting == 0, _left(deadline, _CLOSE_WAIT))
            late = self._putting > 0
        (self._to_sign if self._begin is None else self._to_finish).put(_STOP)  # repeated: harmless
        for t in self._threads:
            t.join(_left(deadline))
        if any(t.is_alive() for t in self._threads) or (late and timeout is not None):
            self._outcome = self._abandon(timeout)  # a put it stopped waiting for is given up, and counted
        else:
            self._stopped = True  # before the sweep: a put landing after it sweeps for itself
            self._fail_leftovers()

    def _abandon(self, timeout: float | None) -> CloseOutcome:
        """close() ran out of time with the device still busy: fail every job
        not yet finished, and leave the threads a way out.

        Every live job is claimed at once, under the lock: whatever the
        threads do next (the device may answer this very moment) finds it
        claimed and leaves it alone, so each job is failed once and the count
        is exact. Repeatable: a close() interrupted in here (Ctrl-C) leaves
        the jobs it claimed in ``_abandoning``, and the close() that takes
        over fails them (failing twice is harmless) and keeps the count."""
        with self._lock:
            # with the claim: a put landing before it is claimed here, one after it sweeps for itself
            self._stopped = True
            # a signature the signing thread already has is past the device: let it finish
            given_up = [ticket for ticket in self._live if ticket.state == _QUEUED and not ticket.signed]
            for ticket in given_up:
                ticket.state = _CLAIMED
            self._abandoning += given_up
            self._given_up += len(given_up)
        error = SignerUnavailableError(f"close() gave up on the device {timeout} s in, before this record was "
                                       "signed and checked; it was not written")
        while self._abandoning:
            ticket = self._abandoning[0]
            ticket.cancel()
            self._complete(ticket, None, error)
            self._abandoning.pop(0)  # only once it is failed and retired
        # once the device answers, both threads end. With a signing thread the
        # stop reaches the finishing thread through it, behind its last job: a
        # stop put straight into _to_finish could overtake a signed job
        self._to_sign.put(_STOP)
        if self._begin is not None:
            self._to_finish.put(_STOP)
        # jobs past the device (signed, or claimed by the finishing thread:
        # checking a signature, handing it to the ledger): let them end before
        # the ledger closes; any still going are reported apart (they may yet be written)
        with self._lock:
            self._wait_done_before(self._seq, _FINISHING_WAIT)  # nothing is put any more: all of them
            return CloseOutcome(self._given_up, len(self._live))

    def _fail_leftovers(self) -> None:
        """Fail every job still queued once the pipeline's threads have stopped."""
        self._sweep(LedgerClosedError("the signing pipeline closed before this record was signed"))

    def _sweep(self, error: BaseException) -> None:
        """Fail every job still queued. A stop found on the way is put back:
        a thread that is still running needs it to end."""
        for q in (self._to_sign, self._to_finish):
            stops = 0
            while True:
                try:
                    item = q.get_nowait()
                except queue.Empty:
                    break
                if item is _STOP:
                    stops += 1
                else:
                    ticket = item if isinstance(item, _Ticket) else item[0]
                    self._settle(ticket, None, error)
                    ticket.cancel()  # settled now or before: its command on a device queue is not wanted
            for _ in range(stops):
                q.put(_STOP)

    def _sign_loop(self) -> None:
        sign = self._sign
        assert sign is not None
        while True:
            ticket = self._to_sign.get()
            if ticket is _STOP:
                self._to_finish.put(_STOP)
                return
            if ticket.state != _QUEUED:  # withdrawn, or given up by close(): not wanted (a benign race
                continue                 # may still make one signature for nothing)
            try:
                signature = sign(ticket.job)
            except BaseException as exc:  # noqa: BLE001 - the job's owner learns it; the device may recover
                self._to_finish.put((ticket, None, exc))
                continue
            ticket.signed = True  # before the hand-over: close() then leaves it to the finishing thread
            self._to_finish.put((ticket, signature, None))

    def _finish_loop(self) -> None:
        queued_on_device = self._begin is not None
        while True:
            item = self._to_finish.get()
            if item is _STOP:
                return
            ticket, signature, error = item
            if queued_on_device and error is None:
                # wait for the device *before* claiming the job: until then
                # close() can still give it up (a hung TPM must not hold it)
                if ticket.state != _QUEUED:
                    ticket.cancel()
                    continue
                try:
                    signature = signature.result()
                except BaseException as exc:  # noqa: BLE001 - the job's owner learns it
                    error = exc
            self._settle(ticket, signature, error)

    def _settle(self, ticket: _Ticket, signature: Any, error: BaseException | None) -> None:
        """Finish or fail one job, unless it was withdrawn or given up already:
        each job is accounted for once."""
        with self._lock:
            if ticket.state != _QUEUED:
                return
            ticket.state = _CLAIMED
        self._complete(ticket, signature, error)

    def _complete(self, ticket: _Ticket, signature: Any, error: BaseException | None) -> None:
        """Finish a claimed job (or fail it: ``error``), then retire it."""
        job = ticket.job
        try:
            if error is None:
                try:
                    self._finish(job, signature)
                except BaseException as exc:  # noqa: BLE001
                    error = exc
            if error is not None:
                try:
                    self._fail(job, error)
                except Exception:  # noqa: BLE001 - a failing callback must not stop the pipeline
                    pass
        finally:
            with self._lock:
                self._retire(ticket)
