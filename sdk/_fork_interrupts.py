"""Ctrl-C kept out of capseal's fork hooks, and handed on after them.

capseal's before-fork hooks take locks (a ledger's, the PKCS#11 lock) that
its after-fork hooks release. A KeyboardInterrupt raised inside a hook is
reported and dropped by CPython, and one raised half-way through the
releases left the rest held for good: the parent's next append, or next
fork, waited for ever. So while the hooks run, SIGINT only records itself,
and once the last hook is done a Ctrl-C that came meanwhile is raised in the
main thread, a moment later, as if it had arrived then.

Only the main thread runs Python signal handlers, so only a fork made on it
needs this; a SIGINT handler that is not a Python callable (ignored, or the
default action) raises nothing and is left alone.
"""

from __future__ import annotations

import _thread
import signal
import threading
from typing import Any

__all__ = ["hold", "release"]

_holders: set[str] = set()
_saved: Any = None  # the SIGINT handler while the hooks run; None when not swapped
_caught = False


def _record(signum: int, frame: Any) -> None:
    global _caught
    _caught = True


def hold(holder: str) -> None:
    """First thing in a before-fork hook."""
    global _saved, _caught
    if threading.current_thread() is not threading.main_thread():
        return
    if not _holders:
        current = signal.getsignal(signal.SIGINT)
        if callable(current) and current is not _record:
            _caught = False
            signal.signal(signal.SIGINT, _record)
            _saved = current
    _holders.add(holder)


def release(holder: str) -> None:
    """Last thing in an after-fork hook (the parent's and the child's)."""
    global _saved
    _holders.discard(holder)
    if _holders or _saved is None or threading.current_thread() is not threading.main_thread():
        return
    saved, _saved = _saved, None
    signal.signal(signal.SIGINT, saved)
    if _caught:  # raised once the hooks are over, in the code that forked
        threading.Timer(0.01, _thread.interrupt_main).start()
