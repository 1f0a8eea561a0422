"""Checks of the producer API's plain arguments, made before anything is signed,
queued or created. Each raises a typed error naming the argument, whatever the
caller passed (a value of the wrong type, a huge integer, a string holding a
lone surrogate or a control character): a value that reached SQLite or an
f-string unchecked raised a bare ``UnicodeEncodeError`` or ``ValueError``.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, NoReturn

from capseal.keys import Signer

from ..canonical import is_hex64
from ..errors import InputError, LedgerError, shown
from ..ledger import DatabaseURL, Ledger, as_url
from ..record import SealedRecord
from . import sealing

__all__ = ["text", "texts", "identity", "capsule_ref", "ledger_path", "epoch", "producer_arguments"]

# C0 controls and DEL: never part of a name a person reads, and U+001F is the
# separator of the ledger's producer stream key (operator, developer)
_CONTROL = re.compile(r"[\x00-\x1f\x7f]").search


def _utf8(name: str, value: str) -> str:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise InputError(f"{name} holds a lone UTF-16 surrogate, which has no UTF-8 form") from None
    return value


def text(name: str, value: Any, *, optional: bool = False) -> str | None:
    """``value`` if it is a string with a UTF-8 form (or None, when ``optional``).

    Args:
        name: the argument's name, for the error.
        value: what the caller passed.
        optional: whether None is accepted.

    Returns:
        ``value``.

    Raises:
        InputError: ``value`` is not a string (or None), or holds a lone surrogate.
    """
    if value is None and optional:
        return None
    if not isinstance(value, str):
        _refuse(name, value, "a string" + (" or None" if optional else ""))
    return _utf8(name, value)


def texts(*, optional: bool = False, **named: Any) -> None:
    """Each named argument is a string with a UTF-8 form (or None, when ``optional``).

    Raises:
        InputError: naming the first that is not.
    """
    for name, value in named.items():
        text(name, value, optional=optional)


def identity(name: str, value: Any) -> str:
    """``value`` if it is a non-empty string with no control characters and a
    UTF-8 form: the producer's own names (operator, developer, epoch id).

    Raises:
        InputError: otherwise, naming ``name``.
    """
    if not isinstance(value, str) or not value:
        _refuse(name, value, "a non-empty string")
    if _CONTROL(value):
        raise InputError(f"{name} holds a control character (U+0000–U+001F or U+007F): {shown(value)}")
    return _utf8(name, value)


def capsule_ref(name: str, value: Any) -> str:
    """The capsule id a parent argument names: a sealed record's id, or a
    64-digit lowercase hex capsule id.

    Raises:
        InputError: ``value`` is neither, naming ``name``.
    """
    capsule_id = value.capsule_id if isinstance(value, SealedRecord) else value
    if not is_hex64(capsule_id):
        _refuse(name, value, "a SealedRecord or a 64-digit lowercase hex capsule id")
    return str(capsule_id)


def ledger_path(value: Any) -> Path | DatabaseURL:
    """A ledger path a file can be opened at, or a ``postgresql://`` URL.

    Raises:
        LedgerError: an empty path, or one with a NUL byte (no file name holds one).
    """
    url = as_url(value)
    if url is not None:
        return url
    raw = os.fspath(value)
    if not isinstance(raw, str):
        raise LedgerError(f"a ledger path is text, not {type(raw).__name__}")
    if not raw:
        raise LedgerError("a ledger path is not empty")
    if "\x00" in raw:
        raise LedgerError(f"ledger path {shown(raw)} holds a NUL byte, which no file name can")
    return Path(raw)


def producer_arguments(operator: Any, developer: Any, signer: Any, ledger: Any, epoch_id: Any, model_id: Any, provider: Any,
             clock: Any, verify_signatures: Any, continue_epoch: bool) -> Path | DatabaseURL | None:
    """Every argument of :class:`Producer` checked before anything is made.

    Returns:
        The ledger path to open, or None for a :class:`Ledger` given.

    Raises:
        InputError, LedgerError, LedgerForkedError: as the class says.
    """
    identity("operator", operator)
    identity("developer", developer)
    if verify_signatures not in ("device", "always"):
        raise InputError("verify_signatures is 'device' (tokens and TPMs) or 'always'")
    if not callable(clock):
        raise InputError("clock is a function returning an RFC 3339 UTC timestamp")
    sealing.check_clock(clock)
    if not isinstance(signer, Signer):  # only the type is named: a key URI passed here may carry its PIN
        raise InputError(f"signer is a capseal.keys.Signer, not a {type(signer).__name__} "
                         "(capseal.keys.open_signer(uri) opens one from a key URI)")
    if not isinstance(ledger, (str, os.PathLike, Ledger, DatabaseURL)):
        raise InputError(f"ledger is a file path or a capseal.Ledger (or a postgresql:// URL), not a {type(ledger).__name__}")
    path = None if isinstance(ledger, Ledger) else ledger_path(ledger)
    epoch(epoch_id)
    if continue_epoch and epoch_id is not None:
        raise InputError("give epoch_id (a new epoch) or continue_epoch=True (the last one), not both")
    if (model_id is None) != (provider is None):
        raise InputError("model_id and provider are given together or not at all "
                         "(model_attestation holds both or neither)")
    texts(optional=True, model_id=model_id, provider=provider)
    if isinstance(ledger, Ledger):  # before the signer's self-test
        ledger.refuse_if_forked("Producer()")
    return path


def epoch(epoch_id: Any) -> None:
    """None (a new id is made) or a producer name (:func:`identity`).

    Raises:
        InputError: anything else.
    """
    if epoch_id is not None:
        try:
            identity("epoch_id", epoch_id)
        except InputError as exc:
            raise InputError(f"epoch_id is a non-empty string, or None for a new one ({exc})") from None


def _refuse(name: str, value: Any, what: str) -> NoReturn:
    raise InputError(f"{name} is {what}, not {shown(value)}")
