"""Handles on a TPM: which are listed, the ESYS_TR of a persistent object,
the transient objects and sessions loaded, and flushing them.
"""

from __future__ import annotations

from typing import Any

from tpm2_pytss import TSS2_Exception
from tpm2_pytss.constants import TPM2_CAP, TPM2_HC, TPM2_HR, TPM2_HT

from capseal.errors import KeyNotFoundError

from ._errors import is_stale_name

__all__ = ["listed_handles", "is_listed", "persistent_tr", "StaleHandleError", "transient_handles",
           "session_handles", "flush_handles"]


def listed_handles(ectx: Any, first: int, types: frozenset[int]) -> list[int]:
    """Every handle the TPM lists (TPM2_GetCapability(TPM_CAP_HANDLES)) from
    ``first`` on, over all pages. Why the type filter: asked for loaded
    sessions (0x02000000) a TPM lists HMAC sessions *and* policy sessions
    (0x03xxxxxx) in one answer.

    Args:
        ectx: the ESAPI context.
        first: the first handle asked for.
        types: the handle types (top byte, TPM2_HT) kept.

    Returns:
        The handles.
    """
    out: list[int] = []
    start = first
    while True:
        more, data = ectx.get_capability(TPM2_CAP.HANDLES, start, 64)
        batch = [int(h) for h in data.data.handles]
        out += [h for h in batch if (h >> int(TPM2_HR.SHIFT)) in types and h not in out]
        if not more or not batch or batch[-1] < start:
            return out
        start = batch[-1] + 1


def is_listed(ectx: Any, handle: int) -> bool:
    """Whether TPM_CAP_HANDLES lists a handle (a persistent object there). Why
    asked before ``Esys_TR_FromTPMPublic``: on an empty handle that call
    fails, as expected, but libtss2 first prints three ERROR lines to stderr;
    capseal leaves the TSS's logging (``TSS2_LOG``) to the application, so it
    does not make calls it expects to fail.

    Args:
        ectx: the ESAPI context.
        handle: the handle.

    Returns:
        True when listed.
    """
    _more, data = ectx.get_capability(TPM2_CAP.HANDLES, handle, 1)
    return handle in [int(h) for h in data.data.handles]


def persistent_tr(ectx: Any, handle: int, tcti: str, what: str = "object", hint: str | None = None) -> Any:
    """The ESYS_TR of the object at a persistent handle.

    Args:
        ectx: the ESAPI context (inside a device call).
        handle: the persistent handle.
        tcti: the TPM, named in errors.
        what: names the object in errors ("attestation key", …).
        hint: the error's hint.

    Returns:
        The ESYS_TR.

    Raises:
        KeyNotFoundError: the TPM lists nothing there (see :func:`is_listed`).
        StaleHandleError: the object there is not the one this context knew
            at that handle (it was replaced since).
    """
    if not is_listed(ectx, handle):
        raise KeyNotFoundError(f"no {what} at persistent handle 0x{handle:08x} on TPM {tcti}", hint=hint)
    try:
        return ectx.tr_from_tpmpublic(handle)
    except TSS2_Exception as exc:
        if is_stale_name(exc):
            raise StaleHandleError(handle, what) from None
        raise


class StaleHandleError(Exception):
    """ESYS still holds an object for this persistent handle under the name it
    had before: the object was replaced since (by another process, or the TPM
    behind the TCTI is another one), so the context is out of date. The device
    runs the job once more on a fresh context; a signer whose key changed is
    refused there by its pinned TPM name."""

    def __init__(self, handle: int, what: str) -> None:
        super().__init__(f"the {what} at persistent handle 0x{handle:08x} is not the object this connection "
                         "knew there")


def transient_handles(ectx: Any) -> list[int]:
    """Every transient object loaded in the TPM, as this connection sees it (all
    of them without a resource manager, its own on /dev/tpmrm0).

    Args:
        ectx: the ESAPI context.

    Returns:
        Their handles.
    """
    return listed_handles(ectx, int(TPM2_HC.TRANSIENT_FIRST), frozenset({int(TPM2_HT.TRANSIENT)}))


def session_handles(ectx: Any) -> list[int]:
    """Every loaded HMAC and policy session.

    Args:
        ectx: the ESAPI context.

    Returns:
        Their handles.
    """
    return listed_handles(ectx, int(TPM2_HC.LOADED_SESSION_FIRST),
                          frozenset({int(TPM2_HT.HMAC_SESSION), int(TPM2_HT.POLICY_SESSION)}))


def flush_handles(ectx: Any, handles: list[int]) -> list[int]:
    """Flush handles (objects and sessions alike: ESYS reaches both through tr_from_tpmpublic).

    Args:
        ectx: the ESAPI context.
        handles: the handles.

    Returns:
        Those flushed (the others were gone).
    """
    flushed = []
    for handle in handles:
        try:
            ectx.flush_context(ectx.tr_from_tpmpublic(handle))
        except TSS2_Exception:
            continue  # already gone
        flushed.append(handle)
    return flushed
