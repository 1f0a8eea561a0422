"""One child of a signing process (see ``_signing_process``): its pipes, the
requests it has not answered yet, the thread that reads its answers, and
how it is retired, stopped or killed.
"""

from __future__ import annotations

import collections
import ctypes
import errno
import json
import logging
import os
import select
import subprocess
import threading
import time
from collections.abc import Callable
from typing import Any, NamedTuple

from capseal import process
from capseal.errors import SignerUnavailableError
from capseal.keys import PendingSignature, SignatureResult
from capseal.keys.secret import Secret

from ._direct import SIGNATURE_BUFFER
from ._signing_main import ANSWER, HEADER, frame

__all__ = ["Child", "ChildRequest", "Outcome", "is_stopped", "send_secret"]

log = logging.getLogger("capseal.keys.pkcs11")

_POLL = 0.2  # s: how often a waiting result() looks whether the child is stopped (or past its timeout)


class Outcome(NamedTuple):
    """How a signer turns a child's answer into a result: ``finish`` checks the
    signature's bytes and makes the result; ``sign_here`` makes the signature in
    this process (the signer's own path: typed errors, reconnect) when the
    child could not."""

    sign_here: Callable[[bytes], SignatureResult]
    finish: Callable[[bytes], SignatureResult]


def _libc_write() -> Any:
    """libc's write(2) called with the GIL held (``ctypes.PyDLL``); None where
    there is none to call."""
    try:
        write = ctypes.PyDLL(None, use_errno=True).write
    except (OSError, AttributeError):
        return None
    write.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t]
    write.restype = ctypes.c_ssize_t
    return write


_LIBC_WRITE = _libc_write()
_PIPE_BUF = getattr(select, "PIPE_BUF", 512)  # POSIX: writes of up to this many bytes to a pipe are atomic


def _send(fd: int, data: bytes | bytearray, direct: bool = True) -> None:
    """Write ``data`` whole to a child's stdin, a non-blocking pipe.

    Why not ``os.write`` alone: it lets go of the GIL and takes it back, and
    with the producer's threads busy that hand-off costs each request CPU
    time the request itself does not need. A request is a few hundred bytes,
    below PIPE_BUF, which a pipe takes whole or refuses at once (EAGAIN), so
    libc's write with the GIL held never blocks; only when the pipe is full
    does this wait for the child to read, with the GIL released (select).
    A closed pipe raises BrokenPipeError, as ``os.write`` does. Without
    ``direct`` (``CAPSEAL_NO_DIRECT``), only ``os.write`` is used."""
    written = 0
    if direct and _LIBC_WRITE is not None and 0 < len(data) <= _PIPE_BUF:
        written = _LIBC_WRITE(fd, bytes(data), len(data))
        if written == len(data):
            return
        if written < 0:
            err = ctypes.get_errno()
            if err not in (errno.EAGAIN, errno.EWOULDBLOCK, errno.EINTR):
                raise OSError(err, os.strerror(err))
            written = 0
    view = memoryview(data)[written:]  # what the first try left (all of it when it was refused or not made)
    while view:
        try:
            view = view[os.write(fd, view):]
        except BlockingIOError:
            select.select([], [fd], [])  # room in the pipe, or its reader gone (then write raises)


def send_secret(fd: int, secret: Secret) -> None:
    """Write a Secret's bytes whole to a non-blocking pipe, never holding them
    in a variable (see :func:`_send` for the waiting).

    Args:
        fd: the pipe's write end.
        secret: what to write.
    """
    written = 0
    while written < secret.size():
        try:
            written += os.write(fd, memoryview(secret.encoded())[written:])
        except BlockingIOError:
            select.select([], [fd], [])



class ChildRequest(PendingSignature):
    """A signature requested from a child. The signer's :class:`Outcome` makes
    it in this process when the child cannot, and turns the bytes into a
    ``SignatureResult``."""

    __slots__ = ("_outcome", "_payload", "_child", "_ready", "_signature", "_failure")

    def __init__(self, outcome: Outcome, payload: bytes, child: Child) -> None:
        self._outcome, self._payload, self._child = outcome, payload, child
        self._ready = threading.Lock()
        self._ready.acquire()  # released once the answer (or the child's end) is in
        self._signature: bytes | None = None
        self._failure: str | None = None

    def settle(self, signature: bytes | None, failure: str | None = None) -> None:
        """Hand over the answer.

        Args:
            signature: the child's signature, or None: it is made in this
                process on ``result()``.
            failure: why the signature cannot be made at all (the child was
                killed while the token hung).
        """
        self._signature, self._failure = signature, failure
        self._ready.release()

    def result(self) -> SignatureResult:
        """Wait for the child's answer (see :meth:`PendingSignature.result`).

        Returns:
            The signature, checked by the signer's ``finish``.

        Raises:
            SignerUnavailableError: the child was killed while the token hung.
            SignerError: what the signer's own path raises, for a signature
                the child could not make.
        """
        # blocks until settled (then free for any later call); a child found
        # stopped, or answering nothing for answer_timeout, is killed, which settles this
        while not self._ready.acquire(timeout=_POLL):
            self._child.kill_if_hung(stopped=True)
        self._ready.release()
        if self._failure is not None:
            raise SignerUnavailableError(self._failure,
                                         hint="check the token (a network HSM's connection, a card reader); open the "
                                              "signer with a longer timeout= if it is only slow")
        if self._signature is None:
            return self._outcome.sign_here(self._payload)
        return self._outcome.finish(self._signature)



class _OutOfStep(Exception):
    """An answer whose sequence number is not the one expected."""


class Child:
    """One child process, its pipes and the requests it has not answered yet
    (in order: the child answers in the order it reads).

    Who touches the file descriptors: every write to stdin happens under
    ``_lock`` while ``accepting``, and stdin is closed only under ``_lock``
    (so a write never lands on a reused fd number). stdout is read by the
    thread that started the child until ``start_reader``, then only by the
    reader; it is closed by the reader when it ends, or by the starter when
    the child is discarded before a reader ever ran."""

    def forget_after_fork(self) -> None:
        """In a process forked from this one (multiprocessing's ``fork``): let go
        of this child's pipes. Otherwise the fork holds the write end of the
        child's stdin, and the child would live on until the fork exits, after
        this process is gone. The fork has no reader threads: its copy of this
        object is dead, and signing there goes in-process."""
        self.accepting = False
        self._lock = threading.Lock()  # a thread that held it at the fork does not exist here
        self._settle_all()  # nobody here will read their answers
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                try:
                    pipe.close()
                except OSError:
                    pass

    def __init__(self, proc: subprocess.Popen[bytes], answer_timeout: float | None, where: str = "a PKCS#11 key", *,
                 direct: bool = True) -> None:
        """Take over a started child's pipes.

        Args:
            proc: the child process, its stdin and stdout pipes.
            answer_timeout: seconds it may answer nothing while requests wait (None: no limit).
            where: names the token and key in messages.
            direct: write requests with libc's write while holding the GIL (off
                under ``CAPSEAL_NO_DIRECT``).
        """
        self._direct = direct
        self.proc = proc
        self.where = where
        #: set when the child was killed for hanging: why the requests it had fail
        self.failure: str | None = None
        assert proc.stdin is not None and proc.stdout is not None
        self._wfd, self._rfd = proc.stdin.fileno(), proc.stdout.fileno()
        os.set_blocking(self._wfd, False)  # see _send: a write never blocks holding the GIL
        self._lock = threading.Lock()  # one writer at a time; the order of writes is the order of _waiting
        self._waiting: collections.deque[ChildRequest] = collections.deque()
        self.accepting = True  # False once retired: no new requests
        self.answer_timeout = answer_timeout
        self._progress = time.monotonic()  # the last answer, or when the queue last went from empty to not
        self._sequence = 0  # of the next answer
        self._reader: threading.Thread | None = None
        _LIVE.add(self)

    # -- start (on the starting thread, before the reader runs)

    def handshake(self, request: Secret, deadline: float) -> dict[str, Any]:
        """Send the start ``request`` (it holds the PIN: written from the
        Secret, then wiped) and read the child's answer.

        Args:
            request: the start frame (see ``_signing_process``).
            deadline: ``time.monotonic()`` by which the answer must be in.

        Returns:
            The child's JSON answer.

        Raises:
            EOFError: the child exited (or was stopped by close()).
            TimeoutError: no answer by ``deadline``.
            OSError, ValueError: a broken pipe, or an answer that is not JSON.
        """
        try:
            with self._lock:
                if not self.accepting:  # stopped by close() meanwhile: its stdin is closed
                    raise EOFError
                send_secret(self._wfd, request)
        finally:
            request.wipe()  # nothing keeps the PIN, not a later traceback's locals
        answer: dict[str, Any] = json.loads(self._read(HEADER.unpack(self._read(HEADER.size, deadline))[0], deadline))
        return answer

    def sign_now(self, payload: bytes, deadline: float) -> bytes | None:
        """One request answered before the reader starts (the self-test).

        Args:
            payload: the bytes to sign.
            deadline: ``time.monotonic()`` by which the answer must be in.

        Returns:
            The signature; None when the module refused.

        Raises:
            EOFError: the child exited, or answered out of step.
            TimeoutError: no answer by ``deadline``.
        """
        self._write_or_eof(frame(payload))
        status, sequence, size = ANSWER.unpack(self._read(ANSWER.size, deadline))
        body = self._read(size, deadline) if size else b""
        if sequence != self._sequence:
            raise EOFError
        self._sequence += 1
        return body if status == 0 else None

    def _write_or_eof(self, data: bytes | bytearray) -> None:
        with self._lock:
            if not self.accepting:  # stopped by close() meanwhile: its stdin is closed
                raise EOFError
            _send(self._wfd, data, self._direct)

    def _read(self, n: int, deadline: float) -> bytes:
        chunks, left = [], n
        while left:
            wait = deadline - time.monotonic()
            if wait <= 0 or not select.select([self._rfd], [], [], wait)[0]:
                raise TimeoutError
            chunk = os.read(self._rfd, left)
            if not chunk:
                raise EOFError
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)

    def start_reader(self, on_end: Callable[[Child, bool], None]) -> None:
        """Read answers until the child ends; ``on_end(child, refused)`` when it
        takes no more requests (refused: the token said no to one).

        Args:
            on_end: called from the reader thread when the child takes no more requests.

        Raises:
            RuntimeError: no thread could be started.
        """
        reader = threading.Thread(target=self._read_loop, args=(on_end,),
                                  name=f"capseal-signing-process-{self.proc.pid}", daemon=True)
        with self._lock:  # stop() decides under it whether a reader will settle the queue
            reader.start()  # RuntimeError (no threads): no reader, as before
            self._reader = reader

    # -- work

    def send(self, outcome: Outcome, payload: bytes) -> ChildRequest | None:
        """The request, written to the child; None when the child takes no more.

        Args:
            outcome: how the signer turns the answer into a result.
            payload: the bytes to sign.

        Returns:
            The pending request; None when the child takes no more.
        """
        pending = ChildRequest(outcome, payload, self)
        with self._lock:
            if not self.accepting:
                self._retire_locked()  # the reader may have left closing stdin to the lock's holder
                return None
            written = False
            try:
                if not self._waiting:
                    self._progress = time.monotonic()
                self._waiting.append(pending)  # before the write: the answer may come back at once
                _send(self._wfd, frame(payload), self._direct)
                written = self.accepting  # the reader may have retired the child meanwhile
            except OSError:  # the child is gone: its reader fails what it had
                if self._waiting and self._waiting[-1] is pending:
                    self._waiting.pop()  # ours: appends happen only under this lock
                return None
            finally:
                if not written:
                    # a broken pipe, a retirement the reader could not finish, or an
                    # interrupt (Ctrl-C) anywhere from the append on: the child's stream
                    # may hold half a frame, or none for a request that waits in the
                    # queue, either of which would put every later answer out of
                    # step. Nothing more is written; the child answers what it read
                    # whole, then exits, and the reader settles the rest (in-process)
                    self._retire_locked()
        return pending

    def kill_if_hung(self, *, stopped: bool = False) -> None:
        """Kill the child if requests wait and it cannot answer them: nothing
        has been answered for ``answer_timeout`` seconds while it runs (the
        token hangs: its requests fail, see ``failure``), or, when asked
        (``stopped``: a caller that has waited a while, never the hot path,
        as it reads ``/proc``), it is stopped: its requests are then made
        in-process, as for a child that died. Its reader then settles them all.

        Args:
            stopped: also look whether the child is stopped (reads ``/proc``).
        """
        if not self._waiting or self.proc.poll() is not None:
            return
        silent = time.monotonic() - self._progress
        if stopped and is_stopped(self.proc.pid):
            log.warning("signing process %d is stopped; killing it and signing its requests in this process",
                        self.proc.pid)
        elif self.answer_timeout is not None and silent > self.answer_timeout:
            log.warning("signing process %d answered nothing for %.0f s; killing it", self.proc.pid, silent)
            self.failure = (f"{self.where}: the signing process answered nothing for {silent:.1f} s (timeout "
                            f"{self.answer_timeout:g} s) while it ran: the token seems to hang; the process was "
                            "killed and this signature was not made")
        else:
            return
        self.accepting = False
        self.proc.kill()

    def _read_loop(self, on_end: Callable[[Child, bool], None]) -> None:
        buffer, refused = b"", False
        try:
            while True:
                chunk = os.read(self._rfd, 1 << 16)
                if not chunk:
                    return
                buffer += chunk
                at = 0
                while len(buffer) - at >= ANSWER.size:
                    status, sequence, size = ANSWER.unpack_from(buffer, at)
                    if sequence != self._sequence or size > SIGNATURE_BUFFER:
                        raise _OutOfStep
                    if len(buffer) - at - ANSWER.size < size:
                        break
                    start = at + ANSWER.size
                    at = start + size
                    refused = refused or status != 0
                    self._sequence = (sequence + 1) & 0xFFFFFFFF
                    self._progress = time.monotonic()
                    self._waiting.popleft().settle(buffer[start:at] if status == 0 else None)
                buffer = buffer[at:]
                if refused and self.accepting:
                    self._retire_from_reader()
                    on_end(self, True)
        except (OSError, IndexError, _OutOfStep):
            # the pipe broke, an answer nobody asked for, or one out of step (bytes
            # that are not the protocol's): this child is done
            if self.proc.poll() is None:
                log.warning("signing process %d answered out of step; killing it", self.proc.pid)
                self.proc.kill()
        finally:
            try:
                self._retire_from_reader()
            except BaseException:  # noqa: BLE001 - whatever happens, the queue is settled below
                self.accepting = False
            with self._lock:  # the child is gone or going: a writer blocked on its pipe is freed
                self.accepting = False
                self._settle_all()
            if self.proc.stdout is not None:
                self.proc.stdout.close()  # the reader owns it now; nobody else reads it
            on_end(self, refused)

    # -- end

    def _retire_from_reader(self) -> None:
        """The reader retires the child without waiting for the lock: a writer
        holding it may be blocked on a full pipe, which the child only drains
        once the reader takes its answers."""
        self.accepting = False
        if not self._retire_within(0.0):  # a writer holds it: a helper waits for it (the reader goes on draining)
            try:
                threading.Thread(target=self.retire, name="capseal-signing-process-retire", daemon=True).start()
            except RuntimeError:  # no threads to be had: wait here (a writer stuck on a full pipe is all but unheard of)
                self.retire()

    def retire(self) -> None:
        """Take no more requests and close the child's stdin (it then answers what it read and exits)."""
        with self._lock:
            self._retire_locked()

    def _retire_within(self, timeout: float) -> bool:
        """Retire if the lock comes within ``timeout`` seconds (0: only if free now)."""
        acquired = self._lock.acquire(timeout=timeout) if timeout > 0 else self._lock.acquire(blocking=False)
        if not acquired:
            return False
        try:
            self._retire_locked()
        finally:
            self._lock.release()
        return True

    def _settle_all(self) -> None:
        """Settle every request still waiting with no answer: each is then made
        in-process by whoever waits for it, or fails with ``failure`` when the
        child was killed for hanging. Lock held (or no other thread)."""
        while self._waiting:
            self._waiting.popleft().settle(None, self.failure)

    def _retire_locked(self) -> None:
        self.accepting = False
        stdin = self.proc.stdin
        if stdin is not None and not stdin.closed:
            try:
                stdin.close()
            except OSError:
                pass

    def stop(self, timeout: float) -> None:
        """Retire the child and wait up to ``timeout`` seconds for it to finish
        its queue; past that it is killed. What it had is then made
        in-process if it was stopped (SIGSTOP), and fails with
        SignerUnavailableError if it ran: it was waiting on a token that
        hangs, which a call from this process would wait on too. A child
        whose reader never started has no queue: it is killed at once (its
        starter sees end of file and lets go of the pipes). A writer blocked
        on a full pipe (the child not reading) holds the lock: then the child
        is killed without waiting, which frees the writer with a broken pipe.

        Args:
            timeout: seconds the child may take to finish its queue.
        """
        deadline = time.monotonic() + timeout
        self.accepting = False
        self._retire_within(timeout)
        if self._reader is None:
            self.proc.kill()
        try:
            self.proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            if self._waiting and not is_stopped(self.proc.pid) and self.failure is None:
                # running, and not done in time: it waits on the token, which a call from
                # this process would wait on too (under the lock every signer shares)
                self.failure = (f"{self.where}: the signing process had not made this signature {timeout:g} s "
                                "into close(), while it ran (the token seems to hang); it was killed")
            self.proc.kill()
            self.proc.wait()
        with self._lock:
            if self._reader is None:  # nobody else will settle what was sent to it
                self._settle_all()
        reader = self._reader
        if reader is not None and reader is not threading.current_thread():
            reader.join(timeout)  # the child is gone: its end of file is on the way

    def discard(self) -> None:
        """Stop a child whose reader never ran, from the thread that started it
        (the owner of its stdout until then)."""
        self.stop(1.0)
        if self._reader is None and self.proc.stdout is not None:
            self.proc.stdout.close()



def is_stopped(pid: int) -> bool:
    """Whether process ``pid`` is stopped (state T: SIGSTOP, a job-control
    stop; t: a debugger holds it), read from ``/proc``. Such a child answers
    nothing until someone resumes it. False where ``/proc`` cannot say.

    Args:
        pid: the process id.

    Returns:
        True for state T or t.
    """
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read()
    except OSError:
        return False
    fields = stat.rpartition(b")")[2].split()  # the name in parentheses may hold spaces
    return bool(fields) and fields[0] in (b"T", b"t")



#: every child started by this process (a fork lets go of each one's pipes)
_LIVE: process.ForkCopies[Child] = process.ForkCopies(Child.forget_after_fork)
