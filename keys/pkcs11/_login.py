"""Logging in to a token: one ``C_Login`` on a session python-pkcs11
opened, and what each answer means.

Why ``C_Login`` is called straight through the module's function table
(:func:`capseal.keys.pkcs11._direct.c_login`) and not through
``Token.open(user_pin=...)``: python-pkcs11 opens a session there and, when
``C_Login`` fails, raises without closing it, so every refused PIN used up
one of the token's sessions. Here the session is opened without a PIN, and
a refused login closes it. Without a trusted function table, python-pkcs11's
own login is the fallback.

The PIN is held in a :class:`~capseal.keys.secret.Secret` and revealed only
in the expression that hands it to ``C_Login``; typed errors are raised
outside the ``except`` block that caught the python-pkcs11 error, so no
exception (or frame) is chained to them. Every function here is called with
``P11_LOCK`` held.
"""

from __future__ import annotations

import time
from typing import Any

import pkcs11
from pkcs11.constants import TokenFlag

from capseal.errors import DeviceError, PinIncorrectError, PinLockedError, SignerError, SignerUnavailableError
from capseal.keys.custody import SOFTWARE_TOKEN_MANUFACTURERS
from capseal.keys.secret import Secret, pin_advice

from ._direct import c_login, c_logout
from ._lock import device_error, p11x

__all__ = ["open_logged_in", "close_session"]

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


def close_session(session: Any, module_path: str, logged_in: bool) -> None:
    """Log out (if ``logged_in``: the login was ours, made by :func:`c_login`)
    and close ``session``. The session is closed whatever the logout answers:
    python-pkcs11's own ``close`` skips ``C_CloseSession`` when its
    ``C_Logout`` fails. Lock held.

    Args:
        session: the python-pkcs11 session.
        module_path: the module's real path.
        logged_in: whether the login was ours.
    """
    if logged_in:
        c_logout(module_path, session.handle)
    try:
        session.close()
    except p11x.PKCS11Error:
        pass


def open_logged_in(token: Any, pin: Secret | None, name: str, module_path: str, *,
                   pin_checked: bool = False) -> tuple[Any, bool]:
    """A session on ``token``, logged in if the token needs it, and whether
    this call made the login (its closer then logs out: :func:`close_session`).

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
    sessions. Lock held.

    Args:
        token: the python-pkcs11 token.
        pin: the PIN (None: a PIN pad, or a token without login).
        name: names the token in errors.
        module_path: the module's real path.
        pin_checked: the token took ``pin`` before in this process.

    Returns:
        The session, and whether this call made the login.

    Raises:
        PinLockedError: the user PIN is locked.
        PinIncorrectError: no PIN for a token that needs one, or the token refused it.
        SignerUnavailableError: other code holds the login and the PIN cannot be checked.
        DeviceError: the token answered C_Login otherwise.
    """
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
            close_session(session, module_path, False)
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
            close_session(session, module_path, False)
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
    rv: int | None = _CKR_GENERAL_ERROR
    for pause in _LOGIN_PAUSES:
        time.sleep(pause)
        rv = c_login(module_path, handle, _CKU_USER, pin)
        if rv != _CKR_GENERAL_ERROR:
            break
    return rv


def _unchecked_pin(pin: Secret | None, pin_checked: bool, name: str) -> SignerError | None:
    """The error for a login other code in this process holds, when ``pin``
    cannot be checked (see :func:`open_logged_in`); None when the session can
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

