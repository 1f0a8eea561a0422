"""The one check every PIN passes before it reaches a device.

Why here, in a module of its own: the CLI (which reads PINs from files, the
environment and a prompt) and the PKCS#11 backend (``pin=``, a URI's
pin-value or pin-source) apply the same rule, and the CLI must not import
python-pkcs11 to do it. Every login with a PIN the token refuses uses up one
of its few tries (then the PIN locks), so a PIN that cannot be right is
refused before any login.
"""

from __future__ import annotations

from capseal.errors import PinIncorrectError

__all__ = ["text_problem", "usable_pin"]


def usable_pin(pin: object, source: str) -> str:
    """``pin`` if it can be sent to a token: a non-empty str that encodes as
    UTF-8 and holds no control character (a line break left from a file, a
    NUL). Otherwise PinIncorrectError naming ``source`` (``pin=``, the URI's
    pin-value, a pin-source file, an environment variable, …) and no part of
    the PIN, with no exception chained to it (a UnicodeEncodeError's args
    hold the whole string)."""
    problem = _pin_problem(pin)
    if problem is None and isinstance(pin, str):
        return pin
    raise PinIncorrectError(f"the PIN from {source} {problem}; refused before it reached the token",
                            hint="check where the PIN comes from: a token locks its PIN after a few wrong tries")


def text_problem(value: object) -> str | None:
    """What keeps ``value`` from being secret text for a device or a PEM (not
    a str, or not encodable as UTF-8), never quoting it; None if it is."""
    if not isinstance(value, str):
        return f"is a {type(value).__name__}, not a str"
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return "is not valid UTF-8 text (it holds undecodable bytes)"
    return None


def _pin_problem(pin: object) -> str | None:
    """What makes ``pin`` unusable (never quoting it), or None."""
    if pin == "":
        return "is empty"
    problem = text_problem(pin)
    if problem is None and isinstance(pin, str) and any(ord(c) < 0x20 or ord(c) == 0x7F for c in pin):
        return "holds a control character (a line break or tab left in a file?)"
    return problem
