"""``C_SignInit`` + ``C_Sign`` straight through the module's function table,
for the signing hot path; and the three calls python-pkcs11 cannot make
correctly: ``C_Initialize``, which a forked process must make first and
python-pkcs11 will not make on a module it believes initialised
(:func:`c_initialize`), and ``C_Login`` / ``C_Logout`` on a session
python-pkcs11 opened, whose session its own login leaves open when the token
refuses the PIN (:func:`c_login`).

Why a direct ``C_Sign``: python-pkcs11's ``key.sign`` makes three calls into
the module per signature (``C_SignInit``, ``C_Sign`` asking for the length,
``C_Sign``), each releasing and re-taking the GIL, and allocates an 8 KB
output buffer each time. In the producer's pipeline the signing thread then
queues for the GIL three times per signature behind threads doing capseal's
own Python work, and the token waits meanwhile. Here: two calls per
signature, into a buffer made once per signer, and for each call the GIL is
released — or, on an in-process software token only, kept or handed away as
the call deserves (:class:`_GILPolicy`): a call that answers at once costs
less with the GIL kept than with a handoff, while a slow one is better left
to run beside the other threads, and a real device's calls may block for any
length of time (bench/keys.py prints the choice each signer made).

Rules:

* only for mechanisms without parameters (``CKM_EDDSA``, ``CKM_ECDSA``) and a
  known signature size; RSA-PSS keeps python-pkcs11's path;
* only when :func:`capseal.keys.direct.direct_calls_allowed` (the
  ``CAPSEAL_NO_DIRECT`` switch), checked when a signer is opened;
* only under ``P11_LOCK``, on the session and key handles python-pkcs11
  opened, so nothing else runs in the module meanwhile;
* any return value but ``CKR_OK`` answers None, and the caller makes the same
  signature through python-pkcs11, which raises its own typed exceptions (and
  the reconnect logic applies): error handling exists once. A failed
  ``C_Sign`` ends the operation (PKCS#11 §5.11; the buffer is never too small),
  so the retry starts clean; and nothing — not a KeyboardInterrupt between
  the two calls — leaves an operation active (see :meth:`FastSign.sign`);
* the function table is trusted only when its ``C_GetFunctionList`` entry is
  the module's exported ``C_GetFunctionList`` (the layout is as expected);
  otherwise there is no direct path. Not on Windows, where PKCS#11 structures
  are packed differently.
"""

from __future__ import annotations

import ctypes
import logging
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, NamedTuple

from capseal import process
from capseal.keys.direct import direct_calls_allowed

__all__ = ["FastSign", "SIGNATURE_BUFFER", "c_initialize", "c_login", "c_logout"]

log = logging.getLogger("capseal.keys.pkcs11")

_CK_ULONG = ctypes.c_ulong
_CKR_BUFFER_TOO_SMALL = 0x150
_CKR_OPERATION_ACTIVE = 0x90
#: the output buffer: far above any signature made here (at most 96 bytes), so no answer is longer
SIGNATURE_BUFFER = 1024
_SPARE = 1 << 17  # ends a leftover operation whatever its mechanism (SLH-DSA signs up to ~50 KB)
_INITIALIZE, _GET_FUNCTION_LIST, _LOGIN, _LOGOUT, _SIGN_INIT, _SIGN, _SIGN_FINAL = 0, 3, 18, 19, 42, 43, 45  # 0-based slots after CK_VERSION (PKCS#11 2.40 §5.13)


class _Mechanism(ctypes.Structure):
    _fields_ = [("mechanism", _CK_ULONG), ("pParameter", ctypes.c_void_p), ("ulParameterLen", _CK_ULONG)]


class _FunctionList(ctypes.Structure):
    # CK_VERSION, then the 2.40 function pointers in order; only the first 46 are read
    _fields_ = [("major", ctypes.c_ubyte), ("minor", ctypes.c_ubyte)] + [(f"f{i}", ctypes.c_void_p) for i in range(46)]


_SIGN_INIT_ARGS = (_CK_ULONG, _CK_ULONG, ctypes.POINTER(_Mechanism), _CK_ULONG)
_SIGN_ARGS = (_CK_ULONG, _CK_ULONG, ctypes.c_char_p, _CK_ULONG, ctypes.c_void_p, ctypes.POINTER(_CK_ULONG))
_SignFinal = ctypes.CFUNCTYPE(_CK_ULONG, _CK_ULONG, ctypes.c_void_p, ctypes.POINTER(_CK_ULONG))
_Initialize = ctypes.CFUNCTYPE(_CK_ULONG, ctypes.c_void_p)
# released GIL: a PIN pad's C_Login waits for a person
_Login = ctypes.CFUNCTYPE(_CK_ULONG, _CK_ULONG, _CK_ULONG, ctypes.c_char_p, _CK_ULONG)
_Logout = ctypes.CFUNCTYPE(_CK_ULONG, _CK_ULONG)

# s: a call quicker than this costs less with the GIL kept than with a handoff
# (waking a thread and taking the GIL back); SoftHSM2's quick calls (C_SignInit,
# P-256 C_Sign) fall well below it and its Ed25519 C_Sign well above it
_KEEP_BELOW = 120e-6
_PROBE_LIMIT = 1e-3  # s: a probe this slow ends the probing: the GIL is released
_STALL_LIMIT = 50e-3  # s: a kept call this slow (a device gone slow) releases the GIL for good
_PROBES = 16


class _GILPolicy:
    """One module function, called with the GIL kept (``PYFUNCTYPE``) or
    released (``CFUNCTYPE``) as the function itself turns out to deserve.

    Only an in-process software token may keep the GIL (``may_keep``): a
    call into a real device can block for as long as the device likes (a
    network HSM reconnecting, a token pulled out), and with the GIL kept the
    whole process would stop with it. Any other module's calls always release
    it.

    For a software token the first 16 calls are probes, run with the GIL
    kept and timed: one over 1 ms releases the GIL at once; otherwise the GIL
    stays kept if their lower quartile is under 120 µs. After that the choice
    holds — a preempted call now and then must not flip it — except that a
    kept call over 50 ms releases the GIL for good. Only ever called under
    ``P11_LOCK``: one caller at a time."""

    __slots__ = ("_kept", "_released", "_keep", "_probes", "_clock")

    def __init__(self, address: int, args: tuple[Any, ...], *, may_keep: bool,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self._kept = ctypes.PYFUNCTYPE(*args)(address)
        self._released = ctypes.CFUNCTYPE(*args)(address)
        self._keep = may_keep
        self._probes: list[float] | None = [] if may_keep else None
        self._clock = clock  # seconds; tests give the durations exactly

    @property
    def keeps_gil(self) -> bool:
        """Whether the next call keeps the GIL."""
        return self._keep

    @property
    def probing(self) -> bool:
        """Whether calls are still being timed to make the choice."""
        return self._probes is not None

    def __call__(self, *args: Any) -> int:
        if not self._keep:
            return int(self._released(*args))
        clock = self._clock
        start = clock()
        rv = int(self._kept(*args))
        took = clock() - start
        probes = self._probes
        if probes is None:
            if took > _STALL_LIMIT:
                self._keep = False
        elif took > _PROBE_LIMIT:
            self._keep, self._probes = False, None
        else:
            probes.append(took)
            if len(probes) == _PROBES:
                # the lower quartile: interference (a preempted call, cold caches
                # at start) only ever adds time, so the quick calls tell the cost
                self._keep, self._probes = sorted(probes)[_PROBES // 4] < _KEEP_BELOW, None
        return rv


class _Table(NamedTuple):
    """A module's library handle and the addresses of the functions used here."""

    lib: Any  # held: the module is never unloaded under us
    initialize: int
    login: int
    logout: int
    sign_init: int
    sign: int
    sign_final: int


_TABLES: dict[str, _Table | None] = {}
_TABLES_LOCK = threading.Lock()


def _table(path: str) -> _Table | None:
    """The function table of the module at ``path`` (already loaded by
    python-pkcs11: the same dlopen handle), or None."""
    if sys.platform == "win32":  # CK_* structures are 1-byte packed there
        return None
    with _TABLES_LOCK:
        if path in _TABLES:
            return _TABLES[path]
        entry: _Table | None = None
        try:
            lib = ctypes.CDLL(path)
            table = ctypes.POINTER(_FunctionList)()
            if lib.C_GetFunctionList(ctypes.byref(table)) == 0 and table:
                functions = table.contents
                exported = ctypes.cast(lib.C_GetFunctionList, ctypes.c_void_p).value
                if getattr(functions, f"f{_GET_FUNCTION_LIST}") == exported:
                    entry = _Table(lib, *(getattr(functions, f"f{i}") for i in (_INITIALIZE, _LOGIN, _LOGOUT, _SIGN_INIT, _SIGN, _SIGN_FINAL)))
        except (OSError, AttributeError, ValueError, TypeError) as exc:
            log.debug("no direct function table for %s: %s", path, type(exc).__name__)
        _TABLES[path] = entry
        return entry


def c_initialize(path: str) -> int | None:
    """``C_Initialize(NULL)`` straight through the module's table.
    python-pkcs11 will not make this call on a module it believes
    initialised, and a process forked from one that used the module must make
    it *first* (``_module``, after a fork).

    Args:
        path: the module's real path (loaded by python-pkcs11 already).

    Returns:
        The module's return value; None without a trusted table.
    """
    table = _table(path)
    return None if table is None else int(_Initialize(table.initialize)(None))


def c_login(path: str, session_handle: int, user_type: int, pin: Any) -> int | None:
    """``C_Login`` on a session python-pkcs11 opened without a PIN, straight
    through the module's table. Why not ``Token.open(user_pin=...)``:
    python-pkcs11 opens a session there and, when ``C_Login`` fails, raises
    without closing it. Here the caller holds the session and closes it.
    ``P11_LOCK`` held.

    Args:
        path: the module's real path.
        session_handle: the session's handle.
        user_type: ``CKU_USER``.
        pin: a :class:`capseal.keys.secret.Secret`, revealed only in the call's
            arguments; None logs in through the token's protected
            authentication path (a PIN pad).

    Returns:
        The module's return value; None without a trusted table.
    """
    table = _table(path)
    if table is None:
        return None
    return int(_Login(table.login)(session_handle, user_type, None if pin is None else pin.encoded(),
                                   0 if pin is None else pin.byte_length()))


def c_logout(path: str, session_handle: int) -> int | None:
    """``C_Logout`` for a login made with :func:`c_login` (python-pkcs11 only
    logs out sessions it logged in itself). ``P11_LOCK`` held.

    Args:
        path: the module's real path.
        session_handle: the session's handle.

    Returns:
        The module's return value; None without a trusted table.
    """
    table = _table(path)
    return None if table is None else int(_Logout(table.logout)(session_handle))


def _after_fork_in_child() -> None:
    global _TABLES_LOCK
    _TABLES_LOCK = threading.Lock()  # a thread that held it at the fork does not exist here


process.on_fork("devices", after_in_child=_after_fork_in_child)


class FastSign:
    """One signer's direct ``C_Sign``: its mechanism and output buffer."""

    __slots__ = ("_init", "_sign", "_final", "_mechanism", "_out", "_out_len", "signatures")

    @classmethod
    def create(cls, module_path: str, mechanism: int, param: Any, size: int | None, *,
               software_token: bool) -> FastSign | None:
        """A signer's direct path, when it may have one.

        Args:
            module_path: the module's real path.
            mechanism: the ``CKM_*`` value.
            param: the mechanism's parameter (None for EdDSA and ECDSA).
            size: the signatures' length (the caller checks each one against it).
            software_token: the module is an in-process software token, whose
                quick calls may keep the GIL (see :class:`_GILPolicy`).

        Returns:
            The direct path; None when the mechanism takes a parameter or makes
            signatures of no known size, when the module's table is not
            trusted, or when ``CAPSEAL_NO_DIRECT`` turns direct calls off.
        """
        if param is not None or size is None or not direct_calls_allowed():
            return None
        table = _table(module_path)
        return None if table is None else cls(table, mechanism, software_token=software_token)

    def __init__(self, table: _Table, mechanism: int, *, software_token: bool) -> None:
        # table.lib, the library itself, stays referenced by _TABLES for the process's life
        # per signer: the same module answers each mechanism at its own speed
        self._init = _GILPolicy(table.sign_init, _SIGN_INIT_ARGS, may_keep=software_token)
        self._sign = _GILPolicy(table.sign, _SIGN_ARGS, may_keep=software_token)
        self._final = _SignFinal(table.sign_final)
        self._mechanism = _Mechanism(int(mechanism), None, 0)
        self._out = ctypes.create_string_buffer(SIGNATURE_BUFFER)
        self._out_len = _CK_ULONG()
        #: signatures made through this path so far
        self.signatures = 0

    @property
    def keeps_gil(self) -> dict[str, bool]:
        """Which calls currently run with the GIL kept (bench/keys.py prints it)."""
        return {"C_SignInit": self._init.keeps_gil, "C_Sign": self._sign.keeps_gil}

    @property
    def probing(self) -> dict[str, bool]:
        """Which calls are still being timed to choose whether they keep the GIL."""
        return {"C_SignInit": self._init.probing, "C_Sign": self._sign.probing}

    def sign(self, session_handle: int, key_handle: int, data: bytes) -> bytes | None:
        """The signature, or None when the module said anything but CKR_OK
        (the caller then signs through python-pkcs11). ``P11_LOCK`` held.

        No signing operation is ever left active on the session: whatever
        stops this method between ``C_SignInit`` and a completed ``C_Sign`` (a
        KeyboardInterrupt, a module that still says the buffer is too small)
        ends the operation before it returns or raises. And an operation
        someone else left active (CKR_OPERATION_ACTIVE) is ended once and
        ``C_SignInit`` tried again, instead of failing every later signature.

        Args:
            session_handle: the session's handle.
            key_handle: the private key's handle.
            data: the bytes to sign (a digest, or the message for EdDSA).

        Returns:
            The signature, or None.
        """
        done = False  # until an answer has ended the operation (or none began)
        try:
            rv = self._init(session_handle, ctypes.byref(self._mechanism), key_handle)
            if rv == _CKR_OPERATION_ACTIVE:
                self._end_operation(session_handle)
                rv = self._init(session_handle, ctypes.byref(self._mechanism), key_handle)
            if rv != 0:
                done = True
                return None
            self._out_len.value = SIGNATURE_BUFFER
            rv = self._sign(session_handle, data, len(data), self._out, ctypes.byref(self._out_len))
            done = rv != _CKR_BUFFER_TOO_SMALL  # any other answer ends the operation (PKCS#11 §5.11)
            if rv != 0:
                return None
            self.signatures += 1
            return self._out.raw[: self._out_len.value]
        finally:
            if not done:
                self._end_operation(session_handle)

    def _end_operation(self, session_handle: int) -> None:
        """End an active signing operation: a ``C_Sign`` into a buffer big enough
        for any signature, or — for a multi-part operation, which ``C_Sign``
        may not end — a ``C_SignFinal`` (results thrown away). Harmless when
        none is active (the module answers CKR_OPERATION_NOT_INITIALIZED)."""
        spare = ctypes.create_string_buffer(_SPARE)
        length = _CK_ULONG(_SPARE)
        if self._sign._released(session_handle, b"\0", 1, spare, ctypes.byref(length)) == _CKR_OPERATION_ACTIVE:
            length.value = _SPARE
            self._final(session_handle, spare, ctypes.byref(length))
