"""One TPM, one worker thread, one ESAPI context: callers queue.

Why a worker thread: an ESAPI context is not thread-safe, and a TPM executes
one command at a time anyway. Every caller (signers, ``capseal.attest`` quotes,
provisioning) hands a function to :meth:`TPMDevice.call`; the worker runs it
with the context it owns and hands back the result or the exception. Callers
never touch the context outside such a function.

Why the connection care:

* swtpm (and ``/dev/tpm0``) have no resource manager. Transient objects left
  loaded by a crashed process stay loaded, and swtpm has only three slots, so
  on every connect the worker flushes leftover transient objects and loaded
  sessions (HMAC and policy). While connected it never flushes objects it did
  not load: they may be another running process's (whose cached handles would
  then name other keys). On TPM_RC_OBJECT_MEMORY, when no other process's
  objects are loaded, it gives up its own cached objects and runs the command
  once more; otherwise, or then, TPMObjectMemoryError says how
  to free the slots (a process that crashed after capseal connected leaves
  its objects until they are flushed, or until capseal connects again).
  Objects capseal loads are flushed in ``finally`` blocks, or kept
  in a per-connection memo (:meth:`TPMDevice.memo`) and flushed on close (or
  when the slots run out, to be reloaded on demand).
  (Consequence: on a TPM without a resource manager, capseal assumes one
  process uses it at a time. ``/dev/tpmrm0`` isolates processes.) A device
  opened with ``flush_others=False`` (``capseal doctor``) never flushes what
  it did not load: a check must not change the TPM.
* When the TPM goes away (swtpm stopped, device reset) the call fails with
  :class:`~capseal.errors.SignerUnavailableError` naming the TCTI and the
  context is dropped; the next call reconnects, so a restarted TPM is used
  again without restarting the process. A call whose function is idempotent
  (the default) is retried once on a fresh connection, which covers "the TPM
  restarted between two calls".

Interface (stable; ``capseal.attest`` uses it for TPM2_Quote)::

    dev = get_device("swtpm:host=127.0.0.1,port=2321")   # process-wide, one per TCTI
    info = dev.info()                                     # TPMInfo: manufacturer, vendor, firmware, software
    name = dev.call(lambda ectx: ectx.read_public(ectx.tr_from_tpmpublic(0x81000102))[1])
    # inside a call: dev.memo(key, factory, flush=...) keeps a handle for this connection only

A device belongs to the process that opened it. In a process forked from that
one (without exec) the worker thread does not exist and the TPM connection is
the parent's: every call raises SignerForkedError (a SignerUnavailableError)
saying so, ``close()`` lets go of that copy without sending the TPM anything,
and :func:`get_device` opens a connection of the child's own (see
:func:`_inherited`, :func:`_after_fork_in_child`).

Errors: every ``TSS2_Exception`` leaves :meth:`call` as a typed
:mod:`capseal.errors` exception (see :func:`map_tss_error`) whose message names
the TCTI. Exceptions that are already capseal errors pass through unchanged.
"""

from __future__ import annotations

import os
import queue
import threading
import time
import weakref
from collections.abc import Callable, Hashable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as _FutureTimeout
from dataclasses import dataclass, field
from typing import Any, TypeVar

from capseal._at_exit import close_devices_last
from capseal._fork_copies import ForkCopies
from capseal.errors import (
    CapsealError,
    DeviceError,
    KeyNotFoundError,
    PinIncorrectError,
    PinLockedError,
    SignerForkedError,
    SignerUnavailableError,
    TPMObjectMemoryError,
)
from capseal.keys._tpm_uri import check_tcti

try:
    from tpm2_pytss import ESAPI, TSS2_Exception
    from tpm2_pytss.constants import TPM2_CAP, TPM2_HC, TPM2_PT
except ImportError as _exc:  # pragma: no cover - exercised only without the extra
    from capseal.errors import MissingExtraError

    raise MissingExtraError(
        "the tpm2: backend needs tpm2-pytss (pip install 'capseal[tpm]') and system packages: "
        f"libtss2-dev pkg-config (build), libtss2-esys ({_exc})"
    ) from None

__all__ = [
    "DEFAULT_TCTI",
    "TPMDevice",
    "TPMInfo",
    "get_device",
    "close_all",
    "map_tss_error",
    "is_transport_error",
    "unreachable_fix",
    "classify_software",
    "is_listed",
    "persistent_tr",
]

T = TypeVar("T")

DEFAULT_TCTI = "device:/dev/tpmrm0"

# TSS2 layer of a response code: 0 = the TPM itself, others = software layers.
_LAYER_MASK = 0xFF0000
_TCTI_LAYER = 0x0A0000
_ESYS_LAYER = 0x070000
_SYS_LAYER = 0x080000
# Base codes from ESYS/SAPI that mean the command stream is broken, not that the
# TPM refused: BAD_SEQUENCE (the context is mid-command after a transport
# failure), NO_CONNECTION, TRY_AGAIN (a receive timed out), IO_ERROR,
# MALFORMED_RESPONSE and INSUFFICIENT_RESPONSE (a reply cut short).
_BROKEN_STREAM = frozenset({0x07, 0x08, 0x09, 0x0A, 0x11, 0x13})
_RC_OBJECT_MEMORY = 0x902
_RC_SESSION_MEMORY = 0x903
_RC_MEMORY = 0x904
_RC_LOCKOUT = 0x921
_RC_RETRY = 0x922
_RC_YIELDED = 0x908
_RC_CANCELED = 0x909
_RC_TESTING = 0x90A
_RC_HANDLE = 0x08B  # fmt1 error number (handle index stripped)
_RC_AUTH_FAIL = 0x08E
_RC_BAD_AUTH = 0x0A2
_RC_REFERENCE_H0 = 0x910  # warning: a handle refers to an object that is not loaded
_ESYS_GENERAL_FAILURE = 0x70001  # what Esys_TR_FromTPMPublic returns on a name mismatch
# handle types (the top byte of a handle, TPM_HT_*)
_HT_TRANSIENT = 0x80
_HT_HMAC_SESSION = 0x02
_HT_POLICY_SESSION = 0x03


def is_transport_error(exc: BaseException) -> bool:
    """True when ``exc`` means the TPM could not be talked to (the connection is
    unusable and must be replaced), as opposed to the TPM refusing a command."""
    if not isinstance(exc, TSS2_Exception):
        return False
    rc = int(exc.rc)
    layer = rc & _LAYER_MASK
    return layer == _TCTI_LAYER or (layer in (_ESYS_LAYER, _SYS_LAYER) and (rc & 0xFFFF) in _BROKEN_STREAM)


def _is_object_memory(exc: TSS2_Exception) -> bool:
    return int(exc.rc) == _RC_OBJECT_MEMORY or int(exc.error) == _RC_OBJECT_MEMORY


#: Fix for TPM_RC_OBJECT_MEMORY. While it runs, capseal never flushes objects
#: it did not load: on a TPM without a resource manager they may be another
#: running process's, and flushing them let that process's cached handles
#: name other keys (it signed with the wrong key). Leftovers are flushed only
#: when capseal connects.
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
    lockout (swtpm: 3 tries, 1000 s each)."""
    from ._pin import pin_advice

    advice = pin_advice("the key's auth value")
    return (f"{advice}; a key at a persistent handle does not say whether "
            "it has one, so without one the empty auth value is tried. Each refused value counts toward the "
            "TPM's dictionary-attack lockout: check with capseal doctor --tcti … before trying again")


def unreachable_fix(tcti: str) -> str:
    """What to do when the TPM behind ``tcti`` does not answer, for that kind of TCTI.

    Why per kind: /dev/tpmrm0 and the tss group mean nothing to someone whose
    TCTI points at a simulator on a TCP port; and why here, in every
    unreachable error's hint and not only the doctor's: an operator whose
    ``capseal tpm provision`` found no TPM was told only "Is the TPM (or
    swtpm) running and is the TCTI right?"."""
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
    """A typed capseal error for a TSS2 failure during ``what`` on ``tcti``.

    Mapping: transport failures → SignerUnavailableError; TPM_RC_OBJECT_MEMORY →
    TPMObjectMemoryError; TPM_RC_HANDLE → KeyNotFoundError; auth failures →
    PinIncorrectError; lockout → PinLockedError; anything else → DeviceError.
    The TSS2 decoded message is included; it never contains auth values.
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
    if (rc & _LAYER_MASK) != 0:
        return DeviceError(text)
    if rc == _RC_OBJECT_MEMORY or err == _RC_OBJECT_MEMORY:
        return TPMObjectMemoryError(
            f"TPM {tcti} has no free object slots (TPM_RC_OBJECT_MEMORY) during {what}",
            hint=OBJECT_MEMORY_HINT,
        )
    if err in (_RC_SESSION_MEMORY, _RC_MEMORY):
        return TPMObjectMemoryError(f"TPM {tcti} is out of memory during {what}: {exc} (rc 0x{rc:x})")
    if err == _RC_LOCKOUT:
        return PinLockedError(
            f"TPM {tcti} is in dictionary-attack lockout during {what}",
            hint="Wait for the lockout interval or reset it with the lockout authorization (tpm2_dictionarylockout -c).",
        )
    if err in (_RC_AUTH_FAIL, _RC_BAD_AUTH):
        return PinIncorrectError(f"TPM {tcti} refused the authorization value during {what} (rc 0x{rc:x})",
                                 hint=auth_value_hint())
    if err == _RC_HANDLE or err == _RC_REFERENCE_H0:
        return KeyNotFoundError(f"{what} on TPM {tcti}: no such object ({exc}, rc 0x{rc:x})")
    if err in (_RC_RETRY, _RC_YIELDED, _RC_CANCELED, _RC_TESTING):
        return SignerUnavailableError(f"TPM {tcti} is busy: {what} returned {exc} (rc 0x{rc:x}); try again")
    return DeviceError(text)


# ---------------------------------------------------------------------------- what the TPM says it is

#: TCG vendor IDs (TPM_PT_MANUFACTURER) of companies that make TPM chips or
#: firmware TPMs inside a CPU/SoC. A TPM reporting one of these is recorded as
#: not a software device (design: False only when the device says so).
HARDWARE_MANUFACTURERS = frozenset(
    {"AMD", "ATML", "BRCM", "CSCO", "HISI", "IFX", "INTC", "NSM", "NTC", "NTZ", "QCOM", "ROCC", "SMSC",
     "SMSN", "SNS", "STM", "TXN", "WEC"}
)
#: Hypervisor TPMs (Hyper-V, Google Compute Engine): neither a chip nor a local emulator.
VIRTUAL_MANUFACTURERS = frozenset({"MSFT", "GOOG"})


def classify_software(manufacturer: str, vendor: str, tcti: str) -> tuple[bool | None, str]:
    """``(software_device, reason)`` from what the TPM reported.

    * ``IBM`` + vendor string ``SW TPM``: the TCG reference implementation as
      shipped by libtpms/swtpm (and the IBM/Microsoft simulators) → True;
    * a ``swtpm:`` or ``mssim:`` TCTI only ever reaches a simulator → True;
    * a chip or firmware-TPM vendor → False; anything else → None (unknown).
    """
    kind = tcti.split(":", 1)[0].strip().lower()
    if manufacturer == "IBM" and " ".join(vendor.split()) == "SW TPM":
        return True, "manufacturer IBM with vendor string 'SW TPM': the TCG reference TPM in software (libtpms/swtpm)"
    if kind in ("swtpm", "mssim"):
        return True, f"reached over the {kind} simulator protocol"
    if manufacturer in HARDWARE_MANUFACTURERS:
        return False, f"manufacturer {manufacturer} makes TPM chips or firmware TPMs"
    if manufacturer in VIRTUAL_MANUFACTURERS:
        return None, f"manufacturer {manufacturer} is a hypervisor (virtual) TPM"
    return None, f"manufacturer {manufacturer!r} is not one capseal recognises"


def _fourcc(value: int) -> str:
    return value.to_bytes(4, "big").rstrip(b"\x00").decode("ascii", "replace")


@dataclass(frozen=True)
class TPMInfo:
    """What the TPM reported about itself (TPM_CAP_TPM_PROPERTIES, TPM_CAP_ALGS)."""

    tcti: str
    manufacturer: str
    vendor: str  # VENDOR_STRING_1..4 concatenated, NULs removed
    firmware_version_1: int
    firmware_version_2: int
    spec_family: str
    spec_level: int
    spec_revision: int  # e.g. 164 for 1.64
    spec_year: int
    spec_day_of_year: int
    algorithms: frozenset[int] = field(repr=False)
    software: bool | None = None
    software_reason: str = ""

    @property
    def firmware(self) -> str:
        """Dotted firmware version: the two 32-bit words split into 16-bit halves
        (the convention tpm2-tools and fwupd use)."""
        v1, v2 = self.firmware_version_1, self.firmware_version_2
        return f"{v1 >> 16}.{v1 & 0xFFFF}.{v2 >> 16}.{v2 & 0xFFFF}"

    @property
    def spec_version(self) -> str:
        return f"{self.spec_family} rev {self.spec_revision // 100}.{self.spec_revision % 100:02d}"

    def supports(self, alg_id: int) -> bool:
        """Does the TPM list ``alg_id`` (a TPM2_ALG value) in TPM_CAP_ALGS?"""
        return int(alg_id) in self.algorithms

    def evidence_device(self) -> dict[str, Any]:
        """The ``device`` member of the evidence slot (design §4)."""
        return {"manufacturer": self.manufacturer, "vendor": self.vendor, "firmware": self.firmware,
                "software": self.software}

    def to_dict(self) -> dict[str, Any]:
        """Custody-statement form; no floats, no secrets."""
        return {
            "manufacturer": self.manufacturer,
            "vendor": self.vendor,
            "firmware": self.firmware,
            "firmware_version_1": f"0x{self.firmware_version_1:08x}",
            "firmware_version_2": f"0x{self.firmware_version_2:08x}",
            "spec": self.spec_version,
            "spec_level": self.spec_level,
            "spec_date": f"{self.spec_year}/{self.spec_day_of_year}",
            "software": self.software,
            "software_reason": self.software_reason,
        }


def _read_info(ectx: Any, tcti: str) -> TPMInfo:
    props: dict[int, int] = {}
    more, prop = True, int(TPM2_PT.FIXED)
    while more:
        more, data = ectx.get_capability(TPM2_CAP.TPM_PROPERTIES, prop, 64)
        items = list(data.data.tpmProperties)
        for p in items:
            props[int(p.property)] = int(p.value)
        if not items:
            break
        prop = int(items[-1].property) + 1
        if prop >= int(TPM2_PT.FIXED) + 0x100:
            break
    algs: set[int] = set()
    more, alg = True, 0
    while more:
        more, data = ectx.get_capability(TPM2_CAP.ALGS, alg, 128)
        items = list(data.data.algorithms)
        algs.update(int(a.alg) for a in items)
        if not items:
            break
        alg = int(items[-1].alg) + 1
    base = int(TPM2_PT.FIXED)
    manufacturer = _fourcc(props.get(base + 5, 0))
    vendor = "".join(_fourcc(props.get(base + i, 0)) for i in (6, 7, 8, 9))
    software, reason = classify_software(manufacturer, vendor, tcti)
    return TPMInfo(
        tcti=tcti,
        manufacturer=manufacturer,
        vendor=vendor,
        firmware_version_1=props.get(base + 11, 0),
        firmware_version_2=props.get(base + 12, 0),
        spec_family=_fourcc(props.get(base + 0, 0)),
        spec_level=props.get(base + 1, 0),
        spec_revision=props.get(base + 2, 0),
        spec_year=props.get(base + 4, 0),
        spec_day_of_year=props.get(base + 3, 0),
        algorithms=frozenset(algs),
        software=software,
        software_reason=reason,
    )


# ---------------------------------------------------------------------------- handles on the TPM


def listed_handles(ectx: Any, first: int, types: frozenset[int]) -> list[int]:
    """Every handle the TPM lists (TPM2_GetCapability(TPM_CAP_HANDLES)) from
    ``first`` on whose type (top byte) is in ``types``, over all pages.

    Why the type filter: asked for loaded sessions (0x02000000) a TPM lists
    HMAC sessions *and* policy sessions (0x03xxxxxx) in one answer."""
    out: list[int] = []
    start = first
    while True:
        more, data = ectx.get_capability(TPM2_CAP.HANDLES, start, 64)
        batch = [int(h) for h in data.data.handles]
        out += [h for h in batch if (h >> 24) in types and h not in out]
        if not more or not batch or batch[-1] < start:
            return out
        start = batch[-1] + 1


def is_listed(ectx: Any, handle: int) -> bool:
    """Whether TPM_CAP_HANDLES lists ``handle`` (a persistent object there).

    Why asked before ``Esys_TR_FromTPMPublic``: on an empty handle that call
    fails, as expected, but libtss2 first prints three ERROR lines to stderr.
    capseal leaves the TSS's logging (``TSS2_LOG``) to the application, so it
    does not make calls it expects to fail."""
    _more, data = ectx.get_capability(TPM2_CAP.HANDLES, handle, 1)
    return handle in [int(h) for h in data.data.handles]


def persistent_tr(ectx: Any, handle: int, tcti: str, what: str = "object", hint: str | None = None) -> Any:
    """The ESYS_TR of the object at persistent ``handle``; KeyNotFoundError
    naming ``what``, the handle and the TCTI (with ``hint``) when the TPM lists
    nothing there (see :func:`is_listed`)."""
    if not is_listed(ectx, handle):
        raise KeyNotFoundError(f"no {what} at persistent handle 0x{handle:08x} on TPM {tcti}", hint=hint)
    try:
        return ectx.tr_from_tpmpublic(handle)
    except TSS2_Exception as exc:
        if int(exc.error) == _ESYS_GENERAL_FAILURE:
            raise StaleHandleError(handle, what) from None
        raise


class StaleHandleError(Exception):
    """ESYS still holds an object for this persistent handle under the name
    it had before (the object was replaced since, by another process, or the
    TPM behind the TCTI is another one): the context is out of date, and
    :meth:`TPMDevice._run` retries the job once on a fresh one. A signer
    whose key changed is refused there by its pinned TPM name."""

    def __init__(self, handle: int, what: str) -> None:
        super().__init__(f"the {what} at persistent handle 0x{handle:08x} is not the object this connection "
                         "knew there")


def transient_handles(ectx: Any) -> list[int]:
    """Every transient object loaded in the TPM (as this connection sees it:
    all of them without a resource manager, its own on /dev/tpmrm0)."""
    return listed_handles(ectx, int(TPM2_HC.TRANSIENT_FIRST), frozenset({_HT_TRANSIENT}))


def session_handles(ectx: Any) -> list[int]:
    """Every loaded HMAC and policy session."""
    return listed_handles(ectx, int(TPM2_HC.LOADED_SESSION_FIRST),
                          frozenset({_HT_HMAC_SESSION, _HT_POLICY_SESSION}))


def _flush_handles(ectx: Any, handles: list[int]) -> list[int]:
    """Flush each handle (objects and sessions alike: ESYS reaches both through
    tr_from_tpmpublic); return those that were flushed (others were gone)."""
    flushed = []
    for handle in handles:
        try:
            ectx.flush_context(ectx.tr_from_tpmpublic(handle))
        except TSS2_Exception:
            continue  # already gone
        flushed.append(handle)
    return flushed


# ---------------------------------------------------------------------------- the device


class _Stop:
    pass


_STOP = _Stop()


class TPMDevice:
    """The single owner of one TCTI's ESAPI context (see the module docstring).

    Obtain with :func:`get_device`; do not construct directly unless you want
    a private connection (tests that fill slots use plain ESAPI instead).

    ``flush_others`` (default True): on connect, flush the transient objects
    (but those other capseal devices of this process hold) and sessions left
    on the TPM (see the module docstring). ``False`` leaves everything this
    device did not load alone; ``capseal doctor`` opens such a private device,
    since looking must not destroy another process's objects.
    """

    def __init__(self, tcti: str, *, flush_others: bool = True) -> None:
        self.tcti = tcti
        self.flush_others = flush_others
        self._jobs: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._ectx: Any = None
        #: memo entries: (value, is_transient, TPM handle of a transient)
        self._memo: dict[Hashable, tuple[Any, bool, int | None]] = {}
        #: TPM handles of the transients in ``_memo``, replaced (never mutated)
        #: so other devices' workers can read it without a lock
        self._owned: frozenset[int] = frozenset()
        self._depth = 0  # nesting of _run (re-entrant calls from inside a job)
        self._info: TPMInfo | None = None
        self._generation = 0
        self._closed = False
        self._lock = threading.Lock()
        #: when the worker started the command it is running (None: idle); the
        #: timeouts of :meth:`wait` count from it
        self._busy_since: float | None = None
        self._pid = os.getpid()  # the process that opened it (named in SignerForkedError)
        self._forked = False  # set in a forked child by _inherited
        self._thread = threading.Thread(target=self._worker, name=f"capseal-tpm[{tcti}]", daemon=True)
        self._thread.start()
        _DEVICES.add(self)
        with _LIVE_LOCK:
            _LIVE.add(self)

    def __repr__(self) -> str:
        state = "closed" if self._closed else ("connected" if self._ectx is not None else "idle")
        return f"TPMDevice({self.tcti!r}, {'forked, ' if self._forked else ''}{state})"

    def _fork_error(self) -> SignerForkedError:
        return SignerForkedError(
            f"TPM {self.tcti}: this process ({os.getpid()}) was forked from process {self._pid}, which opened "
            f"this TPM connection: the connection and its worker thread belong to process {self._pid}. Open the "
            "signer again in this process (open_signer(...)); nothing was sent to the TPM")

    # ------------------------------------------------------------------ public

    def call(self, fn: Callable[[Any], T], *, what: str | None = None, timeout: float | None = None,
             retry: bool = True) -> T:
        """Run ``fn(ectx)`` on the worker thread and return its result.

        ``what`` names the operation in error messages (default: ``fn.__name__``).

        ``retry``: when the connection turns out to be dead, reconnect and run
        ``fn`` once more (only for idempotent work; provisioning passes False).
        ``timeout``: seconds the TPM may spend on one command (a hung TPM);
        once the running command has taken longer, SignerUnavailableError is
        raised and the job is abandoned (see :meth:`wait`).
        Raises typed capseal errors only (see :func:`map_tss_error`); other
        exceptions from ``fn`` become DeviceError (the original is chained).
        """
        what = what or getattr(fn, "__name__", "TPM command").strip("<>")
        if threading.current_thread() is self._thread:  # re-entrant use from inside a job
            return self._run(fn, retry, what)
        return self.wait(self.submit(fn, what=what, retry=retry), timeout)

    def submit(self, fn: Callable[[Any], T], *, what: str, retry: bool = True) -> Future[T]:
        """Queue ``fn(ectx)`` for the worker and return at once; :meth:`wait`
        for the result. Why: a caller that keeps several commands queued keeps
        the TPM busy back to back, instead of leaving it idle while each
        result travels to the caller's thread and the next command back (the
        signing pipeline does this). Must not be called from inside a job."""
        if threading.current_thread() is self._thread:
            raise RuntimeError("TPMDevice.submit from inside a job would wait on itself; use call()")
        if self._forked:  # checked first: in the child a closed device is a forked one
            raise self._fork_error()
        if self._closed:
            raise SignerUnavailableError(f"TPM {self.tcti}: this device handle was closed")
        fut: Future[T] = Future()
        self._jobs.put((fn, retry, what, fut))
        return fut

    def wait(self, fut: Future[T], timeout: float | None = None) -> T:
        """The result of a job queued with :meth:`submit`, as :meth:`call` returns it.

        ``timeout`` bounds how long the TPM may spend on *one* command, not
        how long a job may wait its turn: a deep queue in front of a working
        TPM never times out. Once the command the worker is running has gone
        on for ``timeout`` since it started, the TPM is taken for hung, and
        every job waiting on it — queued or running — is abandoned at once
        (dropped if it has not started) with SignerUnavailableError."""
        if self._forked:  # a job queued before the fork: no worker here will run it
            raise self._fork_error()
        while True:
            since = self._busy_since
            wait = 1.0 if timeout is None or since is None else min(1.0, max(0.0, since + timeout - time.monotonic()))
            try:
                return fut.result(wait)
            except _FutureTimeout:
                if not self._thread.is_alive():  # closed while this job was being queued
                    raise SignerUnavailableError(f"TPM {self.tcti}: this device handle was closed") from None
                since = self._busy_since
                if timeout is not None and since is not None and time.monotonic() >= since + timeout:
                    fut.cancel()
                    raise SignerUnavailableError(f"TPM {self.tcti} did not answer within {timeout} s") from None

    def info(self) -> TPMInfo:
        """What the TPM reports about itself (read once per connection)."""
        return self.call(lambda _ectx: self._current_info(), what="reading TPM properties")

    def memo(self, key: Hashable, factory: Callable[[Any], Any], *, flush: bool = False) -> Any:
        """Per-connection memo, for use *inside* a :meth:`call` function only.

        ``factory(ectx)`` runs once per connection; a reconnect forgets the
        value (an ESYS_TR from an old context means nothing in a new one).
        ``flush=True`` marks the value as a transient object this device must
        flush when it forgets it (close, reconnect, :meth:`forget`). Such
        entries are also flushed when a call fails with TPM_RC_OBJECT_MEMORY
        (swtpm has three slots); the call is then run once more and
        ``factory`` loads the object again, so ``fn`` must fetch handles
        through ``memo`` rather than keep them between calls.
        """
        self._assert_worker()
        hit = self._memo.get(key)
        if hit is not None:
            return hit[0]
        value = factory(self._ectx)
        handle = int(self._ectx.tr_get_tpm_handle(value)) if flush else None
        self._memo[key] = (value, flush, handle)
        self._note_owned()
        return value

    def cached(self, key: Hashable) -> Any | None:
        """The memo value for ``key`` on this connection, or None (nothing is
        made); inside a call only."""
        self._assert_worker()
        hit = self._memo.get(key)
        return None if hit is None else hit[0]

    def forget(self, key: Hashable, *, flush: bool = True) -> None:
        """Drop a memo entry (flushing it if it is a transient); inside a call only.

        ``flush=False`` only lets go of the ESYS_TR: for a handle that may now
        hold another process's object, which must not be flushed."""
        self._assert_worker()
        hit = self._memo.pop(key, None)
        if hit is not None and hit[1]:
            if flush:
                self._flush_quietly(hit[0])
            else:
                self._tr_close_quietly(hit[0])
            self._note_owned()

    def make_room(self) -> None:
        """Flush this device's cached transient objects (they reload on demand),
        so a job that needs several slots (provisioning: SRK + key) gets them.
        Inside a call only."""
        self._assert_worker()
        self._evict_cached_transients()

    def foreign_transients(self) -> list[int]:
        """TPM handles of the transient objects that no capseal device of this
        process holds (another process's, or a crashed one's). Inside a call only."""
        self._assert_worker()
        return [h for h in transient_handles(self._ectx) if h not in _owned_in_process(self.tcti)]

    @property
    def generation(self) -> int:
        """Incremented on every (re)connect; lets callers notice a reconnect."""
        return self._generation

    def close(self) -> None:
        """Flush what this device loaded, close the context, stop the worker. Idempotent.

        In a forked process it only marks this copy closed: the worker is not
        there to stop, and closing the parent's ESAPI context here would end
        the parent's TCTI session (an mssim/swtpm TCTI says goodbye on the
        shared socket)."""
        if self._forked:
            self._closed = True
            return
        with self._lock:
            if self._closed:
                return
            self._closed = True
        with _REGISTRY_LOCK:
            if _REGISTRY.get(self.tcti) is self:
                del _REGISTRY[self.tcti]
        done: Future[None] = Future()
        self._jobs.put((_STOP, False, "close", done))  # the worker ends after what is queued before it
        if threading.current_thread() is self._thread:  # closed from inside a job: no waiting on itself
            self._disconnect(flush=True)
            return
        try:
            done.result(10)
        except Exception:  # a hung TPM must not hang interpreter shutdown
            pass

    # ------------------------------------------------------------------ worker side

    def _assert_worker(self) -> None:
        if threading.current_thread() is not self._thread:
            raise RuntimeError("TPMDevice.memo/forget may only be used inside TPMDevice.call")

    def _worker(self) -> None:
        while True:
            fn, retry, what, fut = self._jobs.get()
            if fn is _STOP:
                self._busy_since = time.monotonic()  # a hung TPM times out a job that slipped in, too
                self._disconnect(flush=True)
                fut.set_result(None)
                self._drain_after_close()
                self._busy_since = None
                return
            if not fut.set_running_or_notify_cancel():
                continue
            self._busy_since = time.monotonic()
            try:
                result = self._run(fn, retry, what)
            except BaseException as exc:  # handed to the caller, never lost
                fut.set_exception(exc)
            else:
                fut.set_result(result)
            finally:
                self._busy_since = None

    def _drain_after_close(self) -> None:
        while True:
            try:
                _fn, _retry, _what, fut = self._jobs.get_nowait()
            except queue.Empty:
                return
            if fut.set_running_or_notify_cancel():
                fut.set_exception(SignerUnavailableError(f"TPM {self.tcti}: this device handle was closed"))

    def _run(self, fn: Callable[[Any], T], retry: bool, what: str) -> T:
        """Run ``fn`` on this worker's context. With ``retry``: once more on a
        fresh connection after a transport failure of a stale one, or after a
        persistent object changed behind this context; once
        more after TPM_RC_OBJECT_MEMORY when this device's cached transients
        were given up (they reload on demand). A re-entrant call never frees
        slots: the outer job may hold objects it has not memoized. Objects
        capseal did not load are never flushed here (see OBJECT_MEMORY_HINT)."""
        reconnect = retry
        evict = retry
        stale = retry
        self._depth += 1
        try:
            while True:
                had_connection = self._ectx is not None
                ectx = self._connect()
                try:
                    return fn(ectx)
                except TSS2_Exception as exc:
                    if is_transport_error(exc):
                        self._disconnect(flush=False)
                        if reconnect and had_connection:  # a stale connection (TPM restarted since)
                            reconnect = False
                            continue
                    elif _is_object_memory(exc) and evict and self._depth == 1:
                        evict = False
                        # only when our own cached objects are what fills the slots: with
                        # another process's there, evicting ours would stop a signer that
                        # works without making room for this job
                        if not self._others_hold_objects() and self._evict_cached_transients():
                            continue
                    raise map_tss_error(exc, self.tcti, what) from None
                except StaleHandleError as exc:
                    # a fresh context reads every name from the TPM again; not inside a
                    # re-entrant call, whose outer job holds objects of this context
                    if stale and self._depth == 1:
                        stale = False
                        self._disconnect(flush=False)
                        continue
                    raise DeviceError(f"{what} on TPM {self.tcti} failed: {exc}") from None
                except CapsealError:
                    raise
                except Exception as exc:  # tpm2-pytss type/value errors: still a typed error naming the TCTI
                    raise DeviceError(f"{what} on TPM {self.tcti} failed: {type(exc).__name__}: {exc}") from exc
        finally:
            self._depth -= 1

    def _connect(self) -> Any:
        if self._ectx is not None:
            return self._ectx
        check_tcti(self.tcti)  # a TCTI name is a library the TSS loads (cmd: runs a command): never an unknown one
        try:
            ectx = ESAPI(self.tcti)
        except TSS2_Exception as exc:
            raise map_tss_error(exc, self.tcti, "connect") from None
        except Exception as exc:  # bad TCTI string, missing TCTI library
            raise SignerUnavailableError(f"cannot open TCTI {self.tcti}: {type(exc).__name__}: {exc}") from None
        if self.flush_others:
            try:
                self._flush_leftovers(ectx)
            except TSS2_Exception as exc:
                _close_quietly(ectx)
                raise map_tss_error(exc, self.tcti, "flushing leftover transient objects") from None
        self._ectx = ectx
        self._memo = {}
        self._note_owned()
        self._info = None
        self._generation += 1
        return ectx

    def _flush_leftovers(self, ectx: Any) -> None:
        """Flush transient objects and loaded sessions (HMAC and policy) nobody
        owns any more (a crashed run on a TPM without a resource manager).
        Objects other capseal devices of this process keep cached are left
        alone; one another device's job holds only for the job's length (an
        SRK while a key file loads) is not known here: one process keeps one
        device per TPM (:func:`get_device`), doctor's private one aside."""
        owned = _owned_in_process(self.tcti)
        _flush_handles(ectx, [h for h in transient_handles(ectx) if h not in owned])
        _flush_handles(ectx, session_handles(ectx))

    def _others_hold_objects(self) -> bool:
        """Whether transient objects this process did not load are in the TPM
        (asked on the TPM_RC_OBJECT_MEMORY path: a failure to ask counts as
        yes, so nothing is evicted and the original error is raised)."""
        try:
            return bool(self.foreign_transients())
        except Exception:  # noqa: BLE001 - the caller raises the typed error it already has
            return True

    def _evict_cached_transients(self) -> bool:
        """Flush every memoized transient (``flush=True``); True if there was one."""
        victims = [k for k, (_v, is_transient, _h) in self._memo.items() if is_transient]
        for key in victims:
            value, _, _ = self._memo.pop(key)
            self._flush_quietly(value)
        self._note_owned()
        return bool(victims)

    def _note_owned(self) -> None:
        self._owned = frozenset(h for _v, t, h in self._memo.values() if t and h is not None)

    def _current_info(self) -> TPMInfo:
        if self._info is None:
            self._info = _read_info(self._ectx, self.tcti)
        return self._info

    def _tr_close_quietly(self, tr: Any) -> None:
        if self._ectx is None:
            return
        try:
            self._ectx.tr_close(tr)
        except Exception:
            pass

    def _flush_quietly(self, tr: Any) -> None:
        if self._ectx is None:
            return
        try:
            self._ectx.flush_context(tr)
        except Exception:
            pass

    def _disconnect(self, *, flush: bool) -> None:
        ectx, self._ectx = self._ectx, None
        memo, self._memo = self._memo, {}
        self._owned = frozenset()
        if ectx is None:
            return
        if flush:
            for value, is_transient, _handle in memo.values():
                if is_transient:
                    try:
                        ectx.flush_context(value)
                    except Exception:
                        pass
        _close_quietly(ectx)


def _close_quietly(ectx: Any) -> None:
    try:
        ectx.close()
    except Exception:
        pass


# ---------------------------------------------------------------------------- registry

_REGISTRY: dict[str, TPMDevice] = {}
_REGISTRY_LOCK = threading.Lock()


def _inherited(dev: TPMDevice) -> None:
    """In a forked child: each call on a parent's device raises SignerForkedError
    instead of waiting for a worker thread that does not exist here (then
    saying "closed"). Its ESAPI context is never closed here (see close());
    tpm2-pytss does not close one when it is freed either."""
    dev._forked = True


#: every device of this process, registered or private (a fork() marks them all)
_DEVICES: ForkCopies[TPMDevice] = ForkCopies(_inherited)
#: the same, for finding which transient handles capseal holds in this process
_LIVE: weakref.WeakSet[TPMDevice] = weakref.WeakSet()
_LIVE_LOCK = threading.Lock()  # a WeakSet iterated while another thread adds raises RuntimeError


def _owned_in_process(tcti: str) -> frozenset[int]:
    """TPM handles of the transients that capseal devices of this process on
    ``tcti`` hold (a private device and the shared one may both be open)."""
    owned: set[int] = set()
    with _LIVE_LOCK:
        devices = list(_LIVE)
    for dev in devices:
        if dev.tcti == tcti and not dev._closed and not dev._forked:
            owned |= dev._owned
    return frozenset(owned)


def _after_fork_in_child() -> None:
    """Empty the registry in a forked child, so :func:`get_device` — and
    ``open_signer`` — open a connection of the child's own and the exit's
    close_all leaves the parent's alone."""
    global _REGISTRY_LOCK, _LIVE_LOCK
    _REGISTRY_LOCK = threading.Lock()  # a parent thread may have held it at the fork
    _LIVE_LOCK = threading.Lock()
    _REGISTRY.clear()


if hasattr(os, "register_at_fork"):  # POSIX only: without fork() nothing is inherited
    os.register_at_fork(after_in_child=_after_fork_in_child)


def get_device(tcti: str | None = None) -> TPMDevice:
    """The process-wide :class:`TPMDevice` for ``tcti`` (default ``device:/dev/tpmrm0``).

    Created on first use; it connects lazily, on the first call.
    """
    key = (tcti or DEFAULT_TCTI).strip()
    with _REGISTRY_LOCK:
        dev = _REGISTRY.get(key)
        if dev is None or dev._closed:
            dev = TPMDevice(key)
            _REGISTRY[key] = dev
        return dev


def close_all() -> None:
    """Close every device (flushes what capseal loaded). Run at exit, after
    every open producer is closed (``capseal._at_exit``)."""
    with _REGISTRY_LOCK:
        devices = list(_REGISTRY.values())
    for dev in devices:
        dev.close()


close_devices_last(close_all)  # after open producers have had their records signed (see capseal._at_exit)
