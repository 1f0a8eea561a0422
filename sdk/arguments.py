"""capseal.arguments — checks of the public API's numeric arguments (waits,
timeouts, counts), shared by capseal's packages so each refusal reads the
same and names the argument.

Why checked up front: a wait that is not a number of seconds from 0 to
``threading.TIMEOUT_MAX`` (a string, ``inf``, NaN) fails deep inside
``threading``, on a background thread, or makes every wait return at once."""

from __future__ import annotations

import threading
from typing import Any

from .errors import InputError, shown

__all__ = ["count", "seconds", "timeout"]


def seconds(value: Any, name: str, *, also: str = "") -> float:
    """``value`` as a wait.

    Args:
        value: what the caller passed.
        name: the argument's name, for the error.
        also: what else the argument takes, added to the error.

    Returns:
        ``value`` as a float: a number of seconds from 0 to ``threading.TIMEOUT_MAX``.

    Raises:
        InputError: ``value`` is not such a number (a bool, a string, NaN, ``inf``, a negative).
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= threading.TIMEOUT_MAX:
        raise InputError(f"{name} is a number of seconds from 0 to {threading.TIMEOUT_MAX:g}{also}, not {shown(value, 40)}")
    return float(value)


def timeout(value: Any, name: str = "timeout") -> float | None:
    """A ``timeout=`` argument.

    Args:
        value: what the caller passed.
        name: the argument's name, for the error.

    Returns:
        None (no limit), or ``value`` as :func:`seconds` reads it.

    Raises:
        InputError: as :func:`seconds`.
    """
    return None if value is None else seconds(value, name, also=" or None (no limit)")


def count(value: Any, name: str) -> int:
    """``value`` as a count.

    Args:
        value: what the caller passed.
        name: the argument's name, for the error.

    Returns:
        ``value``: a whole number from 1.

    Raises:
        InputError: ``value`` is not one (a bool, a float, zero, a negative), naming ``name``.
    """
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InputError(f"{name} is a whole number from 1, not {shown(value, 40)}")
    return value
