"""What a TSS2 return code means to capseal, read by name.

A ``TSS2_Exception`` carries the response code (``rc``) and tpm2-pytss's
decoding of it: ``error`` is the code with the handle, parameter or session
number stripped (``TPM2_RC.HANDLE`` for "handle 1 is not valid"). The layer
(``rc & TSS2_RC.RC_LAYER_MASK``) says who answered: ``TSS2_RC.TPM_RC_LAYER``
for the TPM itself, the TCTI, SAPI or ESAPI layers for the software between.
Every code capseal acts on is named here through tpm2-pytss's ``TPM2_RC`` and
``TSS2_RC``; :func:`map_tss_error` turns a failure into the typed capseal
error, and the predicates say what the signer and provisioning code retry on.
"""

from __future__ import annotations

import os

from tpm2_pytss import TSS2_Exception
from tpm2_pytss.constants import TPM2_RC, TSS2_RC

from capseal.errors import (
    CapsealError,
    DeviceError,
    KeyNotFoundError,
    PinIncorrectError,
    PinLockedError,
    SignerUnavailableError,
    TPMObjectMemoryError,
)
from capseal.keys.secret import pin_advice

__all__ = [
    "OBJECT_MEMORY_HINT",
    "map_tss_error",
    "is_transport_error",
    "is_object_memory",
    "names_no_object",
    "is_auth_failure",
    "is_integrity_failure",
    "is_stale_name",
    "auth_value_hint",
    "unreachable_fix",
]

#: Base codes (the layer stripped) from ESAPI and SAPI that mean the command
#: stream is broken, not that the TPM refused: the context is mid-command
#: after a transport failure, there is no connection, a receive timed out, an
#: I/O error, a reply malformed or cut short.
_BROKEN_STREAM = frozenset({
    int(TSS2_RC.BASE_RC_BAD_SEQUENCE),
    int(TSS2_RC.BASE_RC_NO_CONNECTION),
    int(TSS2_RC.BASE_RC_TRY_AGAIN),
    int(TSS2_RC.BASE_RC_IO_ERROR),
    int(TSS2_RC.BASE_RC_MALFORMED_RESPONSE),
    int(TSS2_RC.BASE_RC_INSUFFICIENT_RESPONSE),
})
_STREAM_LAYERS = (int(TSS2_RC.ESAPI_RC_LAYER), int(TSS2_RC.SYS_RC_LAYER))
_NO_OBJECT = (int(TPM2_RC.HANDLE), int(TPM2_RC.REFERENCE_H0))
_AUTH_FAILED = (int(TPM2_RC.AUTH_FAIL), int(TPM2_RC.BAD_AUTH))
_OUT_OF_MEMORY = (int(TPM2_RC.SESSION_MEMORY), int(TPM2_RC.MEMORY))
_BUSY = (int(TPM2_RC.RETRY), int(TPM2_RC.YIELDED), int(TPM2_RC.CANCELED), int(TPM2_RC.TESTING))


def _layer(rc: int) -> int:
    return rc & int(TSS2_RC.RC_LAYER_MASK)


def is_transport_error(exc: BaseException) -> bool:
    """Whether the TPM could not be talked to at all.

    Args:
        exc: any exception.

    Returns:
        True for a TSS2 failure of the TCTI layer, or of ESAPI/SAPI saying the
        command stream broke: the connection is unusable and must be replaced.
        False for a TPM that refused a command, and for anything else.
    """
    if not isinstance(exc, TSS2_Exception):
        return False
    rc = int(exc.rc)
    layer = _layer(rc)
    return layer == int(TSS2_RC.TCTI_RC_LAYER) or (
        layer in _STREAM_LAYERS and (rc & ~int(TSS2_RC.RC_LAYER_MASK)) in _BROKEN_STREAM)


def is_object_memory(exc: TSS2_Exception) -> bool:
    """Whether the TPM has no free object slot (``TPM_RC_OBJECT_MEMORY``).

    Args:
        exc: a TSS2 failure.

    Returns:
        True for TPM_RC_OBJECT_MEMORY.
    """
    return int(TPM2_RC.OBJECT_MEMORY) in (int(exc.rc), int(exc.error))


def names_no_object(exc: TSS2_Exception) -> bool:
    """Whether a handle in the command named no object.

    Args:
        exc: a TSS2 failure.

    Returns:
        True for TPM_RC_HANDLE (of any handle) and TPM_RC_REFERENCE_H0 (an
        object that is not loaded).
    """
    return int(exc.error) in _NO_OBJECT


def is_auth_failure(exc: TSS2_Exception) -> bool:
    """Whether the TPM refused an authorization value.

    Args:
        exc: a TSS2 failure.

    Returns:
        True for TPM_RC_AUTH_FAIL and TPM_RC_BAD_AUTH (of any session).
    """
    return int(exc.error) in _AUTH_FAILED


def is_integrity_failure(exc: TSS2_Exception) -> bool:
    """Whether a loaded blob failed its integrity check (``TPM_RC_INTEGRITY``):
    a key file made under another parent, or on another TPM.

    Args:
        exc: a TSS2 failure.

    Returns:
        True for TPM_RC_INTEGRITY.
    """
    return int(exc.error) == int(TPM2_RC.INTEGRITY)


def is_stale_name(exc: TSS2_Exception) -> bool:
    """Whether ESAPI refused to look up a persistent handle because the object
    the TPM has there is not the one the context remembers under that handle
    (``Esys_TR_FromTPMPublic`` answers its catch-all
    ``TSS2_ESYS_RC_GENERAL_FAILURE`` when the names differ).

    Args:
        exc: a TSS2 failure of ``tr_from_tpmpublic``.

    Returns:
        True for TSS2_ESYS_RC_GENERAL_FAILURE.
    """
    return int(exc.rc) == int(TSS2_RC.ESYS_RC_GENERAL_FAILURE)


#: Fix for TPM_RC_OBJECT_MEMORY. While it runs, capseal never flushes objects
#: it did not load: on a TPM without a resource manager they may be another
#: running process's, whose cached handles would then name other keys.
#: Leftovers are flushed only when capseal connects.
OBJECT_MEMORY_HINT = (
    "Transient objects that capseal did not load fill the TPM's slots (swtpm has three). If the process that "
    "loaded them is running, stop it or give each process its own view of the TPM (/dev/tpmrm0 or "
    "tpm2-abrmd); if it has exited, its objects stay loaded on a TPM without a resource manager: flush them "
    "(tpm2_flushcontext -t) and sealing resumes, or restart this process (capseal flushes leftovers when it "
    "connects).")


def auth_value_hint() -> str:
    """Where a TPM key's auth value comes from, and what a refused one costs,
    in the caller's terms (the CLI's options, or Python's ``pin=``). Why in
    every auth refusal: each one counts toward the TPM's dictionary-attack
    lockout (swtpm: 3 tries, 1000 s each).

    Returns:
        The hint.
    """
    advice = pin_advice("the key's auth value")
    return (f"{advice}; a key at a persistent handle does not say whether "
            "it has one, so without one the empty auth value is tried. Each refused value counts toward the "
            "TPM's dictionary-attack lockout: check with capseal doctor --tcti … before trying again")


def unreachable_fix(tcti: str) -> str:
    """What to do when the TPM behind a TCTI does not answer, for that kind of
    TCTI: /dev/tpmrm0 and the tss group mean nothing to someone whose TCTI
    points at a simulator on a TCP port.

    Args:
        tcti: the TCTI (``device:…``, ``swtpm:…``, ``mssim:…``, ``tabrmd:…``).

    Returns:
        The fix, for every unreachable error's hint and the doctor's.
    """
    kind, _, conf = tcti.partition(":")
    kind = kind.strip().lower()
    if kind == "device":
        path = conf.strip() or "/dev/tpmrm0"
        if not os.path.exists(path):
            return (f"{path} does not exist: enable the TPM in the firmware setup (TPM, PTT, fTPM) and check that "
                    "the kernel has tpm_tis/tpm_crb, or give the TCTI of the TPM you mean")
        return f"check that this user can read and write {path} (group tss: usermod -aG tss USER, then log in again)"
    if kind in ("swtpm", "mssim"):
        # the command itself: a pip user has none of the repository's scripts
        return (f"start the TPM simulator that {tcti} names and check its host and port (swtpm: swtpm socket "
                "--tpm2 --tpmstate dir=STATE_DIR --server type=tcp,port=PORT --ctrl type=tcp,port=PORT+1 "
                "--flags not-need-init,startup-clear --daemon)")
    if kind == "tabrmd":
        return "start the TPM access broker (systemctl start tpm2-abrmd) and check the TCTI's bus name"
    return f"check the TCTI {tcti!r}: is libtss2-tcti-{kind} installed and is its configuration right?"


def map_tss_error(exc: BaseException, tcti: str, what: str = "TPM command") -> CapsealError:
    """The typed capseal error for a failure during a TPM command.

    Mapping: transport failures → SignerUnavailableError; TPM_RC_OBJECT_MEMORY →
    TPMObjectMemoryError, as are TPM_RC_SESSION_MEMORY and TPM_RC_MEMORY;
    TPM_RC_LOCKOUT → PinLockedError; TPM_RC_AUTH_FAIL and TPM_RC_BAD_AUTH →
    PinIncorrectError; TPM_RC_HANDLE and TPM_RC_REFERENCE_H0 →
    KeyNotFoundError; TPM_RC_RETRY, YIELDED, CANCELED and TESTING →
    SignerUnavailableError ("busy"); anything else, and any code from a
    software layer that is not a transport failure → DeviceError. A capseal
    error passes through unchanged.

    Args:
        exc: the failure (a ``TSS2_Exception``, a capseal error, or anything else).
        tcti: the TPM, named in the message.
        what: the command or job, named in the message.

    Returns:
        The error, its message naming the TCTI, ``what`` and the TSS2 decoded
        text (which never holds an auth value).
    """
    if isinstance(exc, CapsealError):
        return exc
    if not isinstance(exc, TSS2_Exception):
        return DeviceError(f"{what} on TPM {tcti} failed: {type(exc).__name__}: {exc}")
    rc = int(exc.rc)
    err = int(exc.error)
    text = f"{what} on TPM {tcti} failed: {exc} (rc 0x{rc:x})"
    if is_transport_error(exc):
        return SignerUnavailableError(
            f"TPM {tcti} is not reachable: {what} failed: {exc} (rc 0x{rc:x})",
            hint=f"{unreachable_fix(tcti)}; a signer already open reconnects on its next call",
        )
    if _layer(rc) != int(TSS2_RC.TPM_RC_LAYER):
        return DeviceError(text)
    if is_object_memory(exc):
        return TPMObjectMemoryError(
            f"TPM {tcti} has no free object slots (TPM_RC_OBJECT_MEMORY) during {what}",
            hint=OBJECT_MEMORY_HINT,
        )
    if err in _OUT_OF_MEMORY:
        return TPMObjectMemoryError(f"TPM {tcti} is out of memory during {what}: {exc} (rc 0x{rc:x})")
    if err == int(TPM2_RC.LOCKOUT):
        return PinLockedError(
            f"TPM {tcti} is in dictionary-attack lockout during {what}",
            hint="Wait for the lockout interval or reset it with the lockout authorization (tpm2_dictionarylockout -c).",
        )
    if is_auth_failure(exc):
        return PinIncorrectError(f"TPM {tcti} refused the authorization value during {what} (rc 0x{rc:x})",
                                 hint=auth_value_hint())
    if names_no_object(exc):
        return KeyNotFoundError(f"{what} on TPM {tcti}: no such object ({exc}, rc 0x{rc:x})")
    if err in _BUSY:
        return SignerUnavailableError(f"TPM {tcti} is busy: {what} returned {exc} (rc 0x{rc:x}); try again")
    return DeviceError(text)
