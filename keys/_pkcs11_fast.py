"""``C_SignInit`` + ``C_Sign`` straight through the module's function table,
for the signing hot path.

Why: python-pkcs11's ``key.sign`` makes three calls into the module per
signature (``C_SignInit``, ``C_Sign`` asking for the length, ``C_Sign``), each
releasing and re-taking the GIL, and allocates an 8 KB output buffer each
time. In the producer's pipeline the signing thread then queues for the GIL
three times per signature behind threads doing capseal's own Python work,
and the token waits meanwhile. Measured on SoftHSM2 Ed25519 with one Python
thread competing for the GIL: 1,500–1,670 signatures/s through ``key.sign``,
2,190–2,460/s here.

Here ``C_SignInit`` runs with the GIL held (it only sets up the operation)
and ``C_Sign`` runs once, with the GIL released, into a buffer of the
signature's size made once per signer. Rules:

* only for mechanisms without parameters (``CKM_EDDSA``, ``CKM_ECDSA``) and a
  known signature size; RSA-PSS keeps python-pkcs11's path;
* only under ``P11_LOCK``, on the session and key handles python-pkcs11
  opened, so nothing else runs in the module meanwhile;
* any return value but ``CKR_OK`` answers None, and the caller makes the same
  signature through python-pkcs11, which raises its own typed exceptions (and
  the reconnect logic applies): error handling exists once. A failed
  ``C_Sign`` ends the operation (PKCS#11 §5.11; the buffer is never too small),
  so the retry starts clean (and should a module still say the buffer is too
  small, the operation is ended with a buffer of the size it asks for);
* the function table is trusted only when its ``C_GetFunctionList`` entry is
  the module's exported ``C_GetFunctionList`` (the layout is as expected);
  otherwise there is no fast path.
"""

from __future__ import annotations

import ctypes
import logging
import threading
from typing import Any

__all__ = ["FastSign"]

log = logging.getLogger("capseal.keys.pkcs11")

_CK_ULONG = ctypes.c_ulong
_CKR_BUFFER_TOO_SMALL = 0x150
_BUFFER = 1024  # far above any signature made here (at most 96 bytes)
_SIGN_INIT, _SIGN, _GET_FUNCTION_LIST = 42, 43, 3  # 0-based slots after CK_VERSION (PKCS#11 2.40 §5.13)


class _Mechanism(ctypes.Structure):
    _fields_ = [("mechanism", _CK_ULONG), ("pParameter", ctypes.c_void_p), ("ulParameterLen", _CK_ULONG)]


class _FunctionList(ctypes.Structure):
    # CK_VERSION, then the 2.40 function pointers in order; only the first 44 are read
    _fields_ = [("major", ctypes.c_ubyte), ("minor", ctypes.c_ubyte)] + [(f"f{i}", ctypes.c_void_p) for i in range(44)]


_SignInitType = ctypes.PYFUNCTYPE(_CK_ULONG, _CK_ULONG, ctypes.POINTER(_Mechanism), _CK_ULONG)  # keeps the GIL
_SignType = ctypes.CFUNCTYPE(_CK_ULONG, _CK_ULONG, ctypes.c_char_p, _CK_ULONG, ctypes.c_void_p,
                             ctypes.POINTER(_CK_ULONG))  # releases the GIL

_TABLES: dict[str, tuple[Any, Any, Any] | None] = {}
_TABLES_LOCK = threading.Lock()


def _table(path: str) -> tuple[Any, Any, Any] | None:
    """(library, C_SignInit, C_Sign) of the module at ``path`` (already loaded
    and initialised by python-pkcs11: the same dlopen handle), or None."""
    with _TABLES_LOCK:
        if path in _TABLES:
            return _TABLES[path]
        entry: tuple[Any, Any, Any] | None = None
        try:
            lib = ctypes.CDLL(path)  # holds a reference: the module is never unloaded under us
            table = ctypes.POINTER(_FunctionList)()
            if lib.C_GetFunctionList(ctypes.byref(table)) == 0 and table:
                functions = table.contents
                exported = ctypes.cast(lib.C_GetFunctionList, ctypes.c_void_p).value
                if getattr(functions, f"f{_GET_FUNCTION_LIST}") == exported:
                    entry = (lib, _SignInitType(getattr(functions, f"f{_SIGN_INIT}")),
                             _SignType(getattr(functions, f"f{_SIGN}")))
        except (OSError, AttributeError, ValueError, TypeError) as exc:
            log.debug("no direct C_Sign for %s: %s", path, type(exc).__name__)
        _TABLES[path] = entry
        return entry


class FastSign:
    """One signer's direct ``C_Sign``: its mechanism and output buffer."""

    __slots__ = ("_lib", "_init", "_sign", "_mechanism", "_out", "_out_len", "_size")

    @classmethod
    def create(cls, module_path: str, mechanism: int, param: Any, size: int | None) -> FastSign | None:
        if param is not None or size is None:
            return None
        table = _table(module_path)
        return None if table is None else cls(table, mechanism, size)

    def __init__(self, table: tuple[Any, Any, Any], mechanism: int, size: int) -> None:
        self._lib, self._init, self._sign = table
        self._mechanism = _Mechanism(int(mechanism), None, 0)
        self._out = ctypes.create_string_buffer(_BUFFER)
        self._out_len = _CK_ULONG()
        self._size = size  # the caller checks the length it gets against this

    def sign(self, session_handle: int, key_handle: int, data: bytes) -> bytes | None:
        """The signature, or None when the module said anything but CKR_OK
        (the caller then signs through python-pkcs11). ``P11_LOCK`` held."""
        if self._init(session_handle, ctypes.byref(self._mechanism), key_handle) != 0:
            return None
        self._out_len.value = _BUFFER
        rv = self._sign(session_handle, data, len(data), self._out, ctypes.byref(self._out_len))
        if rv == _CKR_BUFFER_TOO_SMALL:  # the operation is still active: end it, then use the slow path
            bigger = ctypes.create_string_buffer(max(int(self._out_len.value), _BUFFER) * 2)
            self._out_len.value = len(bigger)
            self._sign(session_handle, data, len(data), bigger, ctypes.byref(self._out_len))
            return None
        if rv != 0:
            return None
        return self._out.raw[: self._out_len.value]
