"""Persistent objects as provisioning reads, makes and evicts them, and what
``keys list`` says of each.
"""

from __future__ import annotations

from typing import Any

from cryptography.hazmat.primitives import serialization
from tpm2_pytss import TSS2_Exception
from tpm2_pytss.constants import ESYS_TR, TPM2_ALG, TPM2_ECC, TPM2_RC, TPMA_OBJECT
from tpm2_pytss.types import TPM2B_PUBLIC, TPM2B_SENSITIVE_CREATE

from capseal.keys import kid_for
from capseal.keys.secret import Secret

from ._handles import is_listed
from ._objects import HandleInUseError, key_attributes
from ._uri import format_handle

__all__ = ["read_persistent", "occupant", "flush_all", "create_under_srk", "persist", "evict", "close_tr",
           "key_summary"]


def read_persistent(ectx: Any, handle: int) -> TPM2B_PUBLIC | None:
    """The public area at a persistent handle (the TPM is asked first whether it
    lists anything there, see ``is_listed``).

    Args:
        ectx: the ESAPI context.
        handle: the handle.

    Returns:
        The public area, or None when the handle is empty.

    Raises:
        TSS2_Exception: the TPM refused otherwise (the device maps it).
    """
    if not is_listed(ectx, handle):
        return None
    try:
        tr = ectx.tr_from_tpmpublic(handle)
    except TSS2_Exception as exc:
        if int(exc.error) == int(TPM2_RC.HANDLE):
            return None
        raise
    try:
        public, _name, _ = ectx.read_public(tr)
        return public
    finally:
        ectx.tr_close(tr)


def occupant(ectx: Any, handle: int, tcti: str) -> TPM2B_PUBLIC | None:
    """:func:`read_persistent`, refusing a handle that is taken by an object that
    cannot be read: read as empty, provisioning would persist the signing key
    and then fail at the AK's handle (TPM_RC_NV_DEFINED), leaving half a job done.

    Args:
        ectx: the ESAPI context.
        handle: the handle.
        tcti: the TPM, named in errors.

    Returns:
        The public area, or None when the handle is empty.

    Raises:
        HandleInUseError: an object is listed there that cannot be read.
    """
    public = read_persistent(ectx, handle)
    if public is None and is_listed(ectx, handle):
        raise HandleInUseError(
            f"TPM {tcti} lists an object at {format_handle(handle)} that cannot be read (TPM_RC_HANDLE; its "
            "hierarchy, endorsement or platform, is probably disabled): the TPM will not persist a key there and "
            "capseal cannot evict it; nothing was changed",
            hint="use another handle, or enable that hierarchy and evict the object "
                 f"(tpm2_evictcontrol -C o -c {format_handle(handle)})")
    return public



def flush_all(ectx: Any, objects: list[Any]) -> None:
    """Flush transient objects on every path; a flush that fails (the connection
    broke) must not hide the error that got us here.

    Args:
        ectx: the ESAPI context.
        objects: their ESYS_TRs.
    """
    for tr in objects:
        try:
            ectx.flush_context(tr)
        except TSS2_Exception:
            pass


def create_under_srk(ectx: Any, srk: Any, template: TPM2B_PUBLIC, auth: Secret | None = None) -> tuple[Any, Any]:
    """Create a key under the SRK.

    Args:
        ectx: the ESAPI context.
        srk: the SRK's ESYS_TR.
        template: the key's template.
        auth: its auth value (None: empty).

    Returns:
        The new key's private and public blobs.

    Raises:
        TSS2_Exception: the TPM refused (the device maps it).
    """
    sensitive = TPM2B_SENSITIVE_CREATE()
    if auth is not None:
        sensitive.sensitive.userAuth = auth.encoded()
    private, public, _, _, _ = ectx.create(srk, sensitive, template)
    return private, public


def persist(ectx: Any, srk: Any, private: Any, public: Any, handle: int) -> None:
    """Load a new key and persist it at a handle.

    Args:
        ectx: the ESAPI context.
        srk: the SRK's ESYS_TR.
        private: the key's private blob.
        public: its public blob.
        handle: the persistent handle.

    Raises:
        TSS2_Exception: the TPM refused (the device maps it).
    """
    key = ectx.load(srk, private, public)
    try:
        close_tr(ectx, ectx.evict_control(ESYS_TR.OWNER, key, handle))  # the new persistent object's ESYS_TR
    finally:
        ectx.flush_context(key)


def evict(ectx: Any, handle: int) -> None:
    """Evict the persistent object at a handle, and let go of its ESYS_TR: ESYS
    keeps the evicted object's entry otherwise, and a key persisted at the
    handle later is then looked up under that stale name (ESYS answers its
    catch-all error when it is evicted in turn).

    Args:
        ectx: the ESAPI context.
        handle: the handle.

    Raises:
        TSS2_Exception: the TPM refused (the device maps it).
    """
    tr = ectx.tr_from_tpmpublic(handle)
    ectx.evict_control(ESYS_TR.OWNER, tr, handle)
    close_tr(ectx, tr)


def close_tr(ectx: Any, tr: Any) -> None:
    """Let go of an ESYS_TR (nothing for None or ESYS_TR.NONE); a failure is ignored.

    Args:
        ectx: the ESAPI context.
        tr: the ESYS_TR.
    """
    if tr is None or int(tr) == int(ESYS_TR.NONE):
        return
    try:
        ectx.tr_close(tr)
    except TSS2_Exception:
        pass


def key_summary(public: TPM2B_PUBLIC, handle: int | None = None) -> dict[str, Any]:
    """What ``keys list`` and ``provision`` say of an object.

    Args:
        public: its public area.
        handle: its persistent handle, if it has one.

    Returns:
        ``handle``, ``name``, ``public_key_pem`` and ``kid`` (keys with an SPKI),
        ``type``, ``role`` (signing-key, attestation-key, storage-key, other)
        and ``attributes``.
    """
    out: dict[str, Any] = {}
    if handle is not None:
        out["handle"] = format_handle(handle)
    out["name"] = bytes(public.get_name()).hex()
    area = public.publicArea
    kind = int(area.type)
    try:
        key = serialization.load_der_public_key(public.to_der())
        out["public_key_pem"] = public.to_pem().decode("ascii")
        out["kid"] = kid_for(key)
    except Exception:  # keyedhash/symcipher objects have no SPKI
        key = None
    if kind == int(TPM2_ALG.ECC):
        curve = int(area.parameters.eccDetail.curveID)
        out["type"] = {int(TPM2_ECC.NIST_P256): "ecc-p256", int(TPM2_ECC.NIST_P384): "ecc-p384"}.get(curve, f"ecc-0x{curve:04x}")
    elif kind == int(TPM2_ALG.RSA):
        out["type"] = f"rsa-{int(area.parameters.rsaDetail.keyBits)}"
    else:
        out["type"] = str(area.type)
    attrs = area.objectAttributes
    if attrs & TPMA_OBJECT.RESTRICTED and attrs & TPMA_OBJECT.SIGN_ENCRYPT:
        out["role"] = "attestation-key"
    elif attrs & TPMA_OBJECT.RESTRICTED and attrs & TPMA_OBJECT.DECRYPT:
        out["role"] = "storage-key"
    elif attrs & TPMA_OBJECT.SIGN_ENCRYPT:
        out["role"] = "signing-key"
    else:
        out["role"] = "other"
    out["attributes"] = key_attributes(public)
    return out
