"""The live objects of one kind that a forked process inherits, and what it
does to each: one mechanism for every object that belongs to the process
that made it (a TPM device, an evidence worker, a PKCS#11 signing child).

Why a hook and a flag: the object's own hot path then pays one attribute
test, no ``os.getpid()`` call. The set is emptied in the child, so a fork of
the child marks only what the child made itself (the marks it inherited
stay on the objects). Ledgers need more than a mark (their locks are taken
before the fork): see :mod:`._ledger_fork`.
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Callable
from typing import Generic, TypeVar

__all__ = ["ForkCopies"]

T = TypeVar("T")


class ForkCopies(Generic[T]):
    """Objects added here get ``inherited(obj)`` called on them in a forked child."""

    def __init__(self, inherited: Callable[[T], None]) -> None:
        self._objects: weakref.WeakSet[T] = weakref.WeakSet()  # type: ignore[type-var]
        self._inherited = inherited
        if hasattr(os, "register_at_fork"):  # POSIX only: without fork() nothing is inherited
            os.register_at_fork(after_in_child=self._after_fork_in_child)

    def add(self, obj: T) -> None:
        self._objects.add(obj)

    def _after_fork_in_child(self) -> None:
        inherited = list(self._objects)
        self._objects.clear()
        for obj in inherited:
            self._inherited(obj)
