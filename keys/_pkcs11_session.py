"""Process-wide PKCS#11 state: loaded modules, one logged-in session per token, one lock.

Why this shape (measured, ``hardware-notes.md`` §2):

* python-pkcs11 0.10.1 calls ``C_Initialize(NULL)``, which tells SoftHSM2 (and
  other modules) that the application will not call it from several threads
  at once; SoftHSM2 then disables its own mutexes and **segfaults** when two
  threads call it together, even on separate sessions. So *every*
  python-pkcs11 call — load, slot/token listing, open, login, find, attribute
  reads, sign, close — runs under :data:`P11_LOCK`. python-pkcs11 releases the
  GIL inside each C call, so other threads still run Python (canonical form,
  hashing, the ledger) while the token signs.
* Login state is per token per process: a second ``C_Login`` fails with
  ``UserAlreadyLoggedIn``. So there is one :class:`TokenSession` per
  (module real path, token serial), shared by every signer; it holds one
  logged-in session, never one per signature.
* Sessions die underneath us (``C_CloseAllSessions`` elsewhere in the process,
  a token pulled out, a module reset). A :class:`TokenSession` notices,
  reconnects (find token, open, log in again) and the caller retries once.
  Other code in the process may even finalise the module (``C_Finalize``:
  another library that loaded it too, done with it). Every call then answers
  ``CKR_CRYPTOKI_NOT_INITIALIZED``; PKCS#11 says the application must then
  call ``C_Initialize`` again and log in again, which
  :meth:`Module.recover_if_finalized` and the reconnect do, once per call.
* Calls are made through ``_pkcs11_calls.run`` (lock, reconnect, retry once;
  a worker thread when threads contend).
* Search iterators are always drained under the lock: an abandoned one calls
  ``C_FindObjectsFinal`` from its finaliser, i.e. from whatever thread the
  garbage collector runs in, outside the lock.
* A process forked from this one (``os.fork()`` without exec: multiprocessing's
  ``fork``, a pre-forking server) is, for PKCS#11, another application: it
  must call ``C_Initialize`` itself *before anything else*, and log in itself;
  using the parent's module state is undefined (PKCS#11 v2.40 §5.5.1). So a
  fork first waits (up to :data:`FORK_WAIT` s) for a call running in another
  thread to return, so the forked copy of the module is never caught half-way
  through one and the lock is free there; in the fork every loaded module is
  initialised again on its first use (:meth:`Module.ensure_initialized`) and
  every token session logs in again. A fork that could not wait refuses
  PKCS#11 in the forked process with a typed error instead of risking a hang.

The PIN is kept (to log in again after a reconnect) inside a :class:`Secret`
(``_pin``) whose ``repr`` hides it, and is revealed only in the expression
that hands it to ``C_Login``; typed errors are raised outside the ``except`` block
that caught the python-pkcs11 error, so no exception (or frame) is chained to them.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from capseal import _fork_interrupts
from capseal._at_exit import close_devices_last
from capseal.errors import (
    DeviceError,
    KeyURIError,
    MissingExtraError,
    PinIncorrectError,
    PinLockedError,
    SignerError,
    SignerForkedError,
    SignerUnavailableError,
    TokenNotFoundError,
)

from ._pin import Secret, as_secret, pin_advice, usable_pin
from ._pkcs11_uri import PKCS11URI, check_module_allowed, resolve_module
from .custody import SOFTWARE_TOKEN_MANUFACTURERS

try:
    import pkcs11
    from pkcs11 import exceptions as p11x
    from pkcs11.constants import TokenFlag
except ImportError as exc:  # pragma: no cover - the registry turns this into MissingExtraError
    raise MissingExtraError(
        f"the pkcs11: backend needs python-pkcs11 (pip install 'capseal[pkcs11]'): {exc}"
    ) from None

__all__ = ["P11_LOCK", "Module", "TokenSession", "load_module", "open_token", "release_token", "RECONNECT_ERRORS",
           "device_error", "log", "is_shut_down", "usable_pin"]

log = logging.getLogger("capseal.keys.pkcs11")

#: The one lock every python-pkcs11 call in this process runs under.
P11_LOCK = threading.RLock()

#: Seconds a fork waits for a PKCS#11 call running in another thread. Calls
#: take milliseconds; this bounds the wait behind a hung device (or a
#: smart card generating an RSA key), after which the fork goes ahead and
#: refuses PKCS#11 (see _forked_mid_call).
FORK_WAIT = 10.0

#: Errors after which the session (or the key handle) is gone but the token may
#: still be there: reconnect and retry once.
RECONNECT_ERRORS: tuple[type[BaseException], ...] = (
    p11x.SessionClosed,
    p11x.SessionHandleInvalid,
    p11x.DeviceRemoved,
    p11x.TokenNotPresent,
    p11x.ObjectHandleInvalid,
    p11x.KeyHandleInvalid,
    p11x.UserNotLoggedIn,
)

_shutdown = False
# in a process forked while another thread's PKCS#11 call did not return in
# FORK_WAIT s: why every PKCS#11 call here is refused (the module's copy may
# be caught inside that call). None otherwise.
_forked_mid_call: str | None = None
_CKR_CRYPTOKI_ALREADY_INITIALIZED = 0x191


def device_error(exc: BaseException, where: str) -> SignerError:
    """A typed capseal error for a python-pkcs11 exception (no chaining)."""
    name = type(exc).__name__
    if isinstance(exc, p11x.PinIncorrect):
        return PinIncorrectError(f"{where}: the token refused the PIN")
    if isinstance(exc, p11x.PinLocked):
        return PinLockedError(f"{where}: the user PIN is locked (too many wrong attempts)",
                              hint="unlock it with the SO PIN (e.g. pkcs11-tool --init-pin --login-type so)")
    if isinstance(exc, (p11x.PinExpired, p11x.UserPinNotInitialized)):
        return PinLockedError(f"{where}: the user PIN is {'expired' if isinstance(exc, p11x.PinExpired) else 'not initialised'}",
                              hint="set a user PIN with the token's SO PIN (pkcs11-tool --init-pin)")
    if isinstance(exc, RECONNECT_ERRORS):
        return SignerUnavailableError(f"{where}: the token went away ({name})")
    return DeviceError(f"{where}: the token returned {name}")


# ---------------------------------------------------------------------- modules


def _version(pair: tuple[int, int]) -> str:
    """``(2, 6)`` → ``"2.6"``: a string, never a float (custody statements are hashed JSON)."""
    return f"{pair[0]}.{pair[1]}"


@dataclass
class Module:
    """A loaded PKCS#11 module. ``generation`` grows each time the module is
    re-initialised; session handles from an older generation are dead."""

    path: str
    real: str
    lib: Any
    generation: int = 0
    #: loaded before this process was forked from its parent, and not yet
    #: initialised here (see ensure_initialized)
    inherited: bool = False

    def info(self) -> dict[str, str]:
        lib = self.lib
        return {
            "library_manufacturer": lib.manufacturer_id,
            "library_description": lib.library_description,
            "library_version": _version(lib.library_version),
            "cryptoki_version": _version(lib.cryptoki_version),
        }

    def reinitialize(self) -> None:
        """``C_Finalize`` + ``C_Initialize``: SoftHSM2 (and some other modules)
        see tokens created, and recover from storage that vanished, only then.
        Every session of this module in the process dies; the generation bump
        tells each TokenSession to reconnect instead of using a dead handle."""
        self.generation += 1
        log.info("re-initialising PKCS#11 module %s", self.path)
        failure = None
        try:
            if self.lib.initialized:
                self.lib.finalize()
        except p11x.PKCS11Error:
            pass  # finalised underneath already (other code called C_Finalize): initialising is all that is left
        try:
            self.lib.initialize()
        except p11x.PKCS11Error as exc:
            failure = type(exc).__name__
        if failure is not None:  # raised outside the handler: no exception context at all
            raise SignerUnavailableError(f"PKCS#11 module {self.path} cannot be initialised ({failure})",
                                         hint=_module_hint(self.path))

    def recover_if_finalized(self, exc: BaseException | None = None) -> bool:
        """Whether the module had been finalised underneath this process's
        sessions (``C_Finalize`` by other code that loaded it too), in which
        case it is initialised again here and every session of it is marked
        dead (``generation``), so each TokenSession reconnects and logs in
        again on its next call, as PKCS#11 requires.

        Asked with ``C_Initialize`` itself, through the module's function
        table: a module in use answers ``CKR_CRYPTOKI_ALREADY_INITIALIZED``
        and nothing changes; a finalised one answers ``CKR_OK`` and is
        initialised by that very call. Without a trusted table, python-pkcs11's
        own message for ``CKR_CRYPTOKI_NOT_INITIALIZED`` (``exc``) decides,
        and the module is re-initialised through python-pkcs11. Lock held."""
        if self.inherited:  # a fork's first use: ensure_initialized's job
            return False
        from ._pkcs11_fast import c_initialize

        rv = c_initialize(self.real)
        if rv is None:
            if exc is None or "not initialized" not in str(exc):
                return False
            self.reinitialize()
        elif rv != 0:
            return False
        else:
            self.generation += 1
        log.warning("PKCS#11 module %s was finalised by other code in this process; initialised it again "
                    "(its sessions log in again)", self.path)
        return True

    def ensure_initialized(self) -> None:
        if self.inherited:
            self._initialize_in_fork()
        elif not self.lib.initialized:  # an earlier re-initialisation failed
            self.reinitialize()

    def _initialize_in_fork(self) -> None:
        """First use in a process forked from one that had loaded the module:
        ``C_Initialize`` comes first (PKCS#11 v2.40 §5.5.1). A module that
        notices the fork starts afresh and answers ``CKR_OK`` (OpenSC, for
        one, thereby lets go of the parent's reader connections without
        closing them). One that answers ``CKR_CRYPTOKI_ALREADY_INITIALIZED``
        still holds the parent's state (SoftHSM2): ``C_Finalize`` +
        ``C_Initialize`` give this process its own. The parent's sessions,
        whose handles this process shares, are never closed from here
        (``generation`` moved on at the fork)."""
        from ._pkcs11_fast import c_initialize  # the one place that holds the raw function table

        rv = c_initialize(self.real)
        self.inherited = False
        if rv == 0:
            log.info("PKCS#11 module %s initialised in this forked process", self.path)
            return
        if rv is not None and rv != _CKR_CRYPTOKI_ALREADY_INITIALIZED:
            self.inherited = True  # tried again on the next use
            raise SignerForkedError(
                f"PKCS#11 module {self.path} cannot be initialised in this forked process (C_Initialize answered 0x{rv:x})",
                hint="open signers in a process started with spawn or forkserver")
        self.reinitialize()


_MODULES: dict[str, Module] = {}


def _module_hint(path: str) -> str:
    if "softhsm" in path.lower():
        conf = os.environ.get("SOFTHSM2_CONF", "/etc/softhsm/softhsm2.conf")
        return f"SoftHSM2 reads {conf} (SOFTHSM2_CONF): check that it exists and that its tokendir is there"
    return "check the module's own configuration and that the device is connected"


def load_module(path: str, allowlist: object = None) -> Module:
    """Load (once per real path) the module at ``path``, after the allow-list check."""
    real = check_module_allowed(path, allowlist)  # before anything is loaded
    with P11_LOCK:
        _check_alive()
        module = _MODULES.get(real)
        if module is not None:
            module.ensure_initialized()
            return module
        if not os.path.exists(path):
            raise SignerUnavailableError(f"PKCS#11 module {path} does not exist",
                                         hint="install the token's PKCS#11 module and fix module-path")
        if not os.path.isfile(real) or not os.access(real, os.R_OK):
            raise SignerUnavailableError(f"PKCS#11 module {path} is not a readable file")
        # pkcs11.lib caches by the string it is given; two spellings of one
        # file would C_Initialize it twice. Reuse any object for the same file.
        lib = None
        for so, existing in list(getattr(pkcs11, "_loaded", {}).items()):
            if os.path.realpath(so) == real:
                lib = existing
        detail = None
        try:
            lib = lib if lib is not None else pkcs11.lib(real)
            if not lib.initialized:
                lib.initialize()
        except p11x.PKCS11Error as exc:
            detail = str(exc).replace(real, path) if str(exc) else type(exc).__name__
        if detail is not None:
            raise SignerUnavailableError(f"cannot load PKCS#11 module {path}: {detail}", hint=_module_hint(path))
        # and let python-pkcs11 hand this object to anyone asking by the
        # spelling we were given, instead of initialising the module twice
        getattr(pkcs11, "_loaded", {}).setdefault(path, lib)
        module = Module(path=path, real=real, lib=lib)
        _MODULES[real] = module
        return module


# ---------------------------------------------------------------------- tokens


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


def _list_tokens(module: Module) -> list[Any]:
    """Tokens present in the module's slots (under the lock)."""
    tokens = []
    for slot in module.lib.get_slots(token_present=True):
        try:
            tokens.append(slot.get_token())
        except (p11x.TokenNotPresent, p11x.TokenNotRecognised):
            continue
    return tokens


#: seconds to wait before each re-initialise-and-look-again when a token is
#: not found (see _find_tokens): the whole wait comes only to a token that is
#: really absent (or a module that cannot list), under the lock
_RESCAN_PAUSES = (0.0, 0.05, 0.2)


def _find_tokens(module: Module, uri: PKCS11URI) -> list[Any]:
    """Matching initialised tokens. SoftHSM2 only sees tokens that existed at
    ``C_Initialize``, and a module whose storage vanished answers
    ``GeneralError``: in both cases re-initialise and look again.

    Why more than once, after a pause: SoftHSM2 rewrites a token's
    ``token.object`` at every ``C_Login`` (the PIN-count flags), truncating it
    first, and a ``C_Initialize`` in another process that reads it meanwhile
    leaves that token out until the next ``C_Initialize`` (measured: about 3
    in 1,000 initialisations, while another process logs in over and over;
    a second look without re-initialising found it 3 times in 29). Several
    workers of one pool, each logging in, did that to each other: a token
    reported absent that was there."""
    module.ensure_initialized()
    try:
        found = [t for t in _list_tokens(module) if _token_matches(t, uri)]
    except p11x.PKCS11Error as exc:
        found = []
        if module.recover_if_finalized(exc):  # finalised underneath: initialised again, look once more
            try:
                found = [t for t in _list_tokens(module) if _token_matches(t, uri)]
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
            found = [t for t in _list_tokens(module) if _token_matches(t, uri)]
        except p11x.PKCS11Error as exc:
            failure = type(exc).__name__
            continue
        failure = None
        if found:
            return found
    if failure is None:
        return []
    raise SignerUnavailableError(f"PKCS#11 module {module.path} cannot list its tokens ({failure})",
                                 hint=_module_hint(module.path))


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
        return f"token {self.label!r} (serial {self.serial}, module {self.module.path})"

    def device_info(self) -> dict[str, Any]:
        token, slot = self.token, self.token.slot
        info: dict[str, Any] = {
            "token_label": token.label,
            "manufacturer": token.manufacturer_id,
            "model": token.model,
            "serial": self.serial,
            "hardware_version": _version(token.hardware_version),
            "firmware_version": _version(token.firmware_version),
            "slot_description": slot.slot_description,
            "module": self.module.real,  # the file loaded (symlinks resolved), not how the URI spelled it
        }
        info.update(self.module.info())
        return info

    def __repr__(self) -> str:
        return f"<TokenSession {self.name} {'open' if self.session is not None else 'closed'}>"

    # -- connection

    def live(self) -> bool:
        return self.session is not None and self.generation == self.module.generation

    def ensure(self) -> Any:
        """The logged-in session, reconnecting if it is gone."""
        _check_alive()
        if not self.live():
            self.connect()
        return self.session

    def connect(self, *, pin_checked: bool = True) -> None:
        """Find the token again (by label and serial), open a session, log in.
        ``pin_checked``: the token took this session's PIN before (a
        reconnect); False for a PIN tried for the first time (see
        :func:`_open_logged_in`)."""
        self._drop()
        found = _find_tokens(self.module, self._match)
        if not found:
            raise TokenNotFoundError(f"{self.name} is not present")
        token = found[0]
        self.token = token
        self.session, self._logged_in = _open_logged_in(token, self._pin, self.name, self.module.real,
                                                        pin_checked=pin_checked)
        self.pin_refused = False  # the token takes the PIN (again)
        self.generation = self.module.generation
        self.epoch += 1

    def invalidate(self, exc: BaseException) -> None:
        """The session (or a key handle) failed with ``exc``: forget it so the
        next call reconnects. A handle that is already dead is not closed
        (its number may by now belong to someone else's session)."""
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
            _close_session(session, self.module.real, logged_in)

    def pin_matches(self, pin: Secret | None) -> bool:
        if self._pin is None or pin is None:
            return self._pin is None and pin is None
        return self._pin.matches(pin)

    def check_pin(self, pin: Secret | None) -> None:
        """A second signer on a logged-in token: the token cannot be asked
        again (``UserAlreadyLoggedIn``), so compare with the PIN that worked."""
        if self._pin is None or pin is None:
            if self._pin is not pin:
                raise PinIncorrectError(f"{self.name} is logged in with a PIN; this caller gave none")
            return
        if not self._pin.matches(pin):
            raise PinIncorrectError(
                f"{self.name}: the PIN given differs from the one this process logged in with"
            )

    def pin_for_child(self) -> Secret | None:
        """The PIN this process logged in with (as a Secret), for a signing
        process of this signer's (``_pkcs11_helper``), which sends it down the
        child's stdin, and for ``create_key``, which opens the new key with
        it. Read under the lock: ``open_token`` swaps in a caller's PIN while
        it tries it, and only a PIN the token took is sent."""
        with P11_LOCK:
            return self._pin

    def child_refused(self, sent: Secret | None) -> None:
        """A signing process's child was refused the PIN ``sent`` (None: no
        PIN, a PIN pad, whose refusal is marked too: nobody is prompted again
        in the background): remembered (see ``pin_refused``) if it is still
        what this process holds — a caller may have brought the right one
        meanwhile, and then the next start tries that."""
        with P11_LOCK:
            if self.pin_matches(sent):
                self.pin_refused = True

    def child_accepted(self, sent: Secret | None) -> None:
        """A child logged in with ``sent``: if it is what this process holds,
        the token takes it (again)."""
        with P11_LOCK:
            if self.pin_matches(sent):
                self.pin_refused = False

    def close(self) -> None:
        self._drop()


_CKU_USER = 1
_CKR_GENERAL_ERROR = 0x05
_CKR_USER_ALREADY_LOGGED_IN = 0x100
#: what ``C_Login`` answers (PKCS#11 v2.40 §5.6), as the python-pkcs11
#: exception ``device_error`` turns into capseal's typed error
_LOGIN_ERRORS: dict[int, type[p11x.PKCS11Error]] = {
    0x02: p11x.HostMemory, 0x05: p11x.GeneralError, 0x06: p11x.FunctionFailed, 0x07: p11x.ArgumentsBad,
    0x30: p11x.DeviceError, 0x31: p11x.DeviceMemory, 0x32: p11x.DeviceRemoved, 0x50: p11x.FunctionCancelled,
    0xA0: p11x.PinIncorrect, 0xA1: p11x.PinInvalid, 0xA2: p11x.PinLenRange, 0xA3: p11x.PinExpired,
    0xA4: p11x.PinLocked, 0xB0: p11x.SessionClosed, 0xB3: p11x.SessionHandleInvalid,
    0xB7: p11x.SessionReadOnlyExists, 0xE0: p11x.TokenNotPresent, 0x102: p11x.UserPinNotInitialized,
    0x104: p11x.AnotherUserAlreadyLoggedIn, 0x105: p11x.UserTooManyTypes,
}


def _close_session(session: Any, module_path: str, logged_in: bool) -> None:
    """Log out (if ``logged_in``: the login was ours, made by :func:`c_login`)
    and close ``session``. The session is closed whatever the logout answers:
    python-pkcs11's own ``close`` skips ``C_CloseSession`` when its
    ``C_Logout`` fails. Lock held."""
    from ._pkcs11_fast import c_logout

    if logged_in:
        c_logout(module_path, session.handle)
    try:
        session.close()
    except p11x.PKCS11Error:
        pass


def _open_logged_in(token: Any, pin: Secret | None, name: str, module_path: str, *,
                    pin_checked: bool = False) -> tuple[Any, bool]:
    """A session on ``token``, logged in if the token needs it, and whether
    this call made the login (its closer then logs out: :func:`_close_session`).

    When other code in this process already holds a login on the token, it
    answers ``UserAlreadyLoggedIn`` to any PIN: ``pin`` is then taken only if
    ``pin_checked`` (the token took it before in this process: a
    :class:`TokenSession` reconnecting). A PIN it has not taken is refused,
    not kept as the PIN the token took — for reconnects, and for a signing
    process, whose own login with a wrong one the token would count as a
    failed attempt.

    The session is opened without a PIN and logged in with ``C_Login`` on its
    handle (:func:`c_login`), so a refused login closes it: python-pkcs11's
    ``Token.open(user_pin=...)`` leaves the session it opened behind when
    ``C_Login`` fails, and every refused PIN used up one of the token's
    sessions. Lock held."""
    from ._pkcs11_fast import c_login

    flags = token.flags
    if flags & TokenFlag.USER_PIN_LOCKED:
        raise PinLockedError(f"{name}: the user PIN is locked (too many wrong attempts)",
                             hint="unlock it with the SO PIN (pkcs11-tool --init-pin --login-type so)")
    pad = pin is None and bool(flags & TokenFlag.PROTECTED_AUTHENTICATION_PATH)
    if pin is None and not pad and flags & TokenFlag.LOGIN_REQUIRED:
        raise PinIncorrectError(f"{name} needs a PIN: {pin_advice()}, or add pin-source= to the URI")
    failure: SignerError | None = None
    session: Any = None
    kept = False  # until the session is handed to the caller; closed otherwise, whatever stops this
    try:
        session = token.open()
        if pin is None and not pad:
            kept = True
            return session, False
        rv = c_login(module_path, session.handle, _CKU_USER, pin)
        if rv == _CKR_GENERAL_ERROR and token.manufacturer_id in SOFTWARE_TOKEN_MANUFACTURERS:
            rv = _login_again(module_path, session.handle, pin)
        if rv is None:  # no trusted function table (Windows, an unexpected layout): python-pkcs11 logs in
            _close_session(session, module_path, False)
            session = None
            return _login_by_python_pkcs11(token, pin, name, pin_checked), False
        if rv == 0:
            kept = True
            return session, True
        if rv == _CKR_USER_ALREADY_LOGGED_IN:
            # someone else in this process logged in to this token: the login
            # state is shared, so this session can sign — but the PIN is unchecked
            failure = _unchecked_pin(pin, pin_checked, name)
            if failure is None:
                kept = True
                return session, False
        else:
            error = _LOGIN_ERRORS.get(rv)
            failure = (device_error(error(), name) if error is not None
                       else DeviceError(f"{name}: the token answered C_Login with 0x{rv:x}"))
    except p11x.PKCS11Error as exc:
        failure = device_error(exc, name)
    finally:
        if session is not None and not kept:
            _close_session(session, module_path, False)
    raise failure  # outside the handler: nothing of the login is chained to it


#: seconds before each new C_Login after a SoftHSM2 login answered
#: CKR_GENERAL_ERROR (see _login_again); the lock is held meanwhile
_LOGIN_PAUSES = (0.05, 0.2)


def _login_again(module_path: str, handle: int, pin: Secret | None) -> int | None:
    """``C_Login`` again, after a pause, for a SoftHSM2 token that answered
    ``CKR_GENERAL_ERROR``: its ``token.object`` is rewritten (truncated
    first) at every login, and a login in another process that reads it
    meanwhile fails so (seen with fork-pool workers logging in together:
    a few logins in a hundred). It is not a refused PIN, and SoftHSM2 counts
    none. The last answer is returned. Lock held."""
    from ._pkcs11_fast import c_login

    rv: int | None = _CKR_GENERAL_ERROR
    for pause in _LOGIN_PAUSES:
        time.sleep(pause)
        rv = c_login(module_path, handle, _CKU_USER, pin)
        if rv != _CKR_GENERAL_ERROR:
            break
    return rv


def _unchecked_pin(pin: Secret | None, pin_checked: bool, name: str) -> SignerError | None:
    """The error for a login other code in this process holds, when ``pin``
    cannot be checked (see :func:`_open_logged_in`); None when the session can
    be used: no PIN was given (a PIN pad), or the token took ``pin`` before."""
    if pin is None or pin_checked:
        return None
    # not PinIncorrectError: the PIN may be right, and nothing was asked of the token
    return SignerUnavailableError(
        f"{name} is already logged in by other code in this process, so the token cannot check the PIN given; "
        "capseal does not use a login for a PIN the token has not taken",
        hint="open the signer before that code logs in, or have it log out first")


def _login_by_python_pkcs11(token: Any, pin: Secret | None, name: str, pin_checked: bool) -> Any:
    """python-pkcs11's own login, for a module whose function table is not
    called directly. A refused login leaves its session open (python-pkcs11
    0.10.1 does not close it). Its sessions log out when closed."""
    failure = None
    try:
        return token.open(user_pin=pkcs11.PROTECTED_AUTH if pin is None else pin.reveal())
    except p11x.UserAlreadyLoggedIn:
        failure = _unchecked_pin(pin, pin_checked, name)
    if failure is not None:
        raise failure
    # someone else in this process logged in to this token: the login
    # state is shared, so a PIN-less session can sign
    return token.open()


_TOKENS: dict[tuple[str, str], TokenSession] = {}


def open_token(uri: PKCS11URI, *, pin: str | Secret | None, module_allowlist: object = None,
               pin_prompt: Callable[[str], str | None] | None = None) -> TokenSession:
    """The shared :class:`TokenSession` for the token ``uri`` names, logged in.

    Raises TokenNotFoundError (no token matches), KeyURIError (several match),
    PinIncorrectError / PinLockedError, SignerUnavailableError (module)."""
    pin = as_secret(pin, "pin=")
    module = load_module(resolve_module(uri), module_allowlist)
    with P11_LOCK:
        _check_alive()
        if not _library_matches(module, uri):
            raise TokenNotFoundError(f"PKCS#11 module {module.path} is not the library the URI names "
                                     "(library-manufacturer/description/version)")
        found = _find_tokens(module, uri)
        found = [t for t in found if t.flags & TokenFlag.TOKEN_INITIALIZED]
        if not found:
            try:
                seen = sorted({t.label for t in _list_tokens(module) if t.label})
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
    """A user of ``ts`` is done; the last one closes the session (logging out)."""
    with P11_LOCK:
        ts.users -= 1
        if ts.users <= 0:
            ts.users = 0
            ts.close()
            key = (ts.module.real, ts.serial)
            if _TOKENS.get(key) is ts:
                del _TOKENS[key]


def is_shut_down() -> bool:
    return _shutdown


def _check_alive() -> None:
    if _shutdown:
        raise SignerUnavailableError("the interpreter is shutting down; PKCS#11 sessions are closed")
    if _forked_mid_call is not None:
        raise SignerForkedError(_forked_mid_call, hint="open signers in a process started with spawn or "
                                     "forkserver, or fork while no PKCS#11 call is running")


# ---------------------------------------------------------------------- fork

# whether _before_fork took P11_LOCK, per forking thread: a fork on another
# thread, waiting meanwhile, must not change what this one releases
_fork = threading.local()


def _before_fork() -> None:
    """Wait for a PKCS#11 call running in another thread to return, and hold
    the lock across the fork: the forked copy of every module is then between
    calls, and its lock is free. A Ctrl-C meanwhile is held back until the
    after-fork hooks are done (``capseal._fork_interrupts``); the flag is
    cleared before the wait all the same."""
    _fork_interrupts.hold("pkcs11")
    _fork.held = False
    _fork.held = P11_LOCK.acquire(timeout=FORK_WAIT)


def _after_fork_in_parent() -> None:
    try:
        if getattr(_fork, "held", False):
            P11_LOCK.release()
    finally:
        _fork_interrupts.release("pkcs11")


def _after_fork_in_child() -> None:
    """In the forked process: every loaded module must be initialised again
    before use, every token session log in again (its module's generation
    moves on, so the parent's session handles are never closed from here)."""
    global _forked_mid_call
    try:
        if getattr(_fork, "held", False):
            P11_LOCK.release()  # this thread took it in _before_fork: it is ours here too
        else:
            # held by a thread that does not exist here, inside a call that may
            # have left the module's copy in any state
            P11_LOCK._at_fork_reinit()  # type: ignore[attr-defined]
            names = ", ".join(sorted(m.path for m in _MODULES.values())) or "a PKCS#11 module"
            _forked_mid_call = (f"this process was forked while another thread's call into {names} was "
                                f"running (the fork waits up to {FORK_WAIT:g} s for one to return; this one "
                                "did not): the module's state here is undefined, "
                                "so PKCS#11 is refused in this process")
    finally:  # whatever happened above, the parent's state is never used here as it is
        for module in _MODULES.values():
            module.generation += 1
            module.inherited = True
        _fork_interrupts.release("pkcs11")


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent,
                        after_in_child=_after_fork_in_child)


@close_devices_last  # after open producers have had their records signed (see capseal._at_exit)
def _close_all() -> None:
    """Close sessions before python-pkcs11's finaliser calls ``C_Finalize``,
    and stop late calls from daemon threads reaching a finalised module."""
    global _shutdown
    with P11_LOCK:
        _shutdown = True
        for ts in list(_TOKENS.values()):
            ts.close()
        _TOKENS.clear()
