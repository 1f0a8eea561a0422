"""The one logged-in session this process holds on each token, shared by
every signer of the token, and what becomes of it at a fork and at exit.

Why this shape:

* Login state is per token per process: a second ``C_Login`` fails with
  ``UserAlreadyLoggedIn``. So there is one :class:`TokenSession` per
  (module real path, token serial), shared by every signer; it holds one
  logged-in session, never one per signature.
* Sessions die underneath us (``C_CloseAllSessions`` elsewhere in the process,
  a token pulled out, a module reset, a module finalised by other code). A
  :class:`TokenSession` notices, reconnects (find token, open, log in again)
  and the caller retries once (``_calls.run``).
* Search iterators are always drained under the lock: an abandoned one calls
  ``C_FindObjectsFinal`` from its finaliser, i.e. from whatever thread the
  garbage collector runs in, outside the lock.
* A process forked from this one is, for PKCS#11, another application: using
  the parent's module state is undefined (PKCS#11 v2.40 §5.5.1). So a fork
  first waits (until :func:`capseal.process.fork_deadline`) for a call running
  in another thread to return, so the forked copy of the module is never
  caught half-way through one and the lock is free there; in the fork every
  loaded module is initialised again on its first use and every token session
  logs in again. A fork that could not wait refuses PKCS#11 in the forked
  process with a typed error instead of risking a hang. The hooks are
  registered with :mod:`capseal.process`, which runs them in the "devices"
  phase; its exit handler closes the sessions after every producer has had
  its records signed.

The PIN is kept (to log in again after a reconnect) inside a
:class:`~capseal.keys.secret.Secret` whose ``repr`` hides it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from pkcs11.constants import TokenFlag

from capseal import process
from capseal.errors import KeyURIError, PinIncorrectError, SignerUnavailableError, TokenNotFoundError
from capseal.keys.secret import Secret, as_secret, usable_pin

from ._lock import P11_LOCK, check_alive, log, p11x, refuse_after_fork, shut_down
from ._login import close_session, open_logged_in
from ._module import Module, load_module, loaded_modules, module_hint, version_text
from ._uri import PKCS11URI, resolve_module

__all__ = ["TokenSession", "open_token", "release_token", "find_tokens", "list_tokens"]


def _serial(token: Any) -> str:
    raw = token.serial
    return (raw.decode("ascii", "replace") if isinstance(raw, bytes) else str(raw)).strip()


def _token_matches(token: Any, uri: PKCS11URI) -> bool:
    slot = token.slot
    checks = (
        (uri.token, token.label),
        (uri.manufacturer, token.manufacturer_id),
        (uri.serial, _serial(token)),
        (uri.model, token.model),
        (uri.slot_description, slot.slot_description),
        (uri.slot_manufacturer, slot.manufacturer_id),
    )
    if any(want is not None and want != have for want, have in checks):
        return False
    return uri.slot_id is None or uri.slot_id == slot.slot_id


def _library_matches(module: Module, uri: PKCS11URI) -> bool:
    lib = module.lib
    if uri.library_manufacturer is not None and uri.library_manufacturer != lib.manufacturer_id:
        return False
    if uri.library_description is not None and uri.library_description != lib.library_description:
        return False
    if uri.library_version is not None:
        major, _, minor = uri.library_version.partition(".")
        have = lib.library_version
        if int(major) != have[0] or int(minor or 0) != have[1]:
            return False
    return True


def list_tokens(module: Module) -> list[Any]:
    """The tokens present in the module's slots. Lock held.

    Args:
        module: the loaded module.

    Returns:
        The python-pkcs11 tokens.
    """
    tokens = []
    for slot in module.lib.get_slots(token_present=True):
        try:
            tokens.append(slot.get_token())
        except (p11x.TokenNotPresent, p11x.TokenNotRecognised):
            continue
    return tokens


#: seconds to wait before each re-initialise-and-look-again when a token is
#: not found (see find_tokens): the whole wait comes only to a token that is
#: really absent (or a module that cannot list), under the lock
_RESCAN_PAUSES = (0.0, 0.05, 0.2)


def find_tokens(module: Module, uri: PKCS11URI) -> list[Any]:
    """Matching initialised tokens. SoftHSM2 only sees tokens that existed at
    ``C_Initialize``, and a module whose storage vanished answers
    ``GeneralError``: in both cases re-initialise and look again. Why more
    than once, after a pause: SoftHSM2 rewrites a token's ``token.object`` at
    every ``C_Login`` (the PIN-count flags), truncating it first, and a
    ``C_Initialize`` in another process that reads it meanwhile leaves that
    token out until the next ``C_Initialize``: several workers of one pool,
    each logging in, can report to each other a token absent that is there.
    Lock held.

    Args:
        module: the loaded module.
        uri: the URI whose token attributes must match.

    Returns:
        The matching tokens (empty: none).

    Raises:
        SignerUnavailableError: the module cannot list its tokens.
    """
    module.ensure_initialized()
    try:
        found = [t for t in list_tokens(module) if _token_matches(t, uri)]
    except p11x.PKCS11Error as exc:
        found = []
        if module.recover_if_finalized(exc):  # finalised underneath: initialised again, look once more
            try:
                found = [t for t in list_tokens(module) if _token_matches(t, uri)]
            except p11x.PKCS11Error:
                found = []
    if found:
        return found
    failure = None
    for pause in _RESCAN_PAUSES:
        if pause:
            time.sleep(pause)
        module.reinitialize()
        try:
            found = [t for t in list_tokens(module) if _token_matches(t, uri)]
        except p11x.PKCS11Error as exc:
            failure = type(exc).__name__
            continue
        failure = None
        if found:
            return found
    if failure is None:
        return []
    raise SignerUnavailableError(f"PKCS#11 module {module.path} cannot list its tokens ({failure})",
                                 hint=module_hint(module.path))


class TokenSession:
    """The one logged-in session this process holds on one token.

    Every method must be called with :data:`P11_LOCK` held. ``epoch`` grows at
    each (re)connect, so signers know when their key handles are stale.
    """

    def __init__(self, module: Module, token: Any, uri: PKCS11URI, pin: Secret | None) -> None:
        self.module = module
        self.serial = _serial(token)
        self.label = token.label
        self.token = token
        self._pin = pin
        self._match = PKCS11URI(token=token.label, serial=self.serial)
        self.session: Any = None
        self._logged_in = False  # self.session made the login: closing it logs out
        self.generation = -1
        self.epoch = 0
        self.users = 0
        #: set by :meth:`close`: a call that took this session before it closed
        #: must not log in again (that login would be nobody's, never logged out)
        self.closed = False
        self.reconnects = 0
        # a signing process's child was refused self._pin: no child is started in
        # the background with it again (tokens lock a PIN after a few wrong tries).
        # Only background starts heed it: a caller's own call still tries once and
        # gets the typed error; a login with it that succeeds (this process's, or a
        # child's a caller started) clears it. Background starts go one at a time
        self.pin_refused = False
        self.child_starts = threading.Lock()

    # -- identity and description

    @property
    def name(self) -> str:
        """How the token is named in messages (label, serial, module)."""
        return f"token {self.label!r} (serial {self.serial}, module {self.module.path})"

    def device_info(self) -> dict[str, Any]:
        """What the token and its library report about themselves (custody's ``device``).

        Returns:
            Label, manufacturer, model, serial, versions (as text), slot and module.
        """
        token, slot = self.token, self.token.slot
        info: dict[str, Any] = {
            "token_label": token.label,
            "manufacturer": token.manufacturer_id,
            "model": token.model,
            "serial": self.serial,
            "hardware_version": version_text(token.hardware_version),
            "firmware_version": version_text(token.firmware_version),
            "slot_description": slot.slot_description,
            "module": self.module.real,  # the file loaded (symlinks resolved), not how the URI spelled it
        }
        info.update(self.module.info())
        return info

    def __repr__(self) -> str:
        return f"<TokenSession {self.name} {'open' if self.session is not None else 'closed'}>"

    # -- connection

    def live(self) -> bool:
        """Whether the session is open and of the module's current generation.

        Returns:
            True when it can be used as it is.
        """
        return self.session is not None and self.generation == self.module.generation

    def ensure(self) -> Any:
        """The logged-in session, reconnecting if it is gone.

        Returns:
            The python-pkcs11 session.

        Raises:
            SignerUnavailableError: the session was closed (its last user let go
                of it), or see :meth:`connect`.
            TokenNotFoundError, PinIncorrectError: see :meth:`connect`.
        """
        check_alive()
        if self.closed:
            raise SignerUnavailableError(f"{self.name}: the signer using this token was closed")
        if not self.live():
            self.connect()
        return self.session

    def connect(self, *, pin_checked: bool = True) -> None:
        """Find the token again (by label and serial), open a session, log in.

        Args:
            pin_checked: the token took this session's PIN before (a reconnect);
                False for a PIN tried for the first time (see ``open_logged_in``).

        Raises:
            TokenNotFoundError: the token is not there.
            PinIncorrectError, PinLockedError: the login is refused.
            SignerUnavailableError: PKCS#11 is refused in this process, or the module cannot list its tokens.
        """
        self._drop()
        found = find_tokens(self.module, self._match)
        if not found:
            raise TokenNotFoundError(f"{self.name} is not present")
        token = found[0]
        self.token = token
        self.session, self._logged_in = open_logged_in(token, self._pin, self.name, self.module.real,
                                                        pin_checked=pin_checked)
        self.pin_refused = False  # the token takes the PIN (again)
        self.generation = self.module.generation
        self.epoch += 1

    def invalidate(self, exc: BaseException) -> None:
        """The session (or a key handle) failed: forget it so the next call
        reconnects. A handle that is already dead is not closed (its number may
        by now belong to someone else's session).

        Args:
            exc: the python-pkcs11 error.
        """
        self.reconnects += 1
        log.warning("%s: %s; reconnecting", self.name, type(exc).__name__)
        dead = isinstance(exc, (p11x.SessionClosed, p11x.SessionHandleInvalid, p11x.DeviceRemoved, p11x.TokenNotPresent))
        if dead:
            self.session = None
        else:
            self._drop()

    def _drop(self) -> None:
        session, self.session = self.session, None
        logged_in, self._logged_in = self._logged_in, False
        if session is not None and self.generation == self.module.generation:
            close_session(session, self.module.real, logged_in)

    def pin_matches(self, pin: Secret | None) -> bool:
        """Whether a PIN is the one this session holds.

        Args:
            pin: the PIN (None: none).

        Returns:
            True for the same PIN (or none on both sides).
        """
        if self._pin is None or pin is None:
            return self._pin is None and pin is None
        return self._pin.matches(pin)

    def check_pin(self, pin: Secret | None) -> None:
        """A second signer on a logged-in token: the token cannot be asked again
        (``UserAlreadyLoggedIn``), so the PIN is compared with the one that worked.

        Args:
            pin: the second signer's PIN.

        Raises:
            PinIncorrectError: it differs (or one side has none).
        """
        if self._pin is None or pin is None:
            if self._pin is not pin:
                raise PinIncorrectError(f"{self.name} is logged in with a PIN; this caller gave none")
            return
        if not self._pin.matches(pin):
            raise PinIncorrectError(
                f"{self.name}: the PIN given differs from the one this process logged in with"
            )

    def pin_for_child(self) -> Secret | None:
        """The PIN this process logged in with, for a signing process of this
        signer's (``_signing_process``), which sends it down the child's stdin,
        and for ``create_key``, which opens the new key with it. Read under the
        lock: ``open_token`` swaps in a caller's PIN while it tries it, and only
        a PIN the token took is sent.

        Returns:
            The PIN as a Secret, or None.
        """
        with P11_LOCK:
            return self._pin

    def child_refused(self, sent: Secret | None) -> None:
        """A signing process's child was refused a PIN: remembered (see
        ``pin_refused``) if it is still what this process holds — a caller may
        have brought the right one meanwhile, and then the next start tries that.

        Args:
            sent: the PIN the child was sent (None: none, a PIN pad, whose refusal
                is marked too: nobody is prompted again in the background).
        """
        with P11_LOCK:
            if self.pin_matches(sent):
                self.pin_refused = True

    def child_accepted(self, sent: Secret | None) -> None:
        """A child logged in: if with what this process holds, the token takes it (again).

        Args:
            sent: the PIN the child was sent.
        """
        with P11_LOCK:
            if self.pin_matches(sent):
                self.pin_refused = False

    def close(self) -> None:
        """Close the session (logging out a login of ours) for good. Lock held."""
        self.closed = True
        self._drop()



_TOKENS: dict[tuple[str, str], TokenSession] = {}


def open_token(uri: PKCS11URI, *, pin: str | Secret | None, module_allowlist: object = None,
               pin_prompt: Callable[[str], str | None] | None = None) -> TokenSession:
    """The shared :class:`TokenSession` for the token ``uri`` names, logged in
    (a second caller with the same PIN shares it; the PIN is checked against
    the one the token took).

    Args:
        uri: the parsed URI.
        pin: the PIN (None: a PIN pad, a token without login, or ``pin_prompt``).
        module_allowlist: as for ``PKCS11Signer.from_uri``.
        pin_prompt: asked for the PIN when none is given (never under the lock).

    Returns:
        The token session; :func:`release_token` it when done.

    Raises:
        TokenNotFoundError: no token matches.
        KeyURIError: several tokens match.
        PinIncorrectError, PinLockedError: the PIN is refused, or differs from the one the token took.
        SignerUnavailableError: the module cannot be loaded, or PKCS#11 is refused in this process.
    """
    pin = as_secret(pin, "pin=")
    module = load_module(resolve_module(uri), module_allowlist)
    with P11_LOCK:
        check_alive()
        if not _library_matches(module, uri):
            raise TokenNotFoundError(f"PKCS#11 module {module.path} is not the library the URI names "
                                     "(library-manufacturer/description/version)")
        found = find_tokens(module, uri)
        found = [t for t in found if t.flags & TokenFlag.TOKEN_INITIALIZED]
        if not found:
            try:
                seen = sorted({t.label for t in list_tokens(module) if t.label})
            except p11x.PKCS11Error:
                seen = []
            raise TokenNotFoundError(
                f"no {uri.describe_token()} in PKCS#11 module {module.path}"
                + (f" (tokens present: {', '.join(repr(s) for s in seen)})" if seen else " (no initialised tokens)"),
                hint="check token= in the URI; for development create one with `capseal token init`",
            )
        if len(found) > 1:
            raise KeyURIError(
                f"{len(found)} tokens match {uri.describe_token()} in {module.path}; add serial= to the URI"
            )
        token = found[0]
        key = (module.real, _serial(token))
        existing = _TOKENS.get(key)
    # the prompt may block on a terminal: never while holding the lock
    secret = _secret_for(pin, existing, token.label, pin_prompt)
    with P11_LOCK:
        existing = _TOKENS.get(key)
        if existing is not None:
            if existing.pin_matches(secret):
                existing.ensure()
            elif existing.live():
                existing.check_pin(secret)  # raises: the token cannot be asked again
            else:  # its session is gone and this caller has another PIN: ask the token
                old, existing._pin = existing._pin, secret
                try:
                    existing.connect(pin_checked=False)
                except BaseException:
                    existing._pin = old
                    raise
            existing.users += 1
            return existing
        ts = TokenSession(module, token, uri, secret)
        ts.connect(pin_checked=False)
        ts.users += 1
        _TOKENS[key] = ts
        return ts


def _secret_for(pin: Secret | None, existing: TokenSession | None, label: str,
                prompt: Callable[[str], str | None] | None) -> Secret | None:
    """``pin`` (else the prompt's answer, held as a Secret from the start),
    checked to be usable (see ``usable_pin``); None when there is none."""
    if pin is None and prompt is not None:
        pin = as_secret(prompt(f"PIN for PKCS#11 token {label!r}"), f"secrets_handler for token {label!r}")
    return None if pin is None else usable_pin(pin, "pin=")


def release_token(ts: TokenSession) -> None:
    """A user of ``ts`` is done; the last one closes the session (logging out).

    Args:
        ts: the token session.
    """
    with P11_LOCK:
        ts.users -= 1
        if ts.users <= 0:
            ts.users = 0
            ts.close()
            key = (ts.module.real, ts.serial)
            if _TOKENS.get(key) is ts:
                del _TOKENS[key]


# ---------------------------------------------------------------------- fork and exit

# whether _before_fork took P11_LOCK, per forking thread: a fork on another
# thread, waiting meanwhile, must not change what this one releases
_fork = threading.local()


def _before_fork() -> None:
    """Wait (until the fork's deadline) for a PKCS#11 call running in another
    thread to return, and hold the lock across the fork: the forked copy of
    every module is then between calls, and its lock is free. The flag is
    cleared before the wait all the same."""
    _fork.held = False
    _fork.held = P11_LOCK.acquire(timeout=max(0.0, process.fork_deadline() - time.monotonic()))


def _after_fork_in_parent() -> None:
    if getattr(_fork, "held", False):
        P11_LOCK.release()


def _after_fork_in_child() -> None:
    """In the forked process: every loaded module must be initialised again
    before use, every token session log in again (its module's generation
    moves on, so the parent's session handles are never closed from here)."""
    try:
        if getattr(_fork, "held", False):
            P11_LOCK.release()  # this thread took it in _before_fork: it is ours here too
        else:
            # held by a thread that does not exist here, inside a call that may
            # have left the module's copy in any state; the RLock has no public reset
            P11_LOCK._at_fork_reinit()  # type: ignore[attr-defined]
            names = ", ".join(sorted(m.path for m in loaded_modules())) or "a PKCS#11 module"
            refuse_after_fork(f"this process was forked while another thread's call into {names} was "
                              f"running (the fork waits up to {process.FORK_WAIT:g} s for one to return; this one "
                              "did not): the module's state here is undefined, "
                              "so PKCS#11 is refused in this process")
    finally:  # whatever happened above, the parent's state is never used here as it is
        for module in loaded_modules():
            module.generation += 1
            module.inherited = True


def _close_all() -> None:
    """Close sessions before python-pkcs11's finaliser calls ``C_Finalize``,
    and stop late calls from daemon threads reaching a finalised module."""
    with P11_LOCK:
        shut_down()
        for ts in list(_TOKENS.values()):
            ts.close()
        _TOKENS.clear()


process.on_fork("devices", before=_before_fork, after_in_parent=_after_fork_in_parent,
                after_in_child=_after_fork_in_child)
process.at_exit("devices", _close_all)  # after open producers have had their records signed
