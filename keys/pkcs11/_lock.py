"""The one lock every PKCS#11 call in this process runs under, and the state
that decides whether a call may be made at all.

Why one lock for the whole process: python-pkcs11 calls ``C_Initialize(NULL)``,
which tells SoftHSM2 (and other modules) that the application will not call
it from several threads at once; SoftHSM2 then disables its own mutexes and
**segfaults** when two threads call it together, even on separate sessions.
So *every* python-pkcs11 call — load, slot/token listing, open, login, find,
attribute reads, sign, close — runs under :data:`P11_LOCK`. python-pkcs11
releases the GIL inside each C call, so other threads still run Python
(canonical form, hashing, the ledger) while the token signs.

Why calls may be refused: after the interpreter's exit handler closed the
sessions (:func:`shut_down`), a late call from a daemon thread would reach a
finalised module; and in a process forked while another thread's call did
not return within the fork's deadline (:func:`refuse_after_fork`), the
module's copy may be caught inside that call.
"""

from __future__ import annotations

import logging
import threading

from capseal.errors import (
    DeviceError,
    MissingExtraError,
    PinIncorrectError,
    PinLockedError,
    SignerError,
    SignerForkedError,
    SignerUnavailableError,
)

try:
    import pkcs11  # noqa: F401  (the backend's dependency: its absence is named here, once)
    from pkcs11 import exceptions as p11x
except ImportError as exc:  # pragma: no cover - the registry turns this into MissingExtraError
    raise MissingExtraError(
        f"the pkcs11: backend needs python-pkcs11 (pip install 'capseal[pkcs11]'): {exc}"
    ) from None

__all__ = ["P11_LOCK", "RECONNECT_ERRORS", "log", "p11x", "device_error", "check_alive", "is_shut_down",
           "shut_down", "refuse_after_fork"]

log = logging.getLogger("capseal.keys.pkcs11")

#: The one lock every python-pkcs11 call in this process runs under.
P11_LOCK = threading.RLock()

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
# in a process forked while another thread's PKCS#11 call did not return by
# the fork's deadline: why every PKCS#11 call here is refused (the module's
# copy may be caught inside that call). None otherwise.
_forked_mid_call: str | None = None


def device_error(exc: BaseException, where: str) -> SignerError:
    """A typed capseal error for a python-pkcs11 exception.

    Args:
        exc: what python-pkcs11 raised.
        where: names the token and key in the message.

    Returns:
        PinIncorrectError, PinLockedError, SignerUnavailableError (the token
        went away) or DeviceError; the caller raises it outside its ``except``
        block, so nothing is chained to it.
    """
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


def is_shut_down() -> bool:
    """Whether the exit handler has closed this process's PKCS#11 sessions.

    Returns:
        True from then on.
    """
    return _shutdown


def shut_down() -> None:
    """Refuse every PKCS#11 call from now on (the exit handler, lock held)."""
    global _shutdown
    _shutdown = True


def refuse_after_fork(reason: str) -> None:
    """Refuse every PKCS#11 call in this forked process.

    Args:
        reason: why, said by every refusal (:class:`SignerForkedError`).
    """
    global _forked_mid_call
    _forked_mid_call = reason


def check_alive() -> None:
    """Refuse a PKCS#11 call that must not be made now.

    Raises:
        SignerUnavailableError: the interpreter is shutting down.
        SignerForkedError: this process was forked in the middle of another thread's call.
    """
    if _shutdown:
        raise SignerUnavailableError("the interpreter is shutting down; PKCS#11 sessions are closed")
    if _forked_mid_call is not None:
        raise SignerForkedError(_forked_mid_call, hint="open signers in a process started with spawn or "
                                     "forkserver, or fork while no PKCS#11 call is running")
