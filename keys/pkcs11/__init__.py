"""capseal.keys.pkcs11 — signing keys held in PKCS#11 tokens (HSMs, smart
cards, SoftHSM2), named by RFC 7512 ``pkcs11:`` URIs.

>>> from capseal.keys import open_signer
>>> signer = open_signer("pkcs11:token=agents;object=seal-key"
...                      "?module-path=/usr/lib/softhsm/libsofthsm2.so", pin=pin)  # doctest: +SKIP

The URI names (:func:`parse_pkcs11_uri`, :class:`PKCS11URI`, …) are pure
Python and load with this package; the rest needs python-pkcs11
(``pip install 'capseal[pkcs11]'``) and loads on first use, so that a
missing extra is a :class:`~capseal.errors.MissingExtraError` naming it.

Public names: :class:`PKCS11Signer`; :func:`create_key`, :func:`list_keys`,
:func:`delete_key` (``capseal keys``); :func:`init_softhsm_token`,
:func:`softhsm_module` (``capseal token init``); :func:`doctor_checks`
(``capseal doctor``); :data:`P11_LOCK`, the one lock every PKCS#11 call in
this process runs under (other code that calls the same module in this
process must take it too); and the URI names below.

Everything else is private, one job per module: ``_uri`` (URIs, module
paths and allow-lists), ``_lock`` (the lock, typed errors, whether calls are
refused), ``_module`` (loaded modules), ``_login``, ``_session`` (one
logged-in session per token; fork and exit hooks), ``_calls`` (calls with one
reconnect), ``_objects`` (key objects and mechanisms), ``_direct`` (the
direct ``C_Sign``), ``_signer``, ``_signing_process``, ``_child`` and
``_signing_main`` (signatures made in a child process), ``_provision``,
``_tools`` and ``_doctor``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._uri import (
    KNOWN_MODULES,
    MODULE_ALLOWLIST_ENV,
    PKCS11URI,
    check_module_allowed,
    module_allowlist,
    parse_pkcs11_uri,
    pct_encode,
    read_pin_source,
    resolve_module,
)

if TYPE_CHECKING:  # loaded on first use at run time (see __getattr__); typed callers see the real types
    from ._doctor import doctor_checks
    from ._lock import P11_LOCK
    from ._provision import create_key, delete_key, list_keys
    from ._signer import PKCS11Signer
    from ._tools import init_softhsm_token, softhsm_module

__all__ = [
    "PKCS11Signer",
    "create_key",
    "list_keys",
    "delete_key",
    "init_softhsm_token",
    "softhsm_module",
    "doctor_checks",
    "P11_LOCK",
    "PKCS11URI",
    "parse_pkcs11_uri",
    "pct_encode",
    "resolve_module",
    "check_module_allowed",
    "module_allowlist",
    "read_pin_source",
    "MODULE_ALLOWLIST_ENV",
    "KNOWN_MODULES",
]

#: the names that need python-pkcs11, and the leaf each comes from
_LAZY = {
    "PKCS11Signer": "_signer",
    "create_key": "_provision",
    "list_keys": "_provision",
    "delete_key": "_provision",
    "init_softhsm_token": "_tools",
    "softhsm_module": "_tools",
    "doctor_checks": "_doctor",
    "P11_LOCK": "_lock",
}


def __getattr__(name: str) -> Any:
    from capseal.keys import lazy_export  # a missing python-pkcs11 is a MissingExtraError naming the extra

    return lazy_export("pkcs11", __name__, _LAZY, globals(), name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
