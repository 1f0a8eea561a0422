"""Checks of the public API's numeric arguments, shared so each refusal reads
the same and names the argument.

Why a module: a wait passed as a string failed deep inside ``threading`` with
a bare TypeError, ``inf`` raised OverflowError from the wait (past
``threading.TIMEOUT_MAX``) on a background thread, and NaN made every wait
return at once; a ledger's ``group_window=-1`` was a bare ValueError."""

from __future__ import annotations

import threading
from typing import Any

from .errors import InputError

__all__ = ["count", "seconds", "timeout"]


def seconds(value: Any, name: str, *, also: str = "") -> float:
    """``value`` as a wait: a number of seconds from 0 to
    ``threading.TIMEOUT_MAX``. InputError naming ``name`` otherwise (the
    value shown cut short; ``also`` adds what else is taken)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= threading.TIMEOUT_MAX:
        raise InputError(f"{name} is a number of seconds from 0 to {threading.TIMEOUT_MAX:g}{also}, not {value!r:.40}")
    return float(value)


def timeout(value: Any, name: str = "timeout") -> float | None:
    """A ``timeout=`` argument: None (no limit) or :func:`seconds`."""
    return None if value is None else seconds(value, name, also=" or None (no limit)")


def count(value: Any, name: str) -> int:
    """``value`` as a count: a whole number from 1 (InputError naming ``name``)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InputError(f"{name} is a whole number from 1, not {value!r:.40}")
    return value
