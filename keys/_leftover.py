"""A key made by a ``keys create`` that did not finish: removed again, or
named so that the operator can remove it (the public names are exported by
:mod:`capseal.keys.provision`).

Why: a Ctrl-C (or a failure) between the device making a key and the caller
receiving it would leave a key nobody was told of, under the label, handle or
file name the operator chose, and a second ``keys create`` would refuse the
name as taken. Every backend undoes what it made on the way out; when the
undoing itself fails, the exception on its way out says which key stayed
(:func:`note_left`, read by :func:`left_behind`), and the CLI prints it.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["held_interrupts", "left_behind", "note_left"]


def note_left(exc: BaseException, uri: str) -> None:
    """Mark an exception on its way out as leaving a key behind (an attribute it carries).

    Args:
        exc: the exception.
        uri: the key's URI.
    """
    try:
        exc.capseal_key_left = uri  # type: ignore[attr-defined]
    except AttributeError:  # an exception type without a __dict__: nothing to carry it
        pass


def left_behind(exc: BaseException) -> str | None:
    """The key a failed ``keys create`` made and could not remove.

    Args:
        exc: the exception the create raised.

    Returns:
        The key's URI (see :func:`note_left`), or None.
    """
    uri = getattr(exc, "capseal_key_left", None)
    return uri if isinstance(uri, str) else None


@contextmanager
def held_interrupts() -> Iterator[None]:
    """While the block undoes a new key, a Ctrl-C only records itself; it is
    raised when the block is done: a second Ctrl-C must not stop the undoing
    half-way. Only the main thread runs Python signal handlers, and a SIGINT
    handler that is not a Python callable (ignored, the default) is left alone.

    Returns:
        The context manager.

    Raises:
        KeyboardInterrupt: after the block, when a Ctrl-C came during it.
    """
    previous = signal.getsignal(signal.SIGINT)
    if threading.current_thread() is not threading.main_thread() or not callable(previous):
        yield
        return
    caught: list[int] = []
    signal.signal(signal.SIGINT, lambda signum, _frame: caught.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if caught:
        raise KeyboardInterrupt
