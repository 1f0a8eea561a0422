"""Every TPM device of this process, for what the devices ask about each
other: which transient objects capseal holds in this process (a device
connecting flushes only the others, see ``_device``), which devices a fork
hands to the child (each is marked inherited there), and which one is the
process-wide device of each TPM (``get_device``'s registry, emptied in a
forked child so that it opens a connection of its own).
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from typing import Protocol, TypeVar

from capseal import process

__all__ = ["Live", "track", "owned_in_process", "registered", "unregister", "registered_devices"]

D = TypeVar("D", bound="Live")


class Live(Protocol):
    """What a device says of itself here (``TPMDevice``)."""

    tcti: str

    @property
    def closed(self) -> bool: ...

    @property
    def owned_handles(self) -> frozenset[int]: ...

    def mark_inherited(self) -> None: ...

    def close(self) -> None: ...


def _inherited(device: Live) -> None:
    device.mark_inherited()


#: every device of this process, registered or private (a fork() marks them all)
_DEVICES: process.ForkCopies[Live] = process.ForkCopies(_inherited)
#: the same, for finding which transient handles capseal holds in this process
_LIVE: weakref.WeakSet[Live] = weakref.WeakSet()
_LIVE_LOCK = threading.Lock()  # a WeakSet iterated while another thread adds raises RuntimeError


def track(device: Live) -> None:
    """Count a new device among this process's.

    Args:
        device: the device (held weakly).
    """
    _DEVICES.add(device)
    with _LIVE_LOCK:
        _LIVE.add(device)


def owned_in_process(tcti: str) -> frozenset[int]:
    """The transients that capseal devices of this process hold on a TPM (a
    private device and the shared one may both be open).

    Args:
        tcti: the TPM.

    Returns:
        Their TPM handles.
    """
    owned: set[int] = set()
    with _LIVE_LOCK:
        devices = list(_LIVE)
    for device in devices:
        if device.tcti == tcti:
            owned |= device.owned_handles
    return frozenset(owned)


_REGISTRY: dict[str, Live] = {}
_REGISTRY_LOCK = threading.Lock()


def registered(tcti: str, make: Callable[[str], D]) -> D:
    """The process-wide device of a TPM, made (and registered) when there is
    none, or the one there was closed.

    Args:
        tcti: the TPM.
        make: makes a device for it.

    Returns:
        The device.
    """
    with _REGISTRY_LOCK:
        device = _REGISTRY.get(tcti)
        if device is None or device.closed:
            device = _REGISTRY[tcti] = make(tcti)
        return device  # type: ignore[return-value]  # made by ``make`` of this registry's one kind


def unregister(device: Live) -> None:
    """Take a closing device out of the registry (if it is the one there).

    Args:
        device: the device.
    """
    with _REGISTRY_LOCK:
        if _REGISTRY.get(device.tcti) is device:
            del _REGISTRY[device.tcti]


def registered_devices() -> list[Live]:
    """The registry's devices (for closing them all at exit).

    Returns:
        The devices.
    """
    with _REGISTRY_LOCK:
        return list(_REGISTRY.values())


def _after_fork_in_child() -> None:
    """In a forked child the registry is emptied, so ``get_device`` — and
    ``open_signer`` — open a connection of the child's own and the exit's
    ``close_all`` leaves the parent's alone."""
    global _LIVE_LOCK, _REGISTRY_LOCK
    _LIVE_LOCK = threading.Lock()  # a parent thread may have held them at the fork
    _REGISTRY_LOCK = threading.Lock()
    _REGISTRY.clear()


process.on_fork("devices", after_in_child=_after_fork_in_child)
