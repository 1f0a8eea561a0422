"""TPM2_Sign straight through tpm2-pytss's cffi library, for the hot path.

Why: tpm2-pytss's ``ESAPI.sign`` wrapper and its attribute machinery cost
more Python per call than ESYS itself; at a software TPM's rate that Python
time competes with the producer's own work for the GIL. This calls
``Esys_Sign`` with preallocated structures and reads R and S from the C
structure. It relies on tpm2-pytss 3.0's ``ESAPI._ctx`` and
``_libtpm2_pytss`` (the extra pins that version); without them, or under
``CAPSEAL_NO_DIRECT`` (:mod:`capseal.keys.direct`), :meth:`DirectSign.create`
returns None and the signer calls ``ESAPI.sign``. Used only on the device's
worker thread, so the buffers are never shared.
"""

from __future__ import annotations

from typing import Any

from tpm2_pytss import TSS2_Exception
from tpm2_pytss.constants import ESYS_TR
from tpm2_pytss.types import TPMT_TK_HASHCHECK

from capseal.errors import SignatureFailedError
from capseal.keys.direct import direct_calls_allowed

from ._objects import KeyShape

__all__ = ["DirectSign", "esys_context"]


def esys_context(ectx: Any) -> Any:
    """The ``ESYS_CONTEXT *`` of an ESAPI object, which tpm2-pytss keeps in
    ``ESAPI._ctx`` (no public accessor); None when it has none.

    Args:
        ectx: a tpm2-pytss ``ESAPI``.

    Returns:
        The cffi pointer, or None.
    """
    return getattr(ectx, "_ctx", None)


class DirectSign:
    """One signer's direct ``Esys_Sign``: its preallocated structures."""

    __slots__ = ("_ffi", "_lib", "_digest", "_out", "_scheme", "_ticket", "_rsa", "_size", "_scheme_obj",
                 "_ticket_obj")

    @classmethod
    def create(cls, shape: KeyShape, ticket: TPMT_TK_HASHCHECK) -> DirectSign | None:
        """A signer's direct path, when it may have one.

        Args:
            shape: how the key signs (scheme, sizes).
            ticket: the null hashcheck ticket of every signature.

        Returns:
            The direct path; None when tpm2-pytss lacks what it needs, or when
            ``CAPSEAL_NO_DIRECT`` turns direct calls off.
        """
        if not direct_calls_allowed():
            return None
        try:
            from tpm2_pytss._libtpm2_pytss import ffi, lib

            if not hasattr(lib, "Esys_Sign") or not hasattr(lib, "Esys_Free"):
                return None
            return cls(ffi, lib, shape, ticket)
        except Exception:
            return None

    def __init__(self, ffi: Any, lib: Any, shape: KeyShape, ticket: TPMT_TK_HASHCHECK) -> None:
        self._ffi, self._lib = ffi, lib
        self._digest = ffi.new("TPM2B_DIGEST *")
        self._out = ffi.new("TPMT_SIGNATURE **")
        self._scheme_obj, self._ticket_obj = shape.scheme, ticket  # keep the owners of the cdata alive
        self._scheme, self._ticket = shape.scheme._cdata, ticket._cdata
        self._rsa, self._size = shape.is_rsa, shape.size

    def sign(self, ctx: Any, key_tr: Any, digest: bytes) -> bytes:
        """TPM2_Sign of ``digest`` with the key at ``key_tr``.

        Args:
            ctx: the ``ESYS_CONTEXT *`` (:func:`esys_context`).
            key_tr: the key's ESYS_TR (its auth value set on it).
            digest: the message's digest.

        Returns:
            The COSE signature: R ‖ S padded to the curve size, or the RSA-PSS signature.

        Raises:
            TSS2_Exception: ``Esys_Sign`` failed (the device maps it).
            SignatureFailedError: the TPM returned an oversized ECDSA component.
        """
        ffi, lib, d = self._ffi, self._lib, self._digest
        d.size = len(digest)
        ffi.memmove(d.buffer, digest, len(digest))
        rc = lib.Esys_Sign(ctx, int(key_tr), int(ESYS_TR.PASSWORD), int(ESYS_TR.NONE), int(ESYS_TR.NONE), d,
                           self._scheme, self._ticket, self._out)
        if rc:
            raise TSS2_Exception(rc)
        sig = self._out[0]
        try:
            if self._rsa:
                body = sig.signature.rsapss.sig
                return bytes(ffi.buffer(body.buffer, body.size)).rjust(self._size, b"\x00")
            ecdsa = sig.signature.ecdsa
            r = bytes(ffi.buffer(ecdsa.signatureR.buffer, ecdsa.signatureR.size))
            s = bytes(ffi.buffer(ecdsa.signatureS.buffer, ecdsa.signatureS.size))
        finally:
            lib.Esys_Free(sig)
        if len(r) > self._size or len(s) > self._size:
            raise SignatureFailedError("the TPM returned an oversized ECDSA component")
        return r.rjust(self._size, b"\x00") + s.rjust(self._size, b"\x00")
