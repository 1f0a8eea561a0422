"""A signing process: one child process that makes a PKCS#11 signer's
signatures, so the token never waits for this process's GIL.

Why: in the producer's process, ``C_Sign`` runs without the GIL, but when it
returns the signing thread queues for the GIL behind the threads building,
checking and writing records (measured on SoftHSM2 Ed25519: 130–190 µs per
signature, with the token idle). A child process that does nothing but sign
has no one to wait for: requests queue in its pipe and the token goes
straight from one signature to the next, while this process's threads do
their Python work on the other core. Opt-in (``signing_process=True``):
a second process and a second logged-in session are the operator's call.

What stays as it was:

* the producer still verifies every signature against the public key this
  process read from the token (``external_device``); on top, each new child
  signs a random message that is checked before it gets any work;
* error handling exists once: when the child refuses a request, dies, answers
  out of step, or is found stopped (SIGSTOP, a debugger, a freezer: it is
  killed at once), its requests are signed in this process
  (``PKCS11Signer``'s own path: typed errors, reconnect), the child is
  retired, and a new one is started in the background after
  ``respawn_after`` seconds (doubling, up to a minute, while starts keep
  failing); meanwhile signatures are made in this process;
* a child that runs but answers nothing for ``answer_timeout`` seconds (the
  signer's ``timeout``) is waiting on the token, which then hangs: it is
  killed and its requests fail with SignerUnavailableError naming the token
  and key. They are not made in this process: a call into a hung token
  cannot be cancelled, and under the process-wide PKCS#11 lock it would stop
  every other signer too. A PIN a child was refused is not offered again by a background
  start, for any signer of the token (tokens lock a PIN after a few wrong
  tries, and nobody asked for these logins), until a login with it succeeds;
* the PIN reaches the child through its stdin only: never its argv (which
  other users can read in ``/proc``) or its environment (a variable of this
  process that holds the PIN is left out of the child's), and the child's
  stderr goes to /dev/null; the child runs in its own session, so a Ctrl-C
  in a terminal stops the parent, which then closes the child;
* the child exits when its stdin closes, so it cannot outlive this process.
"""

from __future__ import annotations

import collections
import ctypes
import errno
import json
import logging
import os
import re
import select
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol
from urllib.parse import unquote

from capseal._fork_copies import ForkCopies
from capseal.errors import DeviceError, PinIncorrectError, PinLockedError, SignerError, SignerUnavailableError

from ._base import PendingSignature, SignatureResult, _SignOnResult
from ._pin import Secret
from ._pkcs11_fast import _BUFFER as _MAX_SIGNATURE  # the direct path's output buffer: no answer is longer
from ._pkcs11_helper_main import _ANSWER, _HEADER, _frame

__all__ = ["SigningProcess"]


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


def _send(fd: int, data: bytes | bytearray) -> None:
    """Write ``data`` whole to a child's stdin, a non-blocking pipe.

    Why not ``os.write`` alone: it lets go of the GIL and takes it back, and
    with the producer's threads busy that hand-off cost each request about
    15 µs of CPU (SoftHSM2 Ed25519 with a signing process: 251–254 against
    267–268 µs a record, the same runs). A request is a few hundred bytes,
    below PIPE_BUF, which a pipe takes whole or refuses at once (EAGAIN), so
    libc's write with the GIL held never blocks; only when the pipe is full
    does this wait for the child to read, with the GIL released (select).
    A closed pipe raises BrokenPipeError, as ``os.write`` does."""
    written = 0
    if _LIBC_WRITE is not None and 0 < len(data) <= _PIPE_BUF:
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


def _send_secret(fd: int, secret: Secret) -> None:
    """Write a Secret's bytes whole to a non-blocking pipe, never holding them
    in a variable (see :func:`_send` for the waiting)."""
    written = 0
    while written < secret.size():
        try:
            written += os.write(fd, memoryview(secret.encoded())[written:])
        except BlockingIOError:
            select.select([], [fd], [])


log = logging.getLogger("capseal.keys.pkcs11")

# ``python -m`` (and ``-c``) put the working directory first on the import path:
# a stray ``pkcs11.py`` there would run in the child, with the PIN in reach. The
# child drops that entry before it imports anything (``-P`` would too, from 3.11)
_CHILD_MAIN = ("import sys; del sys.path[0]; import runpy; "
               "runpy.run_module('capseal.keys._pkcs11_helper_main', run_name='__main__', alter_sys=True)")
START_TIMEOUT = 60.0  # s: interpreter start, imports, C_Initialize, login, key lookup, self-test
ANSWER_TIMEOUT = 30.0  # s without any answer while requests wait: the child is taken to hang
_POLL = 0.2  # s: how often a waiting result() looks whether the child is stopped (or past its timeout)
_MAX_BACKOFF = 60.0
_PIN_REFUSALS = {"PinIncorrectError": PinIncorrectError, "PinLockedError": PinLockedError}


def _start_request(config: dict[str, Any], pin: Secret | None) -> Secret:
    """The child's start frame (``u32 length`` + JSON of ``config`` and the
    PIN), held as a Secret: the PIN is in it, and this function's frame
    raises nothing while it holds the text."""
    body = json.dumps({**config, "pin": None if pin is None else pin.reveal()}).encode()
    request = Secret(bytearray(_HEADER.pack(len(body))) + body, "a signing process's start request")
    del body
    return request


def _child_environment(pin: Secret | None) -> dict[str, str]:
    """This process's environment without the variables that hold the PIN:
    one that is the PIN (an application's ``CAPSEAL_PIN``) or a URI carrying
    it as ``pin-value=``. The child gets the PIN on its stdin only. Its
    environment is readable in ``/proc`` by the same user and root, who could
    read this process's too; leaving the PIN out keeps it out of core dumps
    and of whatever the child starts. Nothing else is dropped: a value that
    merely contains the PIN's characters (a path, a port) is often what the
    module needs to start (``SOFTHSM2_CONF``)."""
    if pin is None or pin.empty:
        return dict(os.environ)
    return {name: value for name, value in os.environ.items() if not _holds_pin(value, pin)}


def _holds_pin(value: str, pin: Secret) -> bool:
    """Whether an environment value is the PIN or a URI carrying it as pin-value."""
    return value == pin.reveal() or f"pin-value={pin.reveal()}" in value or _pin_value_in(value, pin)


#: a pin-value attribute in a URI (RFC 7512 attribute names are matched case-insensitively)
_PIN_VALUE = re.compile(r"(?i)pin-value=([^&;#?\s]*)")


def _pin_value_in(value: str, pin: Secret) -> bool:
    """Whether ``value`` holds a URI whose pin-value, pct-decoded, is ``pin``:
    RFC 7512 writes a PIN with '&', a space or '%' pct-encoded, in either case
    of hex digit, so the plain ``pin-value=<PIN>`` is not the only spelling."""
    return any(unquote(m.group(1)) == pin.reveal() for m in _PIN_VALUE.finditer(value))


class Credentials(Protocol):
    """Where a child's PIN comes from: the signer's ``TokenSession``, shared by
    every signer of the token, so a PIN the token refused is known to all."""

    pin_refused: bool
    child_starts: threading.Lock  # background starts of any signer's child go one at a time

    def pin_for_child(self) -> Secret | None: ...

    def child_refused(self, sent: Secret | None) -> None: ...

    def child_accepted(self, sent: Secret | None) -> None: ...


class Owner(Protocol):
    """The signer a signing process works for (``PKCS11Signer``)."""

    def _sign_in_process(self, payload: bytes) -> SignatureResult: ...

    def _signature_result(self, signature: bytes) -> SignatureResult: ...


class _ProcessSignature(PendingSignature):
    """A signature requested from a child. ``owner`` (the signer) makes it in
    this process when the child cannot, and turns the bytes into a
    ``SignatureResult``."""

    __slots__ = ("_owner", "_payload", "_child", "_ready", "_signature", "_failure")

    def __init__(self, owner: Owner, payload: bytes, child: _Child) -> None:
        self._owner, self._payload, self._child = owner, payload, child
        self._ready = threading.Lock()
        self._ready.acquire()  # released once the answer (or the child's end) is in
        self._signature: bytes | None = None
        self._failure: str | None = None

    def settle(self, signature: bytes | None, failure: str | None = None) -> None:
        """The answer: a signature, or None (made in this process on
        ``result()``), or ``failure``: why it cannot be made at all."""
        self._signature, self._failure = signature, failure
        self._ready.release()

    def result(self) -> SignatureResult:
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
            return self._owner._sign_in_process(self._payload)
        return self._owner._signature_result(self._signature)


class _OutOfStep(Exception):
    """An answer whose sequence number is not the one expected."""


class _Child:
    """One child process, its pipes and the requests it has not answered yet
    (in order: the child answers in the order it reads).

    Who touches the file descriptors: every write to stdin happens under
    ``_lock`` while ``accepting``, and stdin is closed only under ``_lock``
    (so a write never lands on a reused fd number). stdout is read by the
    thread that started the child until ``start_reader``, then only by the
    reader; it is closed by the reader when it ends, or by the starter when
    the child is discarded before a reader ever ran."""

    def _forget_after_fork(self) -> None:
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

    def __init__(self, proc: subprocess.Popen[bytes], answer_timeout: float | None, where: str = "a PKCS#11 key") -> None:
        self.proc = proc
        self.where = where
        #: set when the child was killed for hanging: why the requests it had fail
        self.failure: str | None = None
        assert proc.stdin is not None and proc.stdout is not None
        self._wfd, self._rfd = proc.stdin.fileno(), proc.stdout.fileno()
        os.set_blocking(self._wfd, False)  # see _send: a write never blocks holding the GIL
        self._lock = threading.Lock()  # one writer at a time; the order of writes is the order of _waiting
        self._waiting: collections.deque[_ProcessSignature] = collections.deque()
        self.accepting = True  # False once retired: no new requests
        self.answer_timeout = answer_timeout
        self._progress = time.monotonic()  # the last answer, or when the queue last went from empty to not
        self._sequence = 0  # of the next answer
        self._reader: threading.Thread | None = None
        _LIVE.add(self)

    # -- start (on the starting thread, before the reader runs)

    def handshake(self, request: Secret, deadline: float) -> dict[str, Any]:
        """Send the start ``request`` (it holds the PIN: written from the
        Secret, then wiped) and read the child's answer."""
        try:
            with self._lock:
                if not self.accepting:  # stopped by close() meanwhile: its stdin is closed
                    raise EOFError
                _send_secret(self._wfd, request)
        finally:
            request.wipe()  # nothing keeps the PIN, not a later traceback's locals
        return json.loads(self._read(_HEADER.unpack(self._read(_HEADER.size, deadline))[0], deadline))

    def sign_now(self, payload: bytes, deadline: float) -> bytes | None:
        """One request answered before the reader starts (the self-test)."""
        self._write_or_eof(_frame(payload))
        status, sequence, size = _ANSWER.unpack(self._read(_ANSWER.size, deadline))
        body = self._read(size, deadline) if size else b""
        if sequence != self._sequence:
            raise EOFError
        self._sequence += 1
        return body if status == 0 else None

    def _write_or_eof(self, data: bytes | bytearray) -> None:
        with self._lock:
            if not self.accepting:  # stopped by close() meanwhile: its stdin is closed
                raise EOFError
            _send(self._wfd, data)

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

    def start_reader(self, on_end: Callable[[_Child, bool], None]) -> None:
        """Read answers until the child ends; ``on_end(child, refused)`` when it
        takes no more requests (refused: the token said no to one)."""
        reader = threading.Thread(target=self._read_loop, args=(on_end,),
                                  name=f"capseal-signing-process-{self.proc.pid}", daemon=True)
        with self._lock:  # stop() decides under it whether a reader will settle the queue
            reader.start()  # RuntimeError (no threads): no reader, as before
            self._reader = reader

    # -- work

    def send(self, owner: Owner, payload: bytes) -> _ProcessSignature | None:
        """The request, written to the child; None when the child takes no more."""
        pending = _ProcessSignature(owner, payload, self)
        with self._lock:
            if not self.accepting:
                self._retire_locked()  # the reader may have left closing stdin to the lock's holder
                return None
            written = False
            try:
                if not self._waiting:
                    self._progress = time.monotonic()
                self._waiting.append(pending)  # before the write: the answer may come back at once
                _send(self._wfd, _frame(payload))
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
        in-process, as for a child that died. Its reader then settles them all."""
        if not self._waiting or self.proc.poll() is not None:
            return
        silent = time.monotonic() - self._progress
        if stopped and _is_stopped(self.proc.pid):
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

    def _read_loop(self, on_end: Callable[[_Child, bool], None]) -> None:
        buffer, refused = b"", False
        try:
            while True:
                chunk = os.read(self._rfd, 1 << 16)
                if not chunk:
                    return
                buffer += chunk
                at = 0
                while len(buffer) - at >= _ANSWER.size:
                    status, sequence, size = _ANSWER.unpack_from(buffer, at)
                    if sequence != self._sequence or size > _MAX_SIGNATURE:
                        raise _OutOfStep
                    if len(buffer) - at - _ANSWER.size < size:
                        break
                    start = at + _ANSWER.size
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
        is killed without waiting, which frees the writer with a broken pipe."""
        deadline = time.monotonic() + timeout
        self.accepting = False
        self._retire_within(timeout)
        if self._reader is None:
            self.proc.kill()
        try:
            self.proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            if self._waiting and not _is_stopped(self.proc.pid) and self.failure is None:
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


def _is_stopped(pid: int) -> bool:
    """Whether process ``pid`` is stopped (state T: SIGSTOP, a job-control
    stop; t: a debugger holds it), read from ``/proc``. Such a child answers
    nothing until someone resumes it. False where ``/proc`` cannot say."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read()
    except OSError:
        return False
    fields = stat.rpartition(b")")[2].split()  # the name in parentheses may hold spaces
    return bool(fields) and fields[0] in (b"T", b"t")


#: every child started by this process (a fork lets go of each one's pipes)
_LIVE: ForkCopies[_Child] = ForkCopies(_Child._forget_after_fork)


class SigningProcess:
    """The child process for one signer, started now and replaced as needed.

    ``config``: what the child needs to find the key (no PIN); ``credentials``:
    the PIN (or None) for each start, and whether the token refused it;
    ``self_test``: (payload, check) — a payload to sign and a check of the
    signature — for each new child."""

    def __init__(self, config: dict[str, Any], credentials: Credentials,
                 self_test: Callable[[], tuple[bytes, Callable[[bytes], bool]]], where: str, *,
                 respawn_after: float = 1.0, answer_timeout: float | None = ANSWER_TIMEOUT) -> None:
        self._config, self._credentials, self._self_test, self._where = config, credentials, self_test, where
        self._pid = os.getpid()  # a process forked from this one signs in-process
        self._respawn_after, self._answer_timeout = respawn_after, answer_timeout
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._replacing = False
        self._children: list[_Child] = []  # every child started and not yet stopped, starting ones too
        self._child: _Child | None = None
        self._use(self._start())  # the first start raises: the caller asked for a signing process

    @property
    def pid(self) -> int | None:
        """The current child's process id (None while there is none)."""
        child = self._child
        return None if child is None else child.proc.pid

    def begin(self, owner: Owner, payload: bytes) -> PendingSignature:
        if os.getpid() != self._pid:
            # a process forked from this one: the children are the parent's, and
            # the fork signs in-process with a login of its own; it never starts
            # one (nor touches this object's locks, which a parent thread may hold)
            return _SignOnResult(owner._sign_in_process, payload)
        child = self._child
        if child is not None:
            child.kill_if_hung()  # new requests do not queue behind a child that hangs
            pending = child.send(owner, payload)
            if pending is not None:
                return pending
        elif not self._replacing and not self._credentials.pin_refused:
            self._replace_soon()  # replacement had stopped on a refused PIN, which the token now takes
        return _SignOnResult(owner._sign_in_process, payload)  # no child to ask: signed here on result()

    def close(self, timeout: float = 5.0) -> None:
        """Stop the children, a child still starting included: each signs what
        it has been sent (for up to ``timeout`` seconds; then it is killed
        and those requests are made in this process, or fail as the signer's
        own path does, or fail outright when the child ran but the token did
        not answer it: see :meth:`_Child.stop`). Idempotent. In a process forked from this one, does
        nothing: the children are the parent's (the fork let go of their pipes)."""
        if os.getpid() != self._pid:
            return
        with self._lock:
            self._closed.set()
            children, self._children, self._child = self._children, [], None
        for child in children:
            child.stop(timeout)

    # -- starting and replacing children

    def _start(self, *, background: bool = False) -> _Child:
        """A new child, logged in and self-tested (its reader not yet
        started); raises a typed error naming the token and key when it
        cannot start. A background start (``background``: nobody asked for
        it) never offers a PIN the token refused a child, and waits for any
        other signer's background start on the token, so that when several
        children end together the token sees one wrong try, not one each."""
        if not background:
            return self._start_child()
        with self._credentials.child_starts:
            if self._closed.is_set():  # closed while it waited for another signer's start
                raise DeviceError(f"{self._where}: the signing process was closed while it started")
            if self._credentials.pin_refused:
                raise PinIncorrectError(f"{self._where}: the token refused this PIN to a signing process; none is "
                                        "started with it in the background (tokens lock a PIN after a few wrong tries)")
            return self._start_child()

    def _start_child(self) -> _Child:
        """``_start``'s work. Listed in ``_children`` from its first moment, so
        a close() meanwhile stops it (and this start then fails)."""
        sent = self._credentials.pin_for_child()
        try:
            proc = subprocess.Popen([sys.executable, "-c", _CHILD_MAIN],
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                    close_fds=True, start_new_session=True, bufsize=0, env=_child_environment(sent))
        except OSError as exc:  # no processes or file descriptors left, …
            raise DeviceError(f"{self._where}: the signing process could not start ({type(exc).__name__}: "
                              f"{exc.strerror or exc})") from None
        child = _Child(proc, self._answer_timeout, self._where)
        with self._lock:
            closed = self._closed.is_set()
            if not closed:
                self._children.append(child)
        if closed:
            child.discard()
            raise DeviceError(f"{self._where}: the signing process was closed while it started")
        deadline = time.monotonic() + START_TIMEOUT
        failure: SignerError | None = None
        try:
            answer = child.handshake(_start_request(self._config, sent), deadline)
            if answer.get("ok") is not True:
                error, message = str(answer.get("error", "unknown error")), str(answer.get("message", ""))
                refusal = _PIN_REFUSALS.get(error)
                if refusal is not None:
                    self._credentials.child_refused(sent)  # for every signer of the token
                    failure = refusal(f"{self._where}: the signing process was refused the PIN: {message}")
                else:
                    failure = DeviceError(f"{self._where}: the signing process could not start: {error}: {message}"
                                          .rstrip(": "))
            else:
                payload, check = self._self_test()
                self._credentials.child_accepted(sent)
                signature = child.sign_now(payload, deadline)
                if signature is None or not check(signature):
                    failure = DeviceError(f"{self._where}: the signing process's self-test signature "
                                          f"{'was refused' if signature is None else 'does not verify'}")
        except (TimeoutError, EOFError, OSError, ValueError) as exc:
            kind = {TimeoutError: f"no answer within {START_TIMEOUT:.0f} s", EOFError: "it exited"}.get(
                type(exc), type(exc).__name__)
            failure = DeviceError(f"{self._where}: the signing process could not start ({kind})")
        except BaseException:
            self._discard(child)
            raise
        if failure is not None:
            self._discard(child)
            raise failure
        return child

    def _discard(self, child: _Child) -> None:
        with self._lock:
            if child in self._children:
                self._children.remove(child)
        child.discard()

    def _use(self, child: _Child) -> None:
        """Make a started child current, then start its reader: a child that
        died meanwhile is then seen to end (and replaced) like any other."""
        with self._lock:
            self._children = [c for c in self._children if c is child or c.proc.poll() is None]
            closed = self._closed.is_set()
            if not closed:
                self._child, self._replacing = child, False
        if closed:
            self._discard(child)
            return
        try:
            child.start_reader(self._ended)
        except RuntimeError:  # no threads to be had: this child cannot be used
            with self._lock:
                if self._child is child:
                    self._child = None
            self._discard(child)  # its requests, if any were sent, are made in-process
            self._replace_soon()

    def _ended(self, child: _Child, refused: bool) -> None:
        """``child`` takes no more requests (the token refused one, or the child
        died): it finishes what it has while signatures are made in this
        process, and a new child is started after a pause."""
        with self._lock:
            if self._child is not child or self._closed.is_set():
                return
            self._child = None
        log.warning("%s: the signing process %s; signing in-process until it is replaced", self._where,
                    "was refused a signature" if refused else "ended")
        self._replace_soon()

    def _replace_soon(self) -> None:
        """Start the replacing thread, unless one runs, the PIN was refused, or this closed."""
        with self._lock:
            if self._replacing or self._child is not None or self._closed.is_set() or self._credentials.pin_refused:
                return
            self._replacing = True
        try:
            threading.Thread(target=self._replace, name="capseal-signing-process-start", daemon=True).start()
        except RuntimeError:  # no threads to be had: a later request tries again
            with self._lock:
                self._replacing = False

    def _replace(self) -> None:
        """Start a new child after ``respawn_after`` seconds, and keep trying
        (the pause doubling up to a minute) until one starts or this closes.
        A PIN refusal that marks the PIN ends the attempts until a login with
        it succeeds again (``begin`` then starts a replacement); one that does
        not (the PIN changed meanwhile) backs off like any other failure.
        Should this thread itself die, the flag is cleared."""
        pause = self._respawn_after
        try:
            while not self._closed.wait(pause):
                try:
                    child = self._start(background=True)
                except (PinIncorrectError, PinLockedError) as exc:
                    if self._credentials.pin_refused:  # marked: no more tries with this PIN
                        with self._lock:
                            self._replacing = False
                        log.error("%s; signing in-process until a login with this PIN succeeds again", exc)
                        return
                    pause = min(pause * 2, _MAX_BACKOFF)  # the PIN changed meanwhile: the next try uses the new one
                    log.warning("%s; trying again in %.0f s", exc, pause)
                    continue
                except Exception as exc:  # noqa: BLE001 - logged; the next attempt follows
                    pause = min(pause * 2, _MAX_BACKOFF)
                    log.warning("%s; signing in-process, trying again in %.0f s",
                                exc if isinstance(exc, SignerError) else f"{self._where}: {type(exc).__name__}", pause)
                    continue
                self._use(child)
                return
        except BaseException:
            with self._lock:
                self._replacing = False
            raise
