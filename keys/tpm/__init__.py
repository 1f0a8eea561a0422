"""capseal.keys.tpm — signing keys inside a TPM 2.0, named by ``tpm2:`` URIs
(persistent handles and ``TSS2 PRIVATE KEY`` files).

>>> from capseal.keys import open_signer
>>> signer = open_signer("tpm2:handle=0x81000101?tcti=swtpm:host=127.0.0.1,port=2321")  # doctest: +SKIP

The device interface (``capseal.attest`` uses it for TPM2_Quote)::

    dev = get_device("swtpm:host=127.0.0.1,port=2321")   # process-wide, one per TCTI
    info = dev.info()                                     # TPMInfo: manufacturer, vendor, firmware, software
    name = dev.call(lambda ectx: ectx.read_public(ectx.tr_from_tpmpublic(0x81000102))[1])
    # inside a call: dev.memo(key, factory, flush=...) keeps a handle for this connection only

The URI and key-file names (:func:`parse_tpm_uri`, :class:`TPMKeyURI`,
:class:`TPMKeyFile`, …) are pure Python and load with this package; the rest
needs tpm2-pytss (``pip install 'capseal[tpm]'``) and loads on first use, so
that a missing extra is a :class:`~capseal.errors.MissingExtraError` naming it.

Public names: :class:`TPMSigner`; :class:`TPMDevice` and :func:`get_device`
(one worker thread per TPM, which every caller — signers, ``capseal.attest``
quotes, provisioning — queues on), :class:`TPMInfo`, :func:`persistent_tr`,
:func:`map_tss_error`, :func:`unreachable_fix`; :func:`provision`,
:func:`create_key`, :func:`list_keys`, :func:`delete_key` and their errors
:class:`HandleInUseError`, :class:`ProvisionIncompleteError`;
:func:`srk_template` (the TCG storage root key every key file's parent
``0x40000001`` means);
:func:`verify_certify` (the TPM2_Certify record check; see also
:func:`capseal.keys.verify_certify`); :func:`doctor_checks`; and the URI
names below.

Everything else is private, one job per module: ``_uri`` (URIs and key
files), ``_errors`` (TSS2 return codes by name), ``_info``, ``_handles``,
``_device`` (the worker; fork and exit hooks), ``_objects`` (templates,
public areas, key files, persistent objects), ``_direct`` (the direct
``Esys_Sign``), ``_signer``, ``_certify``, ``_provision``, ``_manage`` and
``_doctor``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._uri import (
    DEFAULT_TCTI,
    TCTI_NAMES,
    TPM_RH_OWNER,
    TPMKeyFile,
    TPMKeyURI,
    check_tcti,
    explicit_tcti,
    format_handle,
    handle_argument,
    is_persistent_handle,
    parse_handle,
    parse_persistent_handle,
    parse_tpm_uri,
)

if TYPE_CHECKING:  # loaded on first use at run time (see __getattr__); typed callers see the real types
    from ._certify import verify_certify
    from ._device import TPMDevice, close_all, get_device
    from ._doctor import doctor_checks
    from ._errors import map_tss_error, unreachable_fix
    from ._handles import persistent_tr
    from ._info import TPMInfo
    from ._manage import create_key, delete_key, list_keys
    from ._objects import SRK_TEMPLATE, HandleInUseError, srk_template
    from ._provision import ProvisionIncompleteError, provision
    from ._signer import TPMSigner

__all__ = [
    "TPMSigner",
    "TPMDevice",
    "TPMInfo",
    "get_device",
    "close_all",
    "persistent_tr",
    "map_tss_error",
    "unreachable_fix",
    "provision",
    "create_key",
    "list_keys",
    "delete_key",
    "HandleInUseError",
    "ProvisionIncompleteError",
    "srk_template",
    "SRK_TEMPLATE",
    "verify_certify",
    "doctor_checks",
    "DEFAULT_TCTI",
    "TCTI_NAMES",
    "TPM_RH_OWNER",
    "TPMKeyURI",
    "TPMKeyFile",
    "parse_tpm_uri",
    "parse_handle",
    "parse_persistent_handle",
    "check_tcti",
    "explicit_tcti",
    "format_handle",
    "handle_argument",
    "is_persistent_handle",
]

#: the names that need tpm2-pytss, and the leaf each comes from
_LAZY = {
    "TPMSigner": "_signer",
    "TPMDevice": "_device",
    "get_device": "_device",
    "close_all": "_device",
    "TPMInfo": "_info",
    "persistent_tr": "_handles",
    "map_tss_error": "_errors",
    "unreachable_fix": "_errors",
    "provision": "_provision",
    "ProvisionIncompleteError": "_provision",
    "create_key": "_manage",
    "list_keys": "_manage",
    "delete_key": "_manage",
    "HandleInUseError": "_objects",
    "srk_template": "_objects",
    "SRK_TEMPLATE": "_objects",
    "verify_certify": "_certify",
    "doctor_checks": "_doctor",
}


def __getattr__(name: str) -> Any:
    from capseal.keys import lazy_export  # a missing tpm2-pytss is a MissingExtraError naming the extra

    return lazy_export("tpm2", __name__, _LAZY, globals(), name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
