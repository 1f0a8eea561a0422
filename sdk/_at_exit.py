"""Backends' closing of their devices at exit, until they register it with
:func:`capseal.process.at_exit` themselves."""

from __future__ import annotations

from collections.abc import Callable

from . import process

__all__ = ["close_devices_last"]


def close_devices_last(closer: Callable[[], None]) -> Callable[[], None]:
    """Register a backend's closing of its devices, run at exit after every
    producer and ledger is closed. Returns ``closer``: usable as a decorator."""
    return process.at_exit("devices", closer)
