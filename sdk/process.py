"""capseal.process — what capseal's objects do when the process forks or exits,
in one place.

Ledgers, producers, PKCS#11 sessions, TPM connections, signing children and
evidence workers belong to the process that opened them. Each registers here
what it must do at a fork or at exit; this module names none of them, and
runs their hooks in a fixed order whatever order their modules were imported
in:

* **fork** (``os.fork()`` without exec): one ``os.register_at_fork``. Before
  the fork, the ``before`` hooks run in the order of :data:`FORK_ORDER`
  (devices, then ledgers: each waits for the calls under way on it to end,
  all within one deadline, :data:`FORK_WAIT` seconds from the fork's start);
  after it, the ``after_in_parent`` or ``after_in_child`` hooks run in the
  reverse order, then the child's :class:`ForkCopies` mark what the child
  inherited. A Ctrl-C while the hooks run is held back and raised once they
  are done, in the thread that forked: a hook stopped half-way would leave a
  lock held for good.
* **exit**: one ``atexit`` handler runs the tracked objects' closers in the
  order of :data:`EXIT_ORDER` — producers (they finish what was submitted),
  then ledgers, then devices (so every record still on its way is signed
  before the key's session closes) — within :data:`EXIT_WAIT` seconds in all.
  Within a phase: the objects' closers, then the :func:`finalize` finalizers,
  then the :func:`at_exit` closers.

>>> from capseal import process
>>> process.on_fork("ledgers", before=take_locks, after_in_parent=release, after_in_child=mark)  # doctest: +SKIP
>>> process.close_at_exit("producers", producer, close_producer_at_exit)                   # doctest: +SKIP
>>> process.at_exit("devices", close_every_session)                                        # doctest: +SKIP
"""

from __future__ import annotations

import _thread
import atexit
import logging
import os
import signal
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any, Generic, TypeVar

__all__ = [
    "FORK_ORDER",
    "EXIT_ORDER",
    "FORK_WAIT",
    "EXIT_WAIT",
    "on_fork",
    "fork_deadline",
    "ForkCopies",
    "close_at_exit",
    "at_exit",
    "finalize",
    "Finalizer",
    "exit_deadline",
]

#: The order before-fork hooks run in (after-fork hooks run in reverse).
FORK_ORDER = ("devices", "ledgers")

#: The order closers run in at exit.
EXIT_ORDER = ("producers", "ledgers", "devices")

#: Seconds a fork waits, in all, for the calls under way on capseal's objects to end.
FORK_WAIT = 10.0

#: Seconds the exit waits, in all, for devices to sign what was submitted.
EXIT_WAIT = 10.0

log = logging.getLogger("capseal")

T = TypeVar("T")

_Hook = Callable[[], None]
_fork_hooks: dict[str, list[tuple[_Hook | None, _Hook | None, _Hook | None]]] = {p: [] for p in FORK_ORDER}
_child_marks: list[Callable[[], None]] = []
_lock = threading.Lock()
_deadline = 0.0  # monotonic deadline of the fork under way


def _phase(phase: str, known: tuple[str, ...], what: str) -> str:
    if phase not in known:
        raise ValueError(f"{what} phase {phase!r} is not one of {', '.join(known)}")
    return phase


def on_fork(phase: str, *, before: _Hook | None = None, after_in_parent: _Hook | None = None,
            after_in_child: _Hook | None = None) -> None:
    """Run hooks around every fork of this process, in ``phase``'s place.

    Args:
        phase: one of :data:`FORK_ORDER`.
        before: run in the parent just before the fork (may wait, until
            :func:`fork_deadline`, for calls under way to end).
        after_in_parent: run in the parent just after it.
        after_in_child: run in the child just after it.

    Raises:
        ValueError: ``phase`` is not one of :data:`FORK_ORDER`.
    """
    _phase(phase, FORK_ORDER, "fork")
    with _lock:
        _fork_hooks[phase].append((before, after_in_parent, after_in_child))


def fork_deadline() -> float:
    """The ``time.monotonic()`` value by which every before-fork hook of the
    fork under way must be done (one deadline for all of them).

    Returns:
        That deadline (meaningful only inside a before-fork hook).
    """
    return _deadline


class ForkCopies(Generic[T]):
    """Objects added here get ``inherited(obj)`` called on them in a forked child.

    Why a hook and a flag: the object's own hot path then pays one attribute
    test, no ``os.getpid()`` call. The set is emptied in the child, so a fork
    of the child marks only what the child made itself.

    Args:
        inherited: called on each object in the child, right after the fork.
    """

    def __init__(self, inherited: Callable[[T], None]) -> None:
        self._objects: weakref.WeakSet[Any] = weakref.WeakSet()
        self._inherited = inherited
        with _lock:
            _child_marks.append(self._after_fork_in_child)

    def add(self, obj: T) -> None:
        """Mark ``obj`` in any child forked from now on (held weakly).

        Args:
            obj: the object ``inherited`` is called on in the child.
        """
        self._objects.add(obj)

    def _after_fork_in_child(self) -> None:
        inherited = list(self._objects)
        self._objects.clear()
        for obj in inherited:
            self._inherited(obj)


# ---------------------------------------------------------------------------- Ctrl-C during the hooks

_saved_sigint: Any = None  # the SIGINT handler while the hooks run; None when not swapped
_sigint_caught = False


def _record_sigint(signum: int, frame: Any) -> None:
    global _sigint_caught
    _sigint_caught = True


def _hold_sigint() -> None:
    """Only the main thread runs Python signal handlers, so only a fork made
    there needs this; a handler that is not a Python callable is left alone."""
    global _saved_sigint, _sigint_caught
    if threading.current_thread() is not threading.main_thread():
        return
    current = signal.getsignal(signal.SIGINT)
    if callable(current) and current is not _record_sigint:
        _sigint_caught = False
        signal.signal(signal.SIGINT, _record_sigint)
        _saved_sigint = current


def _release_sigint() -> None:
    global _saved_sigint
    if _saved_sigint is None or threading.current_thread() is not threading.main_thread():
        return
    saved, _saved_sigint = _saved_sigint, None
    signal.signal(signal.SIGINT, saved)
    if _sigint_caught:  # raised once the hooks are over, in the code that forked
        threading.Timer(0.01, _thread.interrupt_main).start()


# ---------------------------------------------------------------------------- the one set of fork hooks

def _hooks() -> list[tuple[_Hook | None, _Hook | None, _Hook | None]]:
    with _lock:
        return [hook for phase in FORK_ORDER for hook in _fork_hooks[phase]]


_running: list[tuple[_Hook | None, _Hook | None, _Hook | None]] = []  # the hooks of the fork under way


def _before_fork() -> None:
    global _deadline, _running
    _hold_sigint()
    _deadline = time.monotonic() + FORK_WAIT
    _running = _hooks()
    for before, _, _ in _running:
        if before is not None:
            before()


def _after(which: int) -> None:
    try:
        for hook in reversed(_running):
            after = hook[which]
            if after is not None:
                after()
    finally:
        _release_sigint()


def _after_fork_in_parent() -> None:
    _after(1)


def _after_fork_in_child() -> None:
    try:
        _after(2)
    finally:
        with _lock:
            marks = list(_child_marks)
        for mark in marks:
            mark()


if hasattr(os, "register_at_fork"):  # POSIX only: without fork() nothing is inherited
    os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent,
                        after_in_child=_after_fork_in_child)


# ---------------------------------------------------------------------------- exit

_exit_objects: dict[str, weakref.WeakKeyDictionary[Any, Callable[[Any, float], None]]] = {
    p: weakref.WeakKeyDictionary() for p in EXIT_ORDER}
_exit_closers: dict[str, list[Callable[[], None]]] = {p: [] for p in EXIT_ORDER}
_exit_finalizers: dict[str, dict[Finalizer, None]] = {p: {} for p in EXIT_ORDER}  # ordered, held strongly
_final_lock = threading.RLock()
_exit_deadline = 0.0


def close_at_exit(phase: str, obj: T, close: Callable[[T, float], None]) -> None:
    """At exit, in ``phase``'s place, call ``close(obj, deadline)`` if ``obj``
    is still alive (held weakly: tracking keeps nothing alive).

    Args:
        phase: one of :data:`EXIT_ORDER`.
        obj: the object (a producer, a ledger, …).
        close: closes it; ``deadline`` is the exit's ``time.monotonic()``
            deadline. It should return at once for an object already closed.

    Raises:
        ValueError: ``phase`` is not one of :data:`EXIT_ORDER`.
    """
    _phase(phase, EXIT_ORDER, "exit")
    with _lock:
        _exit_objects[phase][obj] = close


def at_exit(phase: str, closer: Callable[[], None]) -> Callable[[], None]:
    """At exit, in ``phase``'s place, call ``closer()`` (the last registered
    first within a phase; :func:`exit_deadline` says by when it should be
    done).

    Args:
        phase: one of :data:`EXIT_ORDER`.
        closer: called with no arguments (held strongly).

    Returns:
        ``closer``, so that this is usable as a decorator.

    Raises:
        ValueError: ``phase`` is not one of :data:`EXIT_ORDER`.
    """
    _phase(phase, EXIT_ORDER, "exit")
    with _lock:
        _exit_closers[phase].append(closer)
    return closer


class Finalizer:
    """Calls ``func(*args, **kwargs)`` once: when called, when the object it
    watches is collected, or at exit in its phase, whichever comes first.

    Why not ``weakref.finalize``: weakref's own exit hook runs before
    capseal's handler (it is registered later) and then turns every
    ``weakref.finalize`` into a no-op, so a device closed from it, or from a
    closer of an earlier phase, would be closed too early or not at all.
    """

    __slots__ = ("_phase", "_call", "_ref", "__weakref__")

    def __init__(self, phase: str, obj: Any, func: Callable[..., Any], args: tuple[Any, ...],
                 kwargs: dict[str, Any]) -> None:
        self._phase = phase
        self._call: tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any]] | None = (func, args, kwargs)
        self._ref = weakref.ref(obj, self._collected)

    @property
    def alive(self) -> bool:
        """Whether ``func`` is still to be called."""
        return self._call is not None

    def _collected(self, _ref: Any) -> None:
        self()

    def __call__(self) -> Any:
        """Call ``func`` now if it was not called yet.

        Returns:
            What ``func`` returned, or None if it had already been called.
        """
        with _final_lock:  # re-entrant: a collection may call another finalizer in this thread
            call, self._call = self._call, None
            _exit_finalizers[self._phase].pop(self, None)
        if call is None:
            return None
        func, args, kwargs = call
        return func(*args, **kwargs)


def finalize(phase: str, obj: Any, func: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Finalizer:
    """Call ``func(*args, **kwargs)`` when ``obj`` is collected, or at exit in
    ``phase``'s place (the last registered first), or when the returned
    finalizer is called — once, whichever comes first.

    Args:
        phase: one of :data:`EXIT_ORDER`.
        obj: the object whose collection also runs ``func`` (held weakly).
        func: the closer.
        args: passed to ``func``.
        kwargs: passed to ``func``.

    Returns:
        The finalizer: call it to run ``func`` now.

    Raises:
        ValueError: ``phase`` is not one of :data:`EXIT_ORDER`.
    """
    _phase(phase, EXIT_ORDER, "exit")
    done = Finalizer(phase, obj, func, args, kwargs)
    with _final_lock:
        _exit_finalizers[phase][done] = None
    return done


def exit_deadline() -> float:
    """The ``time.monotonic()`` deadline of the exit under way.

    Returns:
        That deadline (meaningful only inside an exit closer).
    """
    return _exit_deadline


def _at_exit() -> None:
    global _exit_deadline
    _exit_deadline = time.monotonic() + EXIT_WAIT
    for phase in EXIT_ORDER:
        with _lock:
            objects = list(_exit_objects[phase].items())
            closers = list(reversed(_exit_closers[phase]))
        with _final_lock:
            finalizers = list(reversed(_exit_finalizers[phase]))
        for obj, close in objects:
            try:
                close(obj, _exit_deadline)
            except Exception as exc:  # noqa: BLE001 - every other object is still closed
                log.warning("capseal: closing %s at exit: %s: %s", type(obj).__name__, type(exc).__name__, exc)
        for done in finalizers:
            try:
                done()
            except Exception as exc:  # noqa: BLE001 - the other objects are still closed
                log.warning("capseal: finalizing at exit: %s: %s", type(exc).__name__, exc)
        for closer in closers:
            try:
                closer()
            except Exception as exc:  # noqa: BLE001 - the other devices are still closed
                log.warning("capseal: closing devices at exit: %s: %s", type(exc).__name__, exc)


atexit.register(_at_exit)
