"""A signing process: one child process that makes a PKCS#11 signer's
signatures, so the token never waits for this process's GIL.

Why: in the producer's process, ``C_Sign`` runs without the GIL, but when it
returns the signing thread queues for the GIL behind the threads building,
checking and writing records, and the token idles meanwhile. A child process that does nothing but sign
has no one to wait for: requests queue in its pipe and the token goes
straight from one signature to the next, while this process's threads do
their Python work on the other core. Opt-in (``signing_process=True``):
a second process and a second logged-in session are the operator's call.

What does not change with it:

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

import json
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol
from urllib.parse import unquote

from capseal.errors import DeviceError, PinIncorrectError, PinLockedError, SignerError
from capseal.keys import PendingSignature, SignatureResult
from capseal.keys.direct import direct_calls_allowed
from capseal.keys.secret import Secret

from ._child import Child, Outcome, log
from ._signing_main import HEADER

__all__ = ["SigningProcess", "Credentials", "ANSWER_TIMEOUT", "START_TIMEOUT"]


# ``python -m`` (and ``-c``) put the working directory first on the import path:
# a stray ``pkcs11.py`` there would run in the child, with the PIN in reach. The
# child drops that entry before it imports anything (``-P`` would too, from 3.11)
_CHILD_MAIN = ("import sys; del sys.path[0]; import runpy; "
               "runpy.run_module('capseal.keys.pkcs11._signing_main', run_name='__main__', alter_sys=True)")
START_TIMEOUT = 60.0  # s: interpreter start, imports, C_Initialize, login, key lookup, self-test
ANSWER_TIMEOUT = 30.0  # s without any answer while requests wait: the child is taken to hang
_MAX_BACKOFF = 60.0
_PIN_REFUSALS = {"PinIncorrectError": PinIncorrectError, "PinLockedError": PinLockedError}


def _start_request(config: dict[str, Any], pin: Secret | None) -> Secret:
    """The child's start frame (``u32 length`` + JSON of ``config`` and the
    PIN), held as a Secret: the PIN is in it, and this function's frame
    raises nothing while it holds the text."""
    body = json.dumps({**config, "pin": None if pin is None else pin.reveal()}).encode()
    request = Secret(bytearray(HEADER.pack(len(body))) + body, "a signing process's start request")
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

    def pin_for_child(self) -> Secret | None:
        """The PIN to send a new child.

        Returns:
            The PIN the token took, or None.
        """

    def child_refused(self, sent: Secret | None) -> None:
        """A child was refused ``sent``.

        Args:
            sent: the PIN it was sent.
        """

    def child_accepted(self, sent: Secret | None) -> None:
        """A child logged in with ``sent``.

        Args:
            sent: the PIN it was sent.
        """


class SigningProcess:
    """The child process for one signer, started now and replaced as needed."""

    def __init__(self, config: dict[str, Any], credentials: Credentials,
                 self_test: Callable[[], tuple[bytes, Callable[[bytes], bool]]], where: str, *,
                 sign_here: Callable[[bytes], SignatureResult], finish: Callable[[bytes], SignatureResult],
                 respawn_after: float = 1.0, answer_timeout: float | None = ANSWER_TIMEOUT) -> None:
        """Start the first child (the caller asked for one: a failure raises).

        Args:
            config: what the child needs to find the key (no PIN).
            credentials: the PIN (or None) for each start, and whether the token refused it.
            self_test: gives (payload, check) — a payload to sign and a check of
                the signature — for each new child.
            where: names the token and key in messages.
            sign_here: makes a signature in this process (the signer's own path).
            finish: checks a child's signature and makes the result.
            respawn_after: seconds before a child that ended is replaced (doubling while starts fail).
            answer_timeout: seconds a child may answer nothing while requests wait (None: no limit).

        Raises:
            PinIncorrectError, PinLockedError: the token refused the child the PIN.
            DeviceError: the child could not start, or its self-test signature did not verify.
        """
        self._config, self._credentials, self._self_test, self._where = config, credentials, self_test, where
        self._outcome = Outcome(sign_here, finish)
        self._direct = direct_calls_allowed()  # the pipe writes' fast path; the child reads the switch itself
        self._pid = os.getpid()  # a process forked from this one signs in-process
        #: seconds before a child that ended is replaced (doubling while starts fail)
        self.respawn_after = respawn_after
        self._answer_timeout = answer_timeout
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._replacing = False
        self._children: list[Child] = []  # every child started and not yet stopped, starting ones too
        self._child: Child | None = None
        self._use(self._start())  # the first start raises: the caller asked for a signing process

    @property
    def pid(self) -> int | None:
        """The current child's process id (None while there is none)."""
        child = self._child
        return None if child is None else child.proc.pid

    @property
    def child(self) -> Child | None:
        """The child that takes requests now (None while there is none)."""
        return self._child

    @property
    def children(self) -> list[Child]:
        """Every child started and not yet stopped, one still starting included."""
        with self._lock:
            return list(self._children)

    @property
    def replacing(self) -> bool:
        """Whether a replacement child is being started in the background."""
        return self._replacing

    def begin(self, payload: bytes) -> PendingSignature:
        """Send ``payload`` to the child to be signed.

        Args:
            payload: the bytes the token signs (a digest, or the message for EdDSA).

        Returns:
            The pending signature: in the child's pipe when this returns, or
            (no child to ask, or a process forked from this one) made in this
            process on ``result()``.
        """
        sign_here = self._outcome.sign_here
        if os.getpid() != self._pid:
            # a process forked from this one: the children are the parent's, and
            # the fork signs in-process with a login of its own; it never starts
            # one (nor touches this object's locks, which a parent thread may hold)
            return PendingSignature.deferred(sign_here, payload)
        child = self._child
        if child is not None:
            child.kill_if_hung()  # new requests do not queue behind a child that hangs
            pending = child.send(self._outcome, payload)
            if pending is not None:
                return pending
        elif not self._replacing and not self._credentials.pin_refused:
            self._replace_soon()  # replacement had stopped on a refused PIN, which the token now takes
        return PendingSignature.deferred(sign_here, payload)  # no child to ask: signed here on result()

    def close(self, timeout: float = 5.0) -> None:
        """Stop the children, a child still starting included: each signs what it
        has been sent (for up to ``timeout`` seconds; then it is killed and those
        requests are made in this process, or fail as the signer's own path does,
        or fail outright when the child ran but the token did not answer it: see
        :meth:`Child.stop`). Idempotent. In a process forked from this one, does
        nothing: the children are the parent's (the fork let go of their pipes).

        Args:
            timeout: seconds each child may take to finish what it was sent.
        """
        if os.getpid() != self._pid:
            return
        with self._lock:
            self._closed.set()
            children, self._children, self._child = self._children, [], None
        for child in children:
            child.stop(timeout)

    # -- starting and replacing children

    def _start(self, *, background: bool = False) -> Child:
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

    def _start_child(self) -> Child:
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
        child = Child(proc, self._answer_timeout, self._where, direct=self._direct)
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

    def _discard(self, child: Child) -> None:
        with self._lock:
            if child in self._children:
                self._children.remove(child)
        child.discard()

    def _use(self, child: Child) -> None:
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

    def _ended(self, child: Child, refused: bool) -> None:
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
        pause = self.respawn_after
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
