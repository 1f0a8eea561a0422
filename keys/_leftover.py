"""A key made by a ``keys create`` that did not finish: removed again, or
named so that the operator can remove it.

Why: a Ctrl-C (or a failure) between the device making a key and the caller
receiving it left a key nobody was told of, under the label, handle or file
name the operator chose, so a second ``keys create`` refused the name as
taken. Every backend undoes what it made on the way out; when the undoing
itself fails, the exception on its way out says which key stayed
(:func:`note_left`, read by :func:`left_behind`), and the CLI prints it.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["held_interrupts", "left_behind", "note_left"]


def note_left(exc: BaseException, uri: str) -> None:
    """Mark ``exc`` (on its way out) as leaving the key at ``uri`` behind."""
    try:
        exc.capseal_key_left = uri  # type: ignore[attr-defined]
    except AttributeError:  # an exception type without a __dict__: nothing to carry it
        pass


def left_behind(exc: BaseException) -> str | None:
    """The URI of a key a failed ``keys create`` made and could not remove, or None."""
    uri = getattr(exc, "capseal_key_left", None)
    return uri if isinstance(uri, str) else None


@contextmanager
def held_interrupts() -> Iterator[None]:
    """While the block undoes a new key, a Ctrl-C only records itself; it is
    raised when the block is done. A second Ctrl-C must not stop the undoing
    half-way. Only the main thread runs Python signal handlers, and a SIGINT
    handler that is not a Python callable (ignored, the default) is left alone."""
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
